"""Where a kernel's warps spend their time, by how often each instruction ran: Nsight Compute's per-instruction
stall samples (`ncu --section SourceCounters ...`, then `ncu --import R.ncu-rep --page source --csv
--print-source sass > src.csv`) grouped by execution count. In a tiled kernel the count says which part an
instruction belongs to: once per warp and block (prologue, epilogue, a loop's single edge step), once per loop
step, the producer's; so the share of samples per count is the share of time per part.

    python benchmarks/ncu_regions.py src.csv [--top 8] [--runs 16384]

--runs N also lists the contiguous runs of instructions executed N times with their share and top stall.
"""
from __future__ import annotations

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernels(path: str):
    """[(name, [row dict per SASS instruction])] for each profiled launch in the CSV."""
    out, rows, header, name = [], None, None, None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                rows, name = [], row[1]
                out.append((name, rows))
            elif row[0] == "Address":
                header = row
            elif rows is not None and header:
                rows.append(dict(zip(header, row)))
    return out


def num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def stalls(row: dict) -> collections.Counter:
    return collections.Counter({k[6:]: num(v) for k, v in row.items() if k.startswith("stall_") and "Not Issued" not in k})


def by_count(rows: list[dict]) -> list[tuple[float, float, collections.Counter]]:
    """[(execution count, share of samples, stall reasons)] largest share first."""
    total = sum(num(r[SAMPLES]) for r in rows) or 1.0
    share, why = collections.Counter(), collections.defaultdict(collections.Counter)
    for r in rows:
        e, s = num(r[EXECUTED]), num(r[SAMPLES])
        if s:
            share[e] += s / total
            why[e] += stalls(r)
    return [(e, s, why[e]) for e, s in share.most_common()]


def runs(rows: list[dict], count: float, gap: int = 3):
    """Contiguous runs (within `gap` instructions) of instructions executed `count` times: (first, last, share, rows)."""
    total = sum(num(r[SAMPLES]) for r in rows) or 1.0
    out = []
    for i, r in enumerate(rows):
        if num(r[EXECUTED]) != count:
            continue
        if out and i - out[-1][1] <= gap:
            out[-1][1] = i
            out[-1][2] += num(r[SAMPLES]) / total
            out[-1][3].append(r)
        else:
            out.append([i, i, num(r[SAMPLES]) / total, [r]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--runs", type=float, default=None)
    args = ap.parse_args()
    for k, (name, rows) in enumerate(kernels(args.csv)):
        print(f"launch {k}: {name}, {len(rows)} instructions, {sum(num(r[SAMPLES]) for r in rows):.0f} samples")
        for e, s, why in by_count(rows)[:args.top]:
            print(f"  executed {e:>10.0f}x  {100 * s:5.1f} %  {', '.join(f'{w} {c:.0f}' for w, c in why.most_common(3))}")
        for a, b, s, rs in (runs(rows, args.runs) if args.runs else []):
            if s >= 0.003:
                top = max(rs, key=lambda r: num(r[SAMPLES]))
                print(f"    [{a}..{b}] {100 * s:4.1f} %  {len(rs)} instr; most: {top['Source'].strip()[:60]}")


if __name__ == "__main__":
    main()
