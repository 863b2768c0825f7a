"""The compile cache (DESIGN section 6): per user, keyed by version, backend, compiler, target,
options and Program text; atomic writes; an entry that fails its integrity check is a miss."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path

from .. import __version__

FORMAT = 1


def cache_dir() -> Path:
    root = os.environ.get("HK_CACHE_DIR")
    if root:
        p = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        p = Path(base) / "hk_portable"
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def cache_key(backend, program, target, options: dict) -> str:
    parts = {"hk": __version__, "format": FORMAT, "backend": backend.name, "compiler": backend.compiler_version(),
             "target": target.spec, "options": options, "program": str(program)}   # spec: emulated or not
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.hkc"


def load(key: str):
    """The cached Artifact for key, or None (missing, unreadable or corrupt: all misses)."""
    try:
        blob = _path(key).read_bytes()
        digest, body = blob[:64], blob[64:]
        if hashlib.sha256(body).hexdigest().encode() != digest:
            return None
        return pickle.loads(body)
    except Exception:   # any unreadable entry is a miss; it is rewritten after compiling
        return None


def store(key: str, artifact) -> None:
    """Write atomically (temp file + os.replace), so concurrent writers never expose a partial entry."""
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    payload, artifact.payload = artifact.payload, None
    try:
        body = pickle.dumps(artifact)
    finally:
        artifact.payload = payload
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(body).hexdigest().encode() + body)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
        except OSError:
            pass   # a read-only or full cache dir must not fail the launch
    return art
