"""A representative sample of the conformance suite on the hip backend's emulated gfx942 and gfx950
targets: the generated HIP source, compiled for the host and executed lane by lane by the wave64
emulator, judged exactly as on hardware (exact tier bit for bit, against float64 math and against the
reference backend). The whole suite: `hk conformance --backend hip --target gfx942 --emulate`."""
from __future__ import annotations

import collections
import functools

import pytest

from hk_portable.backends.hip import emulator
from hk_portable.conformance.cases import all_cases
from hk_portable.conformance.runner import PASSED, SKIPPED, Session

ok, why = emulator.available()
pytestmark = pytest.mark.skipif(not ok, reason=f"hip emulator unavailable: {why}")

KERNEL_CASES = ("kernel/gemm/bf16-f32/17x33x65", "kernel/gemm/f16-f16/100x70x130",
                "kernel/attention_fwd/bf16/B1_Hq2_Hkv1_N77_D64_causal",
                "kernel/dropout_residual_layernorm/bf16/33x1000_p0.1",
                "kernel/attention_fwd/f16/B2_Hq4_Hkv2_N130_D128_full",
                "kernel/attention_fwd/bf16/B1_Hq2_Hkv2_N150_Nkv70_D64_causal_bottom_right",
                "kernel/attention_fwd/f16/B1_Hq4_Hkv2_N130_D128_full_win33-7",
                "kernel/rotary/bf16/gptj/BNHD_2x37x3x64_off3", "kernel/rotary/f16/neox/BHND_1x2x70x128_off0_inverse",
                "kernel/dropout_residual_rmsnorm/bf16/33x1000_p0.1",
                "kernel/layernorm_bwd/bf16/ln_33x1000_p0.1_bias_dh", "kernel/layernorm_bwd/f16/rms_33x1000_p0.1_bias_dh",
                "kernel/attention_varlen/bf16/q113-0-50_k203-5-20_Hq2_Hkv1_D64_causal_bottom_right",
                "kernel/attention_kvcache/bf16/L1-77-300_Nq1_Hq8_Hkv2_D128_page16_splits3",
                "kernel/attention_kvcache/f16/L300-40_Nq4_Hq8_Hkv2_D64_page256_causal_splits2")


@functools.cache
def _cases() -> dict:
    return {c.id: c for c in all_cases()}


def _sample() -> list[str]:
    """Two op cases of every op family (first and last, so dtypes and shapes vary) plus kernel cases."""
    families = collections.defaultdict(list)
    for c in _cases().values():
        if c.kind == "op":
            families["/".join(c.id.split("/")[:3])].append(c.id)
    ids = sorted({i for ids in families.values() for i in (ids[0], ids[-1])})
    return ids + [k for k in KERNEL_CASES if k in _cases()]


def _params() -> list:
    """The sample on both archs. The default run takes every kernel case on both, and each op family's first case
    on gfx942 and its last on gfx950 (so every family runs on both archs, on different dtypes and shapes); the
    family's first case on gfx950 and last on gfx942 are `slow` (HK_EXHAUSTIVE=1 or `pytest -m slow` runs them)."""
    families = collections.defaultdict(list)
    for c in _cases().values():
        if c.kind == "op":
            families["/".join(c.id.split("/")[:3])].append(c.id)
    default = {(ids[0], "gfx942") for ids in families.values()} | {(ids[-1], "gfx950") for ids in families.values()}
    return [pytest.param(arch, case_id, id=f"{case_id}-{arch}",
                         marks=() if case_id.startswith("kernel/") or (case_id, arch) in default else pytest.mark.slow)
            for case_id in _sample() for arch in ("gfx942", "gfx950")]


@functools.cache
def _session(arch: str) -> Session:
    return Session("hip", arch, emulate=True, seed=11)


@pytest.mark.parametrize("arch,case_id", _params())
def test_case_on_emulated_target(arch, case_id):
    r = _session(arch).run_case(_cases()[case_id])
    if r.status == SKIPPED:
        pytest.skip(r.reason)
    assert r.status == PASSED, r.reason


def test_sample_covers_every_kernel_and_op_family():
    ids = _sample()
    assert all(k in ids for k in KERNEL_CASES), "a named kernel case disappeared from the suite"
    fams = {"/".join(i.split("/")[:2]) for i in ids if i.startswith("op/")}
    all_fams = {"/".join(c.id.split("/")[:2]) for c in _cases().values() if c.kind == "op"}
    assert fams == all_fams
