"""The hip backend's compile options (frozen, validated, hashable): the plan overrides codegen accepts
(waves per block, pipeline schedule, pipeline prefetch, block remap) and the FMA contraction every compile of the source
(offline clang, hiprtc, the emulator) uses. The defaults are the numerics policy: no contraction."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...codegen.options import BackendOptions, OptionError

MAX_WAVES = 16
PIPELINE_FORMS = ("double_buffer", "pingpong")   # what a plan records (schedule.PipelineSchedule)
SCHEDULES = ("auto", *PIPELINE_FORMS)
PREFETCH = ("auto", "split", "whole")
INTERLEAVE = ("auto", "off")
FP_CONTRACT = ("off", "on", "fast")


@dataclass(frozen=True)
class HipOptions(BackendOptions):
    backend: ClassVar[str] = "hip"
    waves: int | None = None           # waves per block; None: the kernel's num_warps hint
    schedule: str = "auto"             # pipeline schedule: auto | double_buffer | pingpong
    prefetch: str = "auto"             # pipeline loads split around the compute step: auto | split | whole
    block_remap: bool = True           # XCD-aware block order (hk::detail::xcd_remap)
    interleave: str = "auto"           # MFMA/exp interleave of attention's PV mma (patterns.interleaved_pv): auto | off
    fp_contract: str = "off"           # clang -ffp-contract

    def validate(self) -> None:
        if self.waves is not None and (isinstance(self.waves, bool) or not isinstance(self.waves, int)
                                       or not 1 <= self.waves <= MAX_WAVES):
            raise OptionError(f"hip backend: option waves={self.waves!r}: {self.waves} waves per block; a block runs "
                              f"1 to {MAX_WAVES} waves")
        if self.schedule not in SCHEDULES:
            raise OptionError(f"hip backend: unknown pipeline schedule {self.schedule!r}; expected one of {SCHEDULES}")
        self._expect_choice("prefetch", PREFETCH)
        self._expect_choice("interleave", INTERLEAVE)
        self._expect_bool("block_remap")
        self._expect_choice("fp_contract", FP_CONTRACT)

    def device_flags(self) -> tuple[str, ...]:
        """What every device compile of the source passes (offline clang and hiprtc alike)."""
        return ("-O3", "-std=c++17", f"-ffp-contract={self.fp_contract}")


DEFAULT = HipOptions()
