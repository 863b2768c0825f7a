from __future__ import annotations

import torch

from ...version import __version__
from ...interface.backend import Artifact, Backend, BackendStatus, Target
from ...interface.errors import UnsupportedError
from .interpreter import Interpreter
from .options import ReferenceOptions

CPU_TARGET = Target(backend="reference", arch="cpu", vendor="none", lanes=1,
                    capabilities=("run", "atomics", "dropout", "fp8"))


class ReferenceBackend(Backend):
    """Runs every op as torch does, op by op, all blocks of a grid at once (on any torch device)."""
    name = "reference"

    def status(self) -> BackendStatus:
        return BackendStatus(True, None, f"torch {torch.__version__} interpreter")

    def targets(self) -> list[Target]:
        return [CPU_TARGET]

    def check(self, program, target, options=None) -> None:
        ReferenceOptions.coerce(options)

    def compile(self, program, target, options=None) -> Artifact:
        opts = ReferenceOptions.coerce(options)
        return Artifact(backend=self.name, target=target.arch, kernel_name=program.name,
                        program_hash=program.hash, source=str(program),
                        options={**opts.to_json(), "interpreter": "torch", "version": __version__}, payload=program)

    def launch(self, artifact, args, grid, stream=None) -> None:
        program = artifact.payload
        if program is None:
            raise RuntimeError("reference artifact has no Program attached")
        with torch.no_grad():
            Interpreter(program, args, grid).run()

    def accepts_device(self, device) -> bool:
        """Any torch device with data: a 'meta' tensor has none, so a run would compute nothing."""
        return torch.device(device).type != "meta"

    def claims_device(self, device) -> bool:
        return torch.device(device).type == "cpu"

    def cacheable(self) -> bool:
        return False

    def emit(self, artifact, kind):
        """The reference interprets the Tile IR itself: the IR is all there is to show."""
        if kind != "ir":
            raise UnsupportedError(f"the reference backend interprets the Tile IR and produces no {kind}; "
                                   "use --emit ir (or a compiling backend such as cuda or hip)")
        return str(artifact.payload)
