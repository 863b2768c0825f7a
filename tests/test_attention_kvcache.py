"""Attention against a KV cache (flash_attn_with_kvcache's layouts): paged (block tables, pages of 16 and
256 tokens) and contiguous caches, decode (Nq 1..16) with split-KV and the combine kernel, prefill against
a cache, GQA; checked per sequence against float64 torch math with FlashAttention's rule (at most twice
torch's own bf16 error), on poisoned outputs.

HK_SERVING_TEST_DEVICE=cuda runs the kernels on the GPU (the references stay float64 on the CPU)."""
from __future__ import annotations

import os

import pytest
import torch

from hk_portable.conformance.kernel_cases import cached_sequence
from hk_portable.interface import ArgumentError
from hk_portable.kernels.attention_kvcache import attention_kvcache, kvcache_reference

F = torch.nn.functional
DEV = os.environ.get("HK_SERVING_TEST_DEVICE", "cpu")


def _cache(lens, Nq, Hq, Hkv, D, page, seed):
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    if page:
        max_pages = max(1, -(-max(lens) // page)) + 1
        num_pages = B * max_pages + 5
        table = torch.randperm(num_pages, generator=g)[:B * max_pages].view(B, max_pages).to(torch.int32)
        shape = (num_pages, page, Hkv, D)
    else:
        table, shape = None, (B, max(lens) + 9, Hkv, D)
    kc, vc = (torch.randn(shape, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(B, Nq, Hq, D, generator=g).to(torch.bfloat16)
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32), table


def _torch_bf16(q, kc, vc, lens, table, causal):
    """torch's own computation in bf16 (SDPA with an explicit mask), one sequence at a time."""
    B, Nq, Hq, D = q.shape
    g = Hq // kc.shape[2]
    o = torch.zeros(q.shape, dtype=torch.float64)
    for b, L in enumerate(lens.tolist()):
        if L == 0:
            continue
        kb, vb = cached_sequence(kc, vc, table, b, L)
        keep = torch.ones(Nq, L, dtype=torch.bool)
        if causal:
            keep = torch.arange(L).view(1, -1) <= torch.arange(Nq).view(-1, 1) + (L - Nq)
        kd, vd = (t.permute(1, 0, 2).repeat_interleave(g, 0) for t in (kb, vb))
        ob = F.scaled_dot_product_attention(q[b].permute(1, 0, 2), kd, vd, attn_mask=keep)
        o[b] = torch.where(keep.any(-1, keepdim=True), ob, 0.0).nan_to_num(0.0).permute(1, 0, 2).double()
    return o


def _check(lens, Nq, Hq=8, Hkv=2, D=64, page=16, causal=False, splits=None, seed=0, backend=None):
    q, kc, vc, lens_t, table = _cache(lens, Nq, Hq, Hkv, D, page, seed)
    o = torch.full_like(q, float("nan"), device=DEV)
    lse = torch.full((len(lens), Hq, Nq), float("nan"), device=DEV)
    attention_kvcache(q.to(DEV), kc.to(DEV), vc.to(DEV), lens_t.to(DEV), None if table is None else table.to(DEV),
                      causal=causal, num_splits=splits, out=o, lse=lse, backend=backend)
    o, lse = o.cpu(), lse.cpu()
    ref, ref_lse = kvcache_reference(q, kc, vc, lens_t, table, causal=causal)
    torch_err = (_torch_bf16(q, kc, vc, lens_t, table, causal) - ref).abs().max()
    err = (o.double() - ref).abs().max()
    assert err <= 2 * torch_err + 1e-6, (err, torch_err)            # FlashAttention's rule
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), ~seen)
    assert (o.permute(0, 2, 1, 3)[~seen] == 0).all()
    if seen.any():
        assert (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-3
    return o, lse


LENS = [1, 17, 300, 0, 1023, 64]


@pytest.mark.parametrize("page", [16, 256, None])
def test_decode_one_query_paged_and_contiguous(page):
    _check(LENS, 1, D=128, page=page, seed=1)


@pytest.mark.parametrize("Nq", [2, 5, 16])
def test_decode_several_queries_causal(Nq):
    _check(LENS, Nq, page=16, causal=True, splits=3, seed=Nq)


@pytest.mark.parametrize("splits", [1, 2, 7, 40])
def test_split_kv_gives_the_same_attention(splits):
    """40 splits of a 1023-key cache in 64-key tiles leaves most splits empty: lse -inf, weight 0."""
    _check([1023, 5], 1, Hq=32, Hkv=8, D=64, page=64, splits=splits, seed=splits)


def test_prefill_against_a_paged_cache():
    _check([130, 300], 100, Hq=4, Hkv=2, D=64, page=32, causal=True, seed=7)


# FlashAttention's seqlen grid as (queries, cache length) of paged prefill (bottom-right causal, the cache
# convention; 512 x 256 leaves rows that see no key)
FA_GRID = [(113, 203), (128, 217), (108, 256), (512, 256), (1, 1023)]


@pytest.mark.parametrize("Nq,L", FA_GRID)
@pytest.mark.parametrize("page", [16, 256])
def test_paged_prefill_on_flash_attentions_grid(Nq, L, page):
    _check([L, max(1, L // 3)], Nq, Hq=4, Hkv=2, D=64, page=page, causal=True, seed=Nq + L + page)


def test_a_row_before_every_key_is_empty():
    """causal with Nq > L: query n sees keys j <= L - Nq + n, none for the first rows."""
    o, lse = _check([3, 20], 8, page=16, causal=True, seed=8)
    assert torch.isneginf(lse[0, :, :5]).all() and (o[0, :5] == 0).all()


def test_mqa_decode():
    _check([200, 77], 1, Hq=16, Hkv=1, D=128, page=16, seed=9)


def test_named_errors():
    q, kc, vc, lens, table = _cache([5, 40], 1, 4, 2, 64, 16, 0)

    def call(**kw):
        pos = [kw.pop(n, d) for n, d in (("q", q), ("kc", kc), ("vc", vc), ("lens", lens), ("table", table))]
        return attention_kvcache(*pos, **kw)

    with pytest.raises(ArgumentError, match="'q' must be a 4-D"):
        call(q=q[0])
    with pytest.raises(ArgumentError, match="cache_seqlens"):
        call(lens=lens.long())
    with pytest.raises(ArgumentError, match="block_table"):
        call(table=table.long())
    with pytest.raises(ArgumentError, match="capacity"):
        call(lens=torch.tensor([5, 10_000], dtype=torch.int32))
    with pytest.raises(ArgumentError, match="multiple of 16"):
        call(kc=kc[:, :8], vc=vc[:, :8])
    with pytest.raises(ArgumentError, match="num_splits"):
        call(num_splits=0)
    with pytest.raises(ArgumentError, match="contiguous cache"):
        call(table=None, kc=kc[:3], vc=vc[:3])
    with pytest.raises(ArgumentError, match="multiple of key/value heads"):
        call(q=torch.zeros(2, 1, 3, 64, dtype=torch.bfloat16))


def test_the_splits_fill_the_devices_compute_units():
    """num_splits=None: BLOCKS_PER_UNIT blocks per compute unit of the tensors' device (hk.compute_units: SMs or
    CUs, from torch; a CPU tensor's work is split as on a 132-unit GPU), at most one split per TILES_PER_SPLIT key
    tiles."""
    import hk_portable as hk
    from hk_portable.kernels.attention_kvcache import BLOCKS_PER_UNIT, TILES_PER_SPLIT, _splits
    from hk_portable.runtime.devices import MODELLED_UNITS
    assert hk.compute_units(torch.device("cpu")) == MODELLED_UNITS
    for units in (132, 304):                                    # H100, MI300X
        assert _splits(4, 1 << 20, 32, units) == -(-BLOCKS_PER_UNIT * units // 4)
    assert _splits(4, 4096, 32, 132) == 4096 // (TILES_PER_SPLIT * 32)     # capped by the capacity
    assert _splits(2 * BLOCKS_PER_UNIT * 132, 1 << 20, 32, 132) == 1
