"""Shared test setup: one torch thread, GPU tests skipped with the reason on machines without a GPU,
and `fake_plugins`, which installs backend entry points at run time."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

from hk_portable.backends import registry

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


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items:
        reason = _gpu_unavailable_reason()
        if reason:
            for item in gpu_items:
                item.add_marker(pytest.mark.skip(reason=reason))


class FakePlugins:
    """Writes distributions (a *.dist-info with entry_points.txt) and their modules into a folder on
    sys.path, so that stevedore discovers them exactly as it does installed plugins."""

    def __init__(self, root: Path):
        self.root = root

    def module(self, name: str, source: str) -> None:
        (self.root / f"{name}.py").write_text(textwrap.dedent(source))

    def distribution(self, dist: str, entry_points: dict[str, str]) -> None:
        info = self.root / f"{dist.replace('-', '_')}-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
        lines = [f"{name} = {target}" for name, target in entry_points.items()]
        (info / "entry_points.txt").write_text("[hk_portable.backends]\n" + "\n".join(lines) + "\n")
        registry.reset()


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("HK_BACKEND", raising=False)
    registry.reset()
    yield FakePlugins(tmp_path)
    monkeypatch.undo()          # sys.path first, so reset() forgets the fake entry points
    registry.reset()


# A backend that records that it ran, then runs the Program through the public reference backend.
RECORDING_BACKEND = """
import hk_portable
from hk_portable.interface import Artifact, Backend, BackendStatus, Target

RUNS = []


class Recording(Backend):
    name = "?"

    def status(self):
        return BackendStatus(True, None, "test double")

    def targets(self):
        return [Target(backend=self.name, arch="cpu", capabilities=("run",))]

    def compile(self, program, target, options=None):
        return Artifact(self.name, target.arch, program.name, program.hash, payload=program)

    def launch(self, artifact, args, grid, stream=None):
        RUNS.append(self.name)
        ref = hk_portable.get_backend("reference")
        ref.launch(ref.compile(artifact.payload, ref.default_target()), args, grid, stream)

    def cacheable(self):
        return False


class Alpha(Recording):
    name = "alpha"


class Beta(Recording):
    name = "beta"


class Unusable(Recording):
    name = "unusable"

    def status(self):
        return BackendStatus(False, "the test says it has no device")


class ProbeCrashes(Recording):
    name = "probe_crashes"

    def status(self):
        raise RuntimeError("driver exploded")


class NotABackend:
    pass
"""
