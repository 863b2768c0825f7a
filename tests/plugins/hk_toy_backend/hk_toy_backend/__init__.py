"""A third-party hk_portable backend, as an outside author would write one.

It declares a narrow target (no fp8, no atomics, no dropout, 12 KiB of shared memory) and checks
Programs against it; it executes through the public `hk_portable.get_backend("reference")` object,
so it depends on hk_portable's public API only (no hk_portable.backends.* import)."""
from __future__ import annotations

import hk_portable
from hk_portable.interface import Artifact, Backend, BackendStatus, Target, UnsupportedError
from hk_portable.interface.ir import GlobalType, SharedBufType, TileType

TOY_TARGET = Target(backend="toy", arch="toy1", vendor="none", lanes=1, max_shared_bytes=12 * 1024,
                    dtypes=("bf16", "f16", "f32", "i32"), capabilities=("run",))
NEEDS_CAPABILITY = {"atomic_add": "atomics", "dropout_mask": "dropout"}


class ToyBackend(Backend):
    name = "toy"

    def status(self) -> BackendStatus:
        return BackendStatus(True, None, "toy target on the CPU (executes through the reference)")

    def targets(self) -> list[Target]:
        return [TOY_TARGET]

    def check(self, program, target) -> None:
        smem = sum(op.result.type.nbytes for op in program.body.walk() if op.opcode == "alloc_shared")
        if smem > target.max_shared_bytes:
            raise UnsupportedError(f"toy: kernel '{program.name}' needs {smem} bytes of shared memory; "
                                   f"target {target.arch} has {target.max_shared_bytes}")
        for op in program.body.walk():
            if op.opcode in NEEDS_CAPABILITY and not target.has(NEEDS_CAPABILITY[op.opcode]):
                raise UnsupportedError(f"toy: target {target.arch} has no {NEEDS_CAPABILITY[op.opcode]} "
                                       f"('{op.opcode}' in kernel '{program.name}')")
            for v in op.results:
                t = v.type
                typed = isinstance(t, (TileType, SharedBufType, GlobalType))
                if typed and t.dtype.name not in target.dtypes + ("bool",):
                    raise UnsupportedError(f"toy: target {target.arch} has no {t.dtype} (kernel '{program.name}')")

    def compile(self, program, target, options=None) -> Artifact:
        return Artifact(backend=self.name, target=target.arch, kernel_name=program.name,
                        program_hash=program.hash, source=str(program), payload=program)

    def launch(self, artifact, args, grid, stream=None) -> None:
        ref = hk_portable.get_backend("reference")
        ref.launch(ref.compile(artifact.payload, ref.default_target()), args, grid, stream)

    def cacheable(self) -> bool:
        return False            # the artifact is the Program itself

    def accepts_device(self, device) -> bool:
        return device.type == "cpu"
