"""Compile many Programs for cuda targets at once: the library kernels' examples and every Program the
conformance suite launches, in parallel worker processes, through the disk cache.

Used by the offline-compile tests (CI: every kernel for sm_80 and sm_90a, no GPU) and before a GPU
conformance run (so the run itself hits the cache).

    python -m hk_portable.conformance.offline_compile --arch sm_90a [--workers 16]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from ..interface.backend import Artifact, Backend, BackendStatus, Target


class Capture(Backend):
    """Records the Programs kernels launch, and runs nothing. With `judge` (a cuda arch), a kernel's choice of
    configuration follows what cuda rejects on that arch (Backend.rejects: a build that spills), so the
    Programs recorded are the ones a call on that arch launches."""
    name = "capture"

    def __init__(self, judge: str | None = None):
        self.judge = judge
        self.programs = {}          # hash -> Program, of those launched

    def status(self):
        return BackendStatus(True)

    def targets(self):
        # the arch names the judge, so that kernels' memos of one capture's choices never answer another's
        return [Target("capture", self.judge or "any", "nvidia", 32, 1 << 30,
                       capabilities=("run", "atomics", "dropout", "fp8"))]

    def compile(self, program, target, options=None):
        return Artifact("capture", target.arch, program.name, program.hash, payload=program)

    def launch(self, artifact, args, grid, stream=None):
        self.programs[artifact.program_hash] = artifact.payload

    def rejects(self, artifact, target):
        if self.judge is None:
            return None
        from ..runtime import cache, registry
        cuda = registry.load("cuda")
        real = cuda.target(self.judge)
        return cuda.rejects(cache.compile_cached(cuda, artifact.payload, real), real)

    def cacheable(self):
        return False


def library_programs() -> dict:
    """name -> Program of every library kernel's example configuration."""
    from .. import kernels
    out = {}
    for name in sorted(kernels.KERNELS):
        module, kern = kernels.load(name)
        args, consts = module.example_args()
        out[name] = kern.trace(*args, **consts)
    return out


def chosen_programs(arch: str) -> dict:
    """'name@arch' -> Program of the configuration a call on cuda:`arch` chooses among the candidates a
    kernel module offers (`candidates(consts, args)`), where that differs from the example's."""
    from .. import kernels
    out = {}
    for name in sorted(kernels.KERNELS):
        module, kern = kernels.load(name)
        if not callable(getattr(module, "candidates", None)):
            continue
        args, consts = module.example_args()
        cfg = kern.choose_config(module.candidates(consts, args), *args, backend=f"cuda:{arch}")
        if cfg != consts:
            out[f"{name}@{arch}"] = kern.trace(*args, **cfg)
    return out


def conformance_programs(arch: str | None = None) -> dict:
    """'kernel#hash' -> Program for every Program the conformance cases launch (on cuda:`arch`, where a
    configuration's build there may be rejected for a smaller one)."""
    import torch

    from .cases import all_cases
    cap = Capture(arch)
    for case in all_cases():
        if case.missing:
            continue
        setup = case.make(torch.Generator().manual_seed(0))
        setup.launch({**setup.inputs, **setup.outputs}, cap)
    return {f"{p.name}#{h[:8]}": p for h, p in cap.programs.items()}


_JOBS: dict = {}       # name -> Program; forked workers inherit it (a Program does not survive pickling:
                       # its dtypes are compared by identity)


def _compile(job):
    name, arch, cached = job
    from ..runtime import registry
    from ..runtime import cache
    be = registry.load("cuda")
    program = _JOBS[name]
    t0 = time.perf_counter()
    try:
        target = be.target(arch)
        art = cache.compile_cached(be, program, target) if cached else be.compile(program, target)
    except Exception as e:  # noqa: BLE001 - reported with the kernel's name
        return {"name": name, "arch": arch, "error": f"{type(e).__name__}: {str(e)[:3000]}"}
    return {"name": name, "arch": arch, "error": None, "resources": art.resources, "seconds": time.perf_counter() - t0,
            "mma": "mma.sync.aligned.m16n8k" in (art.asm or "") or "wgmma.mma_async" in (art.asm or ""),
            "wgmma": "wgmma.mma_async" in (art.asm or ""), "tma": "cp.async.bulk.tensor" in (art.asm or ""),
            "cp_async": "cp.async.cg.shared.global" in (art.asm or ""),
            "setmaxnreg": sorted({int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 (\d+)", art.asm or "")}),
            "threads": art.launch.get("threads"),
            "vector_io": bool(re.search(r"(ld|st)\.global(\.\w+)*\.v4\.(b|u|f)32", art.asm or "")),
            "pipeline": "pipeline" in program.opcodes(), "has_mma": "mma" in program.opcodes(),
            "cubin": len(art.binary or b"")}


def compile_many(named_programs: dict, archs, workers: int | None = None, cached: bool = False) -> list[dict]:
    """Compile every (program, arch); one summary dict per compile (error or resources and PTX facts)."""
    _JOBS.clear()
    _JOBS.update(named_programs)
    jobs = [(name, arch, cached) for name in named_programs for arch in archs]
    workers = workers or max(1, min(16, os.cpu_count() or 1))
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [_compile(j) for j in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as ex:
        return list(ex.map(_compile, jobs, chunksize=2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="compile the library and conformance Programs into the cache")
    ap.add_argument("--arch", action="append", help="target (repeatable); default: the cuda backend's default")
    ap.add_argument("--workers", type=int)
    args = ap.parse_args(argv)
    from ..runtime import registry
    archs = args.arch or [registry.load("cuda").default_target().arch]
    t0 = time.perf_counter()
    results = compile_many(library_programs(), archs, args.workers, cached=True)
    for arch in archs:                      # what calls choose on each target, compiled for that target only
        results += compile_many({**conformance_programs(arch), **chosen_programs(arch)}, [arch], args.workers,
                                cached=True)
    errors = [r for r in results if r["error"]]
    spills = [r for r in results if not r["error"] and (r["resources"]["spill_stores"] or r["resources"]["stack_bytes"])]
    print(f"precompiled {len(results)} (program, arch) pairs for {archs} in {time.perf_counter() - t0:.1f} s: "
          f"{len(errors)} errors, {len(spills)} with local memory")
    for r in errors[:20]:
        print(f"  ERROR {r['name']} [{r['arch']}]: {r['error'][:500]}")
    for r in spills[:20]:
        print(f"  SPILL {r['name']} [{r['arch']}]: {r['resources']}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
