"""CudaBackend: Tile IR -> CUDA C++ over hk_cuda.cuh -> NVRTC -> cubin, launched on torch's stream.

Targets (archs.py): the device's own (sm_80 for Ampere, sm_90a for Hopper) first when a GPU is usable,
then compile-only sm_80 and sm_90a, which work on any machine with NVRTC (no GPU needed), then the
emulated sm_80 when a host C++ compiler is present: its artifacts run on CPU tensors (emulator.py).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import asdict, replace

from ...codegen import layouts, lowering
from ...codegen.abi import param_layout
from ...codegen.build_search import Build, Search
from ...codegen.options import OptionError
from ...interface.backend import Artifact, Backend, BackendStatus, Target
from ...interface.errors import UnsupportedError
from ...interface.kernel import stored_params
from ...runtime import clauncher
from . import archs, checks, codegen, compiler, dataflow, driver, emulator, footprint, occupancy, preferences, schedule
from .options import DEFAULT, CudaOptions
from .plan import describe as describe_plan

EMIT_KINDS = ("source", "asm", "ptx", "sass")


def launch_params(params, program) -> tuple:
    """param_layout's (format, size, descriptions), the tensors `program` stores to marked "stored": the compiled
    launcher refuses one whose elements share memory (Kernel.__call__'s check, which its fast path skips)."""
    fmt, size, desc = param_layout(params)
    for i in stored_params(program):
        desc[i]["stored"] = True
    return fmt, size, desc


class CudaBackend(Backend):
    name = "cuda"
    tuning_table = preferences        # preferred() and propose(): its arch-keyed tables

    def __init__(self):
        self._probe = None
        self._targets: list[Target] | None = None
        self._lock = threading.RLock()     # _plan() holds it while _probed() takes it again

    # ------------------------------------------------------------------------------ availability
    def _probed(self):
        with self._lock:
            if self._probe is None:
                self._probe = driver.probe()
            return self._probe

    def status(self) -> BackendStatus:
        ok, reason, devices = self._probed()
        if not ok:
            return BackendStatus(False, reason)
        d = devices[0]
        # the first kernel call asks for status(): name NVRTC by its library file, without loading it
        return BackendStatus(True, None, f"{d['name']} (sm_{d['cc'][0]}{d['cc'][1]}, target "
                                         f"{archs.arch_for(d['cc'])}; {self.nvrtc_name()})")

    def targets(self) -> list[Target]:
        if self._targets is None:                   # on every kernel call's path: built once
            self._targets = self._make_targets()
        return self._targets

    def _make_targets(self) -> list[Target]:
        ok, _, devices = self._probed()
        out: list[Target] = []
        if ok:
            d = devices[0]
            out.append(archs.device_target(archs.arch_for(d["cc"]), d["smem_optin"]))
        out += [archs.make_target(a, runs=False, compile_only=True) for a in archs.ARCHS
                if all(t.arch != a for t in out)]
        if emulator.available()[0]:
            out.append(archs.make_target(archs.EMULATED, runs=True, emulated=True))
        return out

    def accepts_device(self, device) -> bool:
        """CUDA tensors of a CUDA build of torch; CPU tensors too when the emulated target can run them."""
        import torch
        kind = getattr(device, "type", None)
        if kind == "cpu":
            return emulator.available()[0]
        return kind == "cuda" and not getattr(torch.version, "hip", None)

    def claims_device(self, device) -> bool:
        """CUDA tensors of a CUDA build of torch; never CPU tensors (those go to the reference unless the
        emulated target is named)."""
        return getattr(device, "type", None) == "cuda" and self.accepts_device(device)

    @staticmethod
    def nvrtc_name() -> str:
        try:
            ident = compiler.nvrtc_identity()
        except Exception as e:  # noqa: BLE001 - reported, never fatal in status()
            return f"NVRTC unavailable: {e}"
        return ident if ident.startswith("nvrtc") else "NVRTC " + ident.split(":")[0].split("/")[-1]

    # ------------------------------------------------------------------------------------ compile
    def compiler_version(self) -> str:
        """Part of the cache key: NVRTC, the numerics flags, a hash of the device library and emitters, and
        the host build of the emulated target, so editing any of them never reuses a stale binary."""
        try:
            nvrtc = compiler.nvrtc_identity()
        except Exception as e:  # noqa: BLE001 - the emulated target compiles without NVRTC
            nvrtc = f"unavailable ({type(e).__name__})"
        return (f"nvrtc {nvrtc}; lib {codegen.library_hash()}; flags {' '.join(compiler.FLAGS)}; "
                f"host {emulator.identity()}")

    def choose_config(self, candidates, target: Target) -> dict:
        """The first candidate on a fast path: TMA + wgmma pipelines (sm_90a), or, for a kernel without
        mma, every register value in a strip (any target); else the kernel's baseline."""
        for cfg, program in candidates:
            if archs.async_path(target) and _fast_path(program, target):
                return cfg
            if layouts.all_strips(footprint.layouts(program, footprint.num_warps(program, target))):
                return cfg
        return super().choose_config(candidates, target)

    def rejects(self, artifact: Artifact, target: Target) -> str | None:
        """A build that keeps values in local memory after every fallback of _build (the compiler at hand
        may spill where another did not): a smaller configuration is taken instead. Not FA3's schedule within
        the spill it is allowed (schedule.FA3_SPILL_BYTES: measured faster with it than without)."""
        r = artifact.resources
        spill = max(r.get("spill_stores", 0), r.get("stack_bytes", 0))
        if target.emulated or not spill:
            return None
        if (artifact.options.get("schedule") or {}).get("why") == schedule.FA3_WHY:
            consumers = artifact.launch["threads"] // 32 // schedule.PRODUCER_WARPS - 1
            if spill <= schedule.FA3_SPILL_BYTES.get(consumers, 0):
                return None
        return (f"spills {r['spill_stores']} bytes ({r['stack_bytes']}-byte stack) at {r['registers']} registers "
                f"under NVRTC {artifact.options.get('nvrtc')}")

    def lowered(self, program, target: Target, after: str | None = None) -> str:
        return lowering.describe(lowering.lower(program, target, PASSES, after), PASSES)

    def check(self, program, target: Target, options=None) -> None:
        self._options(target, options)
        checks.check(program, target)

    @staticmethod
    def _options(target: Target, options) -> CudaOptions:
        opts = CudaOptions.coerce(options)
        if target.emulated and opts.numerics() != DEFAULT.numerics():
            raise OptionError(f"cuda backend: the emulated target {target.arch} builds with the numerics policy's "
                              f"flags only ({DEFAULT.numerics()}), not {opts.numerics()}")
        return opts

    def compile(self, program, target: Target, options=None) -> Artifact:
        opts = self._options(target, options)
        checks.check(program, target)
        if target.emulated:
            return self._compile_emulated(program, target, opts)
        if opts.variant != "auto":
            return self._build(program, target, opts, opts.fa3() if opts.variant == "fa3" else opts.base())
        fa3 = schedule.fa3_variant(program, target, opts.fa3())
        if fa3 is not None:
            art = self._build(program, target, opts, fa3)
            r, allowed = art.resources, schedule.FA3_SPILL_BYTES[program.num_warps // schedule.PRODUCER_WARPS]
            if max(r["spill_stores"], r["stack_bytes"]) <= allowed and art.launch.get("hand_over_registers"):
                art.options["schedule"]["why"] = schedule.FA3_WHY
                return art
        return self._build(program, target, opts, opts.base())

    def _build(self, program, target: Target, opts: CudaOptions, variant: schedule.Variant) -> Artifact:
        """NVRTC + ptxas, then the plan changes a spill, a lost register hand-over or an SM left part-empty call for,
        in the order of the shared build search (codegen/build_search.py), each try recorded in the Artifact."""
        flags = opts.nvrtc_flags()

        def build(spec: dict) -> Build:
            emitted, shared = codegen.emit(program, target, schedule.plan(program, target, **spec))
            compiled, resources = _nvrtc(emitted, target.arch, flags)
            return Build(spec, (emitted, shared, compiled), resources)

        search = Search(build, refusals=(compiler.CompileError,))
        search.start({"variant": variant, "min_blocks": opts.min_blocks, "hand_over": True, "fast_exp2": True,
                      "tma_reduce": True})
        if opts.min_blocks is None and any(_spilled(search.kept)):
            # ptxas capped registers for occupancy and spilled: allow it all registers one block needs
            search.consider("min_blocks=1", {**search.kept.spec, "min_blocks": 1}, _fewer_spills)
        if any(_spilled(search.kept)):
            # many flushing exps in flight can cost registers the unflushed form does not: try that
            search.consider("fast_exp2=False", {**search.kept.spec, "fast_exp2": False}, _fewer_spills)
        if any(_spilled(search.kept)) and "hk::reduce_" in search.kept.products[0].source:
            # the TMA reduce-adds' two code paths can cost the registers the adds from registers did not
            search.consider("tma_reduce=False", {**search.kept.spec, "tma_reduce": False}, _fewer_spills)
        wanted = search.kept.products[0].extras.get("hand_over_registers")
        if wanted and search.kept.resources["registers"] != wanted:
            # setmaxnreg.inc would wait for registers the block was never given: build without the hand-over
            search.consider("hand_over=False", {**search.kept.spec, "hand_over": False}, lambda c, k: True)
        if (search.kept.spec["min_blocks"] is None and opts.fill_sm
                and not search.kept.products[0].extras.get("producer_warps")):
            self._fill_sm(search, target)
        (emitted, shared, compiled), resources, spec = search.kept.products, search.kept.resources, search.kept.spec
        resources["shared_bytes"] = shared
        return Artifact(
            backend=self.name, target=target.arch, kernel_name=emitted.kernel_name, program_hash=program.hash,
            source=emitted.source, binary=compiled.cubin, asm=compiled.ptx,
            launch=self._launch_info(emitted, shared, program), resources=resources,
            options={**opts.to_json(), "nvrtc": compiler.nvrtc_version(), "nvrtc_library": compiler.loaded_nvrtc(),
                     "flags": list(compiled.options),
                     **({} if compiler.ptxas_report(compiled.log) else {"ptxas_log": compiled.log[-4000:]}),
                     "launch_bounds_min_blocks": spec["min_blocks"], "fast_exp2": spec["fast_exp2"],
                     "schedule": {"variant": spec["variant"].name, **asdict(spec["variant"])},
                     "build_tries": search.record(), "library": codegen.library_hash()},
            payload=None)

    @staticmethod
    def _fill_sm(search: Search, target: Target) -> None:
        """The build asking ptxas for as many blocks an SM as shared memory allows, where registers alone held
        the block below that and the capped build compiles without spilling (occupancy.py). Where what spills is
        one ring across the pipelines (the causal 64x64 attention block at 96 registers: 96 bytes in its diagonal
        step) or the heaviest-first dispatch's indices (registers held all kernel long), the build without them
        is tried, in that order: a fifth 64x64 attention block an SM measured +11 % on the H200, the order +2.8 %
        (the windowed block spills 140 bytes with both). Stops at the first build kept or refused."""
        emitted, shared, _ = search.kept.products
        resources, variant = search.kept.resources, search.kept.spec["variant"]
        want = occupancy.fill_target(resources["registers"], emitted.num_threads, shared, archs.of(target))
        if want is None:
            return
        tries = [variant]
        if "ring_runs" in emitted.extras:       # one ring across pipelines keeps more values live: separate rings
            tries.append(replace(variant, one_ring=False))
        if "dispatch_axis" in emitted.extras:
            tries.append(replace(tries[-1], heavy_first=False))

        def fills(c: Build, kept: Build) -> bool:
            return not c.resources["spill_stores"] and c.resources["stack_bytes"] <= resources["stack_bytes"]
        for v in tries:
            change = f"min_blocks={want}" + ("" if v == variant else f", {v}")
            if search.consider(change, {**search.kept.spec, "min_blocks": want, "variant": v}, fills):
                return
            if search.last is None:             # not built: too few registers for an instruction (a wgmma's
                return                          # accumulator), or the search's cap

    def _compile_emulated(self, program, target: Target, opts: CudaOptions) -> Artifact:
        emitted, shared = codegen.emit(program, target, schedule.plan(program, target, opts.base(),
                                                                      min_blocks=opts.min_blocks))
        source = emulator.emulation_source(emitted, shared)
        return Artifact(
            backend=self.name, target=target.arch, kernel_name=emitted.kernel_name, program_hash=program.hash,
            source=source, binary=emulator.build(source, emitted.kernel_name),
            launch={**self._launch_info(emitted, shared, program), "emulated": True}, resources={"shared_bytes": shared},
            options={**opts.to_json(), "emulated": True, "host": emulator.identity(),
                     "library": codegen.library_hash()})

    @staticmethod
    def _launch_info(emitted, shared: int, program) -> dict:
        fmt, size, params = launch_params(emitted.params, program)
        info = {"threads": emitted.num_threads, "block": (emitted.num_threads, 1, 1), "shared_bytes": shared,
                "params": params, "param_format": fmt, "param_size": size}
        if emitted.extras.get("tma"):
            info["tma"] = emitted.extras["tma"]       # tensor maps + flag after the params (tma.py)
        if emitted.extras.get("persistent"):
            info["persistent"] = True                 # the logical grid follows; one block per SM walks it
        if emitted.extras.get("hand_over_registers"):
            info["hand_over_registers"] = emitted.extras["hand_over_registers"]   # setmaxnreg in the build
        return info

    def restore(self, artifact: Artifact, program) -> Artifact | None:
        """A cached Artifact is usable as is (the cubin or host library loads lazily at the first launch)."""
        if (artifact.backend != self.name or not artifact.binary or artifact.program_hash != program.hash
                or "param_format" not in artifact.launch):
            return None
        artifact.payload = None
        return artifact

    # ------------------------------------------------------------------------------------- launch
    @staticmethod
    def _plans(artifact: Artifact) -> "_Plans":
        plans = artifact.payload
        if plans is None:
            plans = artifact.payload = _Plans()
        return plans

    def _plan(self, artifact: Artifact, device_index: int) -> driver.LaunchPlan:
        plans = self._plans(artifact)
        plan = plans.get(device_index)
        if plan is None:
            with self._lock:
                plan = plans.get(device_index)
                if plan is None:
                    ok, reason, _ = self._probed()
                    if not ok:
                        raise UnsupportedError(f"the cuda backend cannot launch here: {reason}"
                                               + (driver.EMULATED_HINT if emulator.available()[0] else ""))
                    plan = plans[device_index] = driver.LaunchPlan(artifact, device_index)
                    if getattr(plan, "c_launch", None) is not None:
                        plans.launchers[device_index] = plan.c_launch
        return plan

    def fast_launch(self, artifact: Artifact):
        """The compiled launcher's per-device dispatch for this artifact (a call's fast path calls it instead
        of launch()): the current device's plan launches in C; a device without a plan yet goes through
        launch(), which makes one. None for the emulated target, or when the compiled launcher is
        unavailable (runtime/clauncher.py)."""
        if artifact.launch.get("emulated"):
            return None
        mod = clauncher.load()
        if mod is None:
            return None
        with self._lock:
            plans = self._plans(artifact)
            if plans.dispatch is None:
                plans.dispatch = mod.ByDevice(driver.device_getter(), plans.launchers,
                                              functools.partial(self.launch, artifact))
            return plans.dispatch

    def _emulated_plan(self, artifact: Artifact) -> driver.EmulatedPlan:
        with self._lock:
            if artifact.payload is None:
                artifact.payload = driver.EmulatedPlan(artifact)
            return artifact.payload

    def launch(self, artifact: Artifact, args, grid, stream=None) -> None:
        if artifact.launch.get("emulated"):
            plan = artifact.payload or self._emulated_plan(artifact)
            plan.launch(args, grid, stream, artifact.kernel_name)
            return
        dev = driver.current_device()
        plan = artifact.payload.get(dev) if artifact.payload else None
        if plan is None:
            plan = self._plan(artifact, dev)
        plan.launch(args, grid, stream, artifact.kernel_name)

    # --------------------------------------------------------------------------------------- emit
    def emit(self, artifact: Artifact, kind: str) -> str:
        """The artifact as text: 'source' (CUDA C++), 'ptx' (= 'asm'), or 'sass' (cubin disassembly)."""
        if kind == "source":
            return artifact.source or ""
        if kind in ("ptx", "asm", "sass") and artifact.launch.get("emulated"):
            raise UnsupportedError(f"backend 'cuda' cannot emit {kind!r} for the emulated target {artifact.target} "
                                   "(a host build); it can emit: ir, source")
        if kind in ("ptx", "asm"):
            return artifact.asm or ""
        if kind == "sass":
            return compiler.disassemble(artifact.binary)
        raise UnsupportedError(f"backend 'cuda' cannot emit {kind!r} for target {artifact.target}; it can emit: "
                               f"ir, {', '.join(EMIT_KINDS)}")


class _Plans(dict):
    """An artifact's payload on the GPU: device index -> LaunchPlan, plus those plans' compiled launchers
    (device index -> Launcher) and the ByDevice dispatch over them (fast_launch)."""

    def __init__(self):
        super().__init__()
        self.launchers: dict = {}
        self.dispatch = None


def _nvrtc(emitted, arch: str, flags) -> tuple:
    """NVRTC + ptxas on an emitted kernel: (Compiled, resources). On the H200, NVRTC returned an empty log for the
    FA3 attention build in some pytest processes (three sessions; fresh processes never; the cause is unknown), and
    a second compile was empty again: the resources then read as zeros and the register hand-over looked lost. So
    a log without ptxas' report takes registers and stack frame from the cubin itself (compiler.cubin_resources);
    the Artifact keeps the log's tail (options["ptxas_log"]) for whoever looks next."""
    compiled = compiler.compile_source(emitted.source, emitted.kernel_name, arch, flags)
    if compiler.ptxas_report(compiled.log):
        resources = compiler.parse_ptxas(compiled.log)
    else:
        from_cubin = compiler.cubin_resources(compiled.cubin, emitted.kernel_name)
        resources = from_cubin if from_cubin is not None else compiler.parse_ptxas(compiled.log)
    if compiler.wgmma_serialized(compiled.log):
        resources["wgmma_serialized"] = 1       # recorded (hk compile shows resources); the tests keep it off
    return compiled, resources


def _fast_path(program, target: Target) -> bool:
    """Whether every pipeline of the Program runs on TMA and every mma in them on wgmma (sm_90a): what
    the backend's configuration choice looks for among a kernel's candidates."""
    p = schedule.plan(program, target)
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    if not pipes or any(p.pipelines[id(op)].schedule != "tma" for op in pipes):
        return False
    return all(dataflow.wgmma_eligible(m, program.num_warps) for op in pipes for m in op.regions[1].walk()
               if m.opcode == "mma")


def _spilled(b: Build) -> tuple[int, int]:
    return b.resources["spill_stores"], b.resources["stack_bytes"]


def _fewer_spills(candidate: Build, kept: Build) -> bool:
    return _spilled(candidate) < _spilled(kept)


# ------------------------------------------------------------------------------------------- lowering passes
def _variant(lo: lowering.Lowered) -> schedule.Variant:
    """The variant compile() tries first with the default options (FA3's where it applies, kept by compile() only
    when its build keeps the hand-over and spills no more than schedule.FA3_SPILL_BYTES allows)."""
    return schedule.fa3_variant(lo.program, lo.target, DEFAULT.fa3()) or DEFAULT.base()


def _show_variant(lo: lowering.Lowered, v: schedule.Variant) -> str:
    head = ("// FA3's schedule (kept when its build keeps the hand-over and spills no more than "
            "schedule.FA3_SPILL_BYTES allows)" if isinstance(v, schedule.FA3) else "// the base schedule")
    return f"{head}: {v}"


PASSES = (
    lowering.Pass("layouts", lambda lo: footprint.layouts(lo.program, footprint.num_warps(lo.program, lo.target)),
                  lambda lo, lay: f"// layouts ({footprint.num_warps(lo.program, lo.target)} warps)\n"
                  + "\n".join(layouts.describe(lo.program, lay))),
    lowering.Pass("variant", _variant, _show_variant),
    lowering.Pass("schedule", lambda lo: schedule.plan(lo.program, lo.target, lo["variant"], lo["layouts"]),
                  lambda lo, plan: describe_plan(lo.program, plan, lo.target)),
)
"""The cuda lowering before the emitter (`hk compile --emit lowered[:after=PASS]`): the layout pass's choice, the
schedule variant, the plan."""
