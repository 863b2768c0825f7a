"""Variable-length batches (FlashAttention's varlen API): packed q/k/v with cu_seqlens, causal in both
alignments, windows, GQA; checked per sequence against float64 torch SDPA with an explicit mask, with
FlashAttention's rule (error at most twice torch's own error in bf16), on poisoned outputs.

HK_SERVING_TEST_DEVICE=cuda runs the kernels on the GPU (the references stay float64 on the CPU)."""
from __future__ import annotations

import os

import pytest
import torch

from hk_portable.interface import ArgumentError
from hk_portable.kernels.attention_varlen import attention_varlen

F = torch.nn.functional
DEV = os.environ.get("HK_SERVING_TEST_DEVICE", "cpu")


def _dev(*ts):
    return [t.to(DEV) if isinstance(t, torch.Tensor) else t for t in ts]


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _inputs(lq, lk, Hq, Hkv, D, seed, extra_q=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq) + extra_q, Hq, D, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(sum(lk), Hkv, D, generator=g).to(torch.bfloat16) for _ in range(2))
    return q, k, v


def _keep(n, nk, causal, window, align):
    """The [n, nk] bool mask of one sequence: key j is seen by query i when it is inside the sliding window
    (left, right) around i's aligned position (`right` 0 when causal; no window: only causality limits it)."""
    if not causal and window is None:
        return torch.ones(n, nk, dtype=torch.bool)
    left, right = (n + nk, n + nk) if window is None else window
    right = 0 if causal else right
    i = torch.arange(n).view(-1, 1) + (nk - n if align == "bottom_right" else 0)
    j = torch.arange(nk).view(1, -1)
    return (j <= i + right) & (j >= i - left)


def _per_sequence(q, k, v, lq, lk, causal, window, align, dtype):
    """(o [total_q, Hq, D], lse [Hq, total_q], keep-any [total_q]) of torch SDPA per sequence, in `dtype`."""
    o = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64)
    seen = torch.zeros(q.shape[0], dtype=torch.bool)
    g = q.shape[1] // k.shape[1]
    cq, ck = _cu(lq).tolist(), _cu(lk).tolist()
    for b in range(len(lq)):
        n, nk = lq[b], lk[b]
        if n == 0 or nk == 0:
            continue
        keep = _keep(n, nk, causal, window, align)
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1).to(dtype)
        kb, vb = (t[ck[b]:ck[b + 1]].transpose(0, 1).to(dtype).repeat_interleave(g, 0) for t in (k, v))
        ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=keep)
        ob = torch.where(keep.any(-1, keepdim=True), ob, 0.0).nan_to_num(0.0)
        o[cq[b]:cq[b + 1]] = ob.transpose(0, 1).double()
        s = (qb.double() @ kb.double().transpose(-1, -2)) * q.shape[2] ** -0.5
        lse[:, cq[b]:cq[b + 1]] = torch.logsumexp(s.masked_fill(~keep, float("-inf")), -1)
        seen[cq[b]:cq[b + 1]] = keep.any(-1)
    return o, lse, seen


def _check(lq, lk, Hq=4, Hkv=2, D=64, causal=False, window=None, align=None, seed=0, extra_q=0, backend=None):
    q, k, v = _inputs(lq, lk, Hq, Hkv, D, seed, extra_q)
    cq, ck = _cu(lq), _cu(lk)
    o, lse = _dev(torch.full_like(q, float("nan")), torch.full((Hq, q.shape[0]), float("nan")))
    dq_, dk_, dv_, dcq, dck = _dev(q, k, v, cq, ck)
    attention_varlen(dq_, dk_, dv_, dcq, dck if lq != lk else dcq, max(lq), max(lk), causal=causal, window=window,
                     align=align, out=o, lse=lse, backend=backend)
    o, lse = o.cpu(), lse.cpu()
    ref, ref_lse, seen = _per_sequence(q, k, v, lq, lk, causal, window, align, torch.float64)
    ours, _, _ = _per_sequence(q, k, v, lq, lk, causal, window, align, torch.bfloat16)
    torch_err = (ours - ref).abs().max()
    err = (o.double() - ref).abs().max()
    assert err <= 2 * torch_err, (err, torch_err)                 # FlashAttention's rule
    assert torch.equal(torch.isneginf(lse), ~seen.expand_as(lse))   # rows that see no key (or no sequence)
    assert (o[~seen] == 0).all()
    fin = seen.expand_as(lse)
    assert (lse[fin].double() - ref_lse[fin]).abs().max() < 1e-3
    return o, lse


# FlashAttention's seqlen grid as one varlen batch (with an empty and a one-token sequence)
GRID_Q = [113, 128, 108, 512, 1, 0, 37]
GRID_K = [203, 217, 256, 256, 1023, 5, 37]


def test_non_causal_grid_gqa():
    _check(GRID_Q, GRID_K, seed=1)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal_grid_both_alignments(align):
    _check(GRID_Q, GRID_K, causal=True, align=align, seed=2)


def test_causal_equal_lengths_needs_no_alignment_and_d128():
    _check([70, 130, 64], [70, 130, 64], D=128, Hq=2, Hkv=2, causal=True, seed=3)


def test_sliding_window_and_mqa():
    _check([100, 3, 200], [300, 40, 200], Hq=4, Hkv=1, window=(17, 5), align="bottom_right", seed=4)


def test_rows_no_sequence_covers_get_zero_and_minus_inf():
    o, lse = _check([30, 50], [20, 64], causal=True, align="bottom_right", seed=5, extra_q=11)
    assert (o[80:] == 0).all() and torch.isneginf(lse[:, 80:]).all()


def test_named_errors():
    q, k, v = _inputs([5, 6], [5, 6], 2, 1, 64, 0)
    cu = _cu([5, 6])
    def call(**kw):
        pos = [kw.pop(n, d) for n, d in (("q", q), ("k", k), ("v", v), ("cq", cu), ("ck", cu), ("mq", 6), ("mk", 6))]
        return attention_varlen(*pos, **kw)

    with pytest.raises(ArgumentError, match="3-D packed tensor"):
        call(q=q[None])
    with pytest.raises(ArgumentError, match="1-D int32"):
        call(cq=cu.long())
    with pytest.raises(ArgumentError, match="never decrease"):
        call(cq=torch.tensor([0, 6, 5], dtype=torch.int32))
    with pytest.raises(ArgumentError, match="never decrease"):
        call(cq=torch.tensor([0, 5, 12], dtype=torch.int32))          # past the packed length
    with pytest.raises(ArgumentError, match="one length"):
        call(ck=torch.tensor([0, 11], dtype=torch.int32))
    with pytest.raises(ArgumentError, match="needs the alignment named"):
        call(ck=cu.clone(), causal=True)
    with pytest.raises(ArgumentError, match="max_seqlen_q"):
        call(mq=-1)
    with pytest.raises(ArgumentError, match="multiple of key/value heads"):
        call(k=torch.zeros(11, 3, 64, dtype=torch.bfloat16), v=torch.zeros(11, 3, 64, dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match="head dim"):
        call(q=q[..., :36], k=k[..., :36], v=v[..., :36])


# ----------------------------------------------------------------------------------------------- backward
def _grads_per_sequence(q, k, v, do, lq, lk, causal, window, align, dtype):
    """(dq, dk, dv) of torch SDPA in `dtype` with an explicit mask, one sequence at a time."""
    outs = [torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v)]
    g = q.shape[1] // k.shape[1]
    cq, ck = _cu(lq).tolist(), _cu(lk).tolist()
    for b in range(len(lq)):
        n, nk = lq[b], lk[b]
        if n == 0 or nk == 0:
            continue
        keep = _keep(n, nk, causal, window, align)
        qb, kb, vb = (t[c[b]:c[b + 1]].transpose(0, 1).to(dtype).requires_grad_()
                      for t, c in ((q, cq), (k, ck), (v, ck)))
        ob = F.scaled_dot_product_attention(qb, kb.repeat_interleave(g, 0), vb.repeat_interleave(g, 0),
                                            attn_mask=keep)
        ob = torch.where(keep.any(-1, keepdim=True), ob, 0.0).nan_to_num(0.0)
        ob.backward(do[cq[b]:cq[b + 1]].transpose(0, 1).to(dtype))
        for out, t, c in zip(outs, (qb, kb, vb), (cq, ck, ck)):
            out[c[b]:c[b + 1]] = t.grad.transpose(0, 1).double()
    return outs


@pytest.mark.parametrize("causal,window,align", [(False, None, None), (True, None, "bottom_right"),
                                                 (True, None, "top_left"), (False, (9, 3), "bottom_right")])
def test_gradients_match_float64(causal, window, align):
    from hk_portable.kernels.attention_varlen import attention_varlen_bwd
    lq, lk = [113, 0, 64, 1, 40], [203, 5, 64, 30, 17]
    q, k, v = _inputs(lq, lk, 4, 2, 64, seed=11)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    cq, ck = _cu(lq), _cu(lk)
    dq_, dk_, dv_, ddo, dcq, dck = _dev(q, k, v, do, cq, ck)
    o, lse = attention_varlen(dq_, dk_, dv_, dcq, dck, max(lq), max(lk), causal=causal, window=window, align=align)
    got = _dev(*[torch.full_like(t, float("nan")) for t in (q, k, v)])
    attention_varlen_bwd(dq_, dk_, dv_, o, lse, ddo, dcq, dck, max(lq), max(lk), causal=causal, window=window,
                         align=align, dq=got[0], dk=got[1], dv=got[2])
    got = [t.cpu() for t in got]
    ref = _grads_per_sequence(q, k, v, do, lq, lk, causal, window, align, torch.float64)
    ours = _grads_per_sequence(q, k, v, do, lq, lk, causal, window, align, torch.bfloat16)
    for name, a, r, t in zip(("dq", "dk", "dv"), got, ref, ours):
        torch_err = (t - r).abs().max()
        assert (a.double() - r).abs().max() <= 2 * torch_err + 1e-4, name     # FlashAttention's rule (+ its atol)


def test_the_torch_op_differentiates_through_the_varlen_backward():
    from hk_portable import torch_ops  # noqa: F401 - registers torch.ops.hk
    lq, lk = [30, 50], [20, 64]
    q, k, v = (t.requires_grad_() for t in _dev(*_inputs(lq, lk, 2, 1, 64, seed=13)))
    cq, ck = _dev(_cu(lq), _cu(lk))
    o, _ = torch.ops.hk.attention_varlen(q, k, v, cq, ck, 50, 64, True, None, "bottom_right")
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(14)).to(torch.bfloat16)
    o.backward(do.to(DEV))
    ref = _grads_per_sequence(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), do, lq, lk, True, None,
                              "bottom_right", torch.float64)
    for t, r in zip((q, k, v), ref):
        assert ((t.grad.cpu().double() - r).abs().max() / r.abs().max()) < 0.02


def test_one_cu_seqlens_for_q_and_k_needs_no_alignment_in_the_backward_either():
    from hk_portable import torch_ops  # noqa: F401 - registers torch.ops.hk
    lens = [30, 50]
    q, k, v = (t.requires_grad_() for t in _dev(*_inputs(lens, lens, 2, 2, 64, seed=15)))
    (cu,) = _dev(_cu(lens))
    o, _ = torch.ops.hk.attention_varlen(q, k, v, cu, cu, 50, 50, True)
    o.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
