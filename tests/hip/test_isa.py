"""CI for the hip backend without AMD hardware: every kernel of the library and every Program the
conformance suite launches, compiled for gfx942 and gfx950 with the pinned clang, must

  * contain the intended MFMA for each mma (gfx942: v_mfma_f32_16x16x16_{bf16,f16}; gfx950:
    v_mfma_f32_16x16x32_{bf16,f16} when K is a multiple of 32, else the 16x16x16 form),
  * spill no VGPR or SGPR and use no scratch,
  * fit the arch's LDS and the backend's plan (arena + library scratch; the compiler may drop an
    unreachable buffer, so the plan is an upper bound),
  * declare .max_flat_workgroup_size equal to the block size the backend chose.

Compiles go through the compile cache (HK_CACHE_DIR) in a thread pool. Measured on a 2-core machine:
105 s cold for 555 programs x 2 archs (about 0.2 s of clang per program and arch), 2 s warm.
Compiling 24 programs as one translation unit measured 35% less CPU than 24 separate compiles, but it
compiles a different source (renamed kernels, one shared scratch area) on one core, so it is not used.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from hk_portable.runtime import cache
from hk_portable.backends.hip import HipBackend, codegen, compiler
from hk_portable.backends.hip.archs import ARCHS, make_target
from hk_portable.interface.ir import Program

from hip_programs import all_programs  # noqa: E402 - tests/hip on sys.path (conftest)
from hk_test_sampling import split  # noqa: E402 - tests/ on sys.path (its conftest)

pytestmark = pytest.mark.skipif(not compiler.available()[0], reason=compiler.available()[1])

MFMA = {("gfx942", 16): "v_mfma_f32_16x16x16_{}", ("gfx950", 16): "v_mfma_f32_16x16x16_{}",
        ("gfx950", 32): "v_mfma_f32_16x16x32_{}"}


def _fp8_mfma(arch: str, a: str, b: str, k: int) -> str:
    """docs/fp8.md: gfx950 reads OCP natively (the f8f6f4 16x16x128 form, formats as cbsz / blgp, when K is a
    multiple of 128); gfx942 maps e4m3 x e4m3 onto FNUZ and widens any e5m2 to f16."""
    name = {"fp8e4m3": "fp8", "fp8e5m2": "bf8"}
    if arch == "gfx950":
        return "v_mfma_scale_f32_16x16x128_f8f6f4" if k % 128 == 0 else f"v_mfma_f32_16x16x32_{name[a]}_{name[b]}"
    return "v_mfma_f32_16x16x32_fp8_fp8" if a == b == "fp8e4m3" else "v_mfma_f32_16x16x16_f16"


def intended_mfma(program: Program, arch: str) -> set[str]:
    """The MFMA instructions the backend means to use for the program's mma ops."""
    out = set()
    for op in program.body.walk():
        if op.opcode == "mma":
            a, b = op.operands[0].type, op.operands[1].type
            k = a.rows if op.attrs["trans_a"] else a.cols
            if a.dtype.name.startswith("fp8"):
                out.add(_fp8_mfma(arch, a.dtype.name, b.dtype.name, k))
                continue
            ks = 32 if arch == "gfx950" and k % 32 == 0 else 16
            out.add(MFMA[arch, ks].format(a.dtype.name))
    return out


def problems(program: Program, arch: str, be: HipBackend) -> list[str]:
    target = make_target(arch, runs=False, compile_only=True)
    art = cache.compile_cached(be, program, target)
    r, plan = art.resources, art.launch["plan"]
    out = []
    for key in ("vgpr_spill", "sgpr_spill", "scratch_bytes"):
        if r[key] != 0:
            out.append(f"{key} = {r[key]}")
    if r.get("dynamic_stack"):
        out.append("uses a dynamic stack")
    if r["lds_bytes"] > ARCHS[arch].lds_bytes:
        out.append(f"LDS {r['lds_bytes']} > {ARCHS[arch].lds_bytes}")
    if r["lds_bytes"] > plan["lds_bytes"]:
        out.append(f"LDS {r['lds_bytes']} > planned {plan['lds_bytes']}")
    if plan["arena_bytes"] and "pipeline" not in program.opcodes() and r["lds_bytes"] < plan["arena_bytes"]:
        out.append(f"LDS {r['lds_bytes']} < the kernel's shared buffers ({plan['arena_bytes']} B)")
    if r["max_flat_workgroup_size"] != plan["threads"]:
        out.append(f"max_flat_workgroup_size {r['max_flat_workgroup_size']} != block size {plan['threads']}")
    want = intended_mfma(program, arch)
    missing = want - set(r["mfma"])
    if missing:
        out.append(f"no {sorted(missing)} in the ISA (found {r['mfma'] or 'no MFMA'})")
    stray = set(r["mfma"]) - want
    if stray:
        out.append(f"unexpected MFMA {sorted(stray)}")
    return out


@pytest.mark.parametrize("part", ["sample", pytest.param("rest", marks=pytest.mark.slow)])
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_every_program_compiles_clean(arch, part):
    """Every Program compiles clean for the arch: the default run compiles hk_test_sampling.split's part (every
    library kernel and mma form, a fifth of their Programs, every twelfth other; several minutes per arch on a busy 2-core
    runner with a cold cache), the `slow` part the rest (HK_EXHAUSTIVE=1 or `pytest -m slow`)."""
    be = HipBackend()
    everything = all_programs()
    assert len(everything) > 400 and sum("mma" in p.opcodes() for _, p in everything) >= 30
    default, rest = split({f"{origin}#{i}": p for i, (origin, p) in enumerate(everything)})
    kept = default if part == "sample" else rest
    progs = [(name.rsplit("#", 1)[0], p) for name, p in kept.items()]
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda op: (op[0], op[1], problems(op[1], arch, be)), progs))
    bad = [f"{origin} ({p.name}): {'; '.join(errs)}" for origin, p, errs in results if errs]
    assert not bad, f"{len(bad)} of {len(progs)} programs on {arch}:\n" + "\n".join(bad)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_every_library_kernels_hip_choice_compiles_clean(arch):
    """The configuration a call on hip:`arch` runs for each library kernel (choose_config over its module's
    candidates, where it offers some; else its example's), which the conformance Programs above do not reach (they
    are recorded through a backend that keeps each kernel's baseline): the same checks, spills included. gemm_fp8's
    256x256 block on gfx942 spilled 67 VGPRs in its epilogue here until 2026-12-07 (issue 42)."""
    from hk_portable import kernels
    be = HipBackend()
    bad = []
    for name in sorted(kernels.KERNELS):
        module, kern = kernels.load(name)
        args, consts = module.example_args()
        cfg = consts
        if callable(getattr(module, "candidates", None)):
            cfg = {**consts, **kern.choose_config(module.candidates(consts, args), *args, backend=f"hip:{arch}")}
        errs = problems(kern.trace(*args, **cfg), arch, be)
        if errs:
            bad.append(f"{name} {cfg}: {'; '.join(errs)}")
    assert not bad, "\n".join(bad)
