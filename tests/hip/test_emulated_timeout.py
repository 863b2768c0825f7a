"""An emulated launch that never ends fails with the emulator's timeout instead of hanging the suite."""
import pytest
import torch

import hk_portable as hk
from hk_portable.backends.hip import HipBackend, emulator
from hk_portable.backends.hip.archs import make_target
from hk_portable.interface import GL, RT, f32

ok, why = emulator.available()
pytestmark = pytest.mark.skipif(not ok, reason=f"hip emulator unavailable: {why}")


@hk.kernel
def spin(x: GL[2], n: int):
    t = hk.fori_loop(0, n, lambda i, acc: acc + 1.0, hk.zeros(RT[f32, 16, 16]))
    hk.store(x, t, (0, 0))


def test_runaway_kernel_times_out(monkeypatch):
    monkeypatch.setenv("HK_EMU_TIMEOUT_S", "1")
    be = HipBackend()
    x = torch.empty(16, 16)
    prog = spin.trace(x, 2**31 - 1)
    art = be.compile(prog, make_target("gfx942", runs=True, emulated=True))
    with pytest.raises(emulator.EmulatorError, match="(?i)time"):
        be.launch(art, [x, 2**31 - 1], (1, 1, 1))


def test_the_same_kernel_finishes_with_a_sane_trip_count():
    be = HipBackend()
    x = torch.full((16, 16), float("nan"))
    art = be.compile(spin.trace(x, 5), make_target("gfx942", runs=True, emulated=True))
    be.launch(art, [x, 5], (1, 1, 1))
    assert torch.equal(x, torch.full((16, 16), 5.0))
