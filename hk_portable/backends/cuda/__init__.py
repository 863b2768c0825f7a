"""The cuda backend: Tile IR -> CUDA C++ over hk_cuda.cuh -> NVRTC -> cubin, launched on torch's stream.

Targets: the device's own (sm_80 for Ampere, sm_90a for Hopper) first when a GPU is usable, then
compile-only sm_80 and sm_90a, which work on any machine with NVRTC (no GPU needed).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ...interface.backend import Artifact, Backend, BackendStatus, Target
from ...interface.errors import ArgumentError, UnsupportedError
from . import codegen, runtime

SMEM_LIMIT = {"sm_80": 166912, "sm_90a": 232448}          # 163 KiB (A100), 227 KiB (H100/H200) per block
MMA_SHAPES = ("m16n8k16",)
DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")
EMIT_KINDS = ("source", "asm", "ptx", "sass")


def _target(arch: str, compile_only: bool, max_shared: int | None = None) -> Target:
    caps = ("atomics", "dropout", "fp8") + (() if compile_only else ("run",))
    return Target(backend="cuda", arch=arch, vendor="nvidia", lanes=32,
                  max_shared_bytes=max_shared or SMEM_LIMIT.get(arch, SMEM_LIMIT["sm_80"]),
                  mma_shapes=MMA_SHAPES, dtypes=DTYPES, capabilities=caps, compile_only=compile_only)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self):
        self._probe = None
        self._targets: list[Target] | None = None
        self._lock = threading.RLock()     # _plan() holds it while _probed() takes it again

    # ------------------------------------------------------------------------------ availability
    def _probed(self):
        with self._lock:
            if self._probe is None:
                self._probe = runtime.probe()
            return self._probe

    def status(self) -> BackendStatus:
        ok, reason, devices = self._probed()
        if not ok:
            return BackendStatus(False, reason)
        d = devices[0]
        # the first kernel call asks for status(): name NVRTC by its library file, without loading it
        return BackendStatus(True, None, f"{d['name']} (sm_{d['cc'][0]}{d['cc'][1]}, target {runtime.arch_for(d['cc'])}; "
                                         f"{self.nvrtc_name()})")

    def targets(self) -> list[Target]:
        if self._targets is None:                   # on every kernel call's path: built once
            self._targets = self._make_targets()
        return self._targets

    def _make_targets(self) -> list[Target]:
        ok, _, devices = self._probed()
        out: list[Target] = []
        if ok:
            d = devices[0]
            arch = runtime.arch_for(d["cc"])
            out.append(_target(arch, False, min(d["smem_optin"] or SMEM_LIMIT.get(arch, 0),
                                                SMEM_LIMIT.get(arch, d["smem_optin"]))))
        for arch in ("sm_80", "sm_90a"):
            if all(t.arch != arch for t in out):
                out.append(_target(arch, True))
        return out

    def accepts_device(self, device) -> bool:
        import torch
        return getattr(device, "type", None) == "cuda" and not getattr(torch.version, "hip", None)

    def claims_device(self, device) -> bool:
        return self.accepts_device(device)      # CUDA tensors of a CUDA build of torch

    @staticmethod
    def nvrtc_name() -> str:
        try:
            ident = runtime.nvrtc_identity()
        except Exception as e:  # noqa: BLE001 - reported, never fatal in status()
            return f"NVRTC unavailable: {e}"
        return ident if ident.startswith("nvrtc") else "NVRTC " + ident.split(":")[0].split("/")[-1]

    # ------------------------------------------------------------------------------------ compile
    def compiler_version(self) -> str:
        """Part of the cache key: NVRTC version, the numerics flags and a hash of the device library and
        emitters, so editing either never reuses a stale binary."""
        return f"nvrtc {runtime.nvrtc_identity()}; lib {codegen.library_hash()}; flags {' '.join(runtime.FLAGS)}"

    def check(self, program, target: Target) -> None:
        codegen.check(program, target)

    def compile(self, program, target: Target, options: dict | None = None) -> Artifact:
        codegen.check(program, target)
        emitted, shared = codegen.emit(program, target)
        compiled = runtime.compile_source(emitted.source, emitted.kernel_name, target.arch)
        resources = runtime.parse_ptxas(compiled.log)
        min_blocks = None
        if resources["spill_stores"] or resources["stack_bytes"]:
            # ptxas capped registers for occupancy and spilled: allow it all registers one block needs
            again, _ = codegen.emit(program, target, min_blocks=1)
            retry = runtime.compile_source(again.source, again.kernel_name, target.arch)
            r2 = runtime.parse_ptxas(retry.log)
            if (r2["spill_stores"], r2["stack_bytes"]) < (resources["spill_stores"], resources["stack_bytes"]):
                emitted, compiled, resources, min_blocks = again, retry, r2, 1
        fmt, size, params = runtime.param_layout(emitted.params)
        resources["shared_bytes"] = shared
        return Artifact(
            backend=self.name, target=target.arch, kernel_name=emitted.kernel_name, program_hash=program.hash,
            source=emitted.source, binary=compiled.cubin, asm=compiled.ptx,
            launch={"threads": emitted.num_threads, "block": (emitted.num_threads, 1, 1), "shared_bytes": shared,
                    "params": params, "param_format": fmt, "param_size": size},
            resources=resources,
            options={**runtime.NUMERICS, "nvrtc": runtime.nvrtc_version(), "flags": list(compiled.options),
                     "launch_bounds_min_blocks": min_blocks,
                     "library": codegen.library_hash(), **(options or {})},
            payload=None)

    def restore(self, artifact: Artifact, program) -> Artifact | None:
        """A cached Artifact is usable as is (the cubin loads lazily at the first launch)."""
        if (artifact.backend != self.name or not artifact.binary or artifact.program_hash != program.hash
                or "param_format" not in artifact.launch):
            return None
        artifact.payload = None
        return artifact

    # ------------------------------------------------------------------------------------- launch
    def _plan(self, artifact: Artifact, device_index: int) -> runtime.LaunchPlan:
        plans = artifact.payload
        if plans is None:
            plans = artifact.payload = {}
        plan = plans.get(device_index)
        if plan is None:
            with self._lock:
                plan = plans.get(device_index)
                if plan is None:
                    ok, reason, _ = self._probed()
                    if not ok:
                        raise UnsupportedError(f"the cuda backend cannot launch here: {reason}")
                    plan = plans[device_index] = runtime.LaunchPlan(artifact, device_index)
        return plan

    def launch(self, artifact: Artifact, args, grid, stream=None) -> None:
        dev = runtime.current_device()
        plan = artifact.payload.get(dev) if artifact.payload else None
        if plan is None:
            plan = self._plan(artifact, dev)
        plan.launch(args, grid, stream, artifact.kernel_name)

    # --------------------------------------------------------------------------------------- emit
    def emit(self, artifact: Artifact, kind: str) -> str:
        """The artifact as text: 'source' (CUDA C++), 'ptx' (= 'asm'), or 'sass' (cubin disassembly)."""
        if kind == "source":
            return artifact.source or ""
        if kind in ("ptx", "asm"):
            return artifact.asm or ""
        if kind == "sass":
            return disassemble(artifact.binary)
        raise UnsupportedError(f"backend 'cuda' cannot emit {kind!r} for target {artifact.target}; it can emit: "
                               f"ir, {', '.join(EMIT_KINDS)}")


def find_disassembler() -> list[str] | None:
    """cuobjdump (or nvdisasm) from PATH, CUDA_HOME, the usual toolkit folder or Triton's bundled copy."""
    dirs = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for tool, args in (("cuobjdump", ["-sass"]), ("nvdisasm", ["-c"])):
        cands = [shutil.which(tool)] + [str(Path(d) / "bin" / tool) for d in dirs if d]
        try:
            import triton
            cands.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool))
        except Exception:  # noqa: BLE001 - triton is optional
            pass
        for c in cands:
            if c and os.path.isfile(c) and os.access(c, os.X_OK):
                return [c, *args]
    return None


def disassemble(cubin: bytes | None) -> str:
    if not cubin:
        raise UnsupportedError("cuda backend: this artifact has no cubin to disassemble")
    cmd = find_disassembler()
    if cmd is None:
        raise UnsupportedError("cuda backend: --emit sass needs a disassembler, and neither cuobjdump nor nvdisasm was "
                               "found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, triton's bundled tools); install the "
                               "CUDA toolkit or triton, or use --emit ptx")
    with tempfile.TemporaryDirectory(prefix="hk-sass-") as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([*cmd, path], capture_output=True, text=True)
    if res.returncode != 0:
        raise UnsupportedError(f"cuda backend: {' '.join(cmd)} failed: {res.stderr.strip()}")
    return res.stdout


__all__ = ["CudaBackend", "ArgumentError"]
