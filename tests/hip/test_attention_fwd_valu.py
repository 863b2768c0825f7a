"""Attention forward's VALU against its MFMAs on both AMD archs (issue 37, item 3): every loop of the kernel that
runs MFMAs (the leading edge tiles, the full tiles, the trailing edge tiles), as `hk analyze` reads the offline
compile, and the edge tiles' masks on the emulator. Static figures from the ISA: no AMD hardware measured them."""
from __future__ import annotations

import json

import pytest
import torch

import hk_portable as hk
from hk_portable import kernels
from hk_portable.backends.hip import HipBackend, compiler, emulator
from hk_portable.backends.hip.archs import make_target
from hk_portable.cli import main
from hk_portable.interface import GL, RT, ST, f32

needs_clang = pytest.mark.skipif(not compiler.available()[0], reason=compiler.available()[1])

# bound_vs_peak each MFMA loop's one_trip reaches (2026-12-07, clang 22.1.8; docs/perf-notes.md). Issue 37 asks 0.8.
# D=128 meets it in every loop on both archs, and so does gfx942 at D=64 (0.81-0.82 since P's bf16 rounding lost its
# NaN arm: patterns.nan_row_casts). gfx950 at D=64 does not: its 32 v_exp a trip (quarter rate) take as long as its
# 32 16x16x32 MFMAs, so VALU alone bounds it below 0.5 in this model. The floors below are what the lowering reaches,
# so a regression fails.
FLOOR = {("gfx942", 128): 0.8, ("gfx950", 128): 0.8, ("gfx942", 64): 0.8, ("gfx950", 64): 0.46}


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


# where_band at the int32 limits (tests/test_fused_masks.py's cases, whose select is not a transposed fragment and so
# never reaches where_band): a select in the layout attention's scores take, the A operand of a second mma.
T = 64


@hk.kernel(num_warps=4)
def _band_select(q: GL[2], k: GL[2], y: GL[2], o: GL[2], ro: int, co: int, ro2: int, co2: int, bro: int, bco: int,
                 nr: int, nc: int):
    q_s, k_s = hk.shared(ST[q.dtype, T, T]), hk.shared(ST[k.dtype, T, T])
    hk.load(q_s, q, (0, 0))
    hk.load(k_s, k, (0, 0))
    s = hk.mma_ABt(q_s, k_s, hk.zeros(RT[f32, T, T]))
    keep = hk.bounds_mask(s, bro, bco, nr, nc) & hk.causal_mask(s, ro, co) & ~hk.causal_mask(s, ro2, co2)
    w = hk.where(keep, s, -1.0)
    hk.store(y, w, (0, 0))
    hk.store(o, hk.mma(w.to(q.dtype), k_s, hk.zeros(RT[f32, T, T])), (0, 0))


I32_MIN, I32_MAX = -2**31, 2**31 - 1
BAND_CASES = [(0, 0, -5, 0, 0, 0, T, T), (5, -3, 2, 10, 3, -4, 20, 17),
              (I32_MAX, I32_MIN, I32_MIN, I32_MAX, 0, 0, T, T), (I32_MIN, I32_MAX, I32_MAX, I32_MIN, 0, 0, T, T),
              (I32_MAX - 40, I32_MIN + 3, I32_MIN + 9, I32_MAX - 2, I32_MAX - 40, I32_MIN, I32_MAX, 9),
              (I32_MAX - 10, I32_MAX - 20, 0, 12, -16, -16, 8, 8), (2**30, 2**30 + 9, 2**30 + 3, 2**30, 0, 5, T, T),
              (40, 8, 20, 40, 0, 0, 50, 61)]


@pytest.mark.skipif(not emulator.available()[0], reason=emulator.available()[1])
@pytest.mark.parametrize("case", BAND_CASES)
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_where_band_matches_int64_math(arch, case):
    ro, co, ro2, co2, bro, bco, nr, nc = case
    q, k = (torch.randn(T, T, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16) for i in (1, 2))
    y, o = torch.empty(T, T), torch.empty(T, T)
    _band_select(q, k, y, o, *case, grid=(1,), backend=f"hip:{arch}:emulated")
    src = _band_select.compile(q, k, y, o, *case, backend=f"hip:{arch}").source
    assert "hk::where_band(" in src
    r, c = torch.arange(T, dtype=torch.int64).view(-1, 1), torch.arange(T, dtype=torch.int64).view(1, -1)
    keep = ((bro + r >= 0) & (bro + r < nr) & (bco + c >= 0) & (bco + c < nc)
            & (ro + r >= co + c) & ~(ro2 + r >= co2 + c))
    s = q.double() @ k.double().T
    assert torch.equal(y == -1.0, ~keep | (s == -1.0))
    assert (y.double()[keep] - s[keep]).abs().max().item() < 1e-3 if keep.any() else True


# P's conversion without the NaN arm (patterns.nan_row_casts, gfx942): P = exp2(S * c) converted to bf16 and
# multiplied by V = I, so each row of the product is the row's bf16 values exactly, or all NaN where the row holds
# a NaN or an infinity (inf * 0). With c = 1, rows 7 and 9 hold NaNs (a NaN in Q; inf * 0 in one column), row 3
# infinities and zeros only. With c a NaN every row holds NaNs with its payload (quieted): 0x7FBFFFFF and 0xFFFFFFFF
# give P NaNs whose bits the rounding add carries into a zero (hk::nan_rows restores those rows; without it both
# cases fail on gfx942), a signalling 0x7F800001 one that stays a NaN.
@hk.kernel(num_warps=4)
def _p_times_v(q: GL[2], k: GL[2], v: GL[2], p: GL[2], l: GL[1], o: GL[2], c: float):
    q_s, k_s, v_s = hk.shared(ST[q.dtype, T, T]), hk.shared(ST[k.dtype, T, T]), hk.shared(ST[v.dtype, T, T])
    hk.load(q_s, q, (0, 0))
    hk.load(k_s, k, (0, 0))
    hk.load(v_s, v, (0, 0))
    pt = hk.exp2(hk.mma_ABt(q_s, k_s, hk.zeros(RT[f32, T, T])) * c)
    hk.store(p, pt, (0, 0))
    hk.store(l, hk.row_sum(pt), (0,))
    hk.store(o, hk.mma(pt.to(v.dtype), v_s, hk.zeros(RT[f32, T, T])), (0, 0))


def _f32_bits(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


@pytest.mark.skipif(not emulator.available()[0], reason=emulator.available()[1])
@pytest.mark.parametrize("c", [1.0, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF],
                         ids=lambda c: f"{c:#x}" if isinstance(c, int) else "1")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_p_conversion_keeps_nan_rows(arch, c):
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(T, T, generator=g) * 0.3).to(torch.bfloat16)
    k = (torch.randn(T, T, generator=g) + 0.5).to(torch.bfloat16)
    k[k == 0] = 1.0
    q[7, 2] = float("nan")
    q[9, 3], k[11, 3] = float("inf"), 0.0
    q[3, 0] = float("inf")
    v = torch.eye(T, dtype=torch.bfloat16)
    p, l, o = torch.empty(T, T), torch.empty(T), torch.empty(T, T)
    scale = c if isinstance(c, float) else _f32_bits(c)
    _p_times_v(q, k, v, p, l, o, scale, grid=(1,), backend=f"hip:{arch}:emulated")
    src = _p_times_v.compile(q, k, v, p, l, o, scale, backend=f"hip:{arch}").source
    assert ("hk::nan_rows(" in src) == (arch == "gfx942")
    bad = ~torch.isfinite(p).all(dim=1)
    if isinstance(c, float):
        assert bad.nonzero().flatten().tolist() == [3, 7, 9]
        assert torch.isnan(l[[7, 9]]).all() and l[3] == float("inf")
    else:
        assert bad.all() and torch.isnan(l).all()
    assert torch.isnan(o[bad]).all()
    want = p[~bad].to(torch.bfloat16).float()
    assert torch.equal(o[~bad].view(torch.int32), want.view(torch.int32))


def test_rounding_without_the_nan_arm_is_round_to_nearest_even():
    """hk::cast_finite's bits (u + 0x7FFF + lsb) >> 16 against torch's f32 -> bf16 for every non-NaN value class:
    each exponent with the halfway patterns (ties to even and odd, one below and one above), random mantissas,
    zeros, subnormals, the largest finite values (which round to infinity) and the infinities."""
    g = torch.Generator().manual_seed(7)
    hi = torch.arange(0, 1 << 16, dtype=torch.int64)
    low = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
    u = torch.cat([(hi[:, None] << 16 | low[None, :]).flatten(), torch.randint(0, 1 << 32, (1 << 20,), generator=g)])
    x = u.to(torch.int32).view(torch.float32)
    x, u = x[~torch.isnan(x)], u[~torch.isnan(x)]
    got = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    want = x.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    assert torch.equal(got, want)
