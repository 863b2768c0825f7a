"""Attention forward tile configurations on this GPU: each checked against float64 on ragged masked shapes,
then timed against SDPA (cuDNN) at H16, B*N = 16384 tokens (N from --n, B4 N4096 by default) with hk bench's
two timing methods. Seeds the candidate
order in kernels/attention.py (CONFIGS) and checks what each lowers to on sm_90a.

    python benchmarks/attention_configs.py --json attention_configs.json
"""
from __future__ import annotations

import argparse
import time

import torch


def _cfg(bm, bn, stages, warps):
    return dict(BM=bm, BN=bn, STAGES=stages, num_warps=warps)


# per head dim: the portable baseline, the 8-warp warp-specialised tiles, and at D=64 FA3's 192-row block
# (three consumer warpgroups)
CONFIGS = {64: [_cfg(64, 64, 2, 4), _cfg(128, 64, 2, 8), _cfg(128, 128, 2, 8), _cfg(192, 64, 2, 12),
                _cfg(192, 128, 2, 12), _cfg(128, 128, 3, 8)],
           128: [_cfg(64, 32, 2, 4), _cfg(128, 64, 2, 8), _cfg(128, 128, 2, 8), _cfg(128, 64, 3, 8),
                 _cfg(128, 128, 3, 8)]}


def _name(cfg) -> str:
    return f"{cfg['BM']}x{cfg['BN']}s{cfg['STAGES']}w{cfg['num_warps']}"


def _parse(name: str) -> dict:
    """The config a BMxBNsSwW name spells (any tile, listed in CONFIGS or not)."""
    bm, rest = name.split("x")
    bn, rest = rest.split("s")
    stages, warps = rest.split("w")
    return _cfg(int(bm), int(bn), int(stages), int(warps))


def check(cfg, d) -> float:
    from hk_portable.kernels import attention
    worst = 0.0
    for (B, hq, hkv, n, nkv, causal, align) in ((1, 2, 1, 77, 77, True, None), (2, 4, 2, 130, 200, True, "bottom_right"),
                                               (1, 2, 2, 300, 300, False, None)):
        q = torch.randn(B, hq, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, hkv, nkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = torch.full_like(q, float("nan"))
        attention.attention_fwd(q, k, v, causal=causal, align=align, out=out, backend="cuda", **cfg)
        ref, _ = attention.reference(q, k, v, causal=causal, align=align)
        worst = max(worst, float((out.double() - ref).abs().max() / ref.abs().max()))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="attention_configs.json")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--n", type=int, nargs="+", default=[4096], help="sequence lengths (B * N = 16384 tokens)")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims")
    ap.add_argument("--causal", choices=("both", "only", "no"), default="both")
    ap.add_argument("--only", nargs="+", default=None, metavar="BMxBNsSwW",
                    help="only these configs (listed or not), e.g. 128x128s2w8 128x176s2w8")
    args = ap.parse_args()
    from hk_portable.bench import time_side_by_side, to_json
    from hk_portable.kernels import attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows, t0 = [], time.time()
    H = 16
    for N, d in ((n, d) for n in args.n for d in args.d):
        B = 16384 // N
        qs = [[torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(2)]
        for causal in {"both": (False, True), "only": (True,), "no": (False,)}[args.causal]:
            fl = 4.0 * B * H * N * N * d / (2 if causal else 1)
            def cudnn(i):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(*qs[i], is_causal=causal)
            for cfg in CONFIGS[d] if args.only is None else [_parse(c) for c in args.only]:
                row = dict(cfg, N=N, D=d, causal=causal)
                try:
                    row["max_rel_err"] = check(cfg, d)
                    out = torch.empty_like(qs[0][0])
                    t, tb = time_side_by_side(      # each config beside its own cuDNN timing (interleaved rounds)
                        {"hk": lambda i: attention.attention_fwd(*qs[i], causal=causal, out=out, backend="cuda", **cfg),
                         "cudnn": cudnn}, 2, "cuda", args.budget).values()
                    row.update(tflops=round(fl / t.ms / 1e9, 1), sdpa_tflops=round(fl / tb.ms / 1e9, 1),
                               ratio=round(tb.ms / t.ms, 3), agree=bool(t.agree and tb.agree))
                except Exception as e:  # noqa: BLE001 - a refused config is a result
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                print(row, flush=True)
    to_json({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(),
             "seconds": round(time.time() - t0, 1), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
