"""Every file the cache loads or runs is checked (issue 41, item 1): corrupted or empty shared objects are rebuilt,
not loaded; read-only and relative cache directories work; a subdirectory symlinked out of the cache is not
followed; a FIFO or deeply nested JSON cannot hang or break a call; no temporary directory outlives its process.

The hip-emulator runs happen in fresh processes (a corrupted shared object would kill the test process). A
read-only cache is simulated with an audit hook that refuses, and records, every write under the cache directory,
so the test means the same as root (who writes through chmod 0500) and as anyone else; as a non-root user the
directory is made read-only with chmod too."""
from __future__ import annotations

import json
import os
import functools
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

from hk_portable.backends.hip.emulator import toolchain
from hk_portable.runtime import cache, clauncher, tuning

SIDECAR, MANIFEST, STALE_S = ".sha256", ".hk-manifest", 3600    # runtime/cachefiles.py's

REPO = Path(__file__).resolve().parents[2]
needs_emulator = pytest.mark.skipif(not toolchain.available()[0], reason="no host clang for the hip emulator")

PROBE = textwrap.dedent("""
    import os, sys
    ro = os.environ.get("HK_TEST_READONLY")
    if ro:                                  # refuse and record every write under the cache directory
        ro = os.path.realpath(ro)
        WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        def under(p):
            try:
                return os.path.realpath(os.fsdecode(p)).startswith(ro)
            except (TypeError, ValueError):
                return False
        def hook(event, args):
            if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and (
                    (args[1] and any(c in args[1] for c in "wax+")) or (args[2] or 0) & WRITE):
                paths = [args[0]]
            elif event in ("os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.truncate", "os.utime"):
                paths = [args[0]]
            elif event in ("os.rename", "os.link", "os.symlink", "shutil.copyfile"):
                paths = [args[1]]
            else:
                return
            if any(under(p) for p in paths):
                print("WRITE", event, paths, file=sys.stderr)
                raise PermissionError(13, "read-only cache (test)", str(paths[0]))
        sys.addaudithook(hook)
    import torch
    from hk_portable.kernels.gemm import gemm
    from hk_portable.runtime import clauncher
    for backend in sys.argv[1:]:
        if backend == "launcher":
            assert clauncher.load() is not None, clauncher.reason()
            continue
        # rows at 16 bytes and a short K: one kernel (no restage, no split-K), so the cache holds one module
        a, b = torch.randn(40, 48).bfloat16(), torch.randn(48, 40).bfloat16()
        out = torch.empty(40, 40)
        gemm(a, b, out, backend=backend)
        assert torch.allclose(out, a.float() @ b.float(), atol=1e-2, rtol=1e-2), backend
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    print("MAPPED", sorted({l.split()[-1] for l in maps.splitlines() if l.split()[-1].endswith(".so")}))
    print("OK")
""")


def run(cache_dir, *backends, readonly=False, cwd=None, tmpdir=None, env=None, ro_mount=False):
    """The probe in a fresh process: (returncode, output). ro_mount: in a private mount namespace where the cache
    is bind-mounted read-only over itself, so the kernel refuses every write, root's included."""
    cmd = [sys.executable, "-c", PROBE, *backends]
    if ro_mount:
        root = str(Path(cwd or ".", cache_dir).resolve())
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"',
               root, *cmd]
    e = {**os.environ, "HK_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO), "HK_EMU_THREADS": "2", **(env or {})}
    if readonly:
        e["HK_TEST_READONLY"] = str(Path(cwd or ".", cache_dir).resolve())
    if tmpdir:
        e["TMPDIR"] = str(tmpdir)
    p = subprocess.run(cmd, env=e, cwd=cwd, capture_output=True, text=True, check=False,
                       timeout=600)
    return p.returncode, p.stdout + p.stderr


def ok(result, refused_writes=False):
    """The probe's output after it passed; `refused_writes`: attempts the read-only hook refused are fine (an
    empty read-only cache is tried, then left alone)."""
    rc, out = result
    assert rc == 0 and "OK" in out and (refused_writes or "WRITE" not in out), out[-3000:]
    return out


def _files(root: Path, pattern: str):
    return sorted(p for p in root.rglob(pattern) if not p.name.endswith(SIDECAR))


def _snapshot(root: Path):
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _launcher():
    return ["launcher"] if clauncher.compiler() and clauncher.python_include() else []


@pytest.fixture
def warm(tmp_path):
    """A cache warmed in place (copies would be a different cache) by one hip-emulator gemm and the launcher."""
    root = tmp_path / "cache"
    ok(run(root, "hip:gfx942:emulated", *_launcher()))
    return root


def _read_only(root: Path, on: bool):
    """chmod the tree read-only (meaningful as a non-root user; the audit hook covers root)."""
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        d.chmod(0o500 if on else 0o700)


# ------------------------------------------------------------------------------------ corrupted or empty
@needs_emulator
def test_a_corrupted_emulator_module_is_rebuilt_not_loaded(warm, tmp_path):
    root = warm
    [so] = _files(root / "hip-emulator" / "mod", "*.so")
    data = bytearray(so.read_bytes())
    data[len(data) // 3: len(data) // 3 + 4096] = b"\xcc" * 4096     # int3 over code: SIGTRAP if it runs
    so.write_bytes(bytes(data))
    ok(run(root, "hip:gfx942:emulated"))
    assert so.read_bytes() != bytes(data)                               # rebuilt in place


@needs_emulator
def test_an_empty_emulator_runtime_library_is_rebuilt(warm, tmp_path):
    root = warm
    [rt] = _files(root / "hip-emulator" / "rt", "*.so")
    rt.write_bytes(b"")
    ok(run(root, "hip:gfx942:emulated"))
    assert rt.stat().st_size > 0
    ok(run(root, "hip:gfx942:emulated"))


@needs_emulator
def test_an_empty_or_corrupted_launcher_is_rebuilt(warm, tmp_path):
    if not (clauncher.compiler() and clauncher.python_include()):
        pytest.skip("no C compiler or Python headers for the launcher")
    root = warm
    [so] = _files(root / "launcher", "_hk_launcher*")
    so.write_bytes(b"")
    ok(run(root, "launcher"))
    assert so.stat().st_size > 0


def test_a_built_file_is_checked_once_per_process_and_rebuilt_when_off(tmp_path):
    from hk_portable.runtime import cachefiles
    assert (cachefiles.SIDECAR, cachefiles.MANIFEST, cachefiles.STALE_S) == (SIDECAR, MANIFEST, STALE_S)
    builds = []

    def build(tmp):
        builds.append(1)
        (tmp / "x.bin").write_bytes(b"payload")
        return tmp / "x.bin"
    dest = tmp_path / "c" / "sub" / "x.bin"
    dest.parent.mkdir(parents=True, mode=0o700)
    (tmp_path / "c").chmod(0o700)
    assert cachefiles.built_file(dest, build, tmp_path / "c") == dest and builds == [1]
    assert cachefiles.built_file(dest, build, tmp_path / "c") == dest and builds == [1]
    dest.write_bytes(b"payloaX")                                        # same size, other bytes
    assert cachefiles.built_file(dest, build, tmp_path / "c") == dest and builds == [1, 1]
    assert dest.read_bytes() == b"payload"


# ------------------------------------------------------------------------------------ read-only, relative
@needs_emulator
def test_a_read_only_warm_cache_serves_every_path_with_no_write(warm, tmp_path):
    _hook_only_where_no_mount()
    root = warm
    ok(run(root, "cuda:sm_80:emulated"))
    before = _snapshot(root)
    if os.geteuid() != 0:
        _read_only(root, True)
    try:
        backends = ["hip:gfx942:emulated", "cuda:sm_80:emulated", "reference"]
        backends += _launcher()
        out = ok(run(root, *backends, readonly=True, env={"HK_EMU_THREADS": "3"}))
    finally:
        _read_only(root, False)
    assert _snapshot(root) == before, "the read path wrote into the cache"
    assert str(root) in out, "the warm cache's shared objects were not the ones loaded"


@functools.lru_cache(maxsize=None)
def _ro_mount_available() -> bool:
    """Whether this process may bind-mount read-only in a private mount namespace (root, unshare, mount)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            p = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" '
                                '"$0" && ! touch "$0/x" 2>/dev/null', d], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return False
        return p.returncode == 0 and not os.path.exists(os.path.join(d, "x"))


def _ro_mount_or_skip(tmp_path):
    if not _ro_mount_available():
        pytest.skip("no read-only bind mount here (needs root and unshare; as another user the chmod test covers it)")


def _hook_only_where_no_mount():
    """The audit-hook form runs where the kernel-enforced one cannot (a non-root user, no unshare): the same probe
    runs twice otherwise (a minute of CI)."""
    if _ro_mount_available():
        pytest.skip("covered by the bind-mounted read-only test, which the kernel enforces")


@needs_emulator
def test_a_read_only_bind_mounted_warm_cache_serves_every_path(warm, tmp_path):
    """The acceptance's form: a cache the kernel refuses to write (EROFS for root too), no audit hook."""
    _ro_mount_or_skip(tmp_path)
    ok(run(warm, "cuda:sm_80:emulated"))
    before = _snapshot(warm)
    out = ok(run(warm, "hip:gfx942:emulated", "cuda:sm_80:emulated", "reference", *_launcher(), ro_mount=True))
    assert _snapshot(warm) == before and str(warm) in out


@needs_emulator
def test_an_empty_read_only_bind_mounted_cache_still_runs_the_emulator(tmp_path):
    _ro_mount_or_skip(tmp_path)
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    ok(run(root, "hip:gfx942:emulated", "cuda:sm_80:emulated", tmpdir=_tmpdir(tmp_path), ro_mount=True))
    assert list(root.iterdir()) == []
    assert list((tmp_path / "tmp").iterdir()) == [], "the private build directory outlived its process"


@needs_emulator
def test_an_empty_read_only_cache_still_runs_the_emulator(tmp_path):
    _hook_only_where_no_mount()
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    if os.geteuid() != 0:
        _read_only(root, True)
    try:
        ok(run(root, "hip:gfx942:emulated", readonly=True, tmpdir=_tmpdir(tmp_path)), refused_writes=True)
    finally:
        _read_only(root, False)
    assert list(root.iterdir()) == []
    assert list((tmp_path / "tmp").iterdir()) == [], "the private build directory outlived its process"


@needs_emulator
def test_a_relative_cache_dir_works(tmp_path):
    ok(run("rel/cache", "hip:gfx942:emulated", cwd=tmp_path))
    assert _files(tmp_path / "rel" / "cache" / "hip-emulator", "*.so")


# --------------------------------------------------------------------------------------------- trust
def _world_writable(tmp_path) -> Path:
    w = tmp_path / "world"
    w.mkdir()
    w.chmod(0o777)
    return w


@needs_emulator
@pytest.mark.parametrize("sub", ["hip-emulator", "launcher"])
def test_a_subdirectory_symlinked_out_of_the_cache_is_not_followed(warm, tmp_path, sub):
    root = warm
    if not (root / sub).exists():
        pytest.skip(f"no {sub} in the warm cache")
    w = _world_writable(tmp_path)
    (root / sub).rename(w / sub)
    (root / sub).symlink_to(w / sub)
    before = _snapshot(w)
    out = ok(run(root, "hip:gfx942:emulated", *(["launcher"] if sub == "launcher" else []),
                 tmpdir=_tmpdir(tmp_path)))
    assert str(w) not in out, "a shared object under the world-writable directory was loaded"
    assert _snapshot(w) == before


def test_a_shard_directory_symlinked_out_is_a_miss(tmp_path, monkeypatch):
    from hk_portable.interface.backend import Artifact
    root = tmp_path / "cache"
    monkeypatch.setenv("HK_CACHE_DIR", str(root))
    key = "ab" + "0" * 62
    cache.store(key, Artifact("b", "t", "k", "h", source="s"))
    assert cache.load(key) is not None
    w = _world_writable(tmp_path)
    (root / "ab").rename(w / "ab")
    (root / "ab").symlink_to(w / "ab")
    assert cache.load(key) is None


# --------------------------------------------------------------------------------------------- hangs
def test_a_fifo_in_place_of_an_entry_or_tuning_json_is_a_miss(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    key = "cd" + "1" * 62
    (root / "cd").mkdir(mode=0o700)
    os.mkfifo(root / "cd" / f"{key}.hkc")
    os.mkfifo(root / tuning.FILE)
    code = (f"from hk_portable.runtime import cache, tuning\n"
            f"assert cache.load({key!r}) is None\nassert tuning._read() == {{}}\nprint('OK')")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "HK_CACHE_DIR": str(root),
                       "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr


def test_a_deeply_nested_tuning_json_is_ignored(tmp_path, monkeypatch):
    from hk_portable.kernels.gemm import gemm
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / tuning.FILE).write_text("[" * 200_000 + "]" * 200_000)
    monkeypatch.setenv("HK_CACHE_DIR", str(root))
    assert tuning._read() == {}
    a, b = torch.randn(16, 32).bfloat16(), torch.randn(32, 16).bfloat16()
    out = torch.empty(16, 16)
    gemm(a, b, out, backend="reference")
    torch.testing.assert_close(out, a.float() @ b.float(), atol=1e-2, rtol=1e-2)


# --------------------------------------------------------------------------------------------- litter
def _tmpdir(tmp_path) -> Path:
    t = tmp_path / "tmp"
    t.mkdir(exist_ok=True)
    return t


def test_cuda_emulation_leaves_nothing_in_the_temp_dir(tmp_path):
    from hk_portable.backends.cuda import emulator
    if not emulator.available()[0]:
        pytest.skip("no host C++ compiler")
    ok(run(tmp_path / "cache", "cuda:sm_80:emulated", tmpdir=_tmpdir(tmp_path)))
    assert list((tmp_path / "tmp").iterdir()) == []


@needs_emulator
def test_an_unusable_cache_leaves_nothing_in_the_temp_dir(tmp_path):
    w = _world_writable(tmp_path)                                       # refused: group/world-writable
    ok(run(w, "hip:gfx942:emulated", *_launcher(), tmpdir=_tmpdir(tmp_path)))
    assert list((tmp_path / "tmp").iterdir()) == []


@needs_emulator
def test_a_killed_builds_leftover_is_swept(warm, tmp_path):
    root = warm
    rt_dir = root / "hip-emulator" / "rt"
    stale = rt_dir / ".build-killed"
    stale.mkdir()
    (stale / "half.o").write_bytes(b"x")
    old = time.time() - 2 * STALE_S
    os.utime(stale, (old, old))
    for so in _files(rt_dir, "*.so"):
        so.write_bytes(b"")                                             # forces a build in that directory
    ok(run(root, "hip:gfx942:emulated"))
    assert not list(rt_dir.glob(".build-*"))


@needs_emulator
def test_sidecars_are_plain_text(warm):
    for side in warm.rglob("*" + SIDECAR):
        size, digest = side.read_text().split()
        assert int(size) >= 0 and len(digest) == 64
    for man in warm.rglob(MANIFEST):
        assert all(isinstance(v, str) for v in json.loads(man.read_text()).values())
