"""What `hk compile --emit KIND` can ask a backend for. A module that imports nothing, so that the command line
builds its parser (`hk --help`) without importing torch, which hk_portable.interface imports."""
EMIT_KINDS = ("ir", "lowered", "source", "asm", "ptx", "sass", "hsaco")
