"""Where one transformers `generate` spends its time, hk attention against SDPA (the model of
benchmarks/generate_tokens.py): the host's top functions by own time (cProfile) and the GPU's kernels by time
(torch.profiler), one warmed-up generate each.

    python benchmarks/generate_profile.py [--batch 1] [--new 64] [--out generate_profile.txt]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

import torch

from generate_tokens import generate, model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from hk_portable.nn.huggingface import register
    register()
    report = io.StringIO()
    ids = torch.randint(3, 32000, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0)).cuda()
    for impl in ("hk", "sdpa"):
        m = model(impl, args.layers)
        generate(m, ids, args.new)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        generate(m, ids, args.new)
        torch.cuda.synchronize()
        prof.disable()
        print(f"\n===== {impl}: host, top functions by own time", file=report)
        pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(25)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            generate(m, ids, args.new)
            torch.cuda.synchronize()
        print(f"\n===== {impl}: GPU kernels", file=report)
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70), file=report)
        del m
        torch.cuda.empty_cache()
    text = report.getvalue()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text[-6000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
