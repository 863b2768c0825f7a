"""The cuda backend's plan for one Program on one target: what schedule.plan decided, frozen, each decision with
its reason (`Plan.reasons`), for the emitter (codegen.py) to render; and `describe`, the plan as text
(`hk compile --emit lowered`). Only schedule.py makes a Plan; nothing changes one after (issue 38: one module
decides, the emitter renders).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from itertools import groupby
from types import MappingProxyType
from typing import NamedTuple

from ...interface.backend import Target
from ...interface.ir import Op, Program
from . import archs, dataflow
from .dataflow import MMA_ASYNC, MMA_DEFERRED, MMA_STAGED, MMA_STANDALONE, TmaLoad  # noqa: F401  (TmaLoad: a plan's field type)

EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class RingGroup:
    """Staged buffers of a pipeline with barriers of their own in a split ring (schedule.py): `reader` is
    the one compute op that reads them (a wgmma), `loads` the global_to_shared op ids filling them, `tx_bytes`
    what those loads deliver per stage."""
    reader: Op
    loads: tuple[int, ...]
    tx_bytes: int


@dataclass(frozen=True)
class PipelinePlan:
    schedule: str                                   # "cp_async" or "tma"
    why: str                                        # the schedule's reason
    tma_loads: Mapping[int, int] = field(default_factory=lambda: EMPTY)   # global_to_shared op id -> tensor map
    tx_bytes: int = 0                               # bytes one stage's TMA copies deliver
    async_mma: bool = False
    overlap: dataflow.Overlap | None = None         # software-pipelined compute (warp-specialised only)
    groups: tuple[RingGroup, ...] = ()              # split ring (Plan.ring_groups > 1) only


class HandOver(NamedTuple):
    """setmaxnreg in a specialised block: the registers a thread compiles with, the producer's after its dec, the
    consumers' after their inc (occupancy.register_split)."""
    block: int
    producer: int
    consumer: int


@dataclass(frozen=True)
class Plan:
    variant: str = "base"               # the schedule variant followed (schedule.Base / schedule.FA3)
    pipelines: Mapping[int, PipelinePlan] = field(default_factory=lambda: EMPTY)   # pipeline op id -> its plan
    mma_modes: Mapping[int, int] = field(default_factory=lambda: EMPTY)            # mma op id -> MMA_*
    tensor_maps: tuple[TmaLoad, ...] = ()
    grouped_blocks: bool = False        # block order: runs of GROUP x-rows sweep y (hk::block_idx, HK_BLOCK_GROUPED)
    dispatch_axis: int | None = None    # not persistent: the block_idx axis a block's trip count grows with, each run
                                        # of rows dispatched heaviest first (hk::heavy_first_idx, HK_DISPATCH_AXIS)
    producer_warps: int = 0             # > 0: warp-specialised, a producer warpgroup issues every pipeline's loads
    producer_runs: frozenset[int] = frozenset()   # specialised only: the body's op ids the producer also runs (the
                                        # scalars and shared addresses its loads need)
    persistent: bool = False            # specialised only: one block per SM walks the logical grid's tiles
    work_axis: int | None = None        # persistent only: the block_idx axis a tile's trip count grows with, walked
                                        # slowest and from its last index (longest tiles first: `work_axis`)
    longest_first: int = 0              # ... once it has this many blocks (hk_cuda/tile_order.cuh); 0: never
    ring_groups: int = 1                # specialised only: > 1, each stage has that many barrier pairs (split ring)
    prologue: Mapping[int, int] = field(default_factory=lambda: EMPTY)   # specialised only: load op id -> tensor
                                        # map, the loads before the pipelines that the producer issues (attention's Q)
    prologue_buffers: frozenset[int] = frozenset()   # alloc_shared op ids those loads fill
    prologue_tx: int = 0                # bytes those loads deliver per tile
    prologue_stages: int = 1            # persistent only: copies of those buffers, tile t's in copy t % stages, so the
                                        # producer loads tile t+1's while the consumers still read tile t's
    pingpong: bool = False              # split and overlapped only: consumer warpgroups take turns issuing wgmma
    tma_stores: Mapping[int, int] = field(default_factory=lambda: EMPTY)   # specialised only: register_to_global
                                        # op id -> tensor map; each warpgroup stores its rows through shared memory
    tma_reduces: Mapping[int, tuple[int, int]] = field(default_factory=lambda: EMPTY)   # specialised only:
                                        # atomic_add op id -> (tensor map as viewed, of the tensor a transposed view
                                        # views): each warpgroup adds its rows through shared memory by TMA reduce-add
    compute_orders: Mapping[int, tuple[int, ...]] = field(default_factory=lambda: EMPTY)   # specialised only:
                                        # pipeline op id -> its compute region's top-level op ids in emission order,
                                        # where its products are MMA_DEFERRED (deferred.py)
    tma_fed: bool = False               # specialised only: with tensor maps every shared buffer is filled by TMA
    free_turns: bool = False            # pingpong only: turns run on across pipelines and tiles (no meeting), where
                                        # the consumers write no shared memory of their own (tma_fed)
    ring_runs: tuple[tuple[int, ...], ...] = ()   # not specialised: runs of consecutive TMA pipelines (op ids) on one
                                        # ring, each pipeline's first copies issued while the one before runs
                                        # (hk::ring_open / ring_steps / ring_close: schedule._ring_runs)
    ring_hoist: tuple[int, ...] = ()    # quiet scalar ops inside a run that later pipelines' trip counts or loads
                                        # read: emitted when the run opens its ring
    late_publish: frozenset[int] = frozenset()   # loads before a run (attention's Q) published once the run's
                                        # first copies are issued, so both land together
    hand_over: HandOver | None = None   # specialised only: setmaxnreg's register counts; None: no hand-over
    min_blocks: int | None = None       # __launch_bounds__' minimum blocks an SM; None: none
    fast_exp2: bool = True              # exp2 as one ex2.approx.ftz (hw.cuh HK_FAST_EXP2)
    folded_scales: Mapping[int, tuple] = field(default_factory=lambda: EMPTY)   # op id -> what its folded form reads
                                        # (codegen.patterns.folded_scales: a softmax's scale folded into its row max
                                        # and its exp2 argument; the mul op maps to its two readers, not emitted)
    tile_invariant: tuple[int, ...] = ()   # persistent only: top-level scalar op ids computed once, before the tile loop
    tile_dividers: tuple = ()           # persistent only: invariant divisors a hk::divider divides by in every tile
    reasons: tuple[tuple[str, str], ...] = ()    # (decision, why) for every field above, in the order taken
    layouts: Mapping = field(default_factory=lambda: EMPTY, repr=False, compare=False)   # the layout pass's
                                        # choice the plan was made with (value -> layout), which the emitter renders

    @property
    def uses_tma(self) -> bool:
        return bool(self.tensor_maps)

    def why(self, decision: str) -> str:
        return dict(self.reasons)[decision]


DECISIONS = tuple(f.name for f in fields(Plan) if f.name not in ("reasons", "layouts"))


# ------------------------------------------------------------------------------------------------ describe
MODE = {MMA_STANDALONE: "standalone (barrier + fence, waits)", MMA_STAGED: "staged (no barrier, waits)",
        MMA_ASYNC: "async (left in flight; the pipeline waits a step later)",
        MMA_DEFERRED: "deferred (left in flight; waited for where the step first reads it)"}


def describe(program: Program, p: Plan, target: Target) -> str:
    """The plan as text (`hk compile --emit lowered`, after the Program): each pipeline's and mma's lowering, each
    decision with the reason schedule.plan gave, the tensor maps."""
    lines = [f"// schedule (cuda backend, {target.spec})"]
    names = {id(op): f"%{op.results[0].id}" if op.results else op.opcode for op in program.body.walk()}
    hopper = archs.of(target).async_tensor_core
    for op in program.body.walk():
        if op.opcode == "pipeline":
            lines.append(_pipeline_line(op, p.pipelines.get(id(op)), names))
        elif op.opcode == "mma":
            k = 32 if op.operands[0].type.dtype.itemsize == 1 else 16
            lines.append(f"mma {names[id(op)]}: wgmma m64n{op.results[0].type.cols}k{k}, "
                         f"{MODE[p.mma_modes.get(id(op), MMA_STANDALONE)]}"
                         if hopper and dataflow.wgmma_eligible(op, program.num_warps)
                         else f"mma {names[id(op)]}: mma.sync m16n8k{k} (ldmatrix fragments)")
    shown = {"mma_modes": {k: MODE[m].split()[0] for k, m in p.mma_modes.items()}}
    for why, taken in groupby(p.reasons, key=lambda r: r[1]):       # decisions taken together, on one line
        lines.append("; ".join(f"{n} = {_shown(shown.get(n, getattr(p, n)), names)}" for n, _ in taken) + f": {why}")
    for i, tm in enumerate(p.tensor_maps):
        lines.append(f"tensor map {i}: param {tm.param} (rank {tm.rank}, {tm.dtype}), box {tm.box_rows}x{tm.box_cols}, "
                     + ("SWIZZLE_128B, zero fill out of bounds" if not tm.store
                        else "SWIZZLE_128B, written (out of bounds dropped)" if not tm.reduce
                        else "SWIZZLE_128B, added into" + (" the tensor of a transposed view" if tm.transpose else "")
                        + " (out of bounds dropped)"))
    return "\n".join(lines)


def _pipeline_line(op, pp: PipelinePlan | None, names: dict) -> str:
    head = f"pipeline {names[id(op)]}: {pp.schedule if pp else 'cp_async'}"
    if pp and pp.schedule == "tma":
        head += f", {len(pp.tma_loads)} tile loads/stage ({pp.tx_bytes} bytes)"
    if pp and pp.overlap:
        ov = pp.overlap
        head += (f", software-pipelined (head {names[id(ov.head)]}; tail {', '.join(names[id(o)] for o in ov.tail)} "
                 f"one step late; crossing {', '.join(f'%{v.id}' for v in ov.crossing)})")
    return f"{head}, stages={op.attrs['stages']}" + (f" ({pp.why})" if pp else "")


def _shown(value, names: dict) -> str:
    """A decision's value: op ids by their results' names (with what a map gives each, where a number or a word),
    tensor maps by count (listed after the decisions)."""
    if isinstance(value, HandOver):
        return f"registers {value.block} -> producer {value.producer}, consumers {value.consumer}"
    if isinstance(value, tuple) and value and isinstance(value[0], TmaLoad):
        return f"{len(value)} (below)"
    if isinstance(value, frozenset):
        value = sorted(value, key=list(names).index)            # program order
    if isinstance(value, Mapping):
        return "[" + ", ".join(names.get(k, str(k)) + (f": {v}" if isinstance(v, (int, str)) else "")
                               for k, v in value.items()) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shown(v, names) if isinstance(v, tuple) else names.get(v, str(v)) for v in value) + "]"
    return str(value)
