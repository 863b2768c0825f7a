"""Shared test setup: one torch thread, `slow` tests left out of the default run (see below), GPU tests skipped with
the reason on machines without a GPU, `fake_plugins`, which installs backend entry points at run time (see hk_test_plugins), and `hip_emulator`,
which skips a test with the reason unless the hip backend's CPU emulator can run here."""
from __future__ import annotations

import os

import pytest
import torch

from hk_portable.runtime import registry

from hk_test_plugins import FakePlugins
from hk_test_sampling import exhaustive

if "OMP_NUM_THREADS" not in os.environ:
    # the tests use small tensors: one thread is as fast, and two spinning threads on a busy 2-core
    # runner made the reference interpreter up to 15x slower (measured)
    torch.set_num_threads(1)


def _gpu_unavailable_reason() -> str | None:
    reasons = []
    for info in registry.report():
        if info.name in ("cuda", "hip"):
            if info.available:
                return None
            reasons.append(f"{info.name}: {info.reason}")
    return "needs a usable GPU backend; none here (" + ("; ".join(reasons) or "no cuda/hip backend installed") + ")"


def _runs_slow(config) -> bool:
    """`slow` marks the long tail of the emulated and offline-compile suites (the cases beyond each one's sample): the
    default `pytest` deselects them, to keep CI's 2-core run short. They run with HK_EXHAUSTIVE=1 (everything, the
    offline-compile samples widened too), under any `-m` expression (`pytest -m slow`: only them; `pytest -m "slow or
    not slow"`: all), or when a test id (`path::name`) is named on the command line."""
    return exhaustive() or bool(config.option.markexpr) or any("::" in str(a) for a in config.args)


def pytest_collection_modifyitems(config, items):
    if not _runs_slow(config):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items:
        reason = _gpu_unavailable_reason()
        if reason:
            for item in gpu_items:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def hip_emulator():
    """The hip backend's emulator module; skips (with the reason) where hip is not installed or the emulator
    cannot be built."""
    if "hip" not in registry.names():
        pytest.skip("the hip backend is not installed")
    from hk_portable.backends.hip import emulator
    ok, why = emulator.available()
    if not ok:
        pytest.skip(why)
    return emulator


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("HK_BACKEND", raising=False)
    registry.reset()
    yield FakePlugins(tmp_path)
    monkeypatch.undo()          # sys.path first, so reset() forgets the fake entry points
    registry.reset()
