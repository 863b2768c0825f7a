"""Run the conformance suite group by group, each group in its own process with a time limit, printing
every case as it finishes: a hanging kernel then costs one group, not the whole run, and the log
names the case it hung in.

    python benchmarks/conformance_triage.py --backend cuda [--limit 60] [--json out.json] [-k PATTERN]
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time


def groups(patterns) -> dict[str, list[str]]:
    from hk_portable.conformance.cases import all_cases
    from hk_portable.conformance.runner import select_cases
    out: dict[str, list[str]] = collections.OrderedDict()
    for c in select_cases(all_cases(), patterns):
        out.setdefault("/".join(c.id.split("/")[:2]), []).append(c.id)
    return out


def child(backend: str, prefix: str, seed: int, emulate: bool, target) -> None:
    from hk_portable.conformance.cases import all_cases
    from hk_portable.conformance.runner import Session
    s = Session(backend, target, emulate, seed)
    for case in all_cases():
        if "/".join(case.id.split("/")[:2]) != prefix:
            continue
        print("START", case.id, flush=True)
        r = s.run_case(case)
        print("RESULT", json.dumps({"id": r.id, "status": r.status, "max_error": r.max_error, "bound": r.bound,
                                    "reason": (r.reason or "")[:400], "seconds": round(r.seconds, 3)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--target")
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds per group")
    ap.add_argument("--deadline", type=float, default=1e9, help="start no group after this many seconds")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--json")
    ap.add_argument("-k", action="append")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        return child(a.backend, a.child, a.seed, a.emulate, a.target)
    results, hung = [], []
    t0 = time.time()
    for prefix, ids in groups(a.k).items():
        if time.time() - t0 > a.deadline:
            print(f"{prefix:32s} not run: past the deadline", flush=True)
            continue
        cmd = [sys.executable, __file__, "--backend", a.backend, "--child", prefix, "--seed", str(a.seed)]
        cmd += ["--emulate"] if a.emulate else []
        cmd += ["--target", a.target] if a.target else []
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.limit).stdout
            timed_out = False
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            timed_out = True
        done = {}
        last_start = None
        for line in out.splitlines():
            if line.startswith("START "):
                last_start = line[6:]
            elif line.startswith("RESULT "):
                r = json.loads(line[7:])
                done[r["id"]] = r
        results += done.values()
        if timed_out:
            hung.append({"group": prefix, "case": last_start if last_start not in done else None})
        n = collections.Counter(r["status"] for r in done.values())
        print(f"{prefix:32s} {len(done):3d}/{len(ids):3d} passed={n['passed']} failed={n['failed']} "
              f"skipped={n['skipped']}{'  TIMEOUT in ' + str(last_start) if timed_out else ''}", flush=True)
        for r in done.values():
            if r["status"] == "failed":
                print("   FAILED", r["id"], r["reason"][:250], flush=True)
    summary = collections.Counter(r["status"] for r in results)
    print(f"total {dict(summary)} hung groups {len(hung)} in {time.time() - t0:.0f}s")
    if a.json:
        json.dump({"backend": a.backend, "seed": a.seed, "results": results, "hung": hung,
                   "summary": dict(summary)}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
