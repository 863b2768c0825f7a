"""The base of every backend's compile options: a frozen, validated, hashable dataclass.

A backend subclasses it with its own fields and a `validate()`; `compile(program, target, options)`
takes None, a dict or the dataclass (`coerce`), and the Artifact records `to_json()`. An unknown key is
an OptionError naming the key and the options there are.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Mapping

from ..interface.errors import UnsupportedError


class OptionError(UnsupportedError, ValueError):
    """A compile option is unknown or has a value its backend does not take."""


@dataclass(frozen=True)
class BackendOptions:
    backend: ClassVar[str] = ""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise OptionError for a value the backend does not take (subclasses)."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        unknown = [k for k in values if k not in cls.names()]
        if unknown:
            raise OptionError(f"{cls.backend} backend: unknown compile option {unknown[0]!r}; its options are "
                              f"{', '.join(cls.names())}")
        return cls(**values)

    @classmethod
    def coerce(cls, options):
        """None (the defaults), a dict of overrides, or the dataclass itself."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if isinstance(options, Mapping):
            return cls.from_dict(options)
        raise OptionError(f"{cls.backend} backend: compile options must be None, a dict or {cls.__name__}, "
                          f"got {type(options).__name__}")

    def to_json(self) -> dict:
        return asdict(self)

    # ---- helpers for validate()
    def _expect(self, name: str, ok: bool, expected: str) -> None:
        if not ok:
            raise OptionError(f"{self.backend} backend: option {name}={getattr(self, name)!r}: expected {expected}")

    def _expect_bool(self, *names: str) -> None:
        for n in names:
            self._expect(n, isinstance(getattr(self, n), bool), "True or False")

    def _expect_choice(self, name: str, choices) -> None:
        self._expect(name, getattr(self, name) in choices, f"one of {', '.join(map(repr, choices))}")

    def _expect_int(self, name: str, lo: int, hi: int, allow_none: bool = True) -> None:
        v = getattr(self, name)
        ok = (v is None and allow_none) or (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi)
        self._expect(name, ok, f"an int from {lo} to {hi}" + (" or None" if allow_none else ""))
