"""The cuda schedule's variants: each a named, frozen set of the parameters that make sense for it, so a combination
that was never a schedule cannot be written. schedule.plan makes the plan of a Program under one; CudaOptions
(options.py) names them and their parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# Tiles go longest first once the work axis has this many blocks (query blocks a head). Block order measured better
# with 8 and 32 (causal D128 N1024 / N4096 and GQA N4096 on the H200: 0.69 vs 0.60 in one A/B; 479 and 490 TFLOP/s
# in block order against 449 and 460 longest first, hk bench across calls), longest first with 128 (N16384: 0.97
# vs 0.66 of cuDNN). 64 lies between: a head's ramp then spans half the SMs' blocks, where dealing beats against it.
LONGEST_FIRST_MIN = 64


@dataclass(frozen=True)
class Base:
    """The schedule every program gets unless FA3's is taken: the cp.async ring on every target; on the async path
    the TMA ring (consecutive pipelines on one ring, `one_ring`), warp-specialised where the Program allows
    (schedule.py) with its epilogue stores by TMA (`tma_store`). A grid whose blocks' work grows along an axis
    dispatches its heaviest blocks first (`heavy_first`). one_ring and heavy_first are what the build search
    (backend._fill_sm) gives up, in that order, where only the build without them fills the SM."""
    name: ClassVar[str] = "base"
    tma_store: bool = True
    one_ring: bool = True
    heavy_first: bool = True
    tma_reduce: bool = False    # specialised: atomic adds of whole f32 tiles by TMA reduce-add (tma_writes.reduces);
                                # off until it has run on a GPU (built 2026-12-07 with no device to run it)
    defer_wgmma: str = ""       # specialised: a compute region's staged wgmma left in flight (deferred.py); "" none,
                                # "all", or the indices of the region's products to defer ("3": its fourth alone)


@dataclass(frozen=True)
class FA3:
    """FlashAttention 3's schedule, as one variant: warp-specialised on a split ring (K and V released apart), the
    loads before the pipelines (Q) on the producer in `prologue_stages` copies, each compute region
    software-pipelined one step (dataflow.Overlap), consumer warpgroups taking turns issuing wgmma (ping-pong, turns running
    on across pipelines and tiles where the consumers write no shared memory), and a persistent grid dealing its
    tiles longest first once the work axis has `longest_first` blocks. A Program that cannot take all of it gets
    the Base plan (plan()): none of its parts alone is a schedule (each measured no gain alone, perf-notes
    2026-12-03), so none can be asked for alone."""
    name: ClassVar[str] = "fa3"
    tma_store: bool = True
    longest_first: int = LONGEST_FIRST_MIN
    prologue_stages: int = 2


Variant = Base | FA3
BASE = Base()
