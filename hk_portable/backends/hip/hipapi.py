"""hip-python, reached lazily (importing it needs no ROCm; the first call does): the hip and hiprtc
bindings, the unpacking of their (error, *results) tuples, and HIP's words for an error. Shared by
compiler.py (hiprtc) and driver.py (hip)."""
from __future__ import annotations

from ...interface.errors import BackendError


class HipError(BackendError):
    """A HIP or hiprtc call failed."""


def hip():
    from hip import hip as binding   # noqa: PLC0415 - optional dependency, imported on use
    return binding


def hiprtc():
    from hip import hiprtc as binding  # noqa: PLC0415
    return binding


def ok(result, call: str):
    """Unpack a hip-python result tuple; HipError if its error is not success."""
    if not isinstance(result, tuple):
        result = (result,)
    err, rest = result[0], result[1:]
    if is_error(err):
        raise HipError(f"{call} failed: {error_text(err)}")
    return rest[0] if len(rest) == 1 else rest


def is_error(err) -> bool:
    # hipError_t / hiprtcResult are enums whose success value is 0
    return int(getattr(err, "value", err)) != 0


def error_text(err) -> str:
    """The error's name and HIP's (or hiprtc's) description of it."""
    name = getattr(err, "name", str(err))
    try:
        if "hiprtc" in type(err).__name__:
            s = hiprtc().hiprtcGetErrorString(err)
        else:
            s = hip().hipGetErrorString(err)
        s = s[-1] if isinstance(s, tuple) else s
        return f"{name} ({s.decode() if isinstance(s, bytes) else s})"
    except Exception:  # noqa: BLE001 - the name alone still says what failed
        return str(name)
