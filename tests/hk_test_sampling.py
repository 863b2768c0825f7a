"""The default run's sample of a long suite (imported by name from tests/ and tests/hip/): every Program of a
library kernel or with an mma, and every EVERY-th of the others in name order; `pytest -m exhaustive` (or
HK_EXHAUSTIVE=1) runs them all."""
from __future__ import annotations

import os

EVERY = 6


def exhaustive() -> bool:
    return os.environ.get("HK_EXHAUSTIVE", "") not in ("", "0")


def sample(named: dict, *, every: int = EVERY) -> dict:
    """`named` (name -> Program) itself when exhaustive, else its sample."""
    if exhaustive():
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
