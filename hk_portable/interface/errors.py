"""Errors raised to kernel authors and callers. Each names what was wrong and what was expected."""


class HKError(Exception):
    """Base of every hk_portable error."""


class TraceError(HKError):
    """The kernel body cannot be turned into a Program (Python control flow on traced values, ...)."""


class ArgumentError(HKError, TypeError):
    """A launch argument has the wrong dtype, shape, rank, device, stride or aliasing."""


class UnsupportedError(HKError):
    """A backend or target cannot take this Program (tile shape, dtype, resource limits)."""


class BackendError(HKError):
    """A backend could not be found, loaded, or used."""
