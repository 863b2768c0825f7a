"""The compile cache (DESIGN section 6): per user, keyed by version, backend, compiler, target, options and
Program text. An entry is data, never code to run while reading it: JSON metadata plus the raw binary,
read by a parser that can only build dicts, lists, tuples, strings, numbers and bytes (see SECURITY.md).

The directory is created 0700 and used only when this user owns it and nobody else may write it;
otherwise a warning says why and the process keeps its compiles in memory. Writes are atomic (temp file
+ os.replace), so concurrent writers never expose a partial entry; an entry that fails any check is a miss
and is rewritten after compiling."""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import threading
import warnings
from pathlib import Path

from ..interface.backend import Artifact
from ..version import __version__
from .cachefiles import (
    UnsafeCacheDir,
    check_dir,
    check_tree,
    read_regular,
    subdir,
    write_atomic,
)

FORMAT = 3
MAGIC = b"HKCACHE2\n"
_TUPLE, _BYTES = "__hk_tuple__", "__hk_bytes__"
_FIELDS = [f.name for f in dataclasses.fields(Artifact) if f.name not in ("binary", "payload")]


# ------------------------------------------------------------------------------------------ directory
def _configured_dir() -> Path:
    root = os.environ.get("HK_CACHE_DIR")
    if root:
        return Path(os.path.abspath(root))   # absolute: compilers run with another cwd
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hk_portable"


_warned: set[str] = set()


def cache_dir() -> Path | None:
    """The on-disk cache directory, created 0700; None when it is unsafe or cannot be created (the
    process then caches in memory, with one warning per directory)."""
    p = _configured_dir()
    try:
        if not os.path.lexists(p):              # no mkdir on what exists: a read-only cache sees no write
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_dir(p)
        return p
    except (OSError, UnsafeCacheDir) as e:
        if str(p) not in _warned:
            _warned.add(str(p))
            warnings.warn(f"hk_portable: not using the compile cache directory {p}: {e}. Compiled kernels are "
                          "kept in memory for this process only; set HK_CACHE_DIR to a directory only you can "
                          "write (mode 0700).", RuntimeWarning, stacklevel=2)
        return None


def cache_key(backend, program, target, options: dict) -> str:
    parts = {"hk": __version__, "format": FORMAT, "backend": backend.name, "compiler": backend.compiler_version(),
             "target": target.spec, "options": options, "program": str(program)}   # spec: emulated or not
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _path(key: str, root: Path) -> Path:
    return root / key[:2] / f"{key}.hkc"


# ------------------------------------------------------------------------------------------- encoding
def _to_json(v):
    """Plain JSON for v; tuples and bytes tagged so they come back as such. TypeError for anything else."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return {_TUPLE: [_to_json(x) for x in v]}
    if isinstance(v, list):
        return [_to_json(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return {_BYTES: base64.b64encode(bytes(v)).decode()}
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v) or _TUPLE in v or _BYTES in v:
            raise TypeError(f"cannot cache a dict with keys {sorted(map(repr, v))[:5]}")
        return {k: _to_json(x) for k, x in v.items()}
    raise TypeError(f"cannot cache a value of type {type(v).__name__}")


def _from_json(v):
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    if isinstance(v, dict):
        if set(v) == {_TUPLE}:
            return tuple(_from_json(x) for x in v[_TUPLE])
        if set(v) == {_BYTES}:
            return base64.b64decode(v[_BYTES], validate=True)
        return {k: _from_json(x) for k, x in v.items()}
    return v


def encode(key: str, artifact: Artifact) -> bytes:
    """MAGIC, sha256 of the rest (hex) and a newline, the metadata's length and a newline, the metadata
    (JSON), the binary. The payload (backend-private, in memory only) is not stored."""
    meta = {"key": key, "artifact": {f: _to_json(getattr(artifact, f)) for f in _FIELDS},
            "binary": None if artifact.binary is None else len(artifact.binary)}
    meta_bytes = json.dumps(meta, sort_keys=True, allow_nan=True).encode()
    rest = b"%d\n" % len(meta_bytes) + meta_bytes + (artifact.binary or b"")
    return MAGIC + hashlib.sha256(rest).hexdigest().encode() + b"\n" + rest


def decode(key: str, blob: bytes) -> Artifact | None:
    """The Artifact in blob, or None if anything about it is off (format, digest, key, lengths, types)."""
    if not blob.startswith(MAGIC):
        return None
    digest, sep, rest = blob[len(MAGIC):].partition(b"\n")
    if not sep or hashlib.sha256(rest).hexdigest().encode() != digest:
        return None
    length, sep, rest = rest.partition(b"\n")
    if not sep or not length.isdigit() or int(length) > len(rest):
        return None
    meta = json.loads(rest[:int(length)])
    binary = rest[int(length):]
    if not isinstance(meta, dict) or meta.get("key") != key or not isinstance(meta.get("artifact"), dict):
        return None
    if meta.get("binary") != (len(binary) if meta.get("binary") is not None else None) or (
            meta.get("binary") is None and binary):
        return None
    fields = _from_json(meta["artifact"])
    if set(fields) != set(_FIELDS):
        return None
    art = Artifact(**fields, binary=None if meta["binary"] is None else binary)
    return art if _well_typed(art) else None


def _well_typed(a: Artifact) -> bool:
    strs = (a.backend, a.target, a.kernel_name, a.program_hash)
    return (all(isinstance(s, str) for s in strs) and all(isinstance(d, dict) for d in (a.launch, a.resources,
            a.options)) and all(x is None or isinstance(x, str) for x in (a.source, a.asm)))


# ----------------------------------------------------------------------------------------- load/store
_memory: dict[str, bytes] = {}           # key -> encoded entry, when there is no safe directory
_memory_lock = threading.Lock()


def load(key: str) -> Artifact | None:
    """The cached Artifact for key, or None (missing, unreadable, corrupt or foreign: all misses)."""
    root = cache_dir()
    try:
        if root is None:
            with _memory_lock:
                blob = _memory.get(key)
        else:
            path = _path(key, root)
            check_tree(root, path)                  # every level, not only the root
            blob = read_regular(path)
        return None if blob is None else decode(key, blob)
    except (OSError, ValueError, TypeError, KeyError, RecursionError, UnsafeCacheDir):   # unreadable, malformed: a miss
        return None


def store(key: str, artifact: Artifact) -> None:
    """Write atomically (temp file + os.replace), so concurrent writers never expose a partial entry.
    OSError when the directory cannot take it (read-only, full); TypeError for an uncacheable Artifact."""
    blob = encode(key, artifact)
    root = cache_dir()
    if root is None:
        with _memory_lock:
            _memory[key] = blob
        return
    path = _path(key, root)
    subdir(root, path.parent.name)                  # OSError when read-only; UnsafeCacheDir when symlinked out
    write_atomic(path, blob)


def compile_cached(backend, program, target, options: dict | None = None):
    """backend.compile through the disk cache (backends that opt out with cacheable() -> False skip it)."""
    options = dict(options or {})
    if not backend.cacheable():
        return backend.compile(program, target, options)
    key = cache_key(backend, program, target, options)
    art = load(key)
    if art is not None:
        art = backend.restore(art, program)
    if art is None:
        art = backend.compile(program, target, options)
        try:
            store(key, art)
        except (OSError, TypeError, UnsafeCacheDir):
            pass   # a read-only or full cache dir, or an Artifact holding more than data, must not fail the launch
    return art
