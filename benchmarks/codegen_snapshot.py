"""The instruction streams of every library kernel on every offline target, for showing that a refactor of the
lowering changes no generated kernel (issue 38's "behaviour-neutral"): each kernel's example configuration and every
candidate configuration its module offers, compiled for cuda sm_80 and sm_90a (PTX, NVRTC) and hip gfx942 and gfx950
(AMDGCN assembly, clang), comments and tool banners stripped, one file per (target, kernel, Program) and an index of
their sha256. Compare two snapshots with --diff.

    python benchmarks/codegen_snapshot.py --out /tmp/snap-before [--targets cuda:sm_90a hip:gfx942] [-k gemm]
    python benchmarks/codegen_snapshot.py --diff /tmp/snap-before /tmp/snap-after
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

TARGETS = ("cuda:sm_80", "cuda:sm_90a", "hip:gfx942", "hip:gfx950")
_DEBUG_SECTION = re.compile(r"^\s*\.section\s+\.debug_str\b")
_BANNER = re.compile(r"^\s*(//|;|\.ident\b|\.file\b|\.loc\b)")     # .loc: source line numbers, not instructions


def normalise(asm: str) -> str:
    """The instruction stream: comment lines, trailing comments, tool banners (compiler versions) and PTX's
    .debug_str section (the names of inlined device functions that -lineinfo lists, which a rename or a deleted
    unused function changes) removed."""
    out, debug = [], False
    for line in asm.splitlines():
        if _DEBUG_SECTION.match(line):
            debug = True
        if debug:
            debug = line.strip() != "}"
            continue
        if _BANNER.match(line):
            continue
        line = re.split(r"\s;|\s//", line, maxsplit=1)[0].rstrip()
        if line:
            out.append(line)
    return "\n".join(out) + "\n"


def programs(pattern: str | None) -> dict:
    """'kernel-hash8' -> Program: each kernel's example configuration and its module's candidates for it."""
    from hk_portable import kernels
    out = {}
    for name in sorted(kernels.KERNELS):
        if pattern and pattern not in name:
            continue
        _, kern, args, configs = kernels.offered_configs(name)
        for cfg in configs:
            prog = kern.trace(*args, **cfg)
            out.setdefault(f"{name}-{prog.hash[:8]}", prog)
    return out


def target_of(spec: str):
    from hk_portable.runtime import registry
    backend_name, arch = spec.split(":")
    be = registry.load(backend_name)
    if backend_name == "hip":
        from hk_portable.backends.hip.archs import make_target
        return be, make_target(arch, runs=False, compile_only=True)
    return be, be.target(arch)


def snapshot(out: Path, targets, pattern: str | None) -> int:
    from hk_portable.runtime import cache
    progs = programs(pattern)
    index, errors = {}, 0
    for spec in targets:
        be, target = target_of(spec)
        (out / spec.replace(":", "-")).mkdir(parents=True, exist_ok=True)
        for key, prog in progs.items():
            try:
                asm = cache.compile_cached(be, prog, target).asm or ""
            except Exception as e:  # noqa: BLE001 - recorded, the snapshot goes on
                asm, errors = f"error: {type(e).__name__}: {str(e)[:300]}\n", errors + 1
            text = normalise(asm)
            rel = f"{spec.replace(':', '-')}/{key}.s"
            (out / rel).write_text(text)
            index[rel] = hashlib.sha256(text.encode()).hexdigest()
        print(f"{spec}: {len(progs)} programs", flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    return 1 if errors else 0


def diff(a: Path, b: Path) -> int:
    ia, ib = (json.loads((d / "index.json").read_text()) for d in (a, b))
    only_a, only_b = sorted(set(ia) - set(ib)), sorted(set(ib) - set(ia))
    # the stored streams normalised again: a snapshot taken before a normalisation rule compares under it too
    text = {k: (normalise((a / k).read_text()), normalise((b / k).read_text())) for k in set(ia) & set(ib)}
    changed = sorted(k for k, (x, y) in text.items() if x != y)
    for k in changed:
        lines = difflib.unified_diff(text[k][0].splitlines(), text[k][1].splitlines(), str(a / k), str(b / k), n=1,
                                     lineterm="")
        print("\n".join(list(lines)[:40]))
    print(f"{len(set(ia) & set(ib))} streams in both; {len(changed)} differ; "
          f"only in {a}: {len(only_a)} {only_a[:5]}; only in {b}: {len(only_b)} {only_b[:5]}")
    if not only_a and not only_b:
        return 1 if changed else 0
    # a change to a Program that its code does not read (a const removed) renames its streams: the same streams
    # per target under other names is neutral too
    moved = {t: (_streams(a, only_a, t), _streams(b, only_b, t)) for t in {k.split("/")[0] for k in only_a + only_b}}
    renamed = all(x == y for x, y in moved.values())
    print(f"the streams only in one snapshot are {'the same' if renamed else 'NOT the same'} per target, renamed")
    return 1 if changed or not renamed else 0


def _streams(snap: Path, keys: list, target: str) -> list:
    """The normalised streams of `target` among `keys`, sorted: what a rename leaves equal."""
    return sorted(normalise((snap / k).read_text()) for k in keys if k.startswith(target + "/"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--targets", nargs="+", default=list(TARGETS))
    ap.add_argument("-k", dest="pattern", help="only kernels whose name contains this")
    ap.add_argument("--diff", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.diff:
        return diff(*args.diff)
    if args.out is None:
        ap.error("--out DIR (or --diff BEFORE AFTER)")
    # a cold compile cache of its own: a cached binary is keyed by what went into it as the code that wrote the
    # key saw it, so a snapshot reading a shared cache could show an earlier tree's streams
    with tempfile.TemporaryDirectory(prefix="hk-snapshot-cache-") as cold:
        os.environ["HK_CACHE_DIR"] = cold
        return snapshot(args.out, args.targets, args.pattern)


if __name__ == "__main__":
    sys.exit(main())
