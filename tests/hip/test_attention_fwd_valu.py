"""Attention forward's VALU against its MFMAs on both AMD archs (issue 37, item 3): every loop of the kernel that
runs MFMAs (the leading edge tiles, the full tiles, the trailing edge tiles), as `hk analyze` reads the offline
compile, and the edge tiles' masks on the emulator. Static figures from the ISA: no AMD hardware measured them."""
from __future__ import annotations

import json

import pytest
import torch

from hk_portable import kernels
from hk_portable.backends.hip import HipBackend, compiler, emulator
from hk_portable.backends.hip.archs import make_target
from hk_portable.cli import main

needs_clang = pytest.mark.skipif(not compiler.available()[0], reason=compiler.available()[1])

# bound_vs_peak each MFMA loop's one_trip reaches (2026-12-07, clang 22.1.8; docs/perf-notes.md). Issue 37 asks 0.8.
# D=128 meets it in every loop on both archs. D=64 does not: gfx950's 32 v_exp a trip (quarter rate) take as long
# as its 32 16x16x32 MFMAs, so VALU alone bounds it below 0.5 in this model; gfx942's is the software bf16 rounding
# of P (about 5 VALU an element). The floors below are what the lowering reaches, so a regression fails.
FLOOR = {("gfx942", 128): 0.8, ("gfx950", 128): 0.8, ("gfx942", 64): 0.6, ("gfx950", 64): 0.38}


def _analysis(arch: str, d: int, causal: bool, capsys) -> dict:
    args = ["--arg", f"D={d}", "--arg", f"causal={causal}", "--json"]
    assert main(["analyze", "attention_fwd", "--backend", "hip", "--target", arch, *args]) == 0
    return json.loads(capsys.readouterr().out)


@needs_clang
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_every_attention_loop_against_the_peak(arch, d, causal, capsys):
    """The configuration `hk analyze` compiles is the one the backend launches (256 query rows on 8 waves, K/V
    blocks of 64, at both D); with a mask the example is a window, so both edge loops are there."""
    r = _analysis(arch, d, causal, capsys)
    loops = [lp for lp in r["loops"] if lp["one_trip"]["mfma_count"]]
    assert len(loops) == (3 if causal else 2)
    for lp in loops:
        c = lp["one_trip"]["clocks"]
        assert c["bound_vs_peak"] >= FLOOR[arch, d], (lp["header"], c)
        assert c["lds_to_mfma"] <= 0.7, (lp["header"], c)
    # the edge tiles cost their masks and little else: within 70 VALU of a full tile's trip (was 207-349 more)
    main_valu = next(lp for lp in loops if lp["main"])["one_trip"]["counts"]["valu"]
    assert all(lp["one_trip"]["counts"]["valu"] <= main_valu + 70 for lp in loops)
    res = r["resources"]
    assert res["vgpr_spill"] == res["sgpr_spill"] == res["scratch_bytes"] == 0
    assert r["occupancy"]["waves_per_simd"] >= 2


@needs_clang
def test_plan_records_the_scale_folded_through_the_edge_select():
    module, k = kernels.load("attention_fwd")
    args, consts = module.example_args(device="cpu", D=128, causal=True)
    target = make_target("gfx950", runs=False, compile_only=True)
    cfg = k.choose_config(module.candidates(consts, args), *args, backend=target.spec)
    art = HipBackend().compile(k.trace(*args, **cfg), target)
    why = [f["why"] for f in art.launch["plan"]["fused"] if f["why"].startswith("scale folded")]
    assert len(why) == 3 and sum("-inf select" in w for w in why) == 2, why
    assert "hk::where_band(" in art.source and "hk::where_at(" not in art.source.split("attention_fwd_kernel(")[-1]


# Masks over several row blocks and key blocks: every edge path of where_band (whole rows kept, 16x16 blocks kept,
# blocks cut by the diagonal or the window or the keys' end, rows that see no key) against float64 math.
MASKS = [dict(N=300, Nkv=333, D=64, causal=True, window=(70, 9), align="bottom_right"),
         dict(N=270, Nkv=200, D=128, causal=True, align="bottom_right"),
         dict(N=97, Nkv=520, D=64, causal=False, window=(40, 200), align="top_left")]


@pytest.mark.skipif(not emulator.available()[0], reason=emulator.available()[1])
@pytest.mark.parametrize("case", MASKS, ids=lambda c: "_".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_edge_masks_emulated(arch, case):
    from hk_portable.kernels.attention import attention_fwd, reference
    torch.manual_seed(3)
    q = torch.randn(1, 2, case["N"], case["D"], dtype=torch.bfloat16)
    k, v = (torch.randn(1, 1, case["Nkv"], case["D"], dtype=torch.bfloat16) for _ in range(2))
    mask = {x: case[x] for x in ("causal", "window", "align") if x in case}
    o, lse = attention_fwd(q, k, v, backend=f"hip:{arch}:emulated", **mask)
    o_ref, lse_ref = reference(q, k, v, **mask)
    seen = torch.isfinite(lse_ref)
    assert (o.double() - o_ref).abs().max() < 2e-2
    assert (lse.double()[seen] - lse_ref[seen]).abs().max() < 1e-4 and (lse[~seen] == float("-inf")).all()
