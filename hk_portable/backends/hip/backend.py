"""HipBackend: AMD Instinct CDNA3 (gfx942) and CDNA4 (gfx950).

Which path a launch takes follows the tensors: CPU tensors run on the emulator, GPU tensors on the
device through hiprtc. See README.md in this folder.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ...version import __version__
from ...codegen import lowering
from ...codegen.build_search import Build, Search
from ...codegen.layouts import all_grids, all_strips, all_wide_accumulators
from ...codegen.layouts import describe as describe_layouts
from ...interface.backend import Artifact, Backend, BackendStatus, Target
from ...interface.errors import ArgumentError, BackendError, UnsupportedError
from ...interface.ir import Program
from . import analyze as isa, codegen, compiler, driver, preferences, schedule
from .archs import NAMES as ARCHS, make_target
from .options import HipOptions

EMIT_KINDS = ("source", "asm", "hsaco")
NUMERICS = {"fp_contract": "off", "std": "c++17", "opt": "-O3", "denormals": "ieee (f32 and f16 kept)",
            "fp8": "OCP e4m3/e5m2 converted in software (RNE, saturating) on both archs; mma per archs.Arch.fp8_mma",
            "exp2/log2": "v_exp_f32 / v_log_f32", "exp/log": "range-reduced onto v_exp_f32 / v_log_f32"}


class HipBackend(Backend):
    name = "hip"
    tuning_table = preferences        # preferred() and propose(): its arch-keyed tables

    # ------------------------------------------------------------------------------------ discovery
    def status(self) -> BackendStatus:
        p = driver.probe()
        if p.available:
            return BackendStatus(True, None, p.device)
        extra = []
        ok, why = compiler.available()
        extra.append(f"compile-only targets {', '.join(ARCHS)} ({compiler.version()})" if ok
                     else f"no offline compiler ({why})")
        emu, why = driver.emulator_module()
        extra.append(f"emulated targets {', '.join(ARCHS)} run on the CPU emulator (--emulate)" if emu
                     else f"no emulator ({why})")
        return BackendStatus(False, f"{p.reason}; {'; '.join(extra)}")

    def targets(self) -> list[Target]:
        p = driver.probe()
        out = [make_target(p.arch, runs=True)] if p.available else []
        out += [make_target(a, runs=False, compile_only=True) for a in ARCHS if not (p.available and a == p.arch)]
        emu, _ = driver.emulator_module()
        if emu is not None:
            out += [make_target(a, runs=True, emulated=True) for a in ARCHS]
        return out

    def claims_device(self, device) -> bool:
        """GPU tensors of a ROCm build of torch (CPU tensors go to the reference unless hip is named)."""
        return torch.device(device).type == "cuda" and bool(getattr(torch.version, "hip", None))

    def accepts_device(self, device) -> bool:
        device = torch.device(device)
        if device.type == "cpu":
            return driver.emulator_module()[0] is not None
        return device.type == "cuda" and bool(getattr(torch.version, "hip", None)) and driver.probe().available

    # ------------------------------------------------------------------------------------ compiling
    def compiler_version(self) -> str:
        """Enters the compile cache key: the offline clang and everything that shapes the source."""
        return f"{compiler.version()} | lib {codegen.library_hash()}"

    def check(self, program: Program, target: Target, options=None) -> None:
        self._require_arch(target)
        schedule.check(program, target, schedule.make_plan(program, target, options))

    def choose_config(self, candidates, target: Target) -> dict:
        """The first candidate whose register values all took strips (the norms' one-pass shapes), whose
        mma accumulators all took wave grids (gemm's wide tiles), or whose accumulators are wave grids or
        transposed fragments of two or more 16-row blocks per wave (attention: each K/V fragment a wave
        reads feeds two MFMAs), among those the target accepts; else the kernel's baseline."""
        for cfg, program in candidates:
            waves = int(program.num_warps)
            lay = schedule.layouts(program, waves, target.lanes)
            if all_strips(lay) or all_grids(program, lay) or all_wide_accumulators(program, lay, waves):
                return cfg
        return super().choose_config(candidates, target)

    def rejects(self, artifact: Artifact, target: Target) -> str | None:
        """A build that spills VGPRs to scratch memory inside a pipeline loop's steady state (scratch loads or
        stores on the one_trip of a loop holding MFMAs, the iteration the ISA analyser measures: every K step pays
        them): the kernel's next configuration is taken instead, the reason in config_notes. A spill outside the
        loops (a prologue's or an epilogue's, once per block) or on a loop's partial-tile paths only is accepted:
        the loop runs as fast as without it. The emulator's host build has no register file to judge."""
        r = artifact.resources
        if target.emulated or artifact.asm is None or not (r.get("vgpr_spill") or r.get("scratch_bytes")):
            return None
        where = isa.scratch_in_loops(self.analyze(artifact))
        if not where:
            return None
        return (f"spills {r.get('vgpr_spill', 0)} VGPRs ({r.get('scratch_bytes', 0)} scratch bytes) at "
                f"{r.get('vgpr')} VGPRs under {r.get('compiler')}, inside its pipeline loop ({'; '.join(where)})")

    def lowered(self, program: Program, target: Target, after: str | None = None) -> str:
        return lowering.describe(lowering.lower(program, target, PASSES, after), PASSES)

    def compile(self, program: Program, target: Target, options=None) -> Artifact:
        self._require_arch(target)
        opts = HipOptions.coerce(options)
        plan = schedule.make_plan(program, target, opts)
        schedule.check(program, target, plan)
        resources: dict[str, Any] = {"waves": plan.waves, "threads": plan.threads, "lds_planned": plan.lds_bytes,
                                     "scratch_lds": plan.scratch_bytes,
                                     "schedule": ", ".join(s.schedule for s in plan.schedules) or "none"}
        asm = None
        ok, why = compiler.available()
        if ok:
            search = Search(lambda spec: self._build_asm(program, target, opts, spec["plan"]))
            search.start({"plan": plan})
            if opts.prefetch == "auto" and any(s.prefetch == "split" for s in plan.schedules):
                self._split_or_whole(program, target, search)
            if opts.interleave == "auto" and any(s.interleave == "mfma_exp" for s in plan.schedules):
                self._interleave_or_not(target, search)
            plan, (k, asm) = search.kept.spec["plan"], search.kept.products
            resources.update(search.kept.resources)
            resources["compiler"] = compiler.version()
            resources["build_tries"] = search.record()
        else:
            k = codegen.emit(program, plan)        # the source an offline artifact keeps
            resources["offline"] = why
        return Artifact(
            backend=self.name, target=target.arch, kernel_name=k.kernel_name, program_hash=program.hash,
            source=k.source, binary=None, asm=asm,
            launch={"block": (plan.threads, 1, 1), "dynamic_shared_bytes": 0, "plan": plan.to_json(),
                    "params": [(p.name, str(p.type)) for p in program.params]},
            resources=resources, options={**NUMERICS, **opts.to_json(), "hk": __version__},
            payload=program)

    @staticmethod
    def _build_asm(program: Program, target: Target, opts: HipOptions, plan) -> Build:
        k = codegen.emit(program, plan)
        asm = compiler.compile_asm(k.source, target.arch, k.kernel_name, opts.device_flags())
        return Build({"plan": plan}, (k, asm), compiler.report(asm, k.kernel_name))

    @staticmethod
    def _split_or_whole(program: Program, target: Target, search: Search) -> None:
        """Split pipeline loads hold a step's tiles in registers across the compute step. When that build
        spills or runs fewer waves per SIMD than the LDS allows, the whole-load build is compiled too and
        the better of the two kept (fewer spilled bytes, then more waves; a tie keeps the split): the
        choice and its reason go into the plan."""
        @_per_build
        def cost(b: Build) -> tuple[int, int, int]:
            (k, a), r = b.products, b.resources
            _, notes = isa.kernel_text(a, k.kernel_name)
            occ = isa.occupancy(target.arch, isa.total_vgprs(r, notes), r.get("lds_bytes", 0),
                                r.get("max_flat_workgroup_size") or b.spec["plan"].threads)
            spilled = r.get("vgpr_spill", 0) + r.get("scratch_bytes", 0)
            return spilled, occ["waves_per_simd"], occ["waves_per_simd_by_lds"]
        split, plan = search.kept, search.kept.spec["plan"]
        spill, waves, by_lds = cost(split)
        if not spill and waves >= by_lds:
            return
        taken = search.consider("whole loads", {"plan": schedule.unsplit(plan, "")},
                                lambda c, k: (cost(c)[0], -cost(c)[1]) < (spill, -waves))
        if search.last is None:                 # not compiled (the cap): the split stays, unexplained
            return
        spill2, waves2, _ = cost(search.last)
        split_build = f"split: {split.resources.get('vgpr')} VGPRs, {waves} waves/SIMD, {spill} bytes spilled"
        whole_build = f"whole: {search.last.resources.get('vgpr')} VGPRs, {waves2} waves/SIMD, {spill2} bytes spilled"
        if taken:
            search.kept.spec["plan"] = schedule.unsplit(plan, f"registers: {split_build}; {whole_build}")
            return
        search.kept.spec["plan"] = schedule.noted(plan, "prefetch", "split",
                                                  f" (whole build no better: {split_build}; {whole_build})")

    @staticmethod
    def _interleave_or_not(target: Target, search: Search) -> None:
        """The MFMA/exp interleave (patterns.interleaved_pv) reorders the compute step and lets LLVM place its
        VALU among the MFMAs; LLVM may then select differently (on gfx950 it unpacks the packed adds it puts in
        an MFMA's shadow: more VALU instructions). When the interleaved build spills, runs fewer waves per SIMD
        than its LDS allows, or its main loop's VALU time exceeds its MFMA time (issue 10's attention bound), the
        plain build is compiled too and kept if it does none of these; the figures of both go into the plan."""
        @_per_build
        def cost(b: Build) -> tuple[int, int, int, float]:
            (k, a), r = b.products, b.resources
            an = isa.analyze(a, target.arch, k.kernel_name, r)
            main = next((lp for lp in an["loops"] if lp["main"]), None)
            ratio = main["one_trip"]["clocks"]["valu_to_mfma"] if main else 0.0
            spilled = r.get("vgpr_spill", 0) + r.get("sgpr_spill", 0) + r.get("scratch_bytes", 0)
            occ = an["occupancy"]
            return spilled, occ["waves_per_simd"], occ["waves_per_simd_by_lds"], ratio or 0.0

        def key(c) -> tuple[int, int, bool]:
            return c[0], -c[1], c[3] > 1.0

        def says(c) -> str:
            return f"{c[0]} bytes spilled, {c[1]} waves/SIMD, main loop VALU/MFMA {c[3]}"

        def note(text: str) -> None:
            search.kept.spec["plan"] = schedule.noted(plan, "interleave", "mfma_exp", f" ({text})")
        plan = search.kept.spec["plan"]
        mine = cost(search.kept)
        if not (mine[0] or mine[1] < mine[2] or mine[3] > 1.0):
            return note(says(mine))
        taken = search.consider("not interleaved", {"plan": schedule.uninterleaved(plan, "")},
                                lambda c, k: key(cost(c)) < key(mine))
        if search.last is None:                 # not compiled (the cap)
            return note(says(mine))
        theirs = cost(search.last)
        if taken:
            search.kept.spec["plan"] = schedule.uninterleaved(
                plan, f"measured: interleaved {says(mine)}; not interleaved {says(theirs)}")
            return
        note(f"{says(mine)}; not interleaved no better: {says(theirs)}")

    def restore(self, artifact: Artifact, program: Program) -> Artifact:
        artifact.payload = program            # the Program (its params) drives argument packing
        return artifact

    def emit(self, artifact: Artifact, kind: str) -> str | bytes:
        if kind == "source":
            return artifact.source
        if kind in ("asm", "hsaco") and artifact.asm is None:
            raise UnsupportedError(f"backend 'hip' cannot emit {kind!r}: {artifact.resources.get('offline')}")
        if kind == "asm":
            return compiler.format_report(artifact.resources) + artifact.asm
        if kind == "hsaco":
            if artifact.binary is None:
                artifact.binary = compiler.assemble(artifact.asm, artifact.target, artifact.kernel_name)
            return artifact.binary
        raise UnsupportedError(f"backend 'hip' cannot emit {kind!r}; it can emit: ir, {', '.join(EMIT_KINDS)}")

    def analyze(self, artifact: Artifact) -> dict:
        """The ISA analyser (analyze.py): loops, instruction classes, occupancy, the issue-rate bound."""
        if artifact.asm is None:
            raise UnsupportedError(f"backend 'hip' cannot analyse {artifact.kernel_name}: no assembly "
                                   f"({artifact.resources.get('offline')})")
        return isa.analyze(artifact.asm, artifact.target, artifact.kernel_name, artifact.resources)

    # ------------------------------------------------------------------------------------ launching
    def launch(self, artifact: Artifact, args: Sequence[Any], grid: tuple[int, int, int], stream=None) -> None:
        program: Program | None = artifact.payload
        if program is None:
            raise BackendError("hip artifact has no Program attached (compile it through this backend)")
        driver.check_args(artifact.kernel_name, program.params, args)
        if 0 in grid:
            return
        threads = artifact.launch["block"][0]
        opts = HipOptions.from_dict({k: artifact.options[k] for k in HipOptions.names() if k in artifact.options})
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        if devices <= {"cpu"} and (devices or not driver.probe().available):
            return driver.launch_emulated(artifact, program, args, grid, threads, opts.fp_contract)
        if devices != {"cuda"}:
            raise ArgumentError(f"{artifact.kernel_name}: tensors on {sorted(devices)}; the hip backend takes all "
                                "tensors on one AMD GPU (or all on the CPU, for the emulator)")
        p = driver.probe()
        if not p.available:
            raise BackendError(f"cannot launch on the GPU: {p.reason}")
        if p.arch != artifact.target:
            raise BackendError(f"artifact compiled for {artifact.target}, but the device is {p.arch}")
        fn = driver.function(artifact.source, p.arch, artifact.kernel_name, artifact.program_hash,
                             opts.device_flags())
        driver.launch(fn, grid, threads, driver.device_struct(program.params, args), stream)

    @staticmethod
    def _require_arch(target: Target) -> None:
        if target.arch not in ARCHS:
            raise UnsupportedError(f"the hip backend generates code for {', '.join(ARCHS)}, not {target.arch!r}")


def _per_build(cost):
    """`cost(build)` computed once per build (reading a build's ISA is the expensive part of the search's rules)."""
    seen: dict[int, tuple] = {}

    def once(b: Build) -> tuple:
        if id(b) not in seen:
            seen[id(b)] = cost(b)
        return seen[id(b)]
    return once


def _show_plan(lo: lowering.Lowered, plan) -> str:
    lay = describe_layouts(lo.program, plan.lowering.layouts)
    return (f"// plan (hip backend, {lo.target.spec}): {plan.to_json()}\n"
            f"// layouts ({plan.waves} waves of {plan.wave_size})\n" + "\n".join(lay))


PASSES = (lowering.Pass("plan", lambda lo: schedule.make_plan(lo.program, lo.target), _show_plan),)
"""The hip lowering before the emitter: make_plan, which runs each analysis once (the layouts, preloads and pattern
finders it keeps in Plan.lowering) and decides the schedules (`hk compile --emit lowered`)."""
