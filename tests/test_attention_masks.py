"""Attention as serving stacks call it: causal with N != Nkv in both alignments, sliding windows, rows that
see no key; checked against float64 torch SDPA (with an explicit mask) on fresh inputs, outputs poisoned."""
from __future__ import annotations

import pytest
import torch

from hk_portable.interface import ArgumentError
from hk_portable.kernels.attention import attention_fwd, band

F = torch.nn.functional


def _inputs(B, Hq, Hkv, N, Nkv, D, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, Hkv, Nkv, D, generator=g).to(torch.bfloat16) for _ in range(2))
    return q, k, v


def _sdpa(q, k, v, keep, dtype=torch.float64):
    """torch SDPA in `dtype` with a boolean keep-mask; rows with no visible key -> 0 (SDPA gives NaN)."""
    g = q.shape[1] // k.shape[1]
    kd, vd = (t.to(dtype).repeat_interleave(g, dim=1) for t in (k, v))
    o = F.scaled_dot_product_attention(q.to(dtype), kd, vd, attn_mask=keep)
    return torch.where(keep.any(-1, keepdim=True), o, 0.0).nan_to_num(0.0).double()


def _keep(N, Nkv, shift, left, right):
    i = torch.arange(N).view(-1, 1) + shift
    j = torch.arange(Nkv).view(1, -1)
    return (j <= i + right) & (j >= i - left)


# FlashAttention's seqlen grid (a sample that runs in seconds on the reference)
GRID = [(113, 203), (128, 217), (108, 256), (512, 256), (203, 113)]


@pytest.mark.parametrize("N,Nkv", GRID)
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal_with_different_lengths_matches_float64_sdpa(N, Nkv, align):
    q, k, v = _inputs(1, 4, 2, N, Nkv, 64, seed=N * 7 + Nkv)
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"))
    attention_fwd(q, k, v, causal=True, align=align, out=o, lse=lse)
    shift = Nkv - N if align == "bottom_right" else 0
    keep = _keep(N, Nkv, shift, N + Nkv, 0)
    ref = _sdpa(q, k, v, keep)
    # FlashAttention's rule: at most twice the error of torch's own computation in the input dtype
    torch_err = (_sdpa(q, k, v, keep, torch.bfloat16) - ref).abs().max()
    assert (o.double() - ref).abs().max() <= 2 * torch_err
    empty = ~keep.any(-1)
    assert torch.equal(torch.isneginf(lse[0, 0]), empty)             # rows that see no key: -inf
    assert (o[:, :, empty] == 0).all()


def test_a_sliding_window_sees_only_its_band():
    q, k, v = _inputs(2, 2, 2, 150, 150, 128, seed=3)
    o, lse = attention_fwd(q, k, v, window=(20, 4))
    keep = _keep(150, 150, 0, 20, 4)
    ref = _sdpa(q, k, v, keep)
    assert (o.double() - ref).abs().max() <= 2 * (_sdpa(q, k, v, keep, torch.bfloat16) - ref).abs().max()
    o0, _ = attention_fwd(q, k, v, window=(0, 0))                     # only the diagonal: o = v
    assert torch.equal(o0, v)


def test_window_with_causal_and_flash_attention_spelling():
    assert band(10, 10, True, (5, -1), None) == (0, 5, 0)             # causal caps the right side at 0
    assert band(10, 30, False, (None, 3), "bottom_right") == (20, 40, 3)
    assert band(10, 10, False, None, None) is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(causal=True), r"N=8 != Nkv=16 .* name the alignment"),
    (dict(causal=True, align="middle"), r"align must be one of"),
    (dict(window=(3,)), r"window must be \(left, right\)"),
    (dict(window=(-2, 0)), r"window left must be an int >= 0"),
])
def test_mask_arguments_are_checked(kwargs, match):
    q, k, v = _inputs(1, 1, 1, 8, 16, 64, seed=0)
    with pytest.raises(ArgumentError, match=match):
        attention_fwd(q, k, v, **kwargs)
