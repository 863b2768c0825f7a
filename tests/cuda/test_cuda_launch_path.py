"""The cuda backend's launch path without a GPU: the first launch of an artifact builds its plan while
holding the backend lock and probes the device under it (a plain Lock deadlocked there on the H200)."""
import threading

import pytest

from hk_portable.backends.cuda import CudaBackend, driver
from hk_portable.interface.backend import Artifact


def test_first_launch_probes_under_the_lock_without_deadlock(monkeypatch):
    be = CudaBackend()
    monkeypatch.setattr(driver, "probe", lambda: (True, None, [{"name": "fake", "cc": (9, 0)}]))
    built = []

    class FakePlan:
        def __init__(self, artifact, device_index):
            built.append(device_index)

    monkeypatch.setattr(driver, "LaunchPlan", FakePlan)
    art = Artifact(backend="cuda", target="sm_90a", kernel_name="k", program_hash="0")
    done = threading.Event()

    def first_launch():
        be._plan(art, 0)
        done.set()

    t = threading.Thread(target=first_launch, daemon=True)
    t.start()
    t.join(timeout=10)
    assert done.is_set(), "building the first launch plan deadlocked on the backend lock"
    assert built == [0]
    assert be._plan(art, 0) is art.payload[0]      # cached: built once
    assert built == [0]
