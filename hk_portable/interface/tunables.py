"""Tunable consts: a kernel's declaration of which compile-time parameters a backend may choose, and their legal values.

    @hk.kernel(tunable={"BM": hk.tunable(64, 128, 256, role="m"), "STAGES": hk.tunable(range(2, 5), role="stages")})
    def f(a: GL[2], ..., *, BM: hk.const = 64, STAGES: hk.const = 2): ...

A declaration says only what is legal (the kernel's business); which value is fast on which target is the
backend's (its arch table's proposals, Backend.propose) or the autotuner's. A *role* names what a const means to a
backend ("m", "n", "k": the block's tile of an mma's rows, columns and depth; "stages": a pipeline's buffers;
"warps": the block size), so that a backend proposes tile shapes for consts it has never seen by name. Pure
interface: nothing here selects a backend or compiles.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ArgumentError

ROLES = ("m", "n", "k", "stages", "warps")
WARPS = "num_warps"             # the launch option every kernel has; declared tunable like a const


@dataclass(frozen=True)
class Tunable:
    """One const's legal values (a tuple, or a range of ints) and its role for backends' proposals (or None)."""
    legal: tuple | range
    role: str | None = None

    def allows(self, value) -> bool:
        # by type and value: True == 1 and 64.0 == 64, but neither is a legal tile size of 1 or 64
        if isinstance(self.legal, range):
            return type(value) is int and value in self.legal
        return any(type(v) is type(value) and v == value for v in self.legal)

    def describe(self) -> str:
        r = self.legal
        if isinstance(r, range):            # range(16, 257, 16): 16..256 step 16
            return f"{r!r}: {r.start}..{r[-1]}" + (f" step {r.step}" if r.step != 1 else "")
        return "{" + ", ".join(repr(v) for v in r) + "}"


def tunable(*values, role: str | None = None) -> Tunable:
    """A const's legal values: `hk.tunable(64, 128, 256)` or `hk.tunable(range(2, 5))`; `role=` one of ROLES."""
    if len(values) == 1 and isinstance(values[0], range):
        legal = values[0]
    elif len(values) == 1 and isinstance(values[0], (tuple, list)):
        legal = tuple(values[0])
    else:
        legal = tuple(values)
    if not len(legal):
        raise TypeError("hk.tunable: give at least one legal value (values or a range)")
    if role is not None and role not in ROLES:
        raise TypeError(f"hk.tunable: role must be one of {ROLES} or None, got {role!r}")
    return Tunable(legal, role)


def tile_proposals(table: dict, row, roles: tuple[str, ...]) -> list[dict]:
    """A backend's proposals from its tile table (capability name -> shapes, None -> the shapes of an arch with none
    of them): the shapes of the first capability `row` (the target's arch row) has, each cut to `roles`; none for a
    kernel that declares no mma tile ("m" or "n"), since nothing in such a table is about it."""
    if "m" not in roles and "n" not in roles:
        return []
    shapes = next((v for cap, v in table.items() if cap is not None and getattr(row, cap, False)), table[None])
    return [{r: v for r, v in shape.items() if r in roles} for shape in shapes]


class Tunables:
    """A kernel's tunable consts: name -> Tunable, checked against the kernel's signature once, at decoration."""

    def __init__(self, kernel: str, decl: dict, defaults: dict):
        if not isinstance(decl, dict) or not decl:
            raise TypeError(f"kernel '{kernel}': tunable= must be a non-empty dict of const name -> hk.tunable(...)")
        self.kernel = kernel
        self.specs: dict[str, Tunable] = {}
        roles: dict[str, str] = {}
        for name, spec in decl.items():
            if not isinstance(spec, Tunable):
                raise TypeError(f"kernel '{kernel}': tunable '{name}' must be hk.tunable(...), got {spec!r}")
            if name not in defaults:            # a tunable needs a default: the baseline every target can run
                raise TypeError(f"kernel '{kernel}': tunable '{name}' is not one of its consts with a default "
                                f"({', '.join(defaults)})")
            if spec.role is not None and spec.role in roles:
                raise TypeError(f"kernel '{kernel}': tunables '{roles[spec.role]}' and '{name}' both have role "
                                f"{spec.role!r}")
            if not spec.allows(defaults[name]):   # the baseline every target falls back to must be legal
                raise TypeError(f"kernel '{kernel}': the default of tunable '{name}', {defaults[name]!r}, is not "
                                f"one of its legal values {spec.describe()}")
            if spec.role is not None:
                roles[spec.role] = name
            self.specs[name] = spec
        self.by_role = {r: n for r, n in roles.items()}
        self.names = tuple(self.specs)

    def roles(self) -> tuple[str, ...]:
        return tuple(self.by_role)

    def check(self, consts: dict) -> None:
        """ArgumentError naming the const and its legal values when a passed value is not legal."""
        for name, value in consts.items():     # the passed consts, usually few (bind's path)
            spec = self.specs.get(name)
            if spec is not None and not spec.allows(value):
                raise ArgumentError(f"{self.kernel}: tunable const '{name}' must be one of its legal values "
                                    f"{spec.describe()}, got {value!r}")

    def legal(self, config: dict) -> bool:
        return all(spec.allows(config[n]) for n, spec in self.specs.items() if n in config)

    def from_proposal(self, proposal: dict, baseline: dict, fixed=()) -> dict | None:
        """A backend's proposal (role -> value) as a config over `baseline`: the roles this kernel declares mapped
        to its consts, roles it does not declare ignored, consts in `fixed` (passed by the caller) kept; None where
        a proposed value is not legal here (the proposal is dropped, never clamped)."""
        cfg = dict(baseline)
        for role, value in proposal.items():
            name = self.by_role.get(role)
            if name is None or name in fixed:
                continue
            if not self.specs[name].allows(value):
                return None
            cfg[name] = value
        return cfg
