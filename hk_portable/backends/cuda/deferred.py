"""Deferred wgmma waits in a warp-specialised pipeline's compute region (schedule.py's decision, codegen.py renders it).

A staged wgmma waits for its own result right after it is issued (MMA_STAGED), so nothing else of the warpgroup runs
while the tensor cores work. A compute region of several products (attention's backward: Sᵀ, dV, dPᵀ, dK, dQ) can do
better: each staged wgmma is issued and left in flight (MMA_DEFERRED), and the warpgroup waits for it
(wgmma.wait_group N, N the groups issued after it) only where its result is first read, where a shared buffer it
reads is written, or at the end of the step; so the exponentials of P run while dPᵀ is on the tensor cores, dS while
dV is, the store of dSᵀ while dK is. An independent product is also issued right after the one before it
(`issue_order`: dPᵀ beside Sᵀ, its zero accumulator with it, the region's first product staying first), not where
the kernel wrote it, so that it has something to overlap with. Only top-level products of the region; the region's other ops keep their order.
"""
from __future__ import annotations

from ...interface import opcodes
from ...interface.ir import Op, Region
from . import dataflow
from .dataflow import MMA_DEFERRED, MMA_STAGED


def deferrable(creg: Region, modes: dict, num_warps: int) -> list[Op]:
    """The region's top-level staged products that run as wgmma: each can be left in flight."""
    return [o for o in creg.ops if o.opcode == "mma" and modes.get(id(o)) == MMA_STAGED
            and dataflow.wgmma_eligible(o, num_warps)]


def _pure(op: Op) -> bool:
    """An op with no memory effect and no region (an address, a constant tile, scalar arithmetic): free to move."""
    spec = opcodes.TABLE.get(op.opcode)
    return spec is not None and not op.regions and op.opcode != "mma" and not (spec.effects.reads or spec.effects.writes)


def issue_order(creg: Region, producers: dict, deferred: set[int]) -> tuple[int, ...]:
    """The region's top-level op ids in the order they are emitted: each deferred product moved up to right after the
    region's first product, with the pure ops between that it reads (its stage's address, its zero accumulator),
    where nothing else between produces what it reads."""
    ops = list(creg.ops)
    for m in [o for o in ops if id(o) in deferred]:
        i = ops.index(m)
        first = next(k for k, o in enumerate(ops) if o.opcode == "mma")
        if i <= first + 1:
            continue
        between = ops[first + 1:i]
        made = {r.id: o for o in between for r in o.results}
        slice_, todo = set(), [v.id for v in m.operands]
        while todo:                                  # the ops between that m reads, transitively
            o = made.get(todo.pop())
            if o is not None and id(o) not in slice_:
                slice_.add(id(o))
                todo += [v.id for v in o.operands]
        moving = [o for o in between if id(o) in slice_]
        if not all(_pure(o) for o in moving) or any(o.regions or opcodes.writes_shared(o.opcode) for o in between):
            continue
        ops = ops[:first + 1] + moving + [m] + [o for o in between if id(o) not in slice_] + ops[i + 1:]
    return tuple(id(o) for o in ops)


def plan(creg: Region, producers: dict, modes: dict, num_warps: int, which: str) -> tuple[int, ...] | None:
    """Marks the region's deferrable products that `which` names ("all", or their indices among them) MMA_DEFERRED
    (into `modes`) and returns the emission order, or None where nothing is deferred (the staged waits stay)."""
    mmas = deferrable(creg, modes, num_warps)
    if which != "all":
        mmas = [m for k, m in enumerate(mmas) if str(k) in which]
    if not which or not mmas:
        return None
    for m in mmas:
        modes[id(m)] = MMA_DEFERRED
    if which != "all":                      # a chosen few keep the kernel's order
        return tuple(id(o) for o in creg.ops)
    return issue_order(creg, producers, {id(m) for m in mmas})
