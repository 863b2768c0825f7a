"""Backend discovery (stevedore entry points, group `hk_portable.backends`): list, load, report, and
which backend claims a torch device. The order of selection is in selection.py.

Listing reads entry-point metadata only; a backend module is imported when it is first loaded by
name. A backend that fails to import, to construct or to probe is reported with its reason."""
from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field

from stevedore import DriverManager, ExtensionManager
from stevedore.exception import MultipleMatches, NoMatches

from ..interface.backend import Backend, BackendStatus
from ..interface.errors import BackendError

NAMESPACE = "hk_portable.backends"

_lock = threading.Lock()
_loaded: dict[str, Backend] = {}
_failed: dict[str, str] = {}
_claims: dict[str, tuple[str, ...]] = {}      # torch device type -> names of the backends that claim it
_on_reset: list = []                          # callables that forget choices made with the old backends
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
        _claims.clear()
    for forget in _on_reset:
        forget()
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
    """The backend `name`, loaded; with require_available, BackendError (and the reason) unless it can run
    kernels here on its device."""
    be = load(name)
    if require_available:
        st = _status(be)
        if not st.available:
            raise BackendError(f"backend {name!r} cannot run kernels here: {st.reason}{emulated_hint(be)}")
    return be


def emulated_hint(be: Backend) -> str:
    """'; its emulated targets run here: hip:gfx942:emulated, ...' when it has any, else ''."""
    try:
        specs = [t.spec for t in be.targets() if t.emulated and not t.compile_only]
    except Exception:  # noqa: BLE001 - only a hint
        specs = []
    return f" (its emulated targets run here: name one as {', '.join(repr(s) for s in specs)})" if specs else ""


def claimant(device) -> Backend:
    """The one installed backend that claims tensors on `device` (Backend.claims_device), usable here.
    Which backends claim a device type is asked once per process; a backend that fails to load claims
    nothing (`hk backends` reports why)."""
    dtype = device.type
    names_ = _claims.get(dtype)
    if names_ is None:
        names_ = _claimants(device)
        with _lock:
            _claims[dtype] = names_
    if len(names_) == 1:
        return get(names_[0])
    if not names_:
        raise BackendError(f"no installed backend claims tensors on {dtype!r} (installed: "
                           f"{', '.join(names()) or 'none'}); name one with backend=..., hk.use_backend(...) "
                           "or HK_BACKEND")
    raise BackendError(f"tensors on {dtype!r} are claimed by several backends ({', '.join(names_)}); name one with "
                       "backend=..., hk.use_backend(...) or HK_BACKEND")


def _claimants(device) -> tuple[str, ...]:
    out = []
    for name in names():
        try:
            if load(name).claims_device(device):
                out.append(name)
        except Exception:  # noqa: BLE001 - a plugin that cannot load or crashes here claims nothing
            continue
    return tuple(out)
