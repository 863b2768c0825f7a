"""Backend discovery (stevedore entry points, group `hk_portable.backends`) and run-time selection.

Listing reads entry-point metadata only; a backend module is imported when it is first loaded by
name. A backend that fails to import, to construct or to probe is reported with its reason."""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import threading
from dataclasses import dataclass, field

from stevedore import DriverManager, ExtensionManager
from stevedore.exception import MultipleMatches, NoMatches

from ..interface.backend import Backend, BackendStatus
from ..interface.errors import BackendError

NAMESPACE = "hk_portable.backends"
ENV = "HK_BACKEND"

_lock = threading.Lock()
_loaded: dict[str, Backend] = {}
_failed: dict[str, str] = {}
_context: contextvars.ContextVar[str | None] = contextvars.ContextVar("hk_backend", default=None)
# a missing name is reported by us (NoMatches below); newer stevedore deprecates warn_on_missing_entrypoint
_QUIET = ({"on_missing_entrypoints_callback": None}
          if "on_missing_entrypoints_callback" in inspect.signature(DriverManager.__init__).parameters
          else {"warn_on_missing_entrypoint": False})


@dataclass
class BackendInfo:
    name: str
    entry_point: str
    loaded: bool
    available: bool
    reason: str | None
    device: str | None = None
    targets: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "available": self.available, "reason": self.reason,
                "targets": self.targets, "loaded": self.loaded, "entry_point": self.entry_point,
                "device": self.device}


def entry_points():
    """The entry points of the group, without importing any backend module."""
    return list(ExtensionManager.make_test_instance([], namespace=NAMESPACE).list_entry_points())


def names() -> list[str]:
    return sorted({ep.name for ep in entry_points()})


def reset() -> None:
    """Forget loaded backends and stevedore's entry-point cache (tests install plugins at run time)."""
    with _lock:
        _loaded.clear()
        _failed.clear()
    ExtensionManager.ENTRY_POINT_CACHE.clear()
    try:
        from stevedore import _cache
        _cache._c = _cache.Cache()
    except Exception:  # pragma: no cover - stevedore internals moved; the class cache is cleared above
        pass


def load(name: str) -> Backend:
    """The backend named `name`, loaded once per process. BackendError with the reason on failure."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        if name in _failed:
            raise BackendError(_failed[name])
    try:
        mgr = DriverManager(NAMESPACE, name, invoke_on_load=True, on_load_failure_callback=_reraise, **_QUIET)
        be = mgr.driver
        if not isinstance(be, Backend):
            raise TypeError(f"entry point does not produce an hk_portable Backend (got {type(be).__name__})")
    except NoMatches:
        raise BackendError(f"no backend named {name!r}; installed backends: {names() or 'none'}") from None
    except MultipleMatches:
        reason = (f"backend name {name!r} is registered by more than one entry point "
                  f"({', '.join(ep.value for ep in entry_points() if ep.name == name)}); uninstall one")
        with _lock:
            _failed[name] = reason
        raise BackendError(reason) from None
    except Exception as e:  # noqa: BLE001 - any plugin failure is reported, never fatal
        reason = f"backend {name!r} failed to load: {type(e).__name__}: {e}"
        with _lock:
            _failed[name] = reason
        raise BackendError(reason) from e
    with _lock:
        _loaded[name] = be
    return be


def _reraise(manager, entrypoint, exc):
    raise exc


def _status(be: Backend) -> BackendStatus:
    try:
        return be.status()
    except Exception as e:  # noqa: BLE001 - a crashing probe is a reason, not a crash
        return BackendStatus(False, f"status probe failed: {type(e).__name__}: {e}")


def report() -> list[BackendInfo]:
    """Every entry point: loaded?, usable here?, why not?, targets."""
    out = []
    eps = entry_points()
    for ep in sorted(eps, key=lambda e: (e.name, e.value)):
        try:
            be = load(ep.name)
        except BackendError as e:
            out.append(BackendInfo(ep.name, ep.value, False, False, str(e)))
            continue
        st = _status(be)
        try:
            targets = [t.arch + (" (compile-only)" if t.compile_only else "") + (" (emulated)" if t.emulated else "")
                       for t in be.targets()]
        except Exception as e:  # noqa: BLE001
            targets, st = [], BackendStatus(False, f"targets() failed: {e}")
        out.append(BackendInfo(ep.name, ep.value, True, st.available, None if st.available else st.reason,
                               st.device, targets))
    return out


def get(name: str, require_available: bool = True) -> Backend:
    be = load(name)
    if require_available:
        st = _status(be)
        if not st.available:
            raise BackendError(f"backend {name!r} cannot run kernels here: {st.reason}")
    return be


def current_context() -> str | None:
    """The backend named by the innermost use_backend() block, if any."""
    return _context.get()


@contextlib.contextmanager
def use_backend(name: str):
    """Within this block, kernels run on `name` unless a call names a backend explicitly."""
    get(name, require_available=False)
    token = _context.set(name)
    try:
        yield
    finally:
        _context.reset(token)


def _device_default(tensors) -> str:
    for t in tensors:
        if t.device.type == "cuda":
            import torch
            return "hip" if getattr(torch.version, "hip", None) else "cuda"
    return "reference"


def select(explicit=None, tensors=()) -> Backend:
    """Argument > use_backend() context > HK_BACKEND (comma list) > tensors' device > reference."""
    if isinstance(explicit, Backend):
        return explicit
    if explicit is not None:
        return get(explicit)
    ctx = _context.get()
    if ctx is not None:
        return get(ctx)
    env = os.environ.get(ENV, "").strip()
    if env:
        listed = [n.strip() for n in env.split(",") if n.strip()]
        backends = []
        for n in listed:
            try:
                backends.append(get(n))
            except BackendError as e:
                raise BackendError(f"{ENV}={env!r}: {e}") from None
        devices = {t.device for t in tensors}
        for be in backends:
            if all(be.accepts_device(d) for d in devices):
                return be
        raise BackendError(f"{ENV}={env!r}: none of these backends accepts tensors on {sorted(map(str, devices))}")
    return get(_device_default(tensors))
