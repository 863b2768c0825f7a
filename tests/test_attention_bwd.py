"""Attention backward: gradients of the library's forward (o, lse from attention_fwd) against float64 torch SDPA
autograd with an explicit mask, judged by the tolerance table's attention_bwd bounds; both dQ forms; rows that
see no key; bitwise-equal reruns of the deterministic form; argument errors that name the argument; and the
emulated gfx942 target."""
from __future__ import annotations

import math

import pytest
import torch

from hk_portable.conformance.cases import Check
from hk_portable.conformance.kernel_cases import _attention_keep, attention_bwd_math
from hk_portable.conformance.runner import judge
from hk_portable.conformance.tolerances import bound_for
from hk_portable.interface import ArgumentError
from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.attention_bwd import attention_bwd

F = torch.nn.functional


def _inputs(B, Hq, Hkv, N, Nkv, D, seed, dtype=torch.bfloat16):
    """q, k, v, dO: normal, clipped to [-2, 2] (the table's bounds assume |q|, |k| <= 2)."""
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(B, Hq, N, D, generator=g).clamp(-2, 2).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Nkv, D, generator=g).clamp(-2, 2).to(dtype) for _ in range(2))
    return q, k, v, do


def _sdpa_grads(q, k, v, do, keep):
    """float64 autograd through torch SDPA; a row that sees no key is masked out of the output (gradient 0)."""
    g = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    mask, sees = None, None
    if keep is not None:
        sees = keep.any(-1, keepdim=True)
        mask = keep | ~sees                          # SDPA gives NaN for an all-masked row
    o = F.scaled_dot_product_attention(qd, kd.repeat_interleave(g, 1), vd.repeat_interleave(g, 1), attn_mask=mask)
    (o if sees is None else o * sees).backward(do.double())
    return {"dq": qd.grad, "dk": kd.grad, "dv": vd.grad}


def _assert_within_table(out, q, k, v, do, causal, align, window=None):
    """Each gradient within its attention_bwd bound of float64 SDPA autograd; the conformance case's math agrees."""
    Hq, N, D = q.shape[1], q.shape[2], q.shape[3]
    Hkv, Nkv = k.shape[1], k.shape[2]
    ref = _sdpa_grads(q, k, v, do, _attention_keep(N, Nkv, causal, window, align))
    math_ = attention_bwd_math(q, k, v, do, causal, 1.0 / math.sqrt(D), window, align)
    terms = {"dq": Nkv + D, "dk": (Hq // Hkv) * N + D, "dv": (Hq // Hkv) * N}
    for name, got in zip(("dq", "dk", "dv"), out):
        value, magnitude = math_[name]
        assert torch.allclose(value, ref[name], rtol=1e-10, atol=1e-12), f"{name}: the case's math != SDPA"
        bound = bound_for("attention_bwd.dv" if name == "dv" else "attention_bwd.dq_dk", "bf16")
        r = judge(Check(name, name, ref[name], bound, scale=magnitude, k=terms[name]), got)
        assert r.passed, f"{name}: {r.detail} (error {r.max_error:.3g}, bound {r.bound:.3g})"


# (B, Hq, Hkv, N, Nkv, D, causal, align): non-causal and causal with ragged N, GQA 4:1 and 2:1, D = 128,
# bottom-right causal with N < Nkv, and with N > Nkv (the first N - Nkv rows see no key)
CONFIGS = [(1, 2, 2, 77, 77, 64, False, None), (1, 2, 2, 77, 77, 64, True, None),
           (2, 4, 1, 100, 100, 64, True, None), (1, 4, 2, 70, 70, 128, False, None),
           (1, 2, 1, 50, 130, 128, True, "bottom_right"), (1, 2, 1, 150, 70, 64, True, "bottom_right")]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic_dq", "deterministic"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "B{}_Hq{}_Hkv{}_N{}_Nkv{}_D{}_causal{}_{}".format(*c))
def test_gradients_match_float64_sdpa(config, deterministic):
    B, Hq, Hkv, N, Nkv, D, causal, align = config
    q, k, v, do = _inputs(B, Hq, Hkv, N, Nkv, D, seed=N + 3 * Nkv + D)
    o, lse = attention_fwd(q, k, v, causal=causal, align=align)
    nan = lambda t: torch.full_like(t, float("nan"))  # noqa: E731 - poisoned outputs: every element is written
    out = attention_bwd(q, k, v, o, lse, do, causal=causal, align=align, deterministic=deterministic,
                        dq=nan(q), dk=nan(k), dv=nan(v))
    assert all(t.dtype == q.dtype for t in out)
    _assert_within_table(out, q, k, v, do, causal, align)


def test_rows_that_see_no_key_get_zero_gradients_not_nan():
    q, k, v, do = _inputs(1, 2, 1, 150, 70, 64, seed=5)
    o, lse = attention_fwd(q, k, v, causal=True, align="bottom_right")
    empty = torch.isneginf(lse[0, 0])
    assert int(empty.sum()) == 80                                 # rows 0..79 see no key
    for deterministic in (False, True):
        dq, dk, dv = attention_bwd(q, k, v, o, lse, do, causal=True, align="bottom_right",
                                   deterministic=deterministic)
        assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
        assert (dq[:, :, empty] == 0).all()


def test_a_sliding_window_matches_float64():
    q, k, v, do = _inputs(1, 2, 2, 90, 90, 64, seed=9)
    o, lse = attention_fwd(q, k, v, window=(20, 4))
    out = attention_bwd(q, k, v, o, lse, do, window=(20, 4), deterministic=True)
    _assert_within_table(out, q, k, v, do, False, None, window=(20, 4))


def test_deterministic_form_reruns_bitwise_equal():
    q, k, v, do = _inputs(1, 4, 2, 100, 100, 64, seed=2)
    o, lse = attention_fwd(q, k, v, causal=True)
    first = attention_bwd(q, k, v, o, lse, do, causal=True, deterministic=True)
    again = attention_bwd(q, k, v, o, lse, do, causal=True, deterministic=True)
    for a, b in zip(first, again):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def _bad(name):
    q, k, v, do = _inputs(1, 2, 1, 16, 16, 64, seed=0)
    o, lse = torch.zeros_like(q), torch.zeros(1, 2, 16)
    args = dict(q=q, k=k, v=v, o=o, lse=lse, do=do)
    if name == "o":
        args["o"] = o[..., :32]
    elif name == "lse":
        args["lse"] = lse.half()
    elif name == "do":
        args["do"] = do.half()
    elif name == "k":
        args["k"], args["v"] = k[..., :32], v[..., :32]
    return args


@pytest.mark.parametrize("name,match", [("o", r"attention_bwd: 'o' must be \(1, 2, 16, 64\)"),
                                        ("lse", r"attention_bwd: 'lse' must be \(1, 2, 16\) torch.float32"),
                                        ("do", r"attention_bwd: 'do' must be .* torch.bfloat16"),
                                        ("k", r"attention_bwd: 'k' must be \[B=1, Hkv, Nkv, D=64\]")])
def test_bad_input_is_named(name, match):
    a = _bad(name)
    with pytest.raises(ArgumentError, match=match):
        attention_bwd(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"])


def test_bad_outputs_and_masks_are_named():
    a = _bad(None)
    with pytest.raises(ArgumentError, match=r"attention_bwd: 'dk' must be \(1, 1, 16, 64\)"):
        attention_bwd(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], dk=torch.empty_like(a["q"]))
    with pytest.raises(ArgumentError, match=r"attention_bwd: output 'dq' overlaps argument 'q'"):
        attention_bwd(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], dq=a["q"])
    q2 = a["q"][:, :, :8]
    with pytest.raises(ArgumentError, match=r"attention_bwd: N=8 != Nkv=16 .* name the alignment"):
        attention_bwd(q2, a["k"], a["v"], q2.clone(), a["lse"][..., :8].clone(), q2.clone(), causal=True)


# ------------------------------------------------------------------------------- the emulated gfx942
EMULATED = "hip:gfx942:emulated"


def _emulator_ok():
    from hk_portable.backends.hip import emulator
    return emulator.available()


# one configuration in the default run, the other `slow` (HK_EXHAUSTIVE=1 or `pytest -m slow`)
@pytest.mark.parametrize("config", [(1, 4, 2, 40, 40, 64, True, False),
                                    pytest.param((1, 2, 2, 33, 50, 64, False, True), marks=pytest.mark.slow)],
                         ids=["causal_gqa_atomic_dq", "full_ragged_deterministic"])
def test_on_emulated_gfx942(config):
    ok, why = _emulator_ok()
    if not ok:
        pytest.skip(f"hip emulator unavailable: {why}")
    B, Hq, Hkv, N, Nkv, D, causal, deterministic = config
    q, k, v, do = _inputs(B, Hq, Hkv, N, Nkv, D, seed=N)
    o, lse = attention_fwd(q, k, v, causal=causal)
    out = attention_bwd(q, k, v, o, lse, do, causal=causal, deterministic=deterministic, backend=EMULATED)
    _assert_within_table(out, q, k, v, do, causal, None)


# ------------------------------------------------------------- sm_90a's wide blocks, on the emulated sm_80 (issue 36)
# The configurations the cuda backend takes on sm_90a (candidates(): 128 keys on 8 warps, dQᵀ through a transposed
# view of the accumulator at D=128; dq_candidates(): 128 query rows) run here through the same kernel body on the
# host emulator, which lowers them to mma.sync: the orientation, the masks of a transposed tile and DQ_T's view.
WIDE = [(1, 4, 2, 150, 150, 128, True, dict(D=128, BM=64, BN=128, STAGES=2, num_warps=8, DQ_T=True)),
        (1, 2, 2, 140, 140, 64, True, dict(D=64, BM=128, BN=128, STAGES=2, num_warps=8)),
        (1, 2, 1, 90, 150, 64, False, dict(D=64, BM=64, BN=128, STAGES=2, num_warps=8, DQ_T=True))]


# the default run takes D128 (DQ_T, then the deterministic form with 128-row dQ blocks); the D64 ones are `slow`
@pytest.mark.parametrize("config", [WIDE[0], *(pytest.param(c, marks=pytest.mark.slow) for c in WIDE[1:])],
                         ids=["D128_gqa_causal_dqT", "D64_causal_128x128", "D64_full_ragged_dqT"])
def test_sm90a_wide_configurations_on_emulated_sm80(config):
    B, Hq, Hkv, N, Nkv, D, causal, cfg = config
    q, k, v, do = _inputs(B, Hq, Hkv, N, Nkv, D, seed=N + D)
    align = "top_left" if causal and N != Nkv else None
    o, lse = attention_fwd(q, k, v, causal=causal, align=align)
    out = attention_bwd(q, k, v, o, lse, do, causal=causal, align=align, backend="cuda:sm_80:emulated", config=cfg)
    _assert_within_table(out, q, k, v, do, causal, align)
    if D == 128:                    # the deterministic form: no DQ_T (no dQ in the dK/dV kernel), 128-row dQ blocks
        out = attention_bwd(q, k, v, o, lse, do, causal=causal, align=align, deterministic=True,
                            backend="cuda:sm_80:emulated", config={**cfg, "DQ_T": False},
                            dq_tiles=dict(D=D, BM=128, BN=64, STAGES=2, num_warps=8))
        _assert_within_table(out, q, k, v, do, causal, align)
