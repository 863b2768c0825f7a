"""Helpers for tests that install backend plugins at run time (imported by name: a module called
`conftest` may be another folder's)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from hk_portable.runtime import registry


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


class Judging(Recording):
    '''Rejects every build whose BM is 64, as cuda rejects one that spills (Backend.rejects).'''
    name = "judging"

    def rejects(self, artifact, target):
        return "spills 8 bytes" if artifact.payload.consts.get("BM") == 64 else None


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
