"""Softcap and attention sinks in dense attention (issue 40 item 2, forward and backward) against an
independent float64 implementation, on the reference backend and the emulated targets; the op and functional API's
argument checks.

softcap c (FlashAttention, Gemma 2): s = c * tanh(scale * q.k / c), before the mask.
sinks [Hq] (GPT-OSS): the head's sink logit joins each row's softmax as one more column whose probability is
dropped; lse includes it."""
from __future__ import annotations

import math

import pytest
import torch

import hk_portable.nn.functional as hF
from hk_portable.interface import ArgumentError
from hk_portable.kernels.attention import attention_fwd

BACKENDS = ["reference", "cuda:sm_80:emulated", "hip:gfx942:emulated", "hip:gfx950:emulated"]

# (B, Hq, Hkv, N, Nkv, D, causal, align, softcap, sinks): GQA causal with both; plain-mask sinks at D=128;
# bottom-right causal with N > Nkv (rows that see no key: o = 0, lse = the sink)
SHAPES = [(1, 4, 2, 70, 70, 64, True, None, 20.0, True),
          (1, 2, 1, 33, 90, 128, False, None, None, True),
          (1, 2, 2, 80, 40, 64, True, "bottom_right", 8.0, True),
          (2, 2, 1, 50, 50, 64, True, None, 2.0, False)]


def float64_attention(q, k, v, causal, align, softcap, sinks):
    """Written from the definitions, not from the library: (o, lse, sum_j p_j |v_j|)."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        n, nk = q.shape[2], k.shape[2]
        shift = nk - n if align == "bottom_right" else 0
        i = torch.arange(n).view(-1, 1)
        j = torch.arange(nk).view(1, -1)
        s = s.masked_fill(j > i + shift, -math.inf)
    if sinks is not None:
        sink = sinks.double().view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        m = torch.maximum(s.amax(-1, keepdim=True), sink)
        e, e_sink = torch.exp(s - m), torch.exp(sink - m)
        denom = e.sum(-1, keepdim=True) + e_sink
        p = e / denom
        lse = (m + torch.log(denom)).squeeze(-1)
    else:
        lse = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v, lse, p @ v.abs()


def _inputs(B, Hq, Hkv, N, Nkv, D, with_sinks, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g).bfloat16()
    k = torch.randn(B, Hkv, Nkv, D, generator=g).bfloat16()
    v = torch.randn(B, Hkv, Nkv, D, generator=g).bfloat16()
    sinks = (torch.rand(Hq, generator=g) * 6 - 3) if with_sinks else None
    return q, k, v, sinks


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "_".join(map(str, s)))
def test_softcap_sinks_forward_matches_float64(backend, shape):
    B, Hq, Hkv, N, Nkv, D, causal, align, softcap, with_sinks = shape
    q, k, v, sinks = _inputs(B, Hq, Hkv, N, Nkv, D, with_sinks)
    o = torch.full_like(q, float("nan"))                        # poisoned: every element must be written
    lse = torch.full((B, Hq, N), float("nan"))
    attention_fwd(q, k, v, causal=causal, align=align, softcap=softcap, sinks=sinks, out=o, lse=lse,
                  backend=backend)
    ref_o, ref_lse, mag = float64_attention(q, k, v, causal, align, softcap, sinks)
    assert not o.isnan().any() and not lse.isnan().any()
    err_o = (o.double() - ref_o).abs()
    assert (err_o <= 2.0 ** -6 * mag + 1e-6).all(), f"o off by {err_o.max().item():.3g}"   # bf16 P and O roundings
    assert torch.allclose(lse.double(), ref_lse, rtol=0, atol=2.0 ** -13), \
        f"lse off by {(lse.double() - ref_lse).abs().max().item():.3g}"
    if align == "bottom_right" and N > Nkv:                      # rows before the first key: o = 0, lse = sink
        empty = N - Nkv
        assert (o[:, :, :empty] == 0).all()
        if sinks is not None:
            assert torch.allclose(lse[:, :, :empty], sinks.view(1, -1, 1).expand(B, -1, empty), atol=1e-6)


def test_sinks_far_above_and_below_every_logit():
    """A sink far above every logit leaves o ~ 0 and lse ~ the sink (no overflow); far below, the plain result."""
    q, k, v, _ = _inputs(1, 2, 2, 40, 40, 64, False, seed=3)
    plain_o, plain_lse = attention_fwd(q, k, v, causal=True, backend="reference")
    o, lse = attention_fwd(q, k, v, causal=True, sinks=torch.tensor([-1e4, 80.0]), backend="reference")
    assert torch.equal(o[:, 0], plain_o[:, 0]) and torch.allclose(lse[:, 0], plain_lse[:, 0])
    assert o[:, 1].abs().max() < 1e-20 and torch.allclose(lse[:, 1], torch.full_like(lse[:, 1], 80.0))


def test_functional_and_op_match_the_wrapper():
    q, k, v, sinks = _inputs(1, 4, 2, 30, 30, 64, True, seed=1)
    o, lse = attention_fwd(q, k, v, causal=True, softcap=10.0, sinks=sinks, backend="reference")
    fo, flse = hF.attention(q, k, v, causal=True, softcap=10.0, sinks=sinks, return_lse=True)
    oo, olse = torch.ops.hk.attention(q, k, v, True, None, None, None, None, 10.0, sinks)
    assert torch.equal(o, fo) and torch.equal(lse, flse) and torch.equal(o, oo) and torch.equal(lse, olse)
    assert torch.equal(hF.attention(q, k, v, causal=True), attention_fwd(q, k, v, causal=True)[0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(softcap=0.0), "'softcap' must be a finite number > 0"),
    (dict(softcap=-2.0), "'softcap' must be a finite number > 0"),
    (dict(softcap=float("inf")), "'softcap' must be a finite number > 0"),
    (dict(sinks=torch.zeros(3)), r"'sinks' must have shape \[Hq=4\]"),
    (dict(sinks=torch.zeros(4, 1)), r"'sinks' must have shape \[Hq=4\]"),
    (dict(sinks=torch.zeros(4, dtype=torch.bfloat16)), "'sinks' must be float32"),
    (dict(sinks=[0.0] * 4), "'sinks' must be a float32 tensor"),
])
def test_bad_softcap_and_sinks_are_refused_by_name(kwargs, match):
    q, k, v, _ = _inputs(1, 4, 2, 16, 16, 64, False)
    with pytest.raises(ArgumentError, match=match):
        attention_fwd(q, k, v, **kwargs)
    if not isinstance(kwargs.get("sinks", torch.zeros(0)), list):
        with pytest.raises(ArgumentError, match=match):
            hF.attention(q, k, v, **kwargs)


def test_sinks_on_another_device_is_refused():
    q, k, v, _ = _inputs(1, 4, 2, 16, 16, 64, False)
    with pytest.raises(ArgumentError, match="'sinks' is on meta, 'q' on cpu"):
        attention_fwd(q, k, v, sinks=torch.zeros(4, device="meta"))


# (B, Hq, Hkv, N, Nkv, D, causal, align, softcap, sinks, use the lse): GQA causal with sinks; bottom-right with rows
# that see no key, softcap and sinks and the lse's gradient used too; softcap alone, unmasked, at D=128
GRAD_SHAPES = [(1, 4, 2, 70, 70, 64, True, None, None, True, False),
               (2, 2, 1, 80, 40, 64, True, "bottom_right", 6.0, True, True),
               (1, 2, 1, 40, 50, 128, False, None, 3.0, False, False)]


# every shape and both dQ forms on the reference; the emulators (time) the op's atomic-dQ path at D=64
GRAD_RUNS = ([("reference", s, det) for s in GRAD_SHAPES for det in (False, True)]
             + [(be, s, False) for be in ("cuda:sm_80:emulated", "hip:gfx942:emulated") for s in GRAD_SHAPES
                if s[5] == 64])


@pytest.mark.parametrize("backend, shape, deterministic", GRAD_RUNS,
                         ids=[f"{b}-{'_'.join(map(str, s))}-{'det' if d else 'atomic'}" for b, s, d in GRAD_RUNS])
def test_backward_matches_float64_autograd(backend, shape, deterministic):
    """dq, dk, dv (and d sinks) of sum(o * w) (+ sum(lse * w_lse)) against torch autograd of the float64 math."""
    import hk_portable as hk
    from hk_portable.kernels.attention_bwd import attention_bwd
    B, Hq, Hkv, N, Nkv, D, causal, align, softcap, with_sinks, use_lse = shape
    q, k, v, sinks = _inputs(B, Hq, Hkv, N, Nkv, D, with_sinks, seed=5)
    g = torch.Generator().manual_seed(6)
    w, w_lse = torch.randn(B, Hq, N, D, generator=g), torch.randn(B, Hq, N, generator=g)
    ours = [t.clone().requires_grad_() for t in (q, k, v, sinks) if t is not None]
    with hk.use_backend(backend):
        o, lse = hF.attention(*ours[:3], causal=causal, align=align, softcap=softcap,
                              sinks=ours[3] if with_sinks else None, return_lse=True)
        ((o.float() * w).sum() + ((lse * w_lse).sum() if use_lse else 0)).backward()
        if deterministic:               # the second dQ kernel, through the wrapper (the op runs the atomic one)
            do = w.to(o.dtype)
            det = attention_bwd(*(t.detach() for t in ours[:3]), o.detach(), lse.detach(), do, causal=causal,
                                align=align, softcap=softcap, dlse=w_lse if use_lse else None, deterministic=True)
    ref = [t.double().requires_grad_() for t in (q, k, v, sinks) if t is not None]
    r_o, r_lse, _ = float64_attention(*ref[:3], causal, align, softcap, ref[3] if with_sinks else None)
    ((r_o * w.double()).sum() + ((r_lse * w_lse.double()).sum() if use_lse else 0)).backward()
    got = [t.grad for t in ours] if not deterministic else list(det)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, ref):
        err = (a.double() - b.grad).abs().max().item()
        # bf16 inputs, P and dS rounded to bf16 as mma operands: 2 % of the largest element (0.1-0.5 % seen)
        assert err <= 0.02 * b.grad.abs().max().item() + 1e-3, f"{name} off by {err:.3g}"


@pytest.mark.parametrize("case", ["sinks_grad", "softcap_sinks_grad", "softcap_sinks_no_grad"])
def test_opcheck_with_softcap_and_sinks(case):
    """Schema, fake, autograd registration and AOT dispatch of hk::attention with the new arguments."""
    q, k, v, sinks = _inputs(1, 4, 2, 20, 20, 64, True, seed=2)
    if case == "sinks_grad":
        args = (*(t.requires_grad_() for t in (q, k, v)), True, None, None, None, None, None, sinks.requires_grad_())
    elif case == "softcap_sinks_grad":
        args = (*(t.requires_grad_() for t in (q, k, v)), True, None, None, None, None, 7.0, sinks.requires_grad_())
    else:
        args = (q, k, v, True, None, None, None, None, 7.0, sinks)
    torch.library.opcheck(torch.ops.hk.attention.default, args)


# ------------------------------------------------------------- varlen (padded batches in transformers): forward and sinks' gradient
VARLEN_RUNS = [("reference", True, 20.0, True), ("reference", False, 4.0, False), ("reference", True, None, True),
               ("cuda:sm_80:emulated", True, 20.0, True), ("hip:gfx942:emulated", False, 4.0, False)]


@pytest.mark.parametrize("backend, causal, softcap, with_sinks", VARLEN_RUNS, ids=lambda x: str(x))
def test_varlen_softcap_sinks_match_float64_per_sequence(backend, causal, softcap, with_sinks):
    if backend.startswith("hip"):
        from hk_portable.backends.hip import emulator
        if not emulator.available()[0]:
            pytest.skip(f"hip emulator unavailable: {emulator.available()[1]}")
    """hk::attention_varlen with softcap and/or sinks: each sequence's o and lse are the dense float64 math's (an
    empty sequence and bottom-right rows that see no key included: o = 0, lse = the sink); with sinks, the op's
    gradients of q, k, v (softcap's derivative in the varlen backward kernels) and of sinks against float64 autograd
    of the same per-sequence math."""
    lens_q, lens_k = (30, 0, 25), (40, 6, 17)
    cu_q = torch.tensor([0, 30, 30, 55], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 46, 63], dtype=torch.int32)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(n, h, 64, generator=g).bfloat16() for n, h in ((55, 4), (63, 2), (63, 2)))
    sinks = (torch.rand(4, generator=g) * 6 - 3) if with_sinks else None
    w = torch.randn(55, 4, 64, generator=g)
    ours = [t.clone().requires_grad_() for t in (q, k, v, sinks) if t is not None]
    o, lse = torch.ops.hk.attention_varlen(*ours[:3], cu_q, cu_k, 30, 40, causal, None,
                                           "bottom_right" if causal else "top_left", None, backend, softcap=softcap,
                                           sinks=ours[3] if with_sinks else None)
    ref = [t.double().requires_grad_() for t in (q, k, v, sinks) if t is not None]
    r_o, r_lse = torch.zeros(55, 4, 64, dtype=torch.float64), torch.full((4, 55), -math.inf, dtype=torch.float64)
    if with_sinks:
        r_lse = ref[3].view(-1, 1).expand(4, 55).clone()
    for b in range(3):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if qe == qs or ke == ks:
            continue
        ob, lb, _ = float64_attention(*(t[s:e].transpose(0, 1)[None] for t, s, e in
                                        ((ref[0], qs, qe), (ref[1], ks, ke), (ref[2], ks, ke))),
                                      causal, "bottom_right", softcap, ref[3] if with_sinks else None)
        r_o = torch.cat([r_o[:qs], ob[0].transpose(0, 1), r_o[qe:]])
        r_lse = torch.cat([r_lse[:, :qs], lb[0], r_lse[:, qe:]], 1)
    assert (o.double() - r_o).abs().max() <= 2.0 ** -6 * r_o.abs().max() + 1e-3
    assert torch.allclose(lse.double(), r_lse, atol=2.0 ** -13) and not lse.isnan().any()
    (o.float() * w).sum().backward()
    (r_o * w.double()).sum().backward()
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), ours, ref):
        err = (a.grad.double() - b.grad).abs().max().item()
        assert err <= 0.02 * b.grad.abs().max().item() + 1e-3, f"{name} off by {err:.3g}"


def test_varlen_opcheck_with_softcap_and_sinks():
    q, k, v = (torch.randn(n, h, 64).bfloat16() for n, h in ((20, 4), (20, 2), (20, 2)))
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    sinks = torch.randn(4)
    torch.library.opcheck(torch.ops.hk.attention_varlen.default,
                          (*(t.requires_grad_() for t in (q, k, v)), cu, cu, 12, 12, True, None, "top_left", None,
                           None, None, sinks.requires_grad_()))
    torch.library.opcheck(torch.ops.hk.attention_varlen.default,
                          (q.detach(), k.detach(), v.detach(), cu, cu, 12, 12, True, None, "top_left", None, None,
                           5.0, sinks.detach()))


# ------------------------------------------------------------------- KV cache (decode): softcap and sinks, split or not
@pytest.mark.parametrize("backend", ["reference", "cuda:sm_80:emulated"])
@pytest.mark.parametrize("splits", [1, 3])
def test_kvcache_softcap_sinks_match_float64(backend, splits):
    """hk::attention_kvcache with softcap and sinks, one query per sequence (an empty sequence: o = 0, lse = the
    sink) in one split (the kernel writes o and lse) or three (the sink counted once, in split 0): the float64
    math of the dense definition."""
    from hk_portable.kernels.attention_kvcache import kvcache_reference
    g = torch.Generator().manual_seed(21)
    kc, vc = (torch.randn(3, 90, 2, 64, generator=g).bfloat16() for _ in range(2))
    q = torch.randn(3, 1, 8, 64, generator=g).bfloat16()
    sinks = torch.rand(8, generator=g) * 6 - 3
    lens = torch.tensor([90, 0, 33], dtype=torch.int32)
    o, lse = torch.ops.hk.attention_kvcache(q, kc, vc, lens, None, True, None, splits, backend, softcap=15.0,
                                            sinks=sinks)
    ro, rl = kvcache_reference(q, kc, vc, lens, causal=True, softcap=15.0, sinks=sinks)
    assert (o.double() - ro).abs().max() <= 2.0 ** -6 * ro.abs().max() + 1e-3
    assert torch.allclose(lse.double(), rl, atol=2.0 ** -13)
    assert (o[1] == 0).all() and torch.allclose(lse[1], sinks.view(-1, 1), atol=1e-6)


def test_kvcache_opcheck_with_softcap_and_sinks():
    kc, vc = (torch.randn(2, 40, 2, 64).bfloat16() for _ in range(2))
    q = torch.randn(2, 1, 4, 64).bfloat16()
    lens = torch.tensor([40, 17], dtype=torch.int32)
    torch.library.opcheck(torch.ops.hk.attention_kvcache.default,
                          (q, kc, vc, lens, None, True, None, 2, None, 5.0, torch.randn(4)))
