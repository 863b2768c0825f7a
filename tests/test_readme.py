"""The README's kernel example runs as written (so the README stays true to the API)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_kernel_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme_example"})
    assert "kernel @scale_rows(" in capsys.readouterr().out


def _quick_start() -> list[str]:
    """The README's quick-start commands as .ci/run extracts them (its own awk line, run here)."""
    ci = (README.parent / ".ci" / "run").read_text()
    (extract,) = [line for line in ci.splitlines() if line.startswith("quick_start=$(")]
    out = subprocess.run(["bash", "-c", f"{extract}; printf '%s' \"$quick_start\""], cwd=README.parent,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_readme_quick_start_is_two_commands_install_and_run_then_test():
    install, test = _quick_start()
    assert install.startswith('pip install -e ".[dev]" && hk conformance --backend reference'), install
    assert test == "pytest"


def test_ci_installs_only_what_the_readme_installs():
    """CI runs the README's quick start as written and installs no Python package of its own (a pre-installed
    torch once hid a spill that the README's install picked: torch 2.14.1 brings NVRTC 13.0)."""
    ci = (README.parent / ".ci" / "run").read_text()
    code = [line.split("#")[0] for line in ci.splitlines()]
    assert 'bash -euo pipefail -c "$quick_start"' in code
    assert not [line for line in code if re.search(r"\bpip\b|\buv\b|conda|poetry", line)], \
        "a Python install in .ci/run besides the README's"
    assert "pip install" in _quick_start()[0]


def test_readme_conformance_counts_are_the_committed_results():
    """Every count the README cites next to a committed conformance report (`N/N ... docs/conformance/X.json`, or
    `N cases ... docs/conformance/X-*.json`) is that report's: the README drifts no further than its sources."""
    import json
    text = README.read_text()
    claims = re.findall(r"(\d+)/(\d+)[^|`]{0,200}?`(docs/conformance/[^`]+\.json)`", text)
    claims += [(n, n, path) for n, path in re.findall(r"(\d+) cases[^|`]{0,300}?`(docs/conformance/[^`]+\.json)`", text)]
    assert len(claims) >= 3, "the README's conformance claims were not found (the pattern or the README changed)"
    for passed, total, pattern in claims:
        files = sorted(README.parent.glob(pattern))
        assert files, f"README cites {pattern}, which is not committed"
        for f in files:
            s = json.loads(f.read_text())["summary"]
            got = (s["passed"], s["passed"] + s["failed"] + s["skipped"])
            assert got == (int(passed), int(total)), f"README says {passed}/{total} for {f.name}; it holds {got}"
