"""The cuda backend's compile options (frozen, validated, hashable). The defaults are the numerics policy
(DESIGN section 4): no flush-to-zero, no FMA contraction, IEEE division and square root."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...codegen.options import BackendOptions
from .schedule import CHAIN_PAIRS, LONGEST_FIRST_MIN

# what every NVRTC compile passes besides the numerics flags and the arch
BASE_FLAGS = ("-std=c++17",)
TAIL_FLAGS = ("-lineinfo", "--ptxas-options=-v",
              # generated code leaves unused values (shapes) and spells f64 literals that round to f32 exactly as
              # the reference rounds them: neither warning says anything about the kernel
              "--diag-suppress=177,1046")
MAX_MIN_BLOCKS = 32


def _flag(b: bool) -> str:
    return "true" if b else "false"


@dataclass(frozen=True)
class CudaOptions(BackendOptions):
    backend: ClassVar[str] = "cuda"
    ftz: bool = False                  # flush f32 denormals to zero
    fmad: bool = False                 # contract a*b+c into FMA
    prec_div: bool = True              # IEEE round-to-nearest division
    prec_sqrt: bool = True             # IEEE round-to-nearest square root
    min_blocks: int | None = None      # __launch_bounds__ min blocks per SM; None: 1 only when ptxas spills,
                                       # else as many as shared memory allows where that build does not spill
    fill_sm: bool = True               # that last rule (occupancy.py); False: ptxas's own register choice
    overlap: bool = False              # software-pipelined attention compute (schedule.Overlap): measured slower
    persistent: bool = False           # specialised kernels walk their tiles on one block per SM (alone: no gain; in FA3)
    split_ring: bool = False           # a stage's buffers released by reader (K and V apart): measured, no gain
    pingpong: bool = False             # with split_ring + overlap: warpgroups take turns issuing wgmma (FA3)
    producer_prologue: bool = False    # loads before the pipelines (attention's Q) by the producer: no gain
    longest_first: int = LONGEST_FIRST_MIN   # persistent: tiles whose work grows along an axis walked longest
                                             # first once it has this many blocks (0: never)
    free_turns: bool = True            # ping-pong turns run on across pipelines and tiles where nothing is published
    prologue_stages: int = 2           # persistent: copies of the producer's prologue buffers (attention's Q) where
                                       # shared memory holds them (1: the next tile's Q waits for this tile's end)
    tma_store: bool = True             # specialised: epilogue stores of whole tiles through shared memory by TMA
    chain: int = CHAIN_PAIRS           # ping-pong: at most this many pairs of consecutive pipelines on one accumulator
                                       # run as one, the last first (schedule._chain_pipelines): measured no gain, 0
    auto_schedule: bool = True         # the backend may take FA3's schedule where measured to pay (schedule.fa3_switches)
    heavy_first: bool = True           # a dispatched grid whose blocks' work grows along an axis starts its heaviest
                                       # blocks first, in runs of rows (hk::heavy_first_idx)
    load_ahead: bool = True            # a non-specialised TMA ring issues step i + S - 1's copy before computing step i
                                       # where step i's mma waits for itself (False: after it, as before 2026-12-04)
    one_ring: bool = True              # with load_ahead: consecutive TMA pipelines of such a block share one ring, each
                                       # one's first copies issued while the one before computes (schedule._ring_runs)

    def validate(self) -> None:
        self._expect_bool("ftz", "fmad", "prec_div", "prec_sqrt", "overlap", "persistent", "split_ring", "pingpong",
                          "producer_prologue", "free_turns", "auto_schedule", "tma_store", "fill_sm", "heavy_first",
                          "load_ahead", "one_ring")
        self._expect_int("longest_first", 0, 1 << 30)
        self._expect_int("prologue_stages", 1, 2)
        self._expect_int("chain", 0, 8)
        self._expect_int("min_blocks", 1, MAX_MIN_BLOCKS)

    def numerics(self) -> dict:
        return {"ftz": self.ftz, "fmad": self.fmad, "prec_div": self.prec_div, "prec_sqrt": self.prec_sqrt}

    def schedule(self) -> dict:
        """The schedule pass's switches, as codegen.emit takes them."""
        return {"overlap": self.overlap, "persistent": self.persistent, "split_ring": self.split_ring,
                "pingpong": self.pingpong, "producer_prologue": self.producer_prologue,
                "longest_first": self.longest_first, "free_turns": self.free_turns,
                "prologue_stages": self.prologue_stages, "tma_store": self.tma_store, "chain": self.chain,
                "heavy_first": self.heavy_first, "load_ahead": self.load_ahead,
                "one_ring": self.one_ring}

    def nvrtc_flags(self) -> tuple[str, ...]:
        """NVRTC's options besides -arch, in the order they have always had."""
        return (*BASE_FLAGS, f"-ftz={_flag(self.ftz)}", f"-fmad={_flag(self.fmad)}",
                f"-prec-div={_flag(self.prec_div)}", f"-prec-sqrt={_flag(self.prec_sqrt)}", *TAIL_FLAGS)


DEFAULT = CudaOptions()
