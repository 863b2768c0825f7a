"""Just enough of a 64-bit little-endian ELF reader for the linker step: section alignments and symbol
values of the objects the emulator itself builds."""
from __future__ import annotations

import struct
from pathlib import Path


def sections(path: Path):
    """(name, addralign, size) of every section of a 64-bit little-endian ELF file."""
    b = path.read_bytes()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    stroff = hdrs[shstrndx][4]
    name = lambda o: b[stroff + o:b.index(b"\0", stroff + o)].decode()  # noqa: E731
    return b, hdrs, [(name(h[0]), h[8], h[5]) for h in hdrs]


def symbols(path: Path, wanted: set[str]) -> dict[str, int]:
    """Values of the ``wanted`` symbols found in the file's .symtab."""
    b, hdrs, secs = sections(path)
    out = {}
    for (nm, _al, _sz), h in zip(secs, hdrs):
        if nm != ".symtab":
            continue
        strtab = hdrs[h[6]][4]
        for off in range(h[4], h[4] + h[5], 24):
            st_name, _info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", b, off)
            s_ = b[strtab + st_name:b.index(b"\0", strtab + st_name)].decode()
            if s_ in wanted:
                out[s_] = value
    return out
