"""Which backend (and target) a kernel call runs on.

The order: the call's `backend=` argument > the innermost `hk.use_backend(...)` block > HK_BACKEND (a
comma list: the first that accepts the tensors) > the backend that claims the tensors' device
(Backend.claims_device). Wherever a backend is named it has one spelling, a spec: "name",
"name:arch" or "name:arch:emulated" (e.g. "hip:gfx950:emulated")."""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import NamedTuple

import torch

from ..interface.backend import Backend, Target, parse_spec
from ..interface.errors import ArgumentError, BackendError, UnsupportedError
from . import registry

ENV = "HK_BACKEND"
# os.environ's own store, read on every kernel call (os.environ.get costs ~0.5 us; this ~0.03 us). setenv,
# os.environ[...] = and monkeypatch all update it; os.putenv alone never was visible to os.environ either.
_ENV_STORE = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(ENV) if _ENV_STORE is not None else ENV


def env_backend_raw():
    """HK_BACKEND as stored (bytes or str; None when unset): part of a call's fast-path key."""
    return _ENV_STORE.get(_ENV_KEY) if _ENV_STORE is not None else os.environ.get(ENV)

_context: contextvars.ContextVar[str | None] = contextvars.ContextVar("hk_backend", default=None)


class Selected(NamedTuple):
    backend: Backend
    target: Target | None      # the target a spec named; None: the call's target= or the backend's default


def parse(spec: str) -> tuple[str, str | None, bool | None]:
    """(name, arch or None, True or None) of a spec; BackendError when it is malformed."""
    if not isinstance(spec, str):
        raise BackendError(f"a backend is named by a string such as 'cuda' or 'hip:gfx950:emulated', or is a "
                           f"Backend object; got {type(spec).__name__}")
    try:
        return parse_spec(spec)
    except ValueError as e:
        raise BackendError(str(e)) from None


def with_flags(spec: str, arch: str | None = None, emulate: bool = False) -> tuple[str, str | None, bool]:
    """(name, arch, emulated) of a spec given beside separate target/emulate options (the CLI's --target and
    --emulate, pytest's --hk-target and --hk-emulate), which must agree with an arch the spec names."""
    name, named, emulated = parse(spec)
    if named is not None and arch is not None and arch != named:
        raise BackendError(f"backend spec {spec!r} names target {named}, but the target given is {arch}; "
                           "name it once")
    return name, named or arch, bool(emulated or emulate)


def resolve(spec: str, require_runnable: bool = True) -> Selected:
    """The backend and target a spec names. With require_runnable, BackendError unless kernels for it can
    run here (a plain name: the backend's device is usable; a target: it runs, natively or emulated)."""
    name, arch, emulated = parse(spec)
    if arch is None:
        return Selected(registry.get(name, require_available=require_runnable), None)
    backend = registry.load(name)
    try:
        target = backend.target(arch, emulated=emulated)
    except UnsupportedError as e:
        raise BackendError(f"backend spec {spec!r}: {e}") from None
    if require_runnable:
        _require_runnable(backend, target)
    return Selected(backend, target)


def _require_runnable(backend: Backend, target: Target) -> None:
    if target.compile_only:
        raise BackendError(f"target {target.spec!r} is compile-only on this machine: kernels cannot run on it"
                           f"{registry.emulated_hint(backend)}")
    if not target.emulated:
        st = registry._status(backend)
        if not st.available:
            raise BackendError(f"backend {backend.name!r} cannot run kernels here: {st.reason}"
                               f"{registry.emulated_hint(backend)}")


def select(explicit: str | Backend | None = None, tensors=()) -> Selected:
    """The backend (and the target its spec named, if any) for a call with these tensor arguments."""
    if isinstance(explicit, Backend):
        return Selected(explicit, None)
    if explicit is not None:
        return resolve(explicit)
    ctx = _context.get()
    if ctx is not None:
        return resolve(ctx)
    env = os.environ.get(ENV, "").strip()
    if env:
        return _from_environment(env, tensors)
    return Selected(registry.claimant(_device_of(tensors)), None)


def _from_environment(env: str, tensors) -> Selected:
    """The first backend of the HK_BACKEND list that can run kernels here and accepts every tensor's device
    (`cuda,reference` falls back to the reference where no GPU is usable). A listed spec that is malformed,
    unknown or whose backend fails to load is an error, never skipped."""
    listed = []
    for spec in (s.strip() for s in env.split(",")):
        if spec:
            try:
                listed.append(resolve(spec, require_runnable=False))
            except BackendError as e:
                raise BackendError(f"{ENV}={env!r}: {e}") from None
    devices = {t.device for t in tensors}
    passed_over = []
    for chosen in listed:
        if not all(chosen.backend.accepts_device(d) for d in devices):
            passed_over.append(f"{chosen.backend.name} does not take tensors on {sorted(map(str, devices))}")
            continue
        try:
            _require_runnable_selected(chosen)
        except BackendError as e:
            passed_over.append(str(e))
            continue
        return chosen
    raise BackendError(f"{ENV}={env!r}: {'; '.join(passed_over)} (no listed backend can run these tensors here)")


def _require_runnable_selected(chosen: Selected) -> None:
    """resolve()'s runnable check for a Selected (a plain name: its device is usable)."""
    if chosen.target is None:
        registry.get(chosen.backend.name)
    else:
        _require_runnable(chosen.backend, chosen.target)


def _device_of(tensors) -> torch.device:
    """The device that picks the backend: the first tensor argument's (all must share one), else the CPU."""
    for t in tensors:
        return t.device
    return torch.device("cpu")


def target_for(selected: Selected, requested: str | Target | None = None) -> Target:
    """The target of a call: the one its backend spec named and/or its `target=` argument (they must agree),
    else the backend's default."""
    backend, named = selected
    if requested is None:
        return named if named is not None else backend.default_target()
    target = backend.target(requested)
    if named is None:
        return target
    agrees = target.spec == named.spec if isinstance(requested, Target) else target.arch == named.arch
    if not agrees:
        raise ArgumentError(f"the backend spec names target {named.spec!r} but target={requested!r}; name the "
                            "target once (e.g. backend='hip:gfx950:emulated'), or the same in both")
    return named


def current_context() -> str | None:
    """The backend spec named by the innermost use_backend() block, if any."""
    return _context.get()


def selection_key() -> tuple:
    """What picks a call's backend besides its arguments and tensors' devices (the use_backend context,
    HK_BACKEND): part of a wrapper's per-signature plan key (runtime/plans.py), as it is of the fast path's."""
    return _context.get(), env_backend_raw()


@contextlib.contextmanager
def use_backend(spec: str):
    """Within this block, kernels run on the backend (and target) `spec` names unless a call names one."""
    from . import opfast                         # (imports this module)
    resolve(spec, require_runnable=False)        # a bad name, spec or arch fails here, not at the first call
    token = _context.set(spec)
    opfast.block_opened(1)
    try:
        yield
    finally:
        opfast.block_opened(-1)
        _context.reset(token)
