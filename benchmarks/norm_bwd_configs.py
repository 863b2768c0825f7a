"""Layernorm backward configurations on this GPU (16384 x 4096 bf16, p = 0.1): the one-pass shape at several
row-tile heights, warps and numbers of row blocks, and the swept baseline; each checked against float64 at
p = 0 on a ragged shape, then timed with hk bench's two methods. Seeds `candidates` in
kernels/layernorm_bwd.py.

    python benchmarks/norm_bwd_configs.py --json norm_bwd_configs.json
"""
from __future__ import annotations

import argparse
import itertools

import torch


def configs(d: int) -> list[dict]:
    out = []
    for br, warps, blocks in itertools.product((1, 2), (4, 8, 16), (256, 512, 1024)):
        bc = -(-d // (256 * warps)) * 256 * warps
        if br * bc // (32 * warps) <= 32:
            out.append(dict(BR=br, BC=bc, ONE_PASS=True, num_warps=warps, ROW_BLOCKS=blocks))
    return out + [dict(BR=64, BC=64)]


def check(cfg: dict) -> float:
    from hk_portable.kernels.layernorm_bwd import dropout_residual_layernorm_bwd
    rows, d = 1100, 4096
    h, dy = (torch.randn(rows, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = torch.randn(d, device="cuda"), torch.randn(d, device="cuda")
    _, dres, dw, _ = dropout_residual_layernorm_bwd(dy, h, w, b, backend="cuda", **cfg)
    hd = h.double().requires_grad_()
    wd = w.double().requires_grad_()
    y = torch.nn.functional.layer_norm(hd, (d,), wd, b.double())
    gh, gw = torch.autograd.grad(y, (hd, wd), dy.double())
    return max(float((dres.double() - gh).abs().max() / gh.abs().max()),
               float((dw.double() - gw).abs().max() / gw.abs().max()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="norm_bwd_configs.json")
    ap.add_argument("--budget", type=float, default=0.3)
    args = ap.parse_args()
    from hk_portable.bench import time_fn, to_json
    from hk_portable.kernels.layernorm_bwd import dropout_residual_layernorm_bwd
    rows, d, p = 16384, 4096, 0.1
    sets = [tuple(torch.randn(rows, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)) for _ in range(4)]
    w, b = torch.randn(d, device="cuda"), torch.randn(d, device="cuda")
    nbytes = 4.0 * rows * d * 2
    results = []
    for cfg in configs(d):
        try:
            err = check(cfg)
            t = time_fn(lambda i: dropout_residual_layernorm_bwd(sets[i][1], sets[i][0], w, b, p=p, seed=i,
                                                                 backend="cuda", **cfg), len(sets), "cuda",
                        args.budget)
            gbs = nbytes / (t.ms * 1e-3) / 1e9
            results.append({"config": cfg, "ms": t.ms, "GB/s": gbs, "rel_err": err, "timing": t.__dict__})
            print(f"{str(cfg):90s} {t.ms:8.3f} ms {gbs:7.0f} GB/s  err {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001 - a refused configuration is a row of the table
            results.append({"config": cfg, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"{str(cfg):90s} refused: {type(e).__name__}: {str(e)[:120]}", flush=True)
    # the second step alone: the partial sums' column reduction over as many rows as blocks of the first
    from hk_portable.kernels.layernorm_bwd import norm_bwd_reduce_kernel
    reduce = []
    for part_rows, (br, bc) in itertools.product((256, 512, 1024), ((16, 128), (64, 32), (32, 64), (128, 32), (64, 64))):
        part = torch.randn(part_rows, d, device="cuda")
        out = torch.empty(d, device="cuda")
        fn = lambda i: norm_bwd_reduce_kernel(part, out, grid=(-(-d // bc),), BR=br, BC=bc)  # noqa: E731
        t = time_fn(fn, 1, "cuda", args.budget)
        err = float((out.double() - part.double().sum(0)).abs().max() / part.double().abs().sum(0).max())
        reduce.append({"part_rows": part_rows, "BR": br, "BC": bc, "ms": t.ms, "rel_err": err})
        print(f"reduce {part_rows:5d} rows BR={br:3d} BC={bc:3d} {t.ms * 1e3:8.1f} us  err {err:.1e}", flush=True)
    to_json({"shape": [rows, d], "p": p, "results": results, "reduce": reduce}, args.json)


if __name__ == "__main__":
    main()
