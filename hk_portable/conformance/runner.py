"""Run conformance cases on a (backend, target) and judge them against the tolerance table.

Each case runs on the backend under test with fresh seeded inputs and poisoned outputs; its checks
compare against float64 math, and for any backend other than the reference also against the
reference backend's outputs (bitwise for the exact tier). Deterministic cases run twice and must
agree bit for bit. Skips are by the target's declared capabilities and always carry a reason.
"""
from __future__ import annotations

import fnmatch
import hashlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from ..runtime import registry
from ..interface import opcodes
from ..interface.backend import Artifact, Backend, BackendStatus, Target
from ..interface.errors import BackendError, UnsupportedError
from ..interface.ir import GlobalType, Program, SharedBufType, TileType
from .cases import Case, Check, Setup

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

# opcodes that a target must declare a capability for (from the opcode table)
OPCODE_CAPABILITIES = opcodes.capabilities()


class CapabilityMissing(UnsupportedError):
    """The target does not declare something a Program needs: the case is skipped with this reason."""


# ------------------------------------------------------------------------------------ requirements
def program_needs(program: Program) -> tuple[set[str], set[str], int]:
    """(dtypes, capabilities, shared-memory bytes) that running `program` needs."""
    dtypes, caps, smem = set(), set(), 0
    types = [p.type for p in program.params]
    for op in program.body.walk():
        types += [r.type for r in op.results]
        if op.opcode in OPCODE_CAPABILITIES:
            caps.add(OPCODE_CAPABILITIES[op.opcode])
        if op.opcode == "alloc_shared":
            smem += op.result.type.nbytes
    for t in types:
        if isinstance(t, (TileType, SharedBufType, GlobalType)) and t.dtype.name != "bool":
            dtypes.add(t.dtype.name)
    return dtypes, caps, smem


def missing_capabilities(program: Program, target: Target) -> list[str]:
    """What `program` needs that `target` does not declare, in words (empty if nothing)."""
    dtypes, caps, smem = program_needs(program)
    out = [f"dtype {d}" for d in sorted(dtypes - set(target.dtypes))]
    out += [f"capability '{c}'" for c in sorted(caps) if not target.has(c)]
    if smem > target.max_shared_bytes:
        out.append(f"{smem} bytes of shared memory (it declares {target.max_shared_bytes})")
    return out


class OnTarget(Backend):
    """A backend pinned to one target, which first checks a Program against the target's declared
    capabilities (CapabilityMissing: a skip) and then asks the backend (UnsupportedError: a failure)."""

    def __init__(self, backend: Backend, target: Target):
        self.inner, self._target = backend, target
        self.name = backend.name

    def status(self) -> BackendStatus:
        return self.inner.status()

    def targets(self) -> list[Target]:
        return self.inner.targets()

    def default_target(self) -> Target:
        return self._target

    def check(self, program: Program, target: Target) -> None:
        missing = missing_capabilities(program, target)
        if missing:
            raise CapabilityMissing(f"target {target.arch} lacks what kernel '{program.name}' needs: "
                                    f"{', '.join(missing)}")
        self.inner.check(program, target)

    def compile(self, program: Program, target: Target, options: dict | None = None) -> Artifact:
        return self.inner.compile(program, target, options)

    def launch(self, artifact: Artifact, args: Sequence[Any], grid, stream=None) -> None:
        self.inner.launch(artifact, args, grid, stream)

    def accepts_device(self, device) -> bool:
        return self.inner.accepts_device(device)

    # the rest of the contract has defaults on Backend: forward each, or the defaults would shadow the inner's
    def claims_device(self, device) -> bool:
        return self.inner.claims_device(device)

    def compiler_version(self) -> str:
        return self.inner.compiler_version()

    def cacheable(self) -> bool:
        return self.inner.cacheable()

    def restore(self, artifact: Artifact, program: Program) -> Artifact | None:
        return self.inner.restore(artifact, program)

    def emit(self, artifact: Artifact, kind: str):
        return self.inner.emit(artifact, kind)

    # the configuration a call chooses (tuning table, proposals, rejected builds): a case runs what users run
    def choose_config(self, candidates: list, target: Target) -> dict:
        return self.inner.choose_config(candidates, target)

    def preferred(self, kernel: str, consts: dict, args: tuple, target: Target) -> list[dict] | None:
        return self.inner.preferred(kernel, consts, args, target)

    def propose(self, roles: tuple[str, ...], target: Target) -> list[dict]:
        return self.inner.propose(roles, target)

    def rejects(self, artifact: Artifact, target: Target) -> str | None:
        return self.inner.rejects(artifact, target)

    def __getattr__(self, item):                 # backend-specific extras
        return getattr(self.inner, item)


def resolve_target(backend: Backend, arch: str | None, emulate: bool = False) -> Target:
    """The target to run on: `arch` (an emulated one when emulate), else the default (or the first
    emulated) target. BackendError names the targets there are."""
    targets = backend.targets()
    if not targets:
        raise BackendError(f"backend {backend.name!r} has no targets")
    if arch is None and not emulate:
        return backend.default_target()
    matches = [t for t in targets if (arch is None or t.arch == arch) and (not emulate or t.emulated)]
    if not matches:
        what = f"emulated target{' ' + repr(arch) if arch else ''}" if emulate else f"target {arch!r}"
        listed = ", ".join(f"{t.arch}{' (emulated)' if t.emulated else ''}{' (compile-only)' if t.compile_only else ''}"
                           for t in targets)
        raise BackendError(f"backend {backend.name!r} has no {what}; its targets: {listed}")
    return matches[0]


def require_usable(backend: Backend) -> None:
    """BackendError (with the backend's reason) unless it can run kernels here, natively or emulated."""
    st = registry._status(backend)
    emulated = any(t.emulated and not t.compile_only for t in _targets_or_none(backend))
    if not st.available and not emulated:
        raise BackendError(f"backend {backend.name!r} cannot run kernels here: {st.reason}")


def require_runnable(backend: Backend, target: Target) -> None:
    """BackendError unless kernels for `target` run on this machine (an emulated target runs on the host)."""
    emulated = [t.arch for t in _targets_or_none(backend) if t.emulated and not t.compile_only]
    hint = f" (its emulated targets {', '.join(emulated)} run here: add --emulate)" if emulated else ""
    if target.compile_only:
        raise BackendError(f"target {target.arch} of backend {backend.name!r} is compile-only on this machine; "
                           f"conformance needs a target that runs{hint}")
    st = registry._status(backend)
    if not st.available and not target.emulated:
        raise BackendError(f"backend {backend.name!r} cannot run kernels here: {st.reason}{hint}")


def _targets_or_none(backend: Backend) -> list[Target]:
    try:
        return backend.targets()
    except Exception:  # noqa: BLE001 - a failing targets() only means no emulated target to fall back on
        return []


# --------------------------------------------------------------------------------------- results
@dataclass
class CheckResult:
    label: str
    passed: bool
    max_error: float
    bound: float
    tier: str
    detail: str = ""


@dataclass
class CaseResult:
    id: str
    kind: str
    name: str
    status: str
    max_error: float | None = None
    bound: float | None = None
    reason: str | None = None
    seed: int | None = None
    seconds: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("max_error", "bound"):
            if d[key] is not None and not math.isfinite(d[key]):
                d[key] = str(d[key])              # JSON has no inf/nan
        for c in d["checks"]:
            for key in ("max_error", "bound"):
                if not math.isfinite(c[key]):
                    c[key] = str(c[key])
        return d


@dataclass
class RunResult:
    backend: str
    target: Target
    device: str
    seed: int
    results: list[CaseResult]
    seconds: float

    @property
    def summary(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in (PASSED, FAILED, SKIPPED)}

    @property
    def ok(self) -> bool:
        return self.summary[FAILED] == 0


# ------------------------------------------------------------------------------------ comparisons
def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of t as integers, so that NaN == NaN and -0 != +0."""
    if not t.dtype.is_floating_point:
        return t
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _select(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return t if mask is None else t[mask]


def _abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in float64 with equal infinities at 0 and any NaN at +inf."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    d = (a - b).abs()
    d = torch.where((a == b), torch.zeros_like(d), d)
    return torch.nan_to_num(d, nan=math.inf)


def judge(check: Check, out: torch.Tensor, against: torch.Tensor | None = None, slack: float = 1.0) -> CheckResult:
    """Compare `out` with the check's expected values (or with `against`, another backend's output,
    allowing `slack` times the bound)."""
    exp = check.expected if against is None else against
    o, e = _select(out, check.select), _select(exp, check.select)
    if o.shape != e.shape:
        return CheckResult(check.label, False, math.inf, 0.0, check.bound.tier,
                           f"shape {tuple(o.shape)} but expected {tuple(e.shape)}")
    if o.numel() == 0:
        return CheckResult(check.label, True, 0.0, 0.0, check.bound.tier)
    if check.bound.exact:
        if e.dtype != o.dtype:
            return CheckResult(check.label, False, math.inf, 0.0, check.bound.tier,
                               f"dtype {o.dtype} but expected {e.dtype}")
        wrong = _bits(o) != _bits(e)
        n_wrong = int(wrong.sum())
        err = float(_abs_diff(o[wrong], e[wrong]).max()) if n_wrong else 0.0
        detail = f"{n_wrong} of {o.numel()} elements differ bitwise{_first_bad(o, e, wrong)}" if n_wrong else ""
        return CheckResult(check.label, n_wrong == 0, err, 0.0,
                           check.bound.tier, detail)
    rel = check.bound.rel_total(check.k)
    scale = (check.expected.to(torch.float64).abs() if check.scale is None else check.scale.to(torch.float64))
    scale = _select(scale, check.select)
    allowed = slack * (check.bound.abs + rel * scale)
    d = _abs_diff(o, e)
    ok = d <= allowed
    floor = check.bound.abs / rel if rel > 0 else 0.0
    err = float((d / (scale + floor)).max()) if rel > 0 else float(d.max())
    n_bad = int((~ok).sum())
    detail = f"{n_bad} of {o.numel()} elements outside the bound{_first_bad(o, e, ~ok)}" if n_bad else ""
    return CheckResult(check.label, n_bad == 0, err, slack * rel if rel > 0 else slack * check.bound.abs,
                       check.bound.tier, detail)


def _first_bad(o: torch.Tensor, e: torch.Tensor, bad: torch.Tensor) -> str:
    idx = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
    return f"; first at {list(idx)}: got {o[idx].item()!r}, expected {e[idx].item()!r}"


# ------------------------------------------------------------------------------------------ running
def case_seed(seed: int, case_id: str) -> int:
    """A per-case seed, so one case reruns alone (-k) with the inputs it had in the full run."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{case_id}".encode()).digest()[:6], "little")


def pick_device(backend: Backend) -> torch.device:
    """Where the case tensors live: the CPU for an emulated target; else a GPU the backend claims; else the
    CPU if the backend takes CPU tensors, else the GPU. (cuda and hip take CPU tensors for their emulated
    targets, so taking them says nothing about where a device target runs.)"""
    cpu = torch.device("cpu")
    gpu = [torch.device("cuda")] if torch.cuda.is_available() else []
    if backend.default_target().emulated:
        candidates = [cpu]
    else:
        candidates = [d for d in gpu if backend.claims_device(d)] + [cpu] + gpu
    for d in candidates:
        if backend.accepts_device(d):
            return d
    raise BackendError(f"backend {backend.name!r} accepts neither CPU tensors nor (here) CUDA/ROCm tensors")


def execute(setup: Setup, backend: Backend, device: torch.device) -> dict[str, torch.Tensor]:
    """Run the setup's launch on fresh device copies; the outputs back on the CPU. Inputs must survive."""
    inputs = {n: t.to(device, copy=True) for n, t in setup.inputs.items()}
    outputs = {n: t.to(device, copy=True) for n, t in setup.outputs.items()}
    setup.launch({**inputs, **outputs}, backend)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    for n, t in inputs.items():
        if not torch.equal(_bits(t.cpu()), _bits(setup.inputs[n])):
            raise AssertionError(f"the kernel modified its input '{n}'")
    return {n: t.cpu() for n, t in outputs.items()}


class Session:
    """Runs cases on one backend and target; `run_case` never raises for a case's own failure."""

    def __init__(self, backend: str | Backend = "reference", target: str | None = None, emulate: bool = False,
                 seed: int = 0, device: str | None = None):
        be = registry.load(backend) if isinstance(backend, str) else backend
        require_usable(be)
        self.target = resolve_target(be, target, emulate)
        require_runnable(be, self.target)
        self.backend = OnTarget(be, self.target)
        self.device = torch.device(device) if device else pick_device(self.backend)
        self.seed = seed
        self.reference: Backend | None = None
        if be.name != "reference":
            ref = registry.load("reference")
            self.reference = OnTarget(ref, ref.default_target())

    def run_case(self, case: Case) -> CaseResult:
        seed = case_seed(self.seed, case.id)
        res = CaseResult(case.id, case.kind, case.name, FAILED, seed=seed)
        if case.missing:
            res.status, res.reason = SKIPPED, case.missing
            return res
        t0 = time.perf_counter()
        try:
            self._run(case, seed, res)
        except CapabilityMissing as e:
            res.status, res.reason = SKIPPED, str(e)
        except UnsupportedError as e:
            res.status, res.reason = FAILED, (f"UnsupportedError although target {self.target.arch} declares every "
                                              f"capability the case needs: {e}")
        except Exception as e:  # noqa: BLE001 - any error in a case is that case's failure
            res.status, res.reason = FAILED, f"{type(e).__name__}: {e}"
        res.seconds = time.perf_counter() - t0
        return res

    def _run(self, case: Case, seed: int, res: CaseResult) -> None:
        gen = torch.Generator().manual_seed(seed)
        setup = case.make(gen)
        out = execute(setup, self.backend, self.device)
        res.checks = [judge(c, out[c.output]) for c in setup.checks]
        if self.reference is not None:
            ref = execute(setup, self.reference, torch.device("cpu"))
            res.checks += [_vs_reference(c, out[c.output], ref[c.output]) for c in setup.checks]
        if case.deterministic:
            again = execute(setup, self.backend, self.device)
            differ = [n for n in out if not torch.equal(_bits(out[n]), _bits(again[n]))]
            res.checks.append(CheckResult("determinism (same inputs twice)", not differ, 0.0, 0.0, "exact",
                                          f"outputs {differ} differ between two runs" if differ else ""))
        _summarise(res)

    def run(self, cases: Iterable[Case], on_result: Callable[[CaseResult], None] | None = None) -> RunResult:
        t0 = time.perf_counter()
        results = []
        for case in cases:
            r = self.run_case(case)
            results.append(r)
            if on_result:
                on_result(r)
        return RunResult(self.backend.name, self.target, str(self.device), self.seed, results,
                         time.perf_counter() - t0)


def _vs_reference(check: Check, out: torch.Tensor, ref: torch.Tensor) -> CheckResult:
    r = judge(check, out, against=ref, slack=2.0)   # both within the bound of the truth: within 2x of each other
    r.label = f"{check.label} vs the reference backend"
    return r


def _summarise(res: CaseResult) -> None:
    """Status from the checks; max_error/bound from the check closest to (or furthest past) its bound."""
    failed = [c for c in res.checks if not c.passed]
    worst = max(res.checks, key=_badness, default=None)
    res.status = FAILED if failed else PASSED
    if worst is not None:
        res.max_error, res.bound = worst.max_error, worst.bound
    if failed:
        res.reason = "; ".join(f"{c.label}: {c.detail}" for c in failed)


def _badness(c: CheckResult) -> float:
    if not c.passed:
        return math.inf
    return c.max_error / c.bound if c.bound > 0 else 0.0


# ------------------------------------------------------------------------------------------ selection
def select_cases(cases: Sequence[Case], patterns: str | Sequence[str] | None) -> list[Case]:
    """Cases whose id matches any pattern: a glob (*, ?, [...]) or else a substring. Patterns may be
    separated by commas; a pattern starting with '!' excludes matching cases."""
    if not patterns:
        return list(cases)
    if isinstance(patterns, str):
        patterns = [patterns]
    terms = [p.strip() for pat in patterns for p in pat.split(",") if p.strip()]
    include = [p for p in terms if not p.startswith("!")]
    exclude = [p[1:] for p in terms if p.startswith("!")]

    def hit(case_id, pat):
        return fnmatch.fnmatchcase(case_id, pat) if any(ch in pat for ch in "*?[") else pat in case_id

    return [c for c in cases if (not include or any(hit(c.id, p) for p in include))
            and not any(hit(c.id, p) for p in exclude)]


def run(backend: str | Backend = "reference", target: str | None = None, patterns=None, emulate: bool = False,
        seed: int = 0, on_result=None) -> RunResult:
    """Run the whole suite (or the cases matching `patterns`) and return the results."""
    from .cases import all_cases
    session = Session(backend, target, emulate, seed)
    return session.run(select_cases(all_cases(), patterns), on_result)
