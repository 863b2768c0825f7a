"""The cuda backend (placeholder until its code generator lands: it says so, and never fakes a run)."""
from ...interface.backend import Backend, BackendStatus
from ...interface.errors import UnsupportedError


class CudaBackend(Backend):
    name = "cuda"

    def status(self) -> BackendStatus:
        return BackendStatus(False, "the cuda backend is not implemented yet")

    def targets(self):
        return []

    def compile(self, program, target, options=None):
        raise UnsupportedError("the cuda backend is not implemented yet")

    def launch(self, artifact, args, grid, stream=None):
        raise UnsupportedError("the cuda backend is not implemented yet")
