"""The backend plugin contract: Backend, Target, Artifact, BackendStatus."""
from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .errors import UnsupportedError
from .ir import Program

from ..emit_kinds import EMIT_KINDS  # noqa: F401  (what `hk compile --emit KIND` can ask a backend for)


@dataclass(frozen=True)
class Target:
    """What code generation needs and what conformance skips on."""
    backend: str
    arch: str                              # "cpu", "sm_80", "sm_90a", "gfx942", "gfx950"
    vendor: str = "none"                   # "nvidia" | "amd" | "none"
    lanes: int = 1                         # lanes per warp/wave
    max_shared_bytes: int = 1 << 62        # per block
    mma_shapes: tuple[str, ...] = ()       # e.g. ("m16n8k16",)
    dtypes: tuple[str, ...] = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")
    capabilities: tuple[str, ...] = ()     # "atomics", "dropout", "run" (can execute here), ...
    compile_only: bool = False             # True when this machine cannot execute the target
    emulated: bool = False                 # True when executed by an emulator
    row_alignment: int = 1                 # bytes a tensor's base and row strides want for the target's bulk
                                           # loads (TMA, 16-byte cp.async, dwordx4): a wrapper restages to it

    def __str__(self) -> str:
        return self.arch

    @property
    def spec(self) -> str:
        """The one spelling of this target wherever a backend is named: "hip:gfx950:emulated"."""
        return f"{self.backend}:{self.arch}" + (":emulated" if self.emulated else "")

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class BackendStatus:
    available: bool                        # can execute kernels here
    reason: str | None = None              # why not, in words
    device: str | None = None              # e.g. "NVIDIA H200 (sm_90)"


@dataclass
class Artifact:
    """What compile() produced: enough to launch, inspect and cache."""
    backend: str
    target: str
    kernel_name: str
    program_hash: str
    source: str | None = None              # generated source (C++), if any
    binary: bytes | None = None            # cubin / hsaco / host shared object
    asm: str | None = None                 # ptx / amdgcn assembly, if produced
    launch: dict[str, Any] = field(default_factory=dict)     # block size, dynamic shared bytes, ABI
    resources: dict[str, Any] = field(default_factory=dict)  # registers, shared memory, spills
    options: dict[str, Any] = field(default_factory=dict)    # numerics flags (ftz, fma contraction, ...)
    payload: Any = None                    # backend-private, not cached (e.g. the reference's Program)


def table_ranking(table: dict, row, kernel: str, consts: dict, args: tuple) -> list[dict] | None:
    """A backend's tuning table read for one call (Backend.preferred): the rule of the first entry (capability, kernel
    name) -> rule(consts, args) whose capability the arch table's `row` has, else None (the kernel's own order)."""
    for (capability, name), rule in table.items():
        if name == kernel and row is not None and getattr(row, capability):
            return rule(consts, args)
    return None


def ranked(items: list, prefs: list[dict], config=lambda item: item) -> list:
    """Backend.preferred's rule: the items (configs, or anything `config` maps to one) matching each preference
    (every item of it equal), in the preferences' order, then the kernel's baseline (the last item) if none
    matched it."""
    out = [it for p in prefs for it in items if all(config(it).get(k) == v for k, v in p.items())]
    out = list({id(it): it for it in out}.values())
    if items and all(it is not items[-1] for it in out):
        out.append(items[-1])
    return out


class Backend(abc.ABC):
    """A backend plugin. Must not import any other backend."""
    name: str = ""

    @abc.abstractmethod
    def status(self) -> BackendStatus:
        """Whether kernels can run here; if not, why (probed with a real call)."""

    @abc.abstractmethod
    def targets(self) -> list[Target]:
        """The device's target first (if any), then compile-only targets."""

    def default_target(self) -> Target:
        ts = self.targets()
        if not ts:
            raise RuntimeError(f"backend {self.name!r} has no targets")
        return ts[0]

    def target(self, arch: "str | Target | None" = None, *, emulated: bool | None = None) -> Target:
        """The target named by `arch` (None: the default one); `emulated` picks between a device or
        compile-only target and an emulated one of the same arch (None: the first listed)."""
        if isinstance(arch, Target):
            return arch
        if isinstance(arch, str) and arch.endswith(":emulated"):     # the spelling the error below lists
            arch, emulated = arch[:-len(":emulated")], True if emulated is None else emulated
        if arch is None and emulated is None:
            return self.default_target()
        for t in self.targets():
            if (arch is None or t.arch == arch) and (emulated is None or t.emulated == emulated):
                return t
        what = ("emulated target" if emulated else "target") + (f" {arch!r}" if arch else "")
        raise UnsupportedError(f"backend {self.name!r} has no {what}; its targets are "
                               f"{[t.arch + (':emulated' if t.emulated else '') for t in self.targets()]}")

    def claims_device(self, device) -> bool:
        """Whether a tensor on this torch device goes to this backend when no call, context or HK_BACKEND
        names one (as Triton's drivers claim their device). At most one installed backend should claim a
        device; the reference claims the CPU."""
        return False

    def check(self, program: Program, target: Target, options=None) -> None:
        """Raise UnsupportedError if `target` cannot take `program` (tile shapes, dtypes, memory)."""

    def choose_config(self, candidates: list, target: Target) -> dict:
        """The configuration a kernel runs at on `target` when no tuned choice is cached. `candidates`:
        the kernel's (config, Program) pairs that `check` accepted, in the kernel's order, its portable
        baseline last. The default is that baseline; a backend with faster schedules for some candidates
        picks among them (cuda on sm_90a: the first whose pipelines all run on TMA and wgmma)."""
        return candidates[-1][0]

    # the backend's tuning table, where it has one: a module with preferred() and propose() of the signatures
    # below (backends/<vendor>/preferences.py), which the two methods defer to
    tuning_table = None

    def preferred(self, kernel: str, consts: dict, args: tuple, target: Target) -> list[dict] | None:
        """This backend's ranking of a kernel's candidates on `target` for these arguments, from its tuning table
        (per-target preferences and thresholds live with the backend; kernels offer legal candidates only): partial
        configurations in the order to try them; a candidate none matches is not offered to choose_config, except
        the kernel's baseline, which stays last. `consts`: the kernel's (its baseline's); `args`: the call's. None:
        the kernel's own order. The autotuner, where it runs, times every candidate regardless."""
        return None if self.tuning_table is None else self.tuning_table.preferred(kernel, consts, args, target)

    def propose(self, roles: tuple[str, ...], target: Target) -> list[dict]:
        """Configurations this backend favours on `target` for a kernel that declares tunable consts with these
        roles (interface/tunables.ROLES: "m", "n", "k", "stages", "warps"), fastest-first, each a dict role ->
        value from the arch table (the tile shapes its matrix instructions and schedules favour). The kernel maps
        them onto its consts and drops any outside its legal values; the target's `check` then filters them as any
        candidate. Without a tuning table nothing is proposed: a kernel keeps its own candidates and defaults."""
        return [] if self.tuning_table is None else self.tuning_table.propose(roles, target)

    def rejects(self, artifact: Artifact, target: Target) -> str | None:
        """Why a built Artifact should not run where a smaller configuration exists (cuda: it spills to
        local memory), in words; None to accept it. Kernel.choose_config then takes the kernel's next
        configuration. The default judges no build."""
        return None

    def lowered(self, program: Program, target: Target, after: str | None = None) -> str:
        """The Program with this backend's lowering decisions for `target` (schedules, per-op
        instruction choices) as text: `hk compile --emit lowered`; `after`: the state after that pass
        (`--emit lowered:after=PASS`; codegen/lowering.py)."""
        if after is not None:
            raise UnsupportedError(f"backend {self.name!r} has no lowering passes (asked for the state after {after!r})")
        return f"{program}\n\n// {self.name} ({target.spec}): no lowering pass; each op maps to its library call"

    def compiler_version(self) -> str:
        """Part of the compile cache key: whatever shapes the output besides the Program, target and
        options (compiler version, device-library fingerprint)."""
        return ""

    def cacheable(self) -> bool:
        """Whether compile() results may be stored in the on-disk compile cache."""
        return True

    def restore(self, artifact: Artifact, program: Program) -> Artifact | None:
        """Make an Artifact read from the compile cache usable (reattach private payloads); None rejects
        it, and the Program is compiled again."""
        return artifact

    @abc.abstractmethod
    def compile(self, program: Program, target: Target, options=None) -> Artifact:
        ...

    @abc.abstractmethod
    def launch(self, artifact: Artifact, args: Sequence[Any], grid: tuple[int, int, int], stream=None) -> None:
        ...

    def fast_launch(self, artifact: Artifact):
        """A callable (args, grid, stream) that does what launch(artifact, args, grid, stream) does, with the
        same checks and errors, for the fast path of repeat kernel calls (args a tuple, grid three ints);
        None, the default: the fast path calls launch(). The cuda backend returns its compiled launcher."""
        return None

    def accepts_device(self, device) -> bool:
        """Whether tensors on this torch device can be passed to launch()."""
        return True

    def emit(self, artifact: Artifact, kind: str) -> str | bytes:
        """What `hk compile --emit KIND` shows, KIND in EMIT_KINDS other than "ir" and "lowered" (the Program's text,
        which the caller prints without compiling: every backend receives the same Program).

        Default: "source" and "asm" from the Artifact. A backend overrides this for its other forms
        ("ptx"/"sass", "hsaco" as bytes); what it cannot give is an UnsupportedError saying what it can."""
        value = {"source": artifact.source, "asm": artifact.asm}.get(kind)
        if value is None:
            can = [k for k, v in (("source", artifact.source), ("asm", artifact.asm)) if v is not None]
            raise UnsupportedError(f"backend {self.name!r} cannot emit {kind!r} for target {artifact.target}; "
                                   f"it can emit: {', '.join(['ir'] + can)}")
        return value

    def analyze(self, artifact: Artifact) -> dict:
        """What `hk analyze` reports about a compiled kernel's machine code, as a JSON-able dict:
        "kernel", "target", "resources" and "occupancy" (flat name -> value), "main_loop" (a loop's
        "header" or None), "loops" (dicts with "header", "depth" and nested counts and clocks) and
        "assumptions" (sentences). A backend without an analyser raises UnsupportedError."""
        raise UnsupportedError(f"backend {self.name!r} has no machine-code analyser (hk analyze)")


def parse_spec(spec: str) -> tuple[str, str | None, bool | None]:
    """"name", "name:arch" or "name:arch:emulated" -> (name, arch or None, True or None)."""
    parts = spec.strip().split(":")
    if not parts[0] or len(parts) > 3 or (len(parts) == 3 and parts[2] != "emulated") or "" in parts[1:]:
        raise ValueError(f"backend spec {spec!r}: expected NAME, NAME:ARCH or NAME:ARCH:emulated "
                         "(e.g. 'cuda', 'cuda:sm_90a', 'hip:gfx950:emulated')")
    return parts[0], (parts[1] if len(parts) > 1 else None), (True if len(parts) == 3 else None)
