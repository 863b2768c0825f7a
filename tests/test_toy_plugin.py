"""A third-party backend distribution (tests/plugins/hk_toy_backend) is found through its entry point and
runs the conformance suite, with capability skips for what its narrow target lacks.

The distribution is laid out for these tests as pip lays out an installed one (the package on sys.path and a
*.dist-info with its METADATA and entry_points.txt), so importlib.metadata and stevedore find it exactly as they
find an installed plugin, and CI installs nothing beyond the README's own command."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hk_portable.runtime import registry
from hk_portable.conformance import run
from hk_portable.conformance.runner import FAILED, PASSED, SKIPPED

PLUGIN = Path(__file__).parent / "plugins" / "hk_toy_backend"


@pytest.fixture(scope="module", autouse=True)
def toy_distribution(tmp_path_factory):
    """The toy distribution's files on sys.path (and on PYTHONPATH for the subprocesses), unless it is installed."""
    if importlib.util.find_spec("hk_toy_backend") is not None:
        yield os.environ.get("PYTHONPATH", "")
        return
    root = tmp_path_factory.mktemp("site")
    info = root / "hk_toy_backend-0.1.0.dist-info"
    info.mkdir()
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = [f"{name} = {value}" for name, value in project["entry-points"]["hk_portable.backends"].items()]
    (info / "entry_points.txt").write_text("[hk_portable.backends]\n" + "\n".join(lines) + "\n")
    paths = [str(root), str(PLUGIN)]
    sys.path[:0] = paths
    registry.reset()
    yield os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    for p in paths:
        sys.path.remove(p)
    sys.modules.pop("hk_toy_backend", None)
    registry.reset()


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


def test_the_cli_runs_it(toy_distribution):
    out = subprocess.run([sys.executable, "-m", "hk_portable.cli", "conformance", "--backend", "toy", "-k",
                          "kernel/gemm/bf16-f32/1x1x1,op/unary/exp/f32"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": toy_distribution})
    assert out.returncode == 0, out.stderr
    assert "CONFORMS: 2 passed, 0 failed, 1 skipped" in out.stdout


def test_pytest_runs_it_through_the_plugin(tmp_path, toy_distribution):
    out = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "hk_portable.conformance",
                          "-p", "no:cacheprovider",
                          "--hk-backend", "toy", "-q", "-rs", "-k", "kernel/gemm/bf16-f32 or op/unary/exp/"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": toy_distribution})
    assert out.returncode == 0, out.stdout[-2000:]
    assert "6 passed, 4 skipped" in out.stdout and "16384 bytes of shared memory" in out.stdout
