"""The default run's sample of a long suite (imported by name from tests/ and tests/hip/): every Program of a
library kernel or with an mma, and every EVERY-th of the others in name order; HK_EXHAUSTIVE=1 runs them all (and
the tests marked `slow`, which the default run leaves out: tests/conftest.py)."""
from __future__ import annotations

import os

EVERY = 6


def exhaustive() -> bool:
    return os.environ.get("HK_EXHAUSTIVE", "") not in ("", "0")


def sample(named: dict, *, every: int = EVERY, full: bool | None = None) -> dict:
    """`named` (name -> Program) itself when `full` (default: when exhaustive), else its sample."""
    if exhaustive() if full is None else full:
        return named
    from hk_portable import kernels
    library = {name.split("@")[0] for name in kernels.KERNELS} | {f"{n}_kernel" for n in kernels.KERNELS}
    keep, rest = {}, []
    for name in sorted(named):
        p = named[name]
        if p.name in library or "mma" in p.opcodes() or any(p.name.startswith(k) for k in library):
            keep[name] = p
        else:
            rest.append(name)
    keep.update({name: named[name] for name in rest[::every]})
    return keep


def split(named: dict, *, every: int = 2 * EVERY, per_name: int = 5) -> tuple[dict, dict]:
    """(the default run's part, the rest) of `named`, whatever HK_EXHAUSTIVE says: of `sample(named, every=every)`'s
    Programs, the first of each Program name (kernel) in name order and every `per_name`-th after it, so that every
    library kernel and mma form is still in the default part (of 840 conformance Programs on sm_90a: 106, against
    141 with every third, when CI took 44.5 of its 45 minutes, 2026-12-07); the rest (for a test marked `slow`) is
    everything else."""
    sampled = sample(named, every=every, full=False)
    seen: dict[str, int] = {}
    default = {}
    for name in sorted(sampled):
        kernel = sampled[name].name
        if seen.get(kernel, 0) % per_name == 0:
            default[name] = sampled[name]
        seen[kernel] = seen.get(kernel, 0) + 1
    return default, {name: p for name, p in named.items() if name not in default}
