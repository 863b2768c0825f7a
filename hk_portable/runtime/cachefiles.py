"""Files the library loads or runs from the cache directory (SECURITY.md): shared objects of the hip emulator,
the compiled launcher and op replay, cache entries, tuning data.

- Every directory from the cache root down to a file is checked (a real directory, owned by this user, not
  group- or world-writable), not only the root: a subdirectory symlinked elsewhere is refused.
- Only regular files are read (opened with O_NOFOLLOW | O_NONBLOCK, then fstat-ed), so a FIFO or a device in
  place of an entry cannot hang the process.
- A built file gets a sidecar `<name>.sha256` (its size and sha256) written at build time; before a file is
  loaded its size and hash are checked against it, once per process per (inode, size, mtime). A file that fails
  is rebuilt. A directory of built files (a hip emulator module) has one manifest for all of them.
- Where the cache cannot be written (read-only), builds go to a private temporary directory of this process,
  removed at exit; nothing is written into the cache on the read path.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

SIDECAR = ".sha256"
MANIFEST = ".hk-manifest"
STALE_S = 3600                  # a .build-* / .tmp-* older than this is a killed build's leftover
_lock = threading.RLock()
_verified: dict[tuple, bool] = {}
_private: Path | None = None


class UnsafeCacheDir(Exception):
    """The cache directory could be written by someone else: it must not be read."""


# ------------------------------------------------------------------------------------------ directories
def check_dir(p: Path) -> None:
    """UnsafeCacheDir unless `p` is a real directory (not a symlink) owned by this user and not group- or
    world-writable."""
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDir(f"{p} is not a directory (a symlink or a file)")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise UnsafeCacheDir(f"{p} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDir(f"{p} is writable by its group or by everyone (mode {stat.S_IMODE(st.st_mode):o})")


def subdir(root: Path, *parts: str, create: bool = True) -> Path:
    """root/parts..., each level checked with check_dir (created 0700 first where missing and `create`; a
    read-only cache leaves it missing: FileNotFoundError). UnsafeCacheDir when a level is unsafe."""
    p = Path(root)
    check_dir(p)
    for part in parts:
        p = p / part
        if create and not os.path.lexists(p):    # no mkdir on what exists: a read-only cache sees no write
            try:
                p.mkdir(mode=0o700)
            except FileExistsError:
                pass
        check_dir(p)
    return p


def check_tree(root: Path, path: Path) -> None:
    """check_dir on root and every directory between it and `path` (a file below root)."""
    rel = Path(path).parent.relative_to(root)
    subdir(root, *rel.parts, create=False)


# ---------------------------------------------------------------------------------------------- files
def read_regular(path: Path, limit: int = 1 << 30) -> bytes:
    """The bytes of `path`, a regular file that is not a symlink, read without blocking on a FIFO;
    OSError otherwise (ValueError when larger than `limit`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path} is larger than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _digest(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def record(path: Path) -> None:
    """Write `path`'s sidecar (size and sha256), atomically."""
    write_atomic(Path(str(path) + SIDECAR), (_digest(read_regular(path)) + "\n").encode())


def verify(path: Path) -> bool:
    """Whether `path` is a regular file matching its sidecar; checked once per process per file version."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    memo = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        if memo in _verified:
            return _verified[memo]
    try:
        want = read_regular(Path(str(path) + SIDECAR), 200).decode().strip()
        ok = want.split(" ")[0] == str(st.st_size) and _digest(read_regular(path)) == want
    except (OSError, ValueError, UnicodeDecodeError):
        ok = False
    with _lock:
        _verified[memo] = ok
    return ok


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in path's directory, then os.replace (readers never see a partial file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(p) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


# ------------------------------------------------------------------------------------ private directory
def private_dir() -> Path:
    """A directory only this process uses (mkdtemp, 0700), removed at exit: the fallback for an unusable or
    read-only cache, and where per-worker copies of shared objects go."""
    global _private
    with _lock:
        if _private is None or not _private.is_dir():
            _private = Path(tempfile.mkdtemp(prefix=f"hk-{os.getpid()}-"))
            atexit.register(shutil.rmtree, _private, True)
        return _private


def sweep_stale(directory: Path) -> None:
    """Remove `.build-*` and `.tmp-*` leftovers of killed builds (older than STALE_S) in `directory`."""
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for e in entries:
        if e.name.startswith((".build-", ".tmp-")):
            try:
                if now - e.stat(follow_symlinks=False).st_mtime > STALE_S:
                    shutil.rmtree(e.path) if e.is_dir(follow_symlinks=False) else os.unlink(e.path)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------- builds
def _start_build(dest: Path, root: Path | None, done) -> tuple[Path, Path | None]:
    """(place, build dir): dest and a fresh `.build-*` beside it when dest's directory (checked from root down)
    can take it; else (a read-only or unsafe cache) the same relative path under the private directory, with
    build dir None when a verified build is already there (`done(place)`)."""
    if root is not None:
        try:
            parent = subdir(root, *dest.parent.relative_to(root).parts)
            sweep_stale(parent)
            return dest, Path(tempfile.mkdtemp(prefix=".build-", dir=parent))
        except (OSError, UnsafeCacheDir, ValueError):
            dest = _private_place(dest, root)
            if done(dest):
                return dest, None
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return dest, Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))


def _private_place(dest: Path, root: Path) -> Path:
    """Where dest goes in the private directory when the cache at root cannot take it: the same relative path."""
    return private_dir() / dest.relative_to(root)


def found(dest: Path, root: Path | None, check=None) -> Path | None:
    """Where a build of dest that passes `check` (default: verify) already is, without building: dest, or its
    private place (a cache that could not take it); None where neither is."""
    check = check or verify
    if trusted(dest, root) and check(dest):
        return dest
    if root is None:
        return None
    try:
        private = _private_place(dest, root)
    except ValueError:
        return None
    return private if check(private) else None


def built_file(dest: Path, build, root: Path | None) -> Path:
    """The path of a verified `dest`, built by build(tmp_dir) -> file first where it is missing or fails its
    check. `root`: the cache directory dest lies under (every level checked), or None for a private one. Returns
    where the file is: dest, or its place in the private directory when the cache cannot take it."""
    def publish(out: Path, place: Path, tmp: Path) -> None:
        Path(str(out) + SIDECAR).write_text(_digest(out.read_bytes()) + "\n")
        os.replace(out, place)                  # the file first: a reader of the old sidecar sees a mismatch and
        os.replace(str(out) + SIDECAR, str(place) + SIDECAR)   # rebuilds; racing builders both win
    return _built(dest, build, root, verify, publish)


def built_dir(dest: Path, build, root: Path | None) -> Path:
    """built_file for a directory of files (build(tmp_dir) -> dir), with one manifest listing every file's size
    and sha256; a directory that fails is moved aside and rebuilt."""
    def publish(out: Path, place: Path, tmp: Path) -> None:
        files = {p.name: _digest(p.read_bytes()) for p in sorted(out.iterdir()) if p.is_file()}
        (out / MANIFEST).write_text(json.dumps(files))
        if verify_dir(place):                   # a racing builder finished first: keep its directory, which
            return                              # other processes may be loading from
        if os.path.lexists(place):
            os.replace(place, tmp / "old")      # a bad one, moved aside atomically and removed with tmp
        try:
            os.replace(out, place)
        except OSError:
            if not verify_dir(place):           # lost the race to a process that moved its directory first
                raise
    return _built(dest, build, root, verify_dir, publish)


def _built(dest: Path, build, root: Path | None, check, publish) -> Path:
    """dest where it passes `check`, else built by build(tmp) in a fresh build directory and put in place by
    publish(out, place, tmp): built_file's and built_dir's common frame."""
    if trusted(dest, root) and check(dest):
        return dest
    place, tmp = _start_build(dest, root, check)
    if tmp is None:
        return place
    try:
        publish(Path(build(tmp)), place, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return place


def verify_dir(d: Path) -> bool:
    """Whether directory d's manifest matches every file it lists (each checked once per process)."""
    try:
        if not stat.S_ISDIR(os.lstat(d).st_mode):
            return False
        files = json.loads(read_regular(d / MANIFEST, 1 << 20))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(files, dict) or not files:
        return False
    return all(isinstance(n, str) and "/" not in n and isinstance(w, str) and _verify_against(d / n, w)
               for n, w in files.items())


def _verify_against(path: Path, want: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    memo = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, want)
    with _lock:
        if memo in _verified:
            return _verified[memo]
    try:
        ok = stat.S_ISREG(st.st_mode) and _digest(read_regular(path)) == want
    except (OSError, ValueError):
        ok = False
    with _lock:
        _verified[memo] = ok
    return ok


def trusted(dest: Path, root: Path | None) -> bool:
    if root is None:
        return True
    try:
        check_tree(root, dest)
        return True
    except (OSError, UnsafeCacheDir, ValueError):
        return False
