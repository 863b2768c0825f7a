"""One build-variant search for every compiling backend: a Program is built as its plan says, then under an ordered
list of plan changes (more registers a thread, a schedule part given up, ...), each compiled and kept only where an
acceptance rule on what the compiler reported (spills, registers, occupancy, the ISA analyser's bound) says it is
better than the build kept so far. Every try is recorded (`record()`, into the Artifact), and a search compiles at
most `cap` builds: a try past it is recorded as skipped, never compiled.

The backend supplies `compile(spec) -> Build` (a spec is its own dict of build parameters, e.g. cuda's min_blocks,
fast_exp2, hand_over, variant; hip's plan) and the rules; the search owns the order, the cap and the record.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

MAX_COMPILES = 8          # the most any backend's ladder takes today (cuda: base, registers, exp2, hand-over, 3 fills)


@dataclass
class Build:
    """One compiled build: the spec it was made from, the backend's products and the compiler's resource report."""
    spec: dict
    products: Any
    resources: dict


@dataclass
class Search:
    compile: Callable[[dict], Build]
    cap: int = MAX_COMPILES
    refusals: tuple = ()                   # the backend's exceptions meaning "this change cannot be built"
    kept: Build | None = None
    tries: list[dict] = field(default_factory=list)
    compiles: int = 0
    last: Build | None = None              # the build the last consider() compiled, kept or not

    def start(self, spec: dict) -> Build:
        """The build the plan asks for: kept whatever it reports."""
        self.kept = self.compile(spec)
        self.compiles = 1
        self.tries.append(self._entry("plan", self.kept, True))
        return self.kept

    def consider(self, change: str, spec: dict, accept: Callable[[Build, Build], bool]) -> bool:
        """Build `spec` (the kept build's spec with `change` made) and keep it where accept(candidate, kept) holds.
        False where the cap was reached or the compiler refused the build (both recorded)."""
        self.last = None
        if self.compiles >= self.cap:
            self.tries.append({"change": change, "kept": False, "skipped": f"cap of {self.cap} compiles reached"})
            return False
        self.compiles += 1
        try:
            build = self.compile(spec)
        except self.refusals as e:
            self.tries.append({"change": change, "kept": False, "refused": str(e)[:200]})
            return False
        self.last = build
        ok = bool(accept(build, self.kept))
        self.tries.append(self._entry(change, build, ok))
        if ok:
            self.kept = build
        return ok

    def record(self) -> list[dict]:
        return list(self.tries)

    @staticmethod
    def _entry(change: str, build: Build, kept: bool) -> dict:
        keys = ("registers", "spill_stores", "stack_bytes", "vgpr", "sgpr", "vgpr_spill", "scratch_bytes")
        return {"change": change, "kept": kept, **{k: build.resources[k] for k in keys if k in build.resources}}
