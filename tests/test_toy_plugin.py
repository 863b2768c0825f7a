"""A third-party backend distribution (tests/plugins/hk_toy_backend, installed by .ci/run) is found
through its entry point and runs the conformance suite, with capability skips for what its narrow
target lacks."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import subprocess
import sys

import pytest

from hk_portable.runtime import registry
from hk_portable.conformance import run
from hk_portable.conformance.runner import FAILED, PASSED, SKIPPED

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("hk_toy_backend") is None,
    reason="the toy backend distribution is not installed (pip install -e tests/plugins/hk_toy_backend)")


def test_discovered_through_its_entry_point():
    (ep,) = [ep for ep in registry.entry_points() if ep.name == "toy"]
    assert ep.value == "hk_toy_backend:ToyBackend"
    dist = importlib.metadata.distribution("hk-toy-backend")
    assert any(e.name == "toy" and e.group == "hk_portable.backends" for e in dist.entry_points)
    info = {i.name: i for i in registry.report()}["toy"]
    assert info.loaded and info.available and info.targets == ["toy1"]


def test_it_imports_no_backend_of_ours():
    import hk_toy_backend
    tree = ast.parse(inspect.getsource(hk_toy_backend))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [m for m in imported if m.startswith("hk_portable.backends")]


def test_it_runs_the_suite_with_passes_and_capability_skips():
    result = run("toy", seed=11)
    s = result.summary
    assert s[FAILED] == 0, [(r.id, r.reason) for r in result.results if r.status == FAILED][:5]
    assert s[PASSED] > 500 and s[SKIPPED] > 0
    reasons = {r.reason for r in result.results if r.status == SKIPPED}
    for lack in ("dtype fp8e4m3", "capability 'atomics'", "capability 'dropout'", "bytes of shared memory"):
        assert any(lack in reason for reason in reasons), lack
    passed = {r.id for r in result.results if r.status == PASSED}
    assert {"kernel/dropout_residual_layernorm/bf16/7x256_p0", "op/mma/AB_st_st/bf16/40x50x70"} <= passed
    gemm = next(r for r in result.results if r.id == "kernel/gemm/bf16-f32/256x256x256")
    assert gemm.status == SKIPPED and "16384 bytes of shared memory (it declares 12288)" in gemm.reason


def test_the_cli_runs_it():
    out = subprocess.run([sys.executable, "-m", "hk_portable.cli", "conformance", "--backend", "toy", "-k",
                          "kernel/gemm/bf16-f32/1x1x1,op/unary/exp/f32"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "CONFORMS: 2 passed, 0 failed, 1 skipped" in out.stdout


def test_pytest_runs_it_through_the_plugin(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "hk_portable.conformance",
                          "-p", "no:cacheprovider",
                          "--hk-backend", "toy", "-q", "-rs", "-k", "kernel/gemm/bf16-f32 or op/unary/exp/"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "6 passed, 4 skipped" in out.stdout and "16384 bytes of shared memory" in out.stdout
