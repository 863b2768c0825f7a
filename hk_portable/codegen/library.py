"""A device library as one text: its top-level file with every `#include "piece"` inlined (recursively,
each piece once, paths relative to the including file). The generated source stays header-free
(NVRTC, hiprtc and the offline compilers get no include path), while the library itself is split into
files by concept, and the top-level file stays includable as it is by a host compiler (tests, emulators).

`pieces(top)` lists the files in inlining order: the library fingerprint (part of every compile cache
key) hashes all of them, so editing any piece changes the key.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

OPCODE_TABLE = Path(__file__).parents[1] / "interface" / "opcodes.py"
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)


def _walk(path: Path, seen: dict[Path, None]) -> None:
    path = path.resolve()
    if path in seen:
        return
    seen[path] = None
    for rel in _INCLUDE.findall(path.read_text()):
        _walk(path.parent / rel, seen)


@lru_cache(maxsize=None)
def pieces(top: Path) -> tuple[Path, ...]:
    """The top-level file and every piece it includes, in depth-first order."""
    seen: dict[Path, None] = {}
    _walk(Path(top), seen)
    return tuple(seen)


def _inline(path: Path, done: set[Path]) -> str:
    path = path.resolve()
    if path in done:
        return f"// (already inlined: {path.name})"
    done.add(path)

    def sub(m: re.Match) -> str:
        piece = (path.parent / m.group(1)).resolve()
        return f"// ---- {piece.parent.name}/{piece.name}\n{_inline(piece, done)}"
    return _INCLUDE.sub(sub, path.read_text())


@lru_cache(maxsize=None)
def text(top: Path) -> str:
    """The library as one header-free text."""
    return _inline(Path(top), set())


class DeviceLibrary:
    """A backend's device library as its codegen uses it: the header-free text for the prelude and the
    fingerprint for the cache key: every piece, and every Python file that decides what is generated (the
    backend's modules beside its emitter: schedules, arch tables; the shared codegen package: the
    emitter, the layout pass; the opcode table, whose roles the lowering reads)."""

    def __init__(self, top: Path, emitter: Path):
        self.top, self.emitter = Path(top), Path(emitter)

    def text(self) -> str:
        return text(self.top)

    @lru_cache(maxsize=None)    # noqa: B019 - one instance per backend module, alive for the process
    def fingerprint(self) -> str:
        from .cstyle import source_fingerprint
        here = Path(__file__).parent
        modules = sorted(self.emitter.parent.glob("*.py")) + sorted(here.glob("*.py")) + [OPCODE_TABLE]
        return source_fingerprint(*pieces(self.top), *modules)
