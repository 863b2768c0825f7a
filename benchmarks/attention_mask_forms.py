"""One causal mask in two forms, side by side in one process: `causal=True` (the kernel's LEFT_BOUND const False: no
left compare in the edge blocks) against a window whose left side reaches every key (`window=(2N-1, 0)`: LEFT_BOUND
True, the compare kept). Both are checked against float64 first; then timed with SDPA (cuDNN) in interleaved rounds
(hk bench's method). `--config BMxBNsSwW` times that tile instead of the library's choice.

    python benchmarks/attention_mask_forms.py --cases 1024,128 1024,64 4096,128 --json attention_mask_forms.json
"""
from __future__ import annotations

import argparse
import json

import torch

from attention_configs import _parse as tile_config     # this folder is on sys.path when run as a script

H, TOKENS = 16, 16384


def main():
    from hk_portable.bench import time_side_by_side
    from hk_portable.kernels import attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["1024,128", "1024,64", "4096,128"], help="N,D each")
    ap.add_argument("--config", type=tile_config, default={}, metavar="BMxBNsSwW")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default="attention_mask_forms.json")
    args = ap.parse_args()
    rows = []
    for case in args.cases:
        n, d = (int(x) for x in case.split(","))
        b = TOKENS // n
        sets = [[torch.randn(b, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(2)]
        forms = {"causal": dict(causal=True), "window": dict(window=(2 * n - 1, 0))}
        ref, _ = attention.reference(*(x[:1] for x in sets[0]), causal=True)
        row = {"N": n, "D": d, "config": args.config or "library"}
        for name, kw in forms.items():
            o, _ = attention.attention_fwd(*sets[0], **kw, **args.config)
            row[f"{name}_err"] = float((o[:1].double() - ref).abs().max() / ref.abs().max())
        del ref

        def cudnn(i):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(*sets[i], is_causal=True)
        fns = {name: (lambda i, kw=kw: attention.attention_fwd(*sets[i], **kw, **args.config)) for name, kw in forms.items()}
        timed = time_side_by_side({**fns, "cudnn": cudnn}, 2, "cuda", 0.1 * args.rounds, rounds=args.rounds)
        flops = 2.0 * b * H * n * n * d
        for name, t in timed.items():
            row[name] = {"tflops": round(flops / t.ms / 1e9, 1), "vs_cudnn": round(timed["cudnn"].ms / t.ms, 3),
                         "spread": round(t.spread, 3), "agree": t.agree}
        rows.append(row)
        print(json.dumps(row), flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
