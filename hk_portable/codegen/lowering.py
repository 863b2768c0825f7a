"""The lowering as a named pipeline: a backend declares its passes in order, each a named function that adds one
annotation (what it found or decided) to the lowered value, reading the Program and the annotations before it; each
runs once. `hk compile KERNEL --emit lowered` prints the Program and every annotation, `--emit lowered:after=PASS`
the state after that pass.

    passes = (Pass("layouts", find_layouts, show_layouts), Pass("schedule", plan, show_plan))
    print(describe(lower(program, target, passes, after="layouts"), passes))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..interface.backend import Target
from ..interface.errors import UnsupportedError
from ..interface.ir import Program


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[["Lowered"], Any]            # the annotation, from the Program and the annotations before it
    show: Callable[["Lowered", Any], str]      # that annotation as text


@dataclass
class Lowered:
    program: Program
    target: Target
    annotations: dict[str, Any] = field(default_factory=dict)     # pass name -> its annotation, in pass order

    def __getitem__(self, name: str) -> Any:
        return self.annotations[name]


def lower(program: Program, target: Target, passes: tuple[Pass, ...], after: str | None = None) -> Lowered:
    """Run `passes` in order on `program` for `target`, stopping after the pass named `after` (None: all)."""
    names = [p.name for p in passes]
    if after is not None and after not in names:
        raise UnsupportedError(f"no lowering pass {after!r} on {target.spec}; its passes are, in order: "
                               f"{', '.join(names) or '(none)'}")
    out = Lowered(program, target)
    for p in passes:
        out.annotations[p.name] = p.run(out)
        if p.name == after:
            break
    return out


def describe(lowered: Lowered, passes: tuple[Pass, ...]) -> str:
    """The Program, then each annotation made so far under the name of its pass."""
    parts = [str(lowered.program)]
    for p in passes:
        if p.name in lowered.annotations:
            parts.append(f"// after pass '{p.name}'\n" + p.show(lowered, lowered.annotations[p.name]))
    return "\n\n".join(parts)


def parse_emit(kind: str) -> tuple[str, str | None]:
    """`lowered:after=PASS` -> ("lowered", "PASS"); any other kind -> (kind, None)."""
    base, sep, rest = kind.partition(":")
    if not sep:
        return kind, None
    if base != "lowered" or not rest.startswith("after=") or not rest[len("after="):]:
        raise UnsupportedError(f"--emit {kind!r}: only 'lowered' takes a suffix, as lowered:after=PASS")
    return base, rest[len("after="):]
