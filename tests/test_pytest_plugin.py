"""The pytest plugin: `pytest --pyargs hk_portable.conformance [--hk-backend NAME]`."""
from __future__ import annotations

import json
import subprocess
import sys


def _pytest(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "hk_portable.conformance", "-p",
                           "no:cacheprovider", "-q", *args], capture_output=True, text=True, cwd=tmp_path)


def test_cases_run_as_tests_on_the_reference_by_default(tmp_path):
    report = tmp_path / "r.json"
    out = _pytest(tmp_path, "-k", "kernel/gemm/bf16-f32", "--hk-json", str(report), "--hk-seed", "5")
    assert out.returncode == 0, out.stdout[-2000:]
    assert "4 passed" in out.stdout
    d = json.loads(report.read_text())
    assert d["backend"] == "reference" and d["seed"] == 5 and d["summary"]["passed"] == 4


def test_a_bad_backend_is_a_usage_error(tmp_path):
    out = _pytest(tmp_path, "--hk-backend", "nope")
    assert out.returncode == 4
    assert "--hk-backend nope: no backend named 'nope'" in out.stderr


def test_a_failing_case_reports_its_reason_and_seed(tmp_path):
    # a bound the reference cannot meet: patch the table in a conftest that only this run sees
    (tmp_path / "conftest.py").write_text(
        "from hk_portable.conformance import tolerances as t\n"
        "t.TABLE[('exp', 'f32')] = t.bounded('impossibly tight', rel=2.0 ** -60)\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--hk-seed", "9",
                          "--pyargs", "hk_portable.conformance", "-k", "op/unary/exp/f32/37x70",
                          "--confcutdir", str(tmp_path), "-c", "/dev/null", "--rootdir", str(tmp_path),
                          "-p", "conftest"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "op/unary/exp/f32/37x70 (seed " in out.stdout and "outside the bound" in out.stdout


def test_the_backend_is_named_by_a_spec(tmp_path):
    report = tmp_path / "r.json"
    out = _pytest(tmp_path, "--hk-backend", "reference:cpu", "-k", "kernel/gemm/bf16-f32", "--hk-json", str(report))
    assert out.returncode == 0, out.stdout[-2000:]
    assert json.loads(report.read_text())["target"] == "cpu"
    out = _pytest(tmp_path, "--hk-backend", "reference:gfx942")
    assert out.returncode == 4
    assert "--hk-backend reference:gfx942: backend 'reference' has no target 'gfx942'" in out.stderr
    out = _pytest(tmp_path, "--hk-backend", "reference:cpu:emulatd")
    assert out.returncode == 4 and "expected NAME, NAME:ARCH or NAME:ARCH:emulated" in out.stderr
