"""The disk compile cache with the cuda backend (NVRTC compile-only: runs without a GPU).

A hit in a new process restores the cubin without running NVRTC; a corrupt entry is a miss and is
recompiled; two processes compiling the same kernel at once both succeed with the same binary; the key
changes with the target and with the numerics flags/library (compiler_version)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import pytest

from hk_portable.runtime import cache
from hk_portable.runtime import registry

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")

# prints: <seconds for compile_cached> <nvrtc calls> <sha256 of the cubin>
SCRIPT = textwrap.dedent("""
    import hashlib, sys, time
    from hk_portable.runtime import cache
    from hk_portable.runtime import registry
    from hk_portable.backends.cuda import compiler
    from hk_portable.kernels import gemm
    calls = []
    real = compiler.compile_source
    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    compiler.compile_source = counting
    be = registry.load("cuda")
    args, consts = gemm.example_args()
    prog = gemm.gemm_kernel.trace(*args, **consts)
    t0 = time.perf_counter()
    art = cache.compile_cached(be, prog, be.target(sys.argv[1]))
    dt = time.perf_counter() - t0
    assert art.binary and art.launch["param_format"]
    print(dt, len(calls), hashlib.sha256(art.binary).hexdigest())
""")


def _run(tmp_path, arch="sm_80"):
    env = {**os.environ, "HK_CACHE_DIR": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", SCRIPT, arch], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    dt, calls, digest = res.stdout.split()
    return float(dt), int(calls), digest


def _entries(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".hkc")]


def test_hit_in_new_process_skips_nvrtc(tmp_path):
    dt1, calls1, digest1 = _run(tmp_path)
    assert calls1 == 1
    dt2, calls2, digest2 = _run(tmp_path)
    assert calls2 == 0, "a cache hit must not run NVRTC"
    assert digest1 == digest2
    assert dt2 < 0.25, f"a cache hit took {dt2 * 1e3:.1f} ms"


def test_corrupt_entry_is_recompiled(tmp_path):
    _run(tmp_path)
    (entry,) = _entries(tmp_path)
    blob = bytearray(open(entry, "rb").read())
    blob[len(blob) // 2] ^= 0xFF                       # damage the body: the integrity hash no longer matches
    open(entry, "wb").write(bytes(blob))
    _, calls, _ = _run(tmp_path)
    assert calls == 1, "a corrupt entry must be a miss"
    open(entry, "wb").write(b"garbage")                # unreadable entry: also a miss, rewritten
    _, calls, _ = _run(tmp_path)
    assert calls == 1
    _, calls, _ = _run(tmp_path)
    assert calls == 0, "the rewritten entry is a hit"


def test_two_processes_compiling_at_once_both_succeed(tmp_path):
    env = {**os.environ, "HK_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, "sm_90a"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    digests = {o[0].split()[2] for o in outs}
    assert len(digests) == 1
    assert len(_entries(tmp_path)) == 1
    assert not [f for d, _, fs in os.walk(tmp_path) for f in fs if f.startswith(".tmp-")], "temp files left behind"


def test_key_covers_target_and_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    from hk_portable.kernels import gemm
    be = registry.load("cuda")
    args, consts = gemm.example_args()
    prog = gemm.gemm_kernel.trace(*args, **consts)
    k80 = cache.cache_key(be, prog, be.target("sm_80"), {})
    k90 = cache.cache_key(be, prog, be.target("sm_90a"), {})
    assert k80 != k90
    version = be.compiler_version()
    assert "-ftz=false" in version and "-fmad=false" in version and "nvrtc" in version
    monkeypatch.setattr(type(be), "compiler_version", lambda self: version + " changed")
    assert cache.cache_key(be, prog, be.target("sm_80"), {}) != k80


def test_restored_artifact_records_numerics(tmp_path, monkeypatch):
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    from hk_portable.kernels import gemm
    be = registry.load("cuda")
    args, consts = gemm.example_args()
    prog = gemm.gemm_kernel.trace(*args, **consts)
    art = cache.compile_cached(be, prog, be.target("sm_80"))
    again = cache.compile_cached(be, prog, be.target("sm_80"))
    assert again is not art and again.binary == art.binary
    assert again.options["ftz"] is False and again.options["fmad"] is False
    assert "-ftz=false" in again.options["flags"] and "-arch=sm_80" in again.options["flags"]
    assert hashlib.sha256(again.binary).hexdigest() == hashlib.sha256(art.binary).hexdigest()
