"""Symbolisation of fault reports: the runtime reports code addresses as "[pc object+0xoff]"; with an
llvm-symbolizer at hand they become "[at file:line:col in function]"."""
from __future__ import annotations

import re
import shutil
import subprocess

from .toolchain import compiler

ALIASES: dict[str, str] = {}   # unlinked per-worker copy -> the cached object it was copied from
_PC = re.compile(r"\[pc (\S+)\+0x([0-9a-f]+)\]")


def _symbolizer() -> list[str] | None:
    c = compiler()
    cands = []
    if c and re.search(r"-(\d+)$", c[0]):
        cands.append("llvm-symbolizer-" + re.search(r"-(\d+)$", c[0]).group(1))
    cands.append("llvm-symbolizer")
    for x in cands:
        if shutil.which(x):
            return [shutil.which(x)]
    return None


def symbolize(msg: str) -> str:
    """Turn "[pc /path/kernel.so+0x1193]" into "[at kernel.hip:12:30 in add]" when a symbolizer exists."""
    m = _PC.search(msg)
    tool = _symbolizer() if m else None
    if not m or not tool:
        return msg
    try:
        obj = ALIASES.get(m.group(1), m.group(1))
        p = subprocess.run(tool + [f"--obj={obj}", "0x" + m.group(2)], capture_output=True, text=True,
                           timeout=20)
        lines = [x for x in p.stdout.splitlines() if x.strip()]
    except (OSError, subprocess.SubprocessError):
        return msg
    if len(lines) >= 2 and not lines[1].startswith("??"):
        where = re.sub(r"^\S*/\.build-[^/]+/", "", lines[1])   # the build dir is gone: keep the file name
        return msg[:m.start()] + f"[at {where} in {lines[0]}]" + msg[m.end():]
    return msg
