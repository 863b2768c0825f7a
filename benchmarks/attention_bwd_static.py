"""The attention backward's kernels as a call on sm_90a builds them, without running (issue 36's static evidence):
the configuration the backend chooses, registers, spills, shared memory, threads, and how its products are issued
(wgmma or mma.sync in the PTX), at the Llama block's shape (B2, GQA 16/4, N4096, D128) and at D64.
Runs anywhere NVRTC does (compile-only target); on the device it shows what that machine's NVRTC builds.

    python benchmarks/attention_bwd_static.py [--arch sm_90a] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import re

import torch


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _figures(kernel, args, cfg, spec) -> dict:
    art = kernel.compile(*args, backend=spec, **cfg)
    r, ptx = art.resources, art.asm or ""
    return {"config": cfg, "registers": r["registers"], "spill_stores": r["spill_stores"],
            "stack_bytes": r["stack_bytes"], "shared_bytes": r["shared_bytes"], "threads": art.launch["threads"],
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
            "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
            "setmaxnreg": re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32 (\d+)", ptx),
            "nvrtc": art.options.get("nvrtc"), "passed_over": art.options.get("passed_over")}


def rows(arch: str) -> list[dict]:
    from hk_portable.kernels import attention_bwd as ab
    spec, out = f"cuda:{arch}", []
    for D, (B, Hq, Hkv) in ((128, (2, 16, 4)), (64, (4, 16, 16))):
        N = 4096
        q, k = _meta(B, Hq, N, D), _meta(B, Hkv, N, D)
        lse = _meta(B, Hq, N, dtype=torch.float32)
        dq_acc = _meta(B, Hq, N, D, dtype=torch.float32)
        args = (q, k, k, q, lse, lse, k, k, dq_acc, 1 / math.sqrt(D), 0, N, 0)
        for masked in (False, True):
            for deterministic in (False, True):
                cfg = ab.dkdv_config(args, masked, deterministic, backend=spec)
                a = args[:8] + ((dq_acc.transpose(-1, -2),) if cfg.get("DQ_T") else (dq_acc,)) + args[9:]
                row = {"kernel": "dkdv", "D": D, "masked": masked, "deterministic": deterministic,
                       **_figures(ab.attention_bwd_dkdv_kernel, a, cfg, spec)}
                out.append(row)
            dq_args = (q, k, k, q, lse, lse, q, 1 / math.sqrt(D), 0, N, 0)
            cfg = ab.dq_config(dq_args, masked, backend=spec)
            out.append({"kernel": "dq (deterministic)", "D": D, "masked": masked, "deterministic": True,
                        **_figures(ab.attention_bwd_dq_kernel, dq_args, cfg, spec)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    table = rows(args.arch)
    for r in table:
        c = r["config"]
        tiles = f"BM{c['BM']} BN{c['BN']} w{c.get('num_warps', 4)}" + (" DQ_T" if c.get("DQ_T") else "")
        print(f"attention_bwd_static: {r['kernel']:18} D{r['D']} {'causal' if r['masked'] else 'full  '} "
              f"{'det' if r['deterministic'] else 'atomic'}: {tiles:22} regs {r['registers']:3} spill {r['spill_stores']:3} "
              f"smem {r['shared_bytes']:6} threads {r['threads']} wgmma {r['wgmma']:3} mma.sync {r['mma_sync']:3} "
              f"setmaxnreg {r['setmaxnreg']} nvrtc {r['nvrtc']}" + (f" (passed over: {r['passed_over']})"
                                                                     if r["passed_over"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": args.arch, "rows": table}, f, indent=1, default=str)
    return 1 if any(r["spill_stores"] or r["stack_bytes"] for r in table) else 0


if __name__ == "__main__":
    raise SystemExit(main())
