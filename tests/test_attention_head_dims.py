"""Head dims other than 64 and 128 (issue 40 item 1): every multiple of 8 from 32 to 256 for q, k and v alike, run on
the kernel of the smallest tile head dim at least D (attention.TILE_HEAD_DIMS; columns past D read 0 and are dropped
on store, the scale 1/sqrt(D)) and, above 128, the backward's dK/dV in column parts (attention_bwd_wide.py).

Forward, backward, varlen and KV-cache at D in {32, 80, 96, 256}, small ragged lengths, causal and not, GQA, against
float64 with the checks of the tests of each entry point (FlashAttention's rule: at most twice torch's own bf16
error; the backward: the tolerance table's attention_bwd bounds), on the reference and on the emulated sm_80, gfx942
and gfx950 (one case each in the default run, the rest `slow`). Modules refuse other head dims at construction."""
from __future__ import annotations

import pytest
import torch

import hk_portable.nn.functional  # noqa: F401 - registers torch.ops.hk
from hk_portable.interface import ArgumentError
from hk_portable.kernels.attention import (HEAD_DIMS, TILE_HEAD_DIMS, attention_fwd, check_head_dim, config_for,
                                           tile_dim)
from hk_portable.kernels.attention_bwd import attention_bwd

from test_attention_bwd import _assert_within_table, _inputs as _bwd_inputs
from test_attention_kvcache import _check as _kvcache_check
from test_attention_masks import _keep, _sdpa
from test_attention_varlen import _check as _varlen_check, _cu, _grads_per_sequence, _inputs as _varlen_inputs

NEW = (32, 80, 96, 256)
EMULATED = ("cuda:sm_80:emulated", "hip:gfx942:emulated", "hip:gfx950:emulated")


def _skip_unless_runs(backend):
    if backend and backend.startswith("hip"):
        from hk_portable.backends.hip import emulator
        ok, why = emulator.available()
        if not ok:
            pytest.skip(f"hip emulator unavailable: {why}")


def _forward(B, Hq, Hkv, N, Nkv, D, causal, seed, backend=None):
    """attention_fwd on poisoned outputs against float64 SDPA with FlashAttention's rule; (q, k, v, o, lse)."""
    q, k, v, _ = _bwd_inputs(B, Hq, Hkv, N, Nkv, D, seed)
    align = "bottom_right" if causal and N != Nkv else None
    o, lse = torch.full_like(q, float("nan")), torch.full(q.shape[:3], float("nan"))
    attention_fwd(q, k, v, causal=causal, align=align, out=o, lse=lse, backend=backend)
    keep = _keep(N, Nkv, Nkv - N if align else 0, N + Nkv, 0 if causal else N + Nkv)
    ref = _sdpa(q, k, v, keep)
    torch_err = (_sdpa(q, k, v, keep, torch.bfloat16) - ref).abs().max()
    assert (o.double() - ref).abs().max() <= 2 * torch_err
    seen = keep.any(-1)
    assert torch.equal(torch.isneginf(lse), ~seen.expand_as(lse))
    return q, k, v, o, lse, align


def test_head_dims_and_their_tiles():
    assert HEAD_DIMS == tuple(range(32, 257, 8))
    assert [tile_dim(d) for d in (32, 64, 72, 80, 96, 128, 136, 200, 256)] == [64, 64, 128, 128, 128, 128, 256, 256,
                                                                              256]
    assert set(tile_dim(d) for d in HEAD_DIMS) == set(TILE_HEAD_DIMS)
    # D 64 and 128 keep their tiles
    assert config_for(64) == dict(D=64, BM=64, BN=64, STAGES=2)
    assert config_for(128) == dict(D=128, BM=64, BN=32, STAGES=2)
    for bad in (24, 36, 100, 264, 512, 64.0, True):
        with pytest.raises(ArgumentError, match=r"attention_fwd: head dim D must be a multiple of 8 from 32 to 256"):
            check_head_dim("attention_fwd", bad)


@pytest.mark.parametrize("D", NEW)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_and_backward_match_float64_on_the_reference(D, causal):
    # GQA 2:1, ragged lengths, N != Nkv (bottom-right causal): query rows past Nkv's reach see no key
    B, Hq, Hkv, N, Nkv = 1, 4, 2, 77, 130 if causal else 101
    q, k, v, o, lse, align = _forward(B, Hq, Hkv, N, Nkv, D, causal, seed=D + causal)
    do = _bwd_inputs(B, Hq, Hkv, N, Nkv, D, seed=D + 7)[3]
    for deterministic in (False, True):
        nan = lambda t: torch.full_like(t, float("nan"))  # noqa: E731 - poisoned: every element is written
        out = attention_bwd(q, k, v, o, lse, do, causal=causal, align=align, deterministic=deterministic,
                            dq=nan(q), dk=nan(k), dv=nan(v))
        _assert_within_table(out, q, k, v, do, causal, align)


def test_every_head_dim_runs_forward_and_backward_on_the_reference():
    """Each of the 29 head dims, one small causal GQA case (fwd against float64 SDPA, bwd against the table)."""
    for D in HEAD_DIMS:
        q, k, v, o, lse, align = _forward(1, 2, 1, 40, 40, D, True, seed=D)
        do = _bwd_inputs(1, 2, 1, 40, 40, D, seed=D + 1)[3]
        _assert_within_table(attention_bwd(q, k, v, o, lse, do, causal=True), q, k, v, do, True, None)


# (backend, D, causal, deterministic): the default run takes one case per emulated target, the rest are `slow`
EMULATED_CASES = [("cuda:sm_80:emulated", 80, True, False), ("hip:gfx942:emulated", 256, True, False),
                  ("hip:gfx950:emulated", 96, False, True)]
EMULATED_SLOW = [(b, D, c, det) for b in EMULATED for D in NEW for c, det in ((True, False), (False, True))
                 if (b, D, c, det) not in EMULATED_CASES and not (b.endswith("gfx950:emulated") and D in (32, 80))]


@pytest.mark.parametrize("backend,D,causal,deterministic",
                         EMULATED_CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in EMULATED_SLOW],
                         ids=lambda x: str(x))
def test_forward_and_backward_on_emulated_targets(backend, D, causal, deterministic):
    _skip_unless_runs(backend)
    B, Hq, Hkv, N, Nkv = 1, 4, 2, 70, 45 if not causal else 70
    q, k, v, o, lse, align = _forward(B, Hq, Hkv, N, Nkv, D, causal, seed=D, backend=backend)
    do = _bwd_inputs(B, Hq, Hkv, N, Nkv, D, seed=D + 3)[3]
    out = attention_bwd(q, k, v, o, lse, do, causal=causal, align=align, deterministic=deterministic, backend=backend)
    _assert_within_table(out, q, k, v, do, causal, align)


# sm_90a's choices run through the same kernel bodies on the emulated sm_80: at D=80 (tile 128) the dK/dV block of
# 128 keys with dQ added transposed (DQ_T: the accumulator's [B, Hq, D, N] view, rows past D dropped); at D=256 the
# forward's 128-row block on two warpgroups
@pytest.mark.slow
def test_sm90a_configurations_at_new_head_dims_on_emulated_sm80():
    backend = "cuda:sm_80:emulated"
    q, k, v, o, lse, _ = _forward(1, 4, 2, 150, 150, 80, True, seed=5)
    do = _bwd_inputs(1, 4, 2, 150, 150, 80, seed=6)[3]
    cfg = dict(D=128, BM=64, BN=128, STAGES=2, num_warps=8, DQ_T=True)
    _assert_within_table(attention_bwd(q, k, v, o, lse, do, causal=True, backend=backend, config=cfg),
                         q, k, v, do, True, None)
    q, k, v, _ = _bwd_inputs(1, 2, 1, 140, 140, 256, seed=7)
    # one stage: two (192 KiB) are over sm_80's shared memory; the same body and block as sm_90a's
    o, _ = attention_fwd(q, k, v, causal=True, backend=backend, D=256, BM=128, BN=64, STAGES=1, num_warps=8)
    keep = _keep(140, 140, 0, 280, 0)
    ref = _sdpa(q, k, v, keep)
    assert (o.double() - ref).abs().max() <= 2 * (_sdpa(q, k, v, keep, torch.bfloat16) - ref).abs().max()


@pytest.mark.parametrize("D", NEW)
def test_varlen_forward_and_backward(D):
    from hk_portable.kernels.attention_varlen import attention_varlen, attention_varlen_bwd
    lq, lk = [37, 0, 64, 1, 20], [50, 5, 64, 30, 17]
    _varlen_check(lq, lk, D=D, causal=True, align="bottom_right", seed=D)
    q, k, v = _varlen_inputs(lq, lk, 4, 2, D, seed=D + 1)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(D)).to(torch.bfloat16)
    cq, ck = _cu(lq), _cu(lk)
    o, lse = attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=True, align="bottom_right")
    got = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    attention_varlen_bwd(q, k, v, o, lse, do, cq, ck, max(lq), max(lk), causal=True, align="bottom_right",
                         dq=got[0], dk=got[1], dv=got[2])
    ref = _grads_per_sequence(q, k, v, do, lq, lk, True, None, "bottom_right", torch.float64)
    ours = _grads_per_sequence(q, k, v, do, lq, lk, True, None, "bottom_right", torch.bfloat16)
    for name, a, r, t in zip(("dq", "dk", "dv"), got, ref, ours):
        assert (a.double() - r).abs().max() <= 2 * (t - r).abs().max() + 1e-4, name     # FlashAttention's rule


@pytest.mark.parametrize("D", NEW)
def test_kvcache_decode_and_prefill(D):
    _kvcache_check([77, 40, 0], 1, D=D, causal=True, seed=D)              # decode, paged (pages of 16), split-KV
    _kvcache_check([90, 33], 20, D=D, page=None, causal=True, seed=D + 1)  # prefill against a contiguous cache


@pytest.mark.parametrize("backend,D", [("cuda:sm_80:emulated", 256),
                                       pytest.param("hip:gfx942:emulated", 80, marks=pytest.mark.slow),
                                       pytest.param("hip:gfx942:emulated", 256, marks=pytest.mark.slow),
                                       pytest.param("cuda:sm_80:emulated", 96, marks=pytest.mark.slow)])
def test_serving_paths_on_emulated_targets(backend, D):
    _skip_unless_runs(backend)
    _varlen_check([37, 1, 20], [50, 30, 17], D=D, causal=True, align="bottom_right", seed=D, backend=backend)
    _kvcache_check([77, 40], 1, D=D, causal=True, seed=D, backend=backend)
    _kvcache_check([50], 20, D=D, causal=True, seed=D + 1, backend=backend)


def test_modules_check_head_dims_at_construction():
    import hk_portable.nn as hnn
    from hk_portable.nn.blocks import LlamaBlock
    hnn.Attention(embed_dim=128, num_heads=4)                              # head dim 32
    hnn.Attention(embed_dim=320, num_heads=4, num_kv_heads=2)              # 80
    with pytest.raises(ArgumentError, match=r"hnn.Attention: the head dim \(embed_dim / num_heads = 100 / 4\) "
                                            r"must be a multiple of 8 from 32 to 256, got 25"):
        hnn.Attention(embed_dim=100, num_heads=4)
    with pytest.raises(ArgumentError, match=r"got 512"):
        hnn.Attention(embed_dim=1024, num_heads=2)
    with pytest.raises(ArgumentError, match=r"hnn.Attention: with rotary, the head dim \(embed_dim / num_heads = "
                                            r"320 / 4\) must be a rotary head dim, one of \(32, 64, 128, 256\), got 80"):
        hnn.Attention(embed_dim=320, num_heads=4, rotary=True)
    with pytest.raises(ArgumentError, match=r"LlamaBlock: the head dim \(dim / num_heads = 96 / 4\)"):
        LlamaBlock(dim=96, num_heads=4, num_kv_heads=2, ffn_dim=64)
    LlamaBlock(dim=96, num_heads=4, num_kv_heads=2, ffn_dim=64, impl="torch")   # torch's attention: any head dim
    with pytest.raises(ArgumentError, match=r"hnn.Rotary: 'dim' must be a rotary head dim"):
        hnn.Rotary(80)


def test_a_module_with_head_dim_80_trains():
    """hnn.Attention at head dim 80 (Phi's): forward against torch SDPA, and gradients flow to every weight."""
    import hk_portable.nn as hnn
    torch.manual_seed(0)
    attn = hnn.Attention(embed_dim=160, num_heads=2, num_kv_heads=1).to(torch.bfloat16)
    x = torch.randn(2, 45, 160, dtype=torch.bfloat16, requires_grad=True)
    y = attn(x)
    B, N, _ = x.shape
    q = attn.q_proj(x).view(B, N, 2, 80).transpose(1, 2)
    k = attn.k_proj(x).view(B, N, 1, 80).transpose(1, 2)
    v = attn.v_proj(x).view(B, N, 1, 80).transpose(1, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                                           enable_gqa=True)
    ref = attn.o_proj(ref.transpose(1, 2).reshape(B, N, 160).to(torch.bfloat16))
    assert (y.double() - ref.double()).abs().max() < 0.05
    y.float().square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())
    assert torch.isfinite(x.grad).all()


# different head dims for q/k and v (DeepSeek's MLA prefill: 192/128): one tile head dim for both, v's columns past
# Dv read 0 and o's, dv's stores drop them; the scale is q's 1/sqrt(D)
VALUE_DIMS = [("reference", 192, 128, True), ("reference", 64, 128, False), ("reference", 128, 40, True),
              ("cuda:sm_80:emulated", 96, 64, True), ("hip:gfx942:emulated", 64, 128, False),
              pytest.param("hip:gfx950:emulated", 192, 128, True, marks=pytest.mark.slow),
              pytest.param("cuda:sm_80:emulated", 192, 128, False, marks=pytest.mark.slow)]


@pytest.mark.parametrize("backend,D,Dv,causal", VALUE_DIMS, ids=lambda x: str(x))
def test_value_head_dim_differs_forward_and_backward(backend, D, Dv, causal):
    """hk::attention and its backward (the op's autograd) with v's head dim != q's, against float64 SDPA (which
    takes them): the forward by FlashAttention's rule, the gradients by the tolerance table."""
    _skip_unless_runs(backend)
    B, Hq, Hkv, N, Nkv = 1, 4, 2, 70, 70 if causal else 45
    q, k, _, _ = _bwd_inputs(B, Hq, Hkv, N, Nkv, D, seed=D + Dv)
    _, _, v, do = _bwd_inputs(B, Hq, Hkv, N, Nkv, Dv, seed=D * Dv)
    o, lse = torch.full((B, Hq, N, Dv), float("nan"), dtype=q.dtype), torch.full((B, Hq, N), float("nan"))
    attention_fwd(q, k, v, causal=causal, out=o, lse=lse, backend=backend)
    keep = _keep(N, Nkv, 0, N + Nkv, 0 if causal else N + Nkv)
    ref = _sdpa(q, k, v, keep)
    assert ref.shape == o.shape
    assert (o.double() - ref).abs().max() <= 2 * (_sdpa(q, k, v, keep, torch.bfloat16) - ref).abs().max()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    o2, _ = torch.ops.hk.attention(qg, kg, vg, causal, None, None, None, backend)
    assert torch.equal(o2.detach(), o)
    o2.backward(do)
    _assert_within_table((qg.grad, kg.grad, vg.grad), q, k, v, do, causal, None)


def test_value_head_dim_is_checked_by_name():
    q, k = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="v's head dim must be a multiple of 8"):
        attention_fwd(q, k, torch.zeros(1, 2, 8, 36, dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match=r"must agree in \[B, Hkv, Nkv\]"):
        attention_fwd(q, k, torch.zeros(1, 2, 9, 128, dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match="'out' must be"):
        attention_fwd(q, k, torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16), out=torch.empty_like(q))


@pytest.mark.parametrize("dv", [64, 128])
def test_op_outputs_follow_q_layout_in_real_and_fake(dv):
    """hk::attention's o takes q's memory layout (a [B, N, H, D] block's transposed view), with v's head dim: the
    fake kernel agrees with the real one (torch.compile asserts it; a contiguous o broke a compiled block once)."""
    q = torch.randn(2, 16, 2, 64, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 2, 16, 64, dtype=torch.bfloat16)
    v = torch.randn(2, 2, 16, dv, dtype=torch.bfloat16)
    o, _ = torch.ops.hk.attention(q, k, v, True, None, None, None, "reference")
    assert o.shape == (2, 2, 16, dv) and o.stride()[1:3] == (dv, 2 * dv)
    torch.library.opcheck(torch.ops.hk.attention.default, (q, k, v, True, None, None, None, "reference"))
