"""The conformance report: JSON (for machines) and a rich table, the "conformance certificate"."""
from __future__ import annotations

import datetime as _dt
import json
import platform
from pathlib import Path

import torch
from rich import box
from rich.console import Console
from rich.table import Table

from ..version import __version__
from .runner import FAILED, PASSED, SKIPPED, RunResult

_STYLE = {PASSED: "green", FAILED: "bold red", SKIPPED: "yellow"}


def to_json(run: RunResult) -> dict:
    """{"backend", "target", "cases": [...], "summary": {...}} plus seed, versions, date, device, timing."""
    return {
        "backend": run.backend,
        "target": run.target.arch,
        "cases": [{k: v for k, v in r.to_json().items()} for r in run.results],
        "summary": run.summary,
        "seed": run.seed,
        "device": run.device,
        "seconds": round(run.seconds, 3),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"hk_portable": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "target_info": run.target.to_json(),
    }


def write_json(run: RunResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(run), indent=1) + "\n")


def _num(x) -> str:
    if x is None:
        return ""
    return f"{x:.3g}" if x else "0"


def certificate(run: RunResult, console: Console | None = None, only_problems: bool = False) -> None:
    """Print the table of cases (or only failed and skipped ones) and the summary line."""
    console = console or Console()
    title = (f"hk_portable conformance certificate: backend [b]{run.backend}[/b], target [b]{run.target.arch}[/b]"
             f"{' (emulated)' if run.target.emulated else ''}, device {run.device}, seed {run.seed}")
    table = Table(title=title, box=box.SIMPLE_HEAD, show_lines=False, expand=False)
    table.add_column("case", overflow="fold")
    table.add_column("status")
    table.add_column("max error", justify="right")
    table.add_column("bound", justify="right")
    table.add_column("reason", overflow="fold", max_width=70)
    rows = [r for r in run.results if not only_problems or r.status != PASSED]
    for r in rows:
        table.add_row(r.id, f"[{_STYLE[r.status]}]{r.status}[/]", _num(r.max_error),
                      _num(r.bound) if r.max_error is not None else "", r.reason or "")
    if rows:
        console.print(table)
    s = run.summary
    verdict = "[bold green]CONFORMS[/]" if s[FAILED] == 0 else "[bold red]DOES NOT CONFORM[/]"
    console.print(f"{verdict}: {s[PASSED]} passed, {s[FAILED]} failed, {s[SKIPPED]} skipped "
                  f"({len(run.results)} cases in {run.seconds:.1f} s)")
