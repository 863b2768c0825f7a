"""Side-by-side kernel benchmarks on one GPU (a thin wrapper over `hk bench`; see hk_portable/bench.py for
the method: rotating inputs, two timing methods that must agree, a scaling check, errors vs float64).

    python benchmarks/bench_kernels.py --backend cuda --json out.json --plot out [--quick]
"""
from hk_portable.cli import main

if __name__ == "__main__":
    import sys
    raise SystemExit(main(["bench", *sys.argv[1:]]))
