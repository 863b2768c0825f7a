"""Backend discovery and selection (DESIGN section 5), with plugins installed at run time."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.runtime import registry, selection
from hk_portable.interface import BackendError, GL, RT

from hk_test_plugins import RECORDING_BACKEND


@hk.kernel
def copy_kernel(x: GL[2], y: GL[2]):
    hk.store(y, hk.load(RT[x.dtype, 16, 16], x, (0, 0)), (0, 0))


def _run_copy(**kw):
    x = torch.arange(16 * 16, dtype=torch.float32).view(16, 16) + 1
    y = torch.zeros_like(x)
    copy_kernel(x, y, grid=(1,), **kw)
    assert torch.equal(x, y)


@pytest.fixture
def plugins(fake_plugins):
    fake_plugins.module("hk_fake_backends", RECORDING_BACKEND)
    fake_plugins.distribution("hk-fake-good", {"alpha": "hk_fake_backends:Alpha", "beta": "hk_fake_backends:Beta",
                                                "unusable": "hk_fake_backends:Unusable",
                                                "probe_crashes": "hk_fake_backends:ProbeCrashes"})
    fake_plugins.distribution("hk-fake-broken", {"broken": "hk_fake_no_such_module:Backend",
                                                  "notabackend": "hk_fake_backends:NotABackend"})
    import hk_fake_backends
    hk_fake_backends.RUNS.clear()
    return hk_fake_backends


# ------------------------------------------------------------------------------------------ discovery
def test_listing_reads_entry_points_without_importing_backends(plugins):
    names = registry.names()
    assert {"reference", "alpha", "beta", "broken"} <= set(names)
    assert "hk_fake_no_such_module" not in registry._loaded


def test_failing_plugin_is_reported_with_its_reason_not_raised(plugins):
    infos = {i.name: i for i in registry.report()}
    broken = infos["broken"]
    assert not broken.loaded and not broken.available
    assert "ModuleNotFoundError" in broken.reason and "hk_fake_no_such_module" in broken.reason
    assert "does not produce an hk_portable Backend" in infos["notabackend"].reason
    assert infos["unusable"].loaded and not infos["unusable"].available
    assert infos["unusable"].reason == "the test says it has no device"
    assert "status probe failed: RuntimeError: driver exploded" in infos["probe_crashes"].reason
    assert infos["alpha"].available and infos["alpha"].targets == ["cpu"]
    assert infos["reference"].available


def test_loading_a_failing_plugin_raises_backend_error_with_the_reason(plugins):
    with pytest.raises(BackendError, match="backend 'broken' failed to load: ModuleNotFoundError"):
        registry.load("broken")


def test_duplicate_names_are_refused(fake_plugins):
    fake_plugins.module("hk_fake_backends", RECORDING_BACKEND)
    fake_plugins.distribution("hk-fake-one", {"dup": "hk_fake_backends:Alpha"})
    fake_plugins.distribution("hk-fake-two", {"dup": "hk_fake_backends:Beta"})
    with pytest.raises(BackendError, match="'dup' is registered by more than one entry point"):
        registry.load("dup")
    info = {i.name: i for i in registry.report()}["dup"]
    assert not info.available and "more than one entry point" in info.reason


def test_unknown_name_lists_the_installed_backends():
    with pytest.raises(BackendError, match=r"no backend named 'nope'; installed backends: \[.*'reference'"):
        registry.load("nope")


# ------------------------------------------------------------------------------------------ selection
def test_cpu_tensors_default_to_reference(monkeypatch):
    monkeypatch.delenv("HK_BACKEND", raising=False)
    assert selection.select(None, [torch.zeros(1)]).backend.name == "reference"
    assert selection.select(None, []).backend.name == "reference"


def test_hk_backend_environment_selects(plugins, monkeypatch):
    monkeypatch.setenv("HK_BACKEND", "alpha")
    _run_copy()
    assert plugins.RUNS == ["alpha"]


def test_hk_backend_comma_list_takes_the_first_that_accepts_the_tensors(plugins, monkeypatch):
    monkeypatch.setenv("HK_BACKEND", "beta,alpha")
    assert selection.select(None, [torch.zeros(1)]).backend.name == "beta"


def test_hk_backend_passes_over_a_listed_backend_that_cannot_run_here(plugins, monkeypatch):
    monkeypatch.setenv("HK_BACKEND", "unusable,alpha")        # README: `cuda,reference` falls back (issue 41)
    assert selection.select(None, [torch.zeros(1)]).backend.name == "alpha"


@pytest.mark.parametrize("env, message", [
    ("nope", "HK_BACKEND='nope': no backend named 'nope'"),
    ("broken", "HK_BACKEND='broken': backend 'broken' failed to load: ModuleNotFoundError"),
    ("alpha,broken", "HK_BACKEND='alpha,broken': backend 'broken' failed to load"),
    ("unusable", "HK_BACKEND='unusable': backend 'unusable' cannot run kernels here: the test says it has no device"),
])
def test_a_listed_backend_that_fails_is_a_clear_error(plugins, monkeypatch, env, message):
    monkeypatch.setenv("HK_BACKEND", env)
    with pytest.raises(BackendError) as e:
        _run_copy()
    assert message in str(e.value)
    assert plugins.RUNS == []


def test_use_backend_context_beats_the_environment(plugins, monkeypatch):
    monkeypatch.setenv("HK_BACKEND", "alpha")
    with hk.use_backend("beta"):
        _run_copy()
    _run_copy()
    assert plugins.RUNS == ["beta", "alpha"]


def test_explicit_argument_beats_context_and_environment(plugins, monkeypatch):
    monkeypatch.setenv("HK_BACKEND", "alpha")
    with hk.use_backend("beta"):
        _run_copy(backend="alpha")
        _run_copy(backend=registry.get("reference"))     # a Backend object works too
    assert plugins.RUNS == ["alpha"]


def test_use_backend_with_a_bad_name_fails_at_the_with(plugins):
    with pytest.raises(BackendError, match="failed to load"):
        with hk.use_backend("broken"):
            pass


def test_context_does_not_leak(plugins):
    with hk.use_backend("beta"):
        pass
    _run_copy()
    assert plugins.RUNS == []          # back to the reference


def test_hk_backends_function_reports_every_entry_point(plugins):
    import hk_portable.backends.reference  # noqa: F401 - importing a submodule must not break hk.backends()
    assert {"reference", "alpha", "broken"} <= {i.name for i in hk.backends()}
