"""The README's kernel example runs as written (so the README stays true to the API)."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_kernel_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme_example"})
    assert "kernel @scale_rows(" in capsys.readouterr().out


def test_readme_quick_start_commands_are_the_ones_ci_runs():
    text = README.read_text()
    for command in ('pip install -e ".[dev]"', "hk conformance --backend reference", "pytest"):
        assert command in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]"' in ci and ci.rstrip().endswith("pytest")
