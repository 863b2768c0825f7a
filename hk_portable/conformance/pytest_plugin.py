"""pytest plugin (entry point `pytest11: hk_portable`): the conformance cases as parametrized tests.

    pytest --pyargs hk_portable.conformance --hk-backend SPEC [--hk-target ARCH] [--hk-emulate]

SPEC is NAME, NAME:ARCH or NAME:ARCH:emulated (hip:gfx950:emulated), as wherever a backend is named.

Any test that takes the `hk_case` argument is parametrized over every conformance case and runs it
with the `hk_conformance` fixture; without --hk-backend the cases run on the reference backend.
A backend named with --hk-backend that cannot run here is a usage error, not a wall of skips.
"""
from __future__ import annotations

import random

import pytest

from ..interface.errors import HKError

_RESULTS = []


def pytest_addoption(parser):
    group = parser.getgroup("hk_portable", "hk_portable conformance")
    group.addoption("--hk-backend", default=None, metavar="SPEC",
                    help="backend the conformance cases run on: NAME, NAME:ARCH or NAME:ARCH:emulated "
                         "(default: reference)")
    group.addoption("--hk-target", default=None, metavar="ARCH", help="target arch (default: the backend's)")
    group.addoption("--hk-emulate", action="store_true", help="run on the backend's emulated target")
    group.addoption("--hk-seed", default="0", metavar="INT|random",
                    help="seed of the case inputs (default 0; 'random' for fresh inputs, reported)")
    group.addoption("--hk-json", default=None, metavar="FILE", help="also write the conformance report as JSON")


def _seed(config) -> int:
    raw = config.getoption("--hk-seed")
    if raw == "random":
        if not hasattr(config, "_hk_seed"):
            config._hk_seed = random.SystemRandom().randrange(2**31)
        return config._hk_seed
    try:
        return int(raw)
    except ValueError:
        raise pytest.UsageError(f"--hk-seed must be an int or 'random', got {raw!r}") from None


def _make_session(config):
    from ..runtime.selection import with_flags
    from .runner import Session
    backend = config.getoption("--hk-backend") or "reference"
    try:
        name, arch, emulate = with_flags(backend, config.getoption("--hk-target"), config.getoption("--hk-emulate"))
        return Session(name, arch, emulate, _seed(config))
    except HKError as e:
        raise pytest.UsageError(f"--hk-backend {backend}: {e}") from None


def pytest_configure(config):
    if config.getoption("--hk-backend", default=None) or config.getoption("--hk-target", default=None):
        config._hk_session = _make_session(config)     # fail fast on a bad backend or target


def pytest_report_header(config):
    if getattr(config, "_hk_session", None) is not None:
        s = config._hk_session
        return f"hk_portable conformance: backend {s.backend.name}, target {s.target.arch}, seed {s.seed}"
    return None


def pytest_generate_tests(metafunc):
    if "hk_case" in metafunc.fixturenames:
        from .cases import all_cases
        cases = all_cases()
        metafunc.parametrize("hk_case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="session")
def hk_session(request):
    """The conformance Session (backend + target + seed) of this pytest run."""
    config = request.config
    if getattr(config, "_hk_session", None) is None:
        config._hk_session = _make_session(config)
    return config._hk_session


@pytest.fixture
def hk_conformance(hk_session):
    """run(case): runs one case; a failure fails the test with its reason, a skip skips with its reason."""
    from .runner import FAILED, SKIPPED

    def run(case):
        r = hk_session.run_case(case)
        _RESULTS.append(r)
        if r.status == SKIPPED:
            pytest.skip(r.reason)
        if r.status == FAILED:
            pytest.fail(f"{case.id} (seed {r.seed}): {r.reason} [max_error {r.max_error}, bound {r.bound}]",
                        pytrace=False)
        return r
    return run


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--hk-json", default=None)
    hk = getattr(session.config, "_hk_session", None)
    if path and hk is not None and _RESULTS:
        from .report import write_json
        from .runner import RunResult
        write_json(RunResult(hk.backend.name, hk.target, str(hk.device), hk.seed, list(_RESULTS),
                             sum(r.seconds for r in _RESULTS)), path)
