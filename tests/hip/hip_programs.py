"""Every Program the conformance suite and the kernel library launch, collected without running them:
a recording backend takes the compile() calls and makes launch() a no-op."""
from __future__ import annotations

from functools import lru_cache

import torch

from hk_portable.interface.backend import Artifact, Backend, BackendStatus, Target
from hk_portable.interface.ir import Program


class Recorder(Backend):
    name = "hip-program-recorder"

    def __init__(self):
        self.programs: dict[str, Program] = {}
        self.origin: dict[str, str] = {}
        self.current = ""

    def status(self) -> BackendStatus:
        return BackendStatus(True, None, "records programs")

    def targets(self) -> list[Target]:
        return [Target(self.name, "any", capabilities=("run", "atomics", "dropout", "fp8"))]

    def compile(self, program, target, options=None) -> Artifact:
        self.programs.setdefault(program.hash, program)
        self.origin.setdefault(program.hash, self.current)
        return Artifact(self.name, target.arch, program.name, program.hash, payload=program)

    def launch(self, artifact, args, grid, stream=None) -> None:
        pass

    def cacheable(self) -> bool:
        return False


@lru_cache(maxsize=1)
def all_programs() -> tuple[tuple[str, Program], ...]:
    """(the first case that launches it, Program) for every distinct Program of every case."""
    from hk_portable.conformance.cases import all_cases
    rec = Recorder()
    for case in all_cases():
        if case.missing:
            continue
        rec.current = case.id
        setup = case.make(torch.Generator().manual_seed(0))
        setup.launch({**setup.inputs, **setup.outputs}, rec)
    return tuple((rec.origin[h], p) for h, p in rec.programs.items())
