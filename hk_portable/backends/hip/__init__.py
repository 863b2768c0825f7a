"""The hip backend: AMD Instinct CDNA3 (gfx942) and CDNA4 (gfx950).

  codegen.py   Program -> header-free HIP C++ over include/hk_hip.h (the device library)
  offline.py   the pinned clang: assembly, code object, resource report (no ROCm needed)
  runtime.py   hip-python: hiprtc, module load, launch on torch's stream (needs ROCm)
  emulator/    the CPU wave64 emulator that runs the same source for emulated targets
  abi.py       the kernel argument layout the host packs

Which path a launch takes follows the tensors: CPU tensors run on the emulator, GPU tensors on the
device through hiprtc. See README.md in this folder.
"""
from __future__ import annotations

import os

from typing import Any, Sequence

import torch

from ... import __version__
from ...interface.backend import Artifact, Backend, BackendStatus, Target
from ...interface.errors import ArgumentError, BackendError, UnsupportedError
from ...interface.ir import Program
from . import abi, codegen, offline, runtime

ARCHS = ("gfx942", "gfx950")
MMA_SHAPES = {"gfx942": ("16x16x16",), "gfx950": ("16x16x16", "16x16x32")}
DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")
EMIT_KINDS = ("source", "asm", "hsaco")
NUMERICS = {"fp_contract": "off", "std": "c++17", "opt": "-O3", "denormals": "ieee (f32 and f16 kept)",
            "fp8": "OCP e4m3/e5m2 converted in software (RNE, saturating) on both archs",
            "exp2/log2": "v_exp_f32 / v_log_f32", "exp/log": "range-reduced onto v_exp_f32 / v_log_f32"}


def _emulator():
    """The emulator module and whether it can run here: (module | None, reason)."""
    try:
        from . import emulator
    except Exception as e:  # noqa: BLE001 - a broken emulator is a reason, not a crash
        return None, f"the emulator failed to import: {type(e).__name__}: {e}"
    ok, why = emulator.available()
    return (emulator, "ok") if ok else (None, why)


def make_target(arch: str, *, runs: bool, compile_only: bool = False, emulated: bool = False) -> Target:
    caps = ("atomics", "dropout", "fp8") + (("run",) if runs else ())
    return Target(backend="hip", arch=arch, vendor="amd", lanes=64, max_shared_bytes=codegen.LDS_BYTES[arch],
                  mma_shapes=MMA_SHAPES[arch], dtypes=DTYPES, capabilities=caps, compile_only=compile_only,
                  emulated=emulated)


EMULATED_LAUNCH_TIMEOUT_S = 300.0   # default per emulated launch; HK_EMU_TIMEOUT_S overrides


class HipBackend(Backend):
    name = "hip"

    # ------------------------------------------------------------------------------------ discovery
    def status(self) -> BackendStatus:
        p = runtime.probe()
        if p.available:
            return BackendStatus(True, None, p.device)
        extra = []
        ok, why = offline.available()
        extra.append(f"compile-only targets {', '.join(ARCHS)} ({offline.version()})" if ok
                     else f"no offline compiler ({why})")
        emu, why = _emulator()
        extra.append(f"emulated targets {', '.join(ARCHS)} run on the CPU emulator (--emulate)" if emu
                     else f"no emulator ({why})")
        return BackendStatus(False, f"{p.reason}; {'; '.join(extra)}")

    def targets(self) -> list[Target]:
        p = runtime.probe()
        out = [make_target(p.arch, runs=True)] if p.available else []
        out += [make_target(a, runs=False, compile_only=True) for a in ARCHS if not (p.available and a == p.arch)]
        emu, _ = _emulator()
        if emu is not None:
            out += [make_target(a, runs=True, emulated=True) for a in ARCHS]
        return out

    def claims_device(self, device) -> bool:
        """GPU tensors of a ROCm build of torch (CPU tensors go to the reference unless hip is named)."""
        return torch.device(device).type == "cuda" and bool(getattr(torch.version, "hip", None))

    def accepts_device(self, device) -> bool:
        device = torch.device(device)
        if device.type == "cpu":
            return _emulator()[0] is not None
        return device.type == "cuda" and bool(getattr(torch.version, "hip", None)) and runtime.probe().available

    # ------------------------------------------------------------------------------------ compiling
    def compiler_version(self) -> str:
        """Enters the compile cache key: the offline clang and everything that shapes the source."""
        return f"{offline.version()} | lib {codegen.library_hash()}"

    def check(self, program: Program, target: Target, options: dict | None = None) -> None:
        self._require_arch(target)
        codegen.check(program, target, codegen.make_plan(program, target, options))

    def compile(self, program: Program, target: Target, options: dict | None = None) -> Artifact:
        self._require_arch(target)
        plan = codegen.make_plan(program, target, options)
        codegen.check(program, target, plan)
        k = codegen.emit(program, plan)
        resources: dict[str, Any] = {"waves": plan.waves, "threads": plan.threads, "lds_planned": plan.lds_bytes,
                                     "scratch_lds": plan.scratch_bytes,
                                     "schedule": ", ".join(s["schedule"] for s in plan.schedules) or "none"}
        asm = None
        ok, why = offline.available()
        if ok:
            asm = offline.compile_asm(k.source, target.arch, k.kernel_name)
            resources.update(offline.report(asm, k.kernel_name))
            resources["compiler"] = offline.version()
        else:
            resources["offline"] = why
        return Artifact(
            backend=self.name, target=target.arch, kernel_name=k.kernel_name, program_hash=program.hash,
            source=k.source, binary=None, asm=asm,
            launch={"block": (plan.threads, 1, 1), "dynamic_shared_bytes": 0, "plan": plan.to_json(),
                    "params": [(p.name, str(p.type)) for p in program.params]},
            resources=resources, options={**NUMERICS, "hk": __version__, **dict(options or {})},
            payload=program)

    def restore(self, artifact: Artifact, program: Program) -> Artifact:
        artifact.payload = program            # the Program (its params) drives argument packing
        return artifact

    def emit(self, artifact: Artifact, kind: str) -> str | bytes:
        if kind == "source":
            return artifact.source
        if kind in ("asm", "hsaco") and artifact.asm is None:
            raise UnsupportedError(f"backend 'hip' cannot emit {kind!r}: {artifact.resources.get('offline')}")
        if kind == "asm":
            return offline.format_report(artifact.resources) + artifact.asm
        if kind == "hsaco":
            if artifact.binary is None:
                artifact.binary = offline.assemble(artifact.asm, artifact.target, artifact.kernel_name)
            return artifact.binary
        raise UnsupportedError(f"backend 'hip' cannot emit {kind!r}; it can emit: ir, {', '.join(EMIT_KINDS)}")

    # ------------------------------------------------------------------------------------ launching
    def launch(self, artifact: Artifact, args: Sequence[Any], grid: tuple[int, int, int], stream=None) -> None:
        program: Program | None = artifact.payload
        if program is None:
            raise BackendError("hip artifact has no Program attached (compile it through this backend)")
        abi.check_args(artifact.kernel_name, program.params, args)
        if 0 in grid:
            return
        threads = artifact.launch["block"][0]
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        if devices <= {"cpu"} and (devices or not runtime.probe().available):
            return self._launch_emulated(artifact, program, args, grid, threads)
        if devices != {"cuda"}:
            raise ArgumentError(f"{artifact.kernel_name}: tensors on {sorted(devices)}; the hip backend takes all "
                                "tensors on one AMD GPU (or all on the CPU, for the emulator)")
        p = runtime.probe()
        if not p.available:
            raise BackendError(f"cannot launch on the GPU: {p.reason}")
        if p.arch != artifact.target:
            raise BackendError(f"artifact compiled for {artifact.target}, but the device is {p.arch}")
        fn = runtime.function(artifact.source, p.arch, artifact.kernel_name, artifact.program_hash)
        runtime.launch(fn, grid, threads, abi.device_struct(program.params, args), stream)

    def _launch_emulated(self, artifact: Artifact, program: Program, args, grid, threads: int) -> None:
        emu, why = _emulator()
        if emu is None:
            raise BackendError(f"cannot run {artifact.kernel_name} on CPU tensors: {why}")
        mod = emu.load(artifact.source, artifact.target, name=f"{artifact.kernel_name}.hip", fp_contract="off")
        # a generated kernel that loops forever must fail the case, not hang the suite (or CI)
        timeout = None if os.environ.get("HK_EMU_TIMEOUT_S") else EMULATED_LAUNCH_TIMEOUT_S
        mod.launch(artifact.kernel_name, grid=grid, block=(threads, 1, 1),
                   args=abi.emulator_args(program.params, args, emu), timeout=timeout)

    @staticmethod
    def _require_arch(target: Target) -> None:
        if target.arch not in ARCHS:
            raise UnsupportedError(f"the hip backend generates code for {', '.join(ARCHS)}, not {target.arch!r}")
