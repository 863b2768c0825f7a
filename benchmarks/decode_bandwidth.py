"""Decode against a paged KV cache on this GPU: hk attention_kvcache (split-KV + combine) at batch 64, one query
per sequence, GQA 32/8, D 128, bf16, pages of 16 and 256 tokens (and a contiguous cache), cache lengths from 1 to
32768 (every sequence one length, then lengths drawn uniformly from [1, 32768]). Each configuration is checked
against float64 math on sampled sequences (FlashAttention's rule: at most twice torch's own bf16 error), then
timed with hk bench's two methods. Bandwidth = bytes of K and V the lengths cover (plus q and o) / time, next
to the device's copy bandwidth (read + write of 1 GiB).

    python benchmarks/decode_bandwidth.py --json decode_bandwidth.json [--splits 1,2,4,8] [--configs JSON]

Configurations: the wrapper's default (16-row blocks of one warp, two stages of 32-key tiles at D128: what fits
every target) and "wide" (64-row blocks of four warps, three stages of 64-key tiles: TMA + wgmma on sm_90a, too
much shared memory for gfx942), key tiles never longer than a page.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

B, HQ, HKV, D = 64, 32, 8, 128
LENGTHS = (1, 128, 1024, 4096, 16384, 32768)
CONFIGS = {"default": {}, "wide": dict(BM=64, BN=64, STAGES=3, num_warps=4)}


def make_cache(lens, page, device, gen):
    """(k_cache, v_cache, block_table or None) holding every sequence's keys, pages in a shuffled order."""
    cap = max(lens)
    if page is None:
        shape, table = (B, cap, HKV, D), None
    else:
        per = -(-cap // page)
        table = torch.randperm(B * per, generator=gen).view(B, per).to(torch.int32).to(device)
        shape = (B * per, page, HKV, D)
    kc = torch.randn(shape, device=device, dtype=torch.bfloat16)
    vc = torch.randn(shape, device=device, dtype=torch.bfloat16)
    return kc, vc, table


def check(q, kc, vc, lens_t, table, out) -> tuple[float, float]:
    """(max error, torch's own bf16 error) against float64 on three sequences."""
    g = HQ // HKV
    err = torch_err = 0.0
    for b in (0, B // 2, B - 1):
        L = int(lens_t[b])
        if table is None:
            kb, vb = kc[b, :L], vc[b, :L]
        else:
            pages = table[b, :-(-L // kc.shape[1])].long()
            kb, vb = (c[pages].reshape(-1, HKV, D)[:L] for c in (kc, vc))
        kd, vd = (t.permute(1, 0, 2).repeat_interleave(g, 0) for t in (kb, vb))
        qb = q[b].permute(1, 0, 2)
        ref = torch.nn.functional.scaled_dot_product_attention(qb.double(), kd.double(), vd.double())
        mine = torch.nn.functional.scaled_dot_product_attention(qb, kd, vd)
        err = max(err, float((out[b].permute(1, 0, 2).double() - ref).abs().max()))
        torch_err = max(torch_err, float((mine.double() - ref).abs().max()))
    return err, torch_err


def copy_bandwidth(budget: float) -> float:
    from hk_portable.bench import time_fn
    n = (1 << 30) // 4
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    t = time_fn(lambda i: dst.copy_(src), 1, "cuda", budget)
    return 2.0 * n * 4 / t.ms / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="decode_bandwidth.json")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--splits", default="", help="comma list of num_splits to time besides the automatic choice")
    ap.add_argument("--configs", default=None, help='JSON {name: config}, e.g. {"wide": {"BM": 64, "BN": 64, '
                    '"STAGES": 3, "num_warps": 4}}; default: the wrapper\'s and "wide"')
    args = ap.parse_args()
    from hk_portable.bench import time_fn
    from hk_portable.kernels.attention_kvcache import attention_kvcache
    gen = torch.Generator().manual_seed(0)
    copy_gbs = copy_bandwidth(args.budget)
    print(f"device copy bandwidth: {copy_gbs:.0f} GB/s ({torch.cuda.get_device_name()})", flush=True)
    rows, t0 = [], time.time()
    splits_list = [None] + [int(s) for s in args.splits.split(",") if s]
    configs = json.loads(args.configs) if args.configs else CONFIGS
    dists = [("uniform", L) for L in LENGTHS] + [("random", 32768)]
    for page in (16, 256, None):
        for dist, L in dists:
            lens = [L] * B if dist == "uniform" else torch.randint(1, L + 1, (B,), generator=gen).tolist()
            kc, vc, table = make_cache(lens, page, "cuda", gen)
            lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
            q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(q)
            nbytes = sum(lens) * HKV * D * 2 * 2 + 2 * q.numel() * 2
            for (name, config), splits in ((c, sp) for c in configs.items() for sp in splits_list):
                cfg = dict(config)
                if page and "BN" in cfg:
                    cfg["BN"] = min(cfg["BN"], page)          # a key tile lies inside one page
                row = dict(page=page or "contiguous", lengths=dist, max_len=L, config=name, splits=splits or "auto",
                           kv_bytes=nbytes, copy_gbs=round(copy_gbs))

                def call(i=0):
                    return attention_kvcache(q, kc, vc, lens_t, table, num_splits=splits, out=out, backend="cuda",
                                             **cfg)
                try:
                    out.fill_(float("nan"))
                    call()
                    err, terr = check(q, kc, vc, lens_t, table, out)
                    row.update(max_err=err, torch_bf16_err=terr, fa_rule=bool(err <= 2 * terr + 1e-6))
                    t = time_fn(call, 1, "cuda", args.budget)
                    gbs = nbytes / t.ms / 1e6
                    row.update(ms=round(t.ms, 4), ms_batch=round(t.ms_batch, 4), gbs=round(gbs),
                               fraction_of_copy=round(gbs / copy_gbs, 3), agree=bool(t.agree))
                except Exception as e:  # noqa: BLE001 - a failing configuration is a result
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
            del kc, vc
            torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), copy_gbs=copy_gbs, B=B, Hq=HQ, Hkv=HKV, D=D,
                       seconds=round(time.time() - t0, 1), rows=rows), f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
