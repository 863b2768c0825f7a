"""The serving kernels (attention_varlen and its backward, attention_kvcache, attention_combine) compile offline
for sm_80 and sm_90a without spills, every Program their conformance cases launch included (no GPU needed)."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")

from hk_portable.conformance import offline_compile as precompile  # noqa: E402
from hk_portable.conformance.cases import all_cases  # noqa: E402

from hk_test_sampling import split  # noqa: E402 - tests/ on sys.path (its conftest)

SERVING = ("kernel/attention_varlen", "kernel/attention_kvcache", "op/scalar_load")


def _programs(arch):
    """What the serving cases launch on cuda:`arch` (where a build there spills, the kernel's fallback: the varlen
    softcap dK/dV kernel's on sm_80)."""
    cap = precompile.Capture(arch)
    for case in all_cases():
        if case.id.startswith(SERVING):
            setup = case.make(torch.Generator().manual_seed(0))
            setup.launch({**setup.inputs, **setup.outputs}, cap)
    return {f"{p.name}#{h[:8]}": p for h, p in cap.programs.items()}


# ~30 Programs x 2 targets, a few minutes on a 2-core runner: the default run compiles hk_test_sampling.split's part
# (every kernel, a third of its Programs), the `slow` part the rest (HK_EXHAUSTIVE=1 or `pytest -m slow`)
@pytest.mark.parametrize("part", ["sample", pytest.param("rest", marks=pytest.mark.slow)])
def test_serving_programs_compile_for_sm80_and_sm90a(part):
    results = []
    for arch in ("sm_80", "sm_90a"):
        progs = _programs(arch)
        names = {p.name for p in progs.values()}
        assert {"attention_varlen_kernel", "attention_varlen_bwd_dkdv_kernel", "attention_varlen_bwd_dq_kernel",
                "attention_varlen_ext_kernel", "attention_varlen_bwd_dkdv_softcap_kernel",
                "attention_kvcache_kernel", "attention_combine_kernel"} <= names, names
        default, rest = split(progs)             # the default part has each kernel's first Program in name order
        progs = default if part == "sample" else rest
        results += precompile.compile_many(progs, (arch,), workers=min(2, os.cpu_count() or 1))
    errors = [f"{r['name']} [{r['arch']}]: {r['error'][:500]}" for r in results if r["error"]]
    assert not errors, "\n".join(errors)
    spills = [r["name"] for r in results if r["resources"]["spill_stores"] or r["resources"]["stack_bytes"]]
    assert not spills, spills
    if part == "rest":
        return
    by = {(r["name"].split("#")[0], r["arch"]): r for r in results}
    assert by["attention_varlen_kernel", "sm_90a"]["wgmma"] and by["attention_varlen_kernel", "sm_90a"]["tma"]
    assert by["attention_kvcache_kernel", "sm_80"]["mma"] and by["attention_kvcache_kernel", "sm_80"]["cp_async"]
