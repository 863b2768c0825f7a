"""The launch path: `hk.kernel` returns a Kernel; calling it selects a backend and target, checks the
devices, compiles through the cache (once per specialisation) and launches.

A repeat call whose launch is fully decided by its arguments' kinds takes the fast path: the argument-kind
key, one dict lookup, the int32 range check it still owes, the grid, and the backend's launch. With the
compiled launcher (runtime/clauncher.py) that is one C call, `fastcall`, down to cuLaunchKernel for a
backend with a fast_launch (cuda). Keep it that way: no per-call work belongs there, and no extra Python
call either (each costs ~0.1 us of a ~5 us budget)."""
from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

import torch

from ..interface.backend import Backend, Target, ranked
from ..interface.errors import ArgumentError, UnsupportedError
from ..interface.ir import Program
from ..interface.kernel import KernelDef, check_outputs, stored_params
from ..interface.verify import verify
from . import cache, clauncher, registry, selection, tuning
from .precompile import recording

_CONFIG_LOG = logging.getLogger("hk_portable.config")


def compile_program(program: Program, backend: Backend, target: str | Target | None = None):
    """The Artifact of `program` for `target` (None: the backend's default): checked, then compiled
    through the on-disk cache. The one compile path of kernel calls and `hk compile`."""
    target = backend.target(target)
    verify(program)                         # the opcode table's rules, before any backend sees it
    backend.check(program, target)
    return cache.compile_cached(backend, program, target)


class Kernel(KernelDef):
    """A tile kernel written against the interface. Call it with its arguments and `grid=`; `backend=`
    takes a spec ("cuda", "hip:gfx950:emulated") or a Backend, `target=` an arch of that backend."""

    def __init__(self, fn: Callable, num_warps: int = 4, name: str | None = None, tunable: dict | None = None):
        super().__init__(fn, num_warps=num_warps, name=name, tunable=tunable)
        self._artifacts: dict[tuple, Any] = {}
        self._launches: dict[tuple, tuple] = {}     # fast path: call key -> (backend, artifact, fast_launch)
        self._configs: dict[tuple, dict] = {}       # choose_config's answers
        self._stored: dict[str, tuple] = {}         # program hash -> the tensor parameters it stores to
        self.config_notes: dict[tuple, str] = {}    # (backend spec, chosen config) -> why an earlier one was passed over
        self._nargs = len(self.runtime_params)
        self._const_names = frozenset(c.name for c in self.const_params)
        self._i32 = [(i, p.name) for i, p in enumerate(self.runtime_params) if p.kind == "i32"]
        _KERNELS.add(self)

    def __call__(self, *args, grid, backend=None, target: str | Target | None = None, stream=None, **kwargs):
        rec = recording()
        if rec is not None:         # hk.precompile: record the build this call needs, run nothing
            return self._record(rec, args, kwargs, backend, target)
        try:
            # the key (_fast_key's), the lookup and, where the backend has a fast_launch and the grid is plain,
            # the launch, in one compiled call (clauncher.fastcall; its Python form only looks up)
            r = clauncher.fastcall(self._launches, self._nargs, args, kwargs, backend, target, stream, grid)
        except ArgumentError:
            if self._i32:           # an int32 out of range: fast_launch refused it; today's message first
                _check_scalars(self.name, self._i32, args)
            raise
        if r is None:
            return
        if r.__class__ is not tuple:                # [key] on a miss, False when the call does not qualify
            return self._slow_call(args, kwargs, grid, backend, target, stream, r[0] if r else None)
        be, art, launch = r                         # a hit Python finishes: the checks the call owes, the launch
        if self._i32:
            _check_scalars(self.name, self._i32, args)
        stored = self._stored.get(art.program_hash)
        if stored:
            check_outputs(self.name, self.runtime_params, args, stored)
        grid3 = _grid3(grid)
        if 0 in grid3:
            return
        if launch is None:
            be.launch(art, list(args), grid3, stream)
            return
        try:
            launch(args, grid3, stream)
        except ArgumentError:
            if self._i32:
                _check_scalars(self.name, self._i32, args)
            raise

    def _slow_call(self, args, kwargs, grid, backend, target, stream, fast) -> None:
        be, art, runtime = self._prepare(args, kwargs, backend, target)
        clauncher.load(build_if_missing=False)     # compiled keys where a GPU backend built it before (same tuples)
        if fast is not None:
            self._launches[fast] = (be, art, be.fast_launch(art))
        grid3 = _grid3(grid)
        if 0 in grid3:
            return
        be.launch(art, runtime, grid3, stream)

    def _record(self, rec: dict, args, kwargs, backend, target) -> None:
        runtime, consts = self.bind(args, kwargs)
        prog = self._program(runtime, consts)
        selected = selection.select(backend, [v for v in runtime if isinstance(v, torch.Tensor)])
        tgt = selected.backend.target(selection.target_for(selected, target))
        rec.setdefault((self.name, selected.backend.name, tgt.spec, prog.hash), (self, prog, selected.backend.name, tgt))

    def _prepare(self, args, kwargs, backend, target):
        """The slow path of a call: bind, specialise, select the backend, check devices, compile.
        Returns (backend, artifact, runtime arguments in order)."""
        runtime, consts = self.bind(args, kwargs)
        prog = self._program(runtime, consts)
        tensors = [v for v in runtime if isinstance(v, torch.Tensor)]
        selected = selection.select(backend, tensors)
        be = selected.backend
        _check_devices(self.name, self.runtime_params, runtime, be)
        check_outputs(self.name, self.runtime_params, runtime, self._once(self._stored, prog.hash,
                                                                            lambda: stored_params(prog)))
        return be, self.compile_for(prog, be, selection.target_for(selected, target)), runtime

    def _fast_key(self, args, kwargs, backend, target):
        """A key for calls whose launch is fully decided by the arguments' kinds (clauncher.call_key): every
        runtime argument passed positionally, consts by keyword. None when the call does not qualify."""
        if len(args) != self._nargs:
            return None
        key = clauncher.call_key(args, kwargs, backend, target)
        try:
            hash(key)
        except TypeError:       # an unhashable const: the slow path reports it
            return None
        return key

    def target_of(self, *tensors, backend=None, target: str | Target | None = None) -> Target:
        """The target a call with these tensor arguments would run on, selected as a call selects: what a wrapper
        sizes a plan by (its `row_alignment`) before it launches anything."""
        selected = selection.select(backend, [t for t in tensors if isinstance(t, torch.Tensor)])
        return selected.backend.target(selection.target_for(selected, target))

    def compile(self, *args, backend=None, target: str | Target | None = None, **kwargs):
        """The Artifact this call would launch, compiled and not run: its `source`, `asm` and `resources`
        (registers, shared memory/LDS, spills), and `backend.emit(artifact, kind)` for the other forms.
        Tensors only give dtype and rank (meta tensors do), so any target compiles on any machine:
        `gemm_kernel.compile(a, b, c, backend="hip:gfx950")`. Selection and checks are a call's."""
        runtime, consts = self.bind(args, kwargs)
        prog = self._program(runtime, consts)
        if isinstance(backend, str):            # compiling needs no runnable target: compile-only ones too
            selected = selection.resolve(backend, require_runnable=False)
        else:
            selected = selection.select(backend, [v for v in runtime if isinstance(v, torch.Tensor)])
        return self.compile_for(prog, selected.backend, selection.target_for(selected, target))

    def choose_config(self, candidates, *args, backend=None, target: str | Target | None = None, launch=None,
                      bucket: tuple | None = None, tune: bool | None = None, key=None, fallbacks=(),
                      fixed=()) -> dict:
        """The configuration (consts and num_warps) to call this kernel with on these arguments: among
        `candidates` (dicts, the kernel's portable baseline last), those the selected backend's target
        accepts; then a tuned winner for the shape `bucket` (runtime/tuning.py: looked up, or timed through
        `launch(config)` when tuning is on and the target runs), else the backend's choice
        (Backend.choose_config). Memoised per backend, target, argument kinds, bucket and candidates.
        `backend=` as for a call; a spec string may name a compile-only target (`hk compile`).

        A wrapper on a hot path passes `key`, a hashable of everything its candidates depend on, and may pass
        `candidates` as a function that builds them: a repeat call is then answered from the call fast path's
        key (argument kinds, backend, target, context, HK_BACKEND) plus bucket and key, about 1 us, without
        building candidates or selecting a backend.

        Where the backend rejects the build of its choice (`Backend.rejects`: cuda's that spill to local memory,
        as a newer or older NVRTC may), the next candidate after it whose build it accepts is taken, then the
        kernel's `fallbacks` (smaller configurations, tried in order, offered for no other reason); what was
        passed over and why is in `config_notes` and the `hk_portable.config` log. A tuned winner is kept as
        measured.

        A kernel that declares tunable consts (`hk.kernel(tunable=...)`) has the backend's proposals for the target
        (`Backend.propose`) joined to its candidates, before its baseline, where every proposed value is legal;
        consts named in `fixed` (a caller passed them) are never changed by a proposal."""
        fast = None
        if key is not None:
            fast = self._fast_key(args, {}, backend, target)
            fast = fast and (fast, bucket, key)
            hit = self._configs.get(fast) if fast is not None else None
            if hit is not None:
                return dict(hit)
        if callable(candidates):
            candidates = candidates()
        choice = self._choose_config(tuple(dict(c) for c in candidates), args, backend, target, launch, bucket, tune,
                                     tuple(dict(f) for f in fallbacks), frozenset(fixed))
        if fast is not None:
            with self._lock:
                self._configs[fast] = choice
        return dict(choice)

    def _choose_config(self, candidates, args, backend, target, launch, bucket, tune, fallbacks=(), fixed=()) -> dict:
        if not candidates:
            raise ArgumentError(f"{self.name}: choose_config needs at least one candidate configuration")
        if isinstance(backend, str):
            selected = selection.resolve(backend, require_runnable=False)
        else:
            selected = selection.select(backend, [a for a in args if isinstance(a, torch.Tensor)])
        be = selected.backend
        tgt = be.target(selection.target_for(selected, target))
        if self.tunables is not None:
            candidates = self._with_proposals(candidates, be, tgt, fixed)
        sig = tuple((a.dtype, a.dim()) if isinstance(a, torch.Tensor) else type(a) for a in args)
        prefs = be.preferred(self.name, candidates[-1], args, tgt)
        key = (be.name, tgt.spec, sig, bucket, tuple(tuple(sorted(c.items())) for c in candidates + fallbacks),
               None if prefs is None else tuple(tuple(sorted(p.items())) for p in prefs))
        with self._lock:
            hit = self._configs.get(key)
        if hit is not None:
            return hit
        ok, refusal = self._accepted(candidates, args, be, tgt)
        if not ok:                  # the baseline's own reason (shared memory, tile shapes), as a call gives it
            raise refusal
        choice = self._tuned(ok, args, be, tgt, sig, bucket, launch, tune)
        if choice is None:
            order = ok if prefs is None else ranked(ok, prefs, config=lambda pair: pair[0])
            choice = dict(be.choose_config(order, tgt))
            at = next((i for i, (c, _) in enumerate(order) if c == choice), None)
            if at is not None:
                choice = self._shippable(order[at:], fallbacks, args, be, tgt)
        with self._lock:
            self._configs[key] = choice
        return choice

    def _with_proposals(self, candidates: tuple, be: Backend, tgt: Target, fixed=()) -> tuple:
        """The kernel's candidates (each legal, or an ArgumentError naming the const), then the backend's proposals
        for `tgt` laid over the baseline (the last candidate) where legal and not already offered, the baseline
        last: one candidate list for the library's wrappers and users' kernels alike."""
        for c in candidates:
            self.tunables.check(c)
        defaults = self.defaults()
        seen = [{**defaults, **c} for c in candidates]
        proposed = []
        for p in be.propose(self.tunables.roles(), tgt):
            cfg = self.tunables.from_proposal(p, candidates[-1], fixed)
            if cfg is not None and {**defaults, **cfg} not in seen:
                seen.append({**defaults, **cfg})
                proposed.append(cfg)
        return candidates[:-1] + tuple(proposed) + candidates[-1:]

    def configure(self, *args, backend=None, target: str | Target | None = None, grid=None, tune: bool | None = None,
                  **kwargs) -> dict:
        """The consts (and num_warps) a call with these arguments runs with when its grid is a function of them:
        those passed, and for each declared tunable not passed, the choice of `choose_config` among the backend's
        proposals and the kernel's defaults (tuned per shape bucket where HK_AUTOTUNE is on and a device runs;
        `grid`, a function of the config, lets the autotuner launch). A kernel without tunables: `consts` as
        passed. No device is needed for a compile-only or emulated target (`hk compile`, the CPU)."""
        if kwargs or len(args) != self._nargs:         # the call's argument errors and illegal values first
            runtime, _ = self.bind(args, kwargs)
        else:                                           # nothing passed by keyword: bind has nothing to check
            runtime = args                              # that a miss's trace does not (a repeat call's ~10 us)
        consts = {k: v for k, v in kwargs.items() if k == "num_warps" or k in self._const_names}
        if self.tunables is None or all(n in consts for n in self.tunables.names):
            return dict(consts)
        baseline = {**{n: v for n, v in self.defaults().items() if n in self.tunables.names}, **consts}
        launch = None if grid is None else self._launcher(runtime, grid, backend, target)
        sizes = [s for v in runtime if isinstance(v, torch.Tensor) for s in v.shape]
        return self.choose_config((baseline,), *runtime, backend=backend, target=target, launch=launch,
                                  bucket=tuning.bucket(*sizes), tune=tune, key=tuple(sorted(consts.items())),
                                  fixed=consts)

    def _launcher(self, runtime, grid, backend, target):
        """launch(config) for the autotuner: this call's arguments at a candidate, its grid from `grid(config)`."""
        def launch(cfg):
            Kernel.__call__(self, *runtime, grid=grid({**self.defaults(), **cfg}), backend=backend, target=target,
                            **cfg)
        return launch

    def _accepted(self, configs, args, be, tgt) -> tuple[list, UnsupportedError | None]:
        """(config, Program) of each config whose Program verifies and the target takes; the last refusal."""
        ok, refusal = [], None
        for cfg in configs:
            runtime, consts = self.bind(args, cfg)
            prog = self._program(runtime, consts)
            try:
                verify(prog)
                be.check(prog, tgt)
            except UnsupportedError as e:
                refusal = e
                continue
            ok.append((cfg, prog))
        return ok, refusal

    def _shippable(self, ranked: list, fallbacks: tuple, args, be, tgt) -> dict:
        """The backend's choice (`ranked[0]`, a (config, Program) the target accepted), or where the backend rejects
        its build, the first after it in `ranked`, then in the kernel's `fallbacks`, whose build it does not reject;
        the choice itself (with a warning) where it rejects them all."""
        choice, prog = ranked[0]
        if (len(ranked) == 1 and not fallbacks) or type(be).rejects is Backend.rejects or recording() is not None:
            return choice           # nothing to take instead; a backend that judges no build; hk.precompile's
                                    # recording (the call judges)
        why = be.rejects(self.compile_for(prog, be, tgt), tgt)
        if why is None:
            return choice
        passed = [f"{choice}: {why}"]
        for cfg, prog in ranked[1:] + self._accepted(fallbacks, args, be, tgt)[0]:
            again = be.rejects(self.compile_for(prog, be, tgt), tgt)
            if again is None:
                note = f"{self.name} on {tgt.spec}: took {cfg} over " + "; ".join(passed)
                self.config_notes[(tgt.spec, tuple(sorted(cfg.items())))] = note
                self.compile_for(prog, be, tgt).options["passed_over"] = note     # on the Artifact a call runs
                _CONFIG_LOG.info(note)
                return cfg
            passed.append(f"{cfg}: {again}")
        _CONFIG_LOG.warning(f"{self.name} on {tgt.spec}: every configuration's build was rejected; running "
                            f"{choice} ({'; '.join(passed)})")
        return choice

    def _tuned(self, ok, args, be, tgt, sig, bucket, launch, tune) -> dict | None:
        """A stored winner for this bucket, or one timed now (tuning on, a runnable target, a launcher)."""
        if bucket is None or len(ok) < 2:
            return None
        choices = [c for c, _ in ok]
        k = tuning.key(self.name, be.name, tgt.spec, sig, bucket, choices)
        hit = tuning.lookup(k, choices)
        if hit is None and launch is not None and tuning.enabled(tune) and tgt.has("run") and not tgt.compile_only:
            device = "cuda" if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args) else "cpu"
            hit = tuning.tune(k, choices, launch, device)
        return hit

    def compile_for(self, prog: Program, be: Backend, target: str | Target | None = None):
        """compile_program, memoised per kernel by (backend, target, Program); racing first calls compile once."""
        tgt = be.target(target)
        return self._once(self._artifacts, (be.name, tgt.spec, prog.hash), lambda: compile_program(prog, be, tgt))


_KERNELS: weakref.WeakSet[Kernel] = weakref.WeakSet()


def _forget_choices() -> None:
    """After registry.reset() (tests install plugins at run time) no kernel reuses a backend it chose before."""
    for k in list(_KERNELS):
        with k._lock:
            k._launches.clear()
            k._artifacts.clear()
            k._configs.clear()


registry._on_reset.append(_forget_choices)


class TunableKernel(Kernel):
    """A kernel that declares tunable consts. Called with `grid` a function of the configuration (a dict of every
    const and num_warps), the tunables it is not passed are chosen (`configure`) and the grid computed from them;
    called with a fixed grid, every const is as written (the grid was computed from those values)."""

    def __call__(self, *args, grid, backend=None, target: str | Target | None = None, stream=None, **kwargs):
        if callable(grid):
            cfg = self.configure(*args, backend=backend, target=target, grid=grid, **kwargs)
            rest = {k: v for k, v in kwargs.items() if k not in cfg}      # runtime arguments passed by keyword
            return Kernel.__call__(self, *args, grid=grid({**self.defaults(), **cfg}), backend=backend,
                                   target=target, stream=stream, **rest, **cfg)
        return Kernel.__call__(self, *args, grid=grid, backend=backend, target=target, stream=stream, **kwargs)


def kernel(fn: Callable | None = None, *, num_warps: int = 4, name: str | None = None, tunable: dict | None = None):
    """Decorate a tile kernel. `num_warps` is a hint; each backend may choose its own per target. `tunable`: the
    consts a backend may choose, name -> `hk.tunable(legal values, role=...)` (interface/tunables.py)."""
    def make(f):
        cls = Kernel if tunable is None else TunableKernel
        return cls(f, num_warps=num_warps, name=name, tunable=tunable)
    return make if fn is None else make(fn)


# ------------------------------------------------------------------------------------------ checks
def _check_scalars(name, i32, args) -> None:
    """The per-value check the fast path still owes: the int32 range of int arguments. `i32`: (index, name)
    of the kernel's int32 parameters (the fast key already fixed each argument's type)."""
    for i, pname in i32:
        v = args[i]
        if isinstance(v, bool) or not -2**31 <= v < 2**31:
            raise ArgumentError(f"{name}: argument '{pname}' must be an int32 Python int, got {v!r}")


def _check_devices(name, params, runtime, be) -> None:
    devs = {}
    for p, v in zip(params, runtime):
        if isinstance(v, torch.Tensor):
            devs.setdefault(v.device, p.name)
            if not be.accepts_device(v.device):
                raise ArgumentError(f"{name}: argument '{p.name}' is on {v.device}, which the '{be.name}' backend "
                                    "cannot use; move it or pick another backend")
    if len(devs) > 1:
        desc = ", ".join(f"'{n}' on {d}" for d, n in devs.items())
        raise ArgumentError(f"{name}: tensor arguments are on different devices ({desc}); expected one device")


_GRIDS: dict = {}


def _grid3(grid) -> tuple[int, int, int]:
    """grid as three ints, validated; memoised because it is on every launch's path. bools hash like ints
    (True == 1), so a grid holding one skips the memo and is refused by the check."""
    if grid.__class__ is bool or (grid.__class__ is tuple and any(v.__class__ is bool for v in grid)):
        return _check_grid(grid)
    try:
        return _GRIDS[grid]
    except (KeyError, TypeError):
        g = _check_grid(grid)
    if isinstance(grid, (int, tuple)) and len(_GRIDS) < 4096:
        _GRIDS[grid] = g
    return g


def _check_grid(grid) -> tuple[int, int, int]:
    if isinstance(grid, int):
        grid = (grid,)
    if not isinstance(grid, (tuple, list)) or not 1 <= len(grid) <= 3:
        raise ArgumentError(f"grid must be an int or a tuple of 1 to 3 ints, got {grid!r}")
    g = tuple(grid) + (1,) * (3 - len(grid))
    for k, x in enumerate(g):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x >= 2**31:
            raise ArgumentError(f"grid[{k}] must be an int in [0, 2**31), got {x!r}")
    return g
