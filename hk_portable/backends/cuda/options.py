"""The cuda backend's compile options (frozen, validated, hashable). The defaults are the numerics policy
(DESIGN section 4): no flush-to-zero, no FMA contraction, IEEE division and square root."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...codegen.options import BackendOptions
from .variants import FA3, LONGEST_FIRST_MIN, Base

# what every NVRTC compile passes besides the numerics flags and the arch
BASE_FLAGS = ("-std=c++17",)
TAIL_FLAGS = ("-lineinfo", "--ptxas-options=-v",
              # generated code leaves unused values (shapes) and spells f64 literals that round to f32 exactly as
              # the reference rounds them: neither warning says anything about the kernel
              "--diag-suppress=177,1046")
MAX_MIN_BLOCKS = 32
VARIANTS = ("auto", "base", "fa3")


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
    variant: str = "auto"              # the schedule variant (schedule.py): "auto", FA3's where it measured a gain
                                       # (schedule.fa3_variant) and its build is kept, else "base"; or either one
    # the variants' parameters (schedule.Base, schedule.FA3)
    tma_store: bool = True             # specialised: epilogue stores of whole tiles through shared memory by TMA
    one_ring: bool = True              # base: consecutive TMA pipelines of a block that is not specialised share one
                                       # ring, each one's first copies issued while the one before computes
    heavy_first: bool = True           # base: a dispatched grid whose blocks' work grows along an axis starts its
                                       # heaviest blocks first, in runs of rows (hk::heavy_first_idx)
    tma_reduce: bool = True            # base, specialised: atomic adds of whole f32 register tiles (attention_bwd's
                                       # dQ) by TMA reduce-add (tma_writes.reduces); H100 2026-12-07: dK/dV kernel
                                       # 18-22 % faster than one red.global per element (docs/perf-notes.md)
    defer_wgmma: str = ""              # base, specialised: staged wgmma waited for where first read (deferred.py):
                                       # "" never (the default until measured), "all", or product indices ("13")
    longest_first: int = LONGEST_FIRST_MIN   # fa3: the persistent grid walks tiles whose work grows along an axis
                                             # longest first once it has this many blocks (0: never)
    prologue_stages: int = 2           # fa3: copies of the producer's prologue buffers (attention's Q) where shared
                                       # memory holds them (1: the next tile's Q waits for this tile's end)

    def validate(self) -> None:
        self._expect_bool("ftz", "fmad", "prec_div", "prec_sqrt", "tma_store", "fill_sm", "heavy_first", "one_ring",
                          "tma_reduce")
        self._expect_choice("variant", VARIANTS)
        self._expect_int("longest_first", 0, 1 << 30)
        self._expect_int("prologue_stages", 1, 2)
        self._expect_int("min_blocks", 1, MAX_MIN_BLOCKS)
        self._expect("defer_wgmma", isinstance(self.defer_wgmma, str) and (
            self.defer_wgmma in ("", "all") or self.defer_wgmma.isdigit()), "'', 'all' or product indices such as '13'")

    def numerics(self) -> dict:
        return {"ftz": self.ftz, "fmad": self.fmad, "prec_div": self.prec_div, "prec_sqrt": self.prec_sqrt}

    def base(self) -> Base:
        return Base(tma_store=self.tma_store, one_ring=self.one_ring, heavy_first=self.heavy_first,
                    tma_reduce=self.tma_reduce, defer_wgmma=self.defer_wgmma)

    def fa3(self) -> FA3:
        return FA3(tma_store=self.tma_store, longest_first=self.longest_first, prologue_stages=self.prologue_stages)

    def nvrtc_flags(self) -> tuple[str, ...]:
        """NVRTC's options besides -arch, in the order they have always had."""
        return (*BASE_FLAGS, f"-ftz={_flag(self.ftz)}", f"-fmad={_flag(self.fmad)}",
                f"-prec-div={_flag(self.prec_div)}", f"-prec-sqrt={_flag(self.prec_sqrt)}", *TAIL_FLAGS)


DEFAULT = CudaOptions()
