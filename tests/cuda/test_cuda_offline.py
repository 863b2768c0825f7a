"""Offline compilation for the cuda backend (no GPU needed: NVRTC runs on the CPU).

Every library kernel and every Program the conformance suite launches is compiled for sm_80 and sm_90a;
the matrix kernels must use mma.sync (m16n8k16; m16n8k32 for fp8) or wgmma, pipelined kernels cp.async, and nothing may spill to
local memory. Also: the parameter buffer layout agrees with the PTX entry's parameter list, status()
gives the reason on a machine without a GPU, and `hk compile` emits source and PTX for both targets."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.cuda import archs, occupancy, schedule
from hk_portable.conformance import offline_compile as precompile
from hk_portable.interface import GL, RT, ST, UnsupportedError, f32

from hk_test_sampling import split

ARCHS = ("sm_80", "sm_90a")

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")


def _cuda():
    return hk.get_backend("cuda")


def _library_programs():
    return precompile.library_programs()


def _compile_all(named_programs):
    return precompile.compile_many(named_programs, ARCHS, workers=min(8, os.cpu_count() or 1))


def _check(results):
    errors = [f"{r['name']} [{r['arch']}]: {r['error']}" for r in results if r["error"]]
    assert not errors, "\n".join(errors[:10])
    spills = [f"{r['name']} [{r['arch']}]: {r['resources']}" for r in results
              if r["resources"]["spill_stores"] or r["resources"]["spill_loads"] or r["resources"]["stack_bytes"]]
    assert not spills, "local-memory spills:\n" + "\n".join(spills)
    no_mma = [f"{r['name']} [{r['arch']}]" for r in results if r["has_mma"] and not r["mma"]]
    assert not no_mma, f"mma in the Program but neither mma.sync nor wgmma in the PTX: {no_mma}"
    # a register hand-over only balances when ptxas gave the block exactly the count it was planned for:
    # otherwise the consumers' setmaxnreg.inc waits forever on the GPU
    for r in results:
        if r["setmaxnreg"]:
            warps = r["threads"] // 32 - schedule.PRODUCER_WARPS
            block, producer, consumer = occupancy.register_split(warps, schedule.PRODUCER_WARPS, archs.ARCHS["sm_90a"])
            assert r["resources"]["registers"] == block and r["setmaxnreg"] == [producer, consumer], r


def test_library_kernels_compile_for_sm80_and_sm90a():
    progs = _library_programs()
    results = _compile_all(progs)
    _check(results)
    by = {(r["name"], r["arch"]): r for r in results}
    for arch in ARCHS:
        for name in ("gemm", "attention_fwd"):
            r = by[name, arch]
            assert r["mma"], f"{name} [{arch}] has no mma.sync.aligned.m16n8k16"
            assert r["cp_async"], f"{name} [{arch}] has no cp.async (its pipeline should use it)"
            assert r["cubin"] > 0
    # the configurations calls choose per target: on sm_90a gemm's is TMA + wgmma, free of spills; on both the
    # layernorm's is the one-pass strip (whole 16-byte vectors); sm_80 keeps the example's configuration otherwise
    chosen = precompile.chosen_programs("sm_90a")
    chosen80 = precompile.chosen_programs("sm_80")
    assert "gemm@sm_90a" in chosen and set(chosen80) == {"dropout_residual_layernorm@sm_80", "layernorm_bwd@sm_80"}
    results = precompile.compile_many(chosen, ["sm_90a"], workers=min(8, os.cpu_count() or 1)) + \
        precompile.compile_many(chosen80, ["sm_80"], workers=min(8, os.cpu_count() or 1))
    _check(results)
    by = {r["name"]: r for r in results}
    assert by["gemm@sm_90a"]["wgmma"] and by["gemm@sm_90a"]["tma"]
    # ... warp-specialised: 8 consumer warps and a producer warpgroup that hands its registers over
    assert by["gemm@sm_90a"]["threads"] == 384 and by["gemm@sm_90a"]["setmaxnreg"] == [24, 240]
    for arch in ARCHS:
        for name in ("dropout_residual_layernorm", "layernorm_bwd"):
            assert {**chosen, **chosen80}[f"{name}@{arch}"].consts["ONE_PASS"]
        ptx = by[f"dropout_residual_layernorm@{arch}"]
        assert ptx["vector_io"], f"layernorm [{arch}]: no 128-bit global loads/stores in the one-pass strip"


# ~790 Programs per target, over 10 minutes on a 2-core runner for hk_test_sampling's old sample (304) alone: the
# default run compiles hk_test_sampling.split's part (106: every library kernel and mma form, a fifth of their
# Programs), the `slow` part the rest (HK_EXHAUSTIVE=1 or `pytest -m slow`: both parts, every Program)
@pytest.mark.parametrize("part", ["sample", pytest.param("rest", marks=pytest.mark.slow)])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_conformance_program_compiles_for_sm80_and_sm90a(arch, part):
    """What the conformance cases launch on each arch: where a configuration's build spills under the NVRTC at
    hand, the kernel's next configuration (Kernel.choose_config's fallbacks) is what runs, and must not spill."""
    progs = precompile.conformance_programs(arch)
    assert len(progs) > 100
    default, rest = split(progs)
    assert {p.name for p in default.values()} >= {p.name for p in progs.values() if "mma" in p.opcodes()}
    _check(precompile.compile_many(default if part == "sample" else rest, [arch], workers=min(8, os.cpu_count() or 1)))


def test_param_layout_matches_ptx_entry():
    """The host's packed parameter buffer must match the entry's .param list (alignment and size)."""
    from hk_portable.codegen import abi
    be = _cuda()
    for name, prog in _library_programs().items():
        art = be.compile(prog, be.target("sm_80"))
        entry = re.search(r"\.entry\s+\w+\((.*?)\)", art.asm, re.S).group(1)
        ptx = []
        for m in re.finditer(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+\w+(?:\[(\d+)\])?", entry):
            align, ty, count = m.groups()
            size = int(count) if count else {"u32": 4, "s32": 4, "f32": 4, "u64": 8, "b32": 4}[ty]
            ptx.append((int(align) if align else size, size))
        ours = [(8 if p["kind"] == "gl" else 4, p["size"]) for p in art.launch["params"]]
        assert ptx == ours, f"{name}: PTX params {ptx} vs packed {ours}"
        off = 0
        for (align, size), p in zip(ptx, art.launch["params"]):
            off = -(-off // align) * align
            assert p["offset"] == off, f"{name}: parameter {p['name']} at {p['offset']}, ABI says {off}"
            off += size
        assert art.launch["param_size"] == off == abi.param_layout(
            [(q.name, q.type) for q in prog.params])[1]


def test_status_reason_and_compile_only_targets_without_gpu():
    be = _cuda()
    st = be.status()
    archs = [t.arch for t in be.targets()]
    assert "sm_80" in archs and "sm_90a" in archs
    if not st.available:
        assert st.reason and len(st.reason) > 10
        # without a GPU every device target is compile-only; the emulated target (sm_80) runs on the host
        assert all(t.compile_only for t in be.targets() if not t.emulated)
        assert all(t.has("run") and not t.compile_only and t.arch == "sm_80" for t in be.targets() if t.emulated)
    info = {b.name: b for b in hk.backends()}["cuda"]
    assert info.available == st.available and (st.available or info.reason == st.reason)


def test_check_rejects_unsupported_shapes_with_clear_errors():
    @hk.kernel
    def odd_rows(x: GL[2], y: GL[2]):
        hk.store(y, hk.load(RT[f32, 24, 32], x, (0, 0)), (0, 0))

    @hk.kernel
    def too_much_smem(x: GL[2], y: GL[2]):
        s = hk.shared(ST[x.dtype, 256, 256], stages=4)
        hk.load(s[0], x, (0, 0))
        hk.store(y, hk.load(RT[f32, 256, 256], s[0]), (0, 0))

    x = torch.zeros(32, 32)
    be = _cuda()
    with pytest.raises(UnsupportedError, match="multiple of 16 rows"):
        be.check(odd_rows.trace(x, x), be.target("sm_80"))
    with pytest.raises(UnsupportedError, match="shared memory"):
        be.check(too_much_smem.trace(x, x), be.target("sm_80"))
    # an accumulator too large for the registers (the hip gemm candidate: 256 f32 a thread on cuda)
    from hk_portable.kernels.gemm import gemm_kernel
    xb = torch.zeros(256, 256, dtype=torch.bfloat16)
    big = gemm_kernel.trace(xb, xb, xb, BM=256, BN=256, BK=16, STAGES=3, num_warps=8)
    for arch in ARCHS:
        with pytest.raises(UnsupportedError, match="holds 256 f32 per thread"):
            be.check(big, be.target(arch))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("emit", ["source", "ptx"])
def test_hk_compile_cli_emits_without_gpu(arch, emit, tmp_path):
    env = {**os.environ, "HK_CACHE_DIR": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "hk_portable.cli", "compile", "gemm", "--backend", "cuda", "--target",
                          arch, "--emit", emit], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    if emit == "ptx" and arch == "sm_90a":       # the configuration a call runs: TMA copies feeding wgmma
        assert f".target {arch}" in res.stdout and "wgmma.mma_async" in res.stdout
        assert "cp.async.bulk.tensor" in res.stdout
    elif emit == "ptx":
        assert f".target {arch}" in res.stdout and "mma.sync.aligned.m16n8k16" in res.stdout
    else:
        assert "extern \"C\" __global__" in res.stdout and "namespace hk" in res.stdout


_FRAME_KERNEL = r"""
extern "C" __global__ void framed(float* o, int i) {
    float a[1024];                               // too large for registers: a local array in the stack frame
    for (int j = 0; j < 1024; ++j) a[j] = o[j] * (float)j;
    a[i & 1023] = o[1024];
    o[0] = a[(i * 7) & 1023];
}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cubin_records_what_the_ptxas_report_says(arch):
    """compiler.cubin_resources, the fallback for an NVRTC log without ptxas' report (seen on the H200): the
    registers and stack frame it reads from the cubin equal the report's, for a library kernel and for a kernel
    with a stack frame; a kernel the cubin does not hold gives None."""
    from hk_portable.backends.cuda import codegen, compiler
    from hk_portable.backends.cuda.options import DEFAULT
    from hk_portable.kernels import attention
    args, consts = attention.example_args(D=128, causal=True)
    program = attention.attention_fwd_kernel.trace(*args, **consts)
    target = hk.get_backend("cuda").target(arch)
    emitted, _ = codegen.emit(program, target, schedule.plan(program, target))
    for source, name in ((emitted.source, emitted.kernel_name), (_FRAME_KERNEL, "framed")):
        built = compiler.compile_source(source, name, arch, DEFAULT.nvrtc_flags())
        if not compiler.ptxas_report(built.log):     # some pytest processes on the H100/H200 get an empty log
            pytest.skip("NVRTC returned no ptxas report to compare the cubin with (the case the fallback is for)")
        report, cubin = compiler.parse_ptxas(built.log), compiler.cubin_resources(built.cubin, name)
        assert cubin is not None
        assert (cubin["registers"], cubin["stack_bytes"]) == (report["registers"], report["stack_bytes"])
    assert report["stack_bytes"] > 0 and cubin["spill_stores"] == report["stack_bytes"]
    assert compiler.cubin_resources(built.cubin, "no_such_kernel") is None
    assert compiler.cubin_resources(b"not an elf", name) is None


def test_whole_elf_pads_a_cubin_cut_short():
    """CuPy's getCUBIN returns the cubin one byte short (sized like the NUL-terminated PTX): compiler.whole_elf pads
    an ELF64 image with zeros to the extent its header declares (program and section headers), and leaves whole
    images and anything that is not ELF64 as they are."""
    import struct

    from hk_portable.backends.cuda.compiler import whole_elf
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<QQ", header, 0x20, 64, 200)              # program headers at 64, section headers at 200
    struct.pack_into("<HHHH", header, 0x36, 56, 2, 64, 3)       # 2 x 56 bytes, 3 x 64 bytes
    whole = bytes(header) + bytes(200 + 3 * 64 - 64)
    assert whole_elf(whole[:-1]) == whole and whole_elf(whole) == whole
    assert whole_elf(b"not an elf") == b"not an elf" and whole_elf(bytes(header)[:10]) == bytes(header)[:10]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_bwd_runs_a_configuration_whose_build_does_not_spill(arch, dtype):
    """NVRTC 13.0 (what torch 2.14's install brings) spills the masked f16 D=64 dK/dV kernel on sm_80 by 8 bytes,
    and the masked deterministic D=64 128x128 block on sm_90a: the call then takes the kernel's next configuration,
    and what it takes compiles without local memory. sm_90a takes a 128-key block on wgmma (issue 36)."""
    from hk_portable.kernels import attention_bwd as ab
    for D in (64, 128):
        args, consts = ab.example_args(D=D, dtype=dtype)
        for deterministic in (False, True):
            cfg = ab.dkdv_config(args, True, deterministic, backend=f"cuda:{arch}")
            flags = dict(MASKED=True, ATOMIC_DQ=not deterministic)
            offered = ab.candidates({"D": D, **flags}) + [{**c, **flags} for c in ab.fallbacks_for(D)]
            assert cfg in offered, cfg
            assert (cfg["BN"] == 128) == (arch == "sm_90a"), cfg
            note = ab.attention_bwd_dkdv_kernel.config_notes.get((f"cuda:{arch}", tuple(sorted(cfg.items()))))
            if note is not None:            # taken after a rejected build: the reason recorded
                assert "spills" in note and "NVRTC" in note, note
            art = ab.attention_bwd_dkdv_kernel.compile(*args, backend=f"cuda:{arch}", **cfg)
            assert art.options.get("passed_over") == note
            assert not art.resources["spill_stores"] and not art.resources["stack_bytes"], (D, cfg, art.resources)


def test_a_new_arch_row_is_all_a_new_arch_needs(monkeypatch):
    """Adding an arch is a row of archs.ARCHS (issue 38: architectures as capabilities): with one more row, here
    Blackwell's sm_100a as compile-only without the asynchronous path (its tensor cores are tcgen05's, which the
    backend does not emit; sm_100a has no wgmma), the backend lists the target and compiles the library's GEMM for
    it on the synchronous path (mma.sync, cp.async), every decision read from the row, with no other edit."""
    from hk_portable.backends.cuda.backend import CudaBackend
    from hk_portable.kernels import gemm
    row = archs.Arch("sm_100a", 10, 232448, ("m16n8k16",), "widened exactly to f16", sm_shared_bytes=233472)
    monkeypatch.setitem(archs.ARCHS, row.name, row)
    be = CudaBackend()
    target = be.target("sm_100a")
    assert target.compile_only and target.max_shared_bytes == row.max_shared_bytes
    a = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    cfg = {**gemm.DEFAULT_CONFIG, **dict(BM=128, BN=128, BK=64, STAGES=3, num_warps=8)}
    art = be.compile(gemm.gemm_kernel.trace(a, a, a, **cfg), target)
    assert ".target sm_100a" in art.asm and "mma.sync" in art.asm and "cp.async" in art.asm
    assert "wgmma" not in art.asm and "cp.async.bulk.tensor" not in art.asm


def _head_dim_256_build(name: str, arch: str):
    """(kernel, args, config) of what a call at head dim 256 launches on cuda:`arch` (its wrapper's choice)."""
    from hk_portable.kernels import attention as A, attention_bwd as AB, attention_bwd_wide as W
    from hk_portable.kernels import attention_kvcache as AK, attention_varlen as AV
    from hk_portable.kernels.attention_combine import attention_combine_kernel, combine_views
    spec = f"cuda:{arch}"
    if name == "fwd":
        args, _ = A.example_args(D=256)
        consts = {"D": 256, "MASKED": True, "LEFT_BOUND": False}
        return A.attention_fwd_kernel, args, A.attention_fwd_kernel.choose_config(A.candidates(consts), *args,
                                                                                  backend=spec)
    if name in ("dkdv_wide", "dkdv_wide_deterministic"):
        args, _ = W.example_args()
        flags = dict(MASKED=True, ATOMIC_DQ=name == "dkdv_wide")
        return W.attention_bwd_dkdv_wide_kernel, args, {**W.dkdv_config(args, flags, False, backend=spec), "PART": 1}
    if name == "dq":
        q, k, v, do, lse, delta = AB.example_args(D=256)[0][:6]
        args = (q, k, v, do, lse, delta, torch.empty_like(q), 1 / 16, 0, q.shape[2], 0)
        return AB.attention_bwd_dq_kernel, args, AB.dq_config(args, True, backend=spec)
    if name == "varlen_dkdv_wide":
        vargs, _ = AV.example_args(D=256)
        q, k, v, lse, cu = vargs[0], vargs[1], vargs[2], vargs[4], vargs[5]
        args = (q, k, v, q, lse, lse, torch.empty_like(k), torch.empty_like(v), cu, cu, 1 / 16, 1, 2 * q.shape[1], 0,
                vargs[-1], 1.0)
        return W.attention_varlen_bwd_dkdv_wide_kernel, args, {**W.varlen_config_for(256), "GROUP": 2, "MASKED": True}
    if name == "kvcache":
        args, cfg = AK.example_args(D=256)
        return AK.attention_kvcache_kernel, args, cfg
    assert name == "combine"
    _, cfg = AK.example_args(D=256)
    args = (*combine_views(torch.randn(12, 4, 256), torch.randn(12, 4), 3),
            torch.empty(2, 2, 4, 256, dtype=torch.bfloat16),
            torch.empty(2, 2, 4, 1))
    return attention_combine_kernel, args, AK.combine_config(cfg)


HEAD_DIM_256 = ("fwd", "dkdv_wide", "dkdv_wide_deterministic", "dq", "varlen_dkdv_wide", "kvcache", "combine")


@pytest.mark.parametrize("arch,name", [
    pytest.param(a, n, marks=() if (a, n) in (("sm_80", "dkdv_wide"), ("sm_90a", "fwd")) else pytest.mark.slow)
    for a in ARCHS for n in HEAD_DIM_256])
def test_head_dim_256_builds_take_no_local_memory(arch, name):
    """Issue 40: what a call at head dim 256 (the tile every D in 136..256 runs) launches on each arch compiles with
    nothing in local memory, as the backend's choice (Kernel.choose_config passes over a build that spills) or the
    wrapper's fixed tiles (the D > 128 dK/dV kernels in column parts, the split-KV combine on 4 warps)."""
    kern, args, cfg = _head_dim_256_build(name, arch)
    art = kern.compile(*args, backend=f"cuda:{arch}", **cfg)
    r = art.resources
    assert not r["spill_stores"] and not r["stack_bytes"], (name, cfg, r)
