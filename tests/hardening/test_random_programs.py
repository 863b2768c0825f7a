"""Random well-typed Programs (issue 14, item 4, the Program half): a hypothesis-drawn sequence of tile ops
(unary, binary, scalar, row reductions broadcast back, round trips through bf16) over random tile and tensor
shapes. Every Program must compile offline for every target or be refused with UnsupportedError (never
crash), and the emulated gfx942 target must agree with the reference backend.

Profiles as in test_properties.py (HK_HYPOTHESIS_PROFILE=long for more examples)."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import hk_portable as hk  # noqa: E402
from hk_portable.interface import GL, RT, BackendError, UnsupportedError, bf16, f32  # noqa: E402
from hk_portable.runtime import registry  # noqa: E402

_COMMON = dict(deadline=None, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("programs-ci", max_examples=6, **_COMMON)
settings.register_profile("programs-long", max_examples=100, **_COMMON)
PROFILE = settings.get_profile("programs-long" if os.environ.get("HK_HYPOTHESIS_PROFILE") == "long"
                               else "programs-ci")

UNARY = {"neg": lambda t: -t, "abs": hk.abs, "relu": hk.relu, "tanh": hk.tanh, "sigmoid": hk.sigmoid,
         "exp_tanh": lambda t: hk.exp(hk.tanh(t)), "sqrt_abs": lambda t: hk.sqrt(hk.abs(t))}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * hk.tanh(b),
          "maximum": hk.maximum, "minimum": hk.minimum}
ROW = {"minus_row_max": lambda t: t - hk.row_max(t)[:, None],
       "times_row_mean": lambda t: t * (hk.row_sum(hk.tanh(t)) * (1.0 / 64))[:, None]}

OP = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY))),
    st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY)), st.sampled_from(["x", "w"])),
    st.tuples(st.just("scalar"), st.sampled_from(["add", "mul"]), st.sampled_from([-1.5, 0.5, 2.0])),
    st.tuples(st.just("row"), st.sampled_from(sorted(ROW))),
    st.tuples(st.just("bf16_round_trip")),
)


def _random_program(x: GL[2], w: GL[2], y: GL[2], *, BM: hk.const, BN: hk.const, OPS: hk.const):
    """Applies OPS (a const: the Program is specialised on it) to the x tile; stores the result."""
    m, n = hk.block_idx(0), hk.block_idx(1)
    tiles = {"x": hk.load(RT[f32, BM, BN], x, (m, n)), "w": hk.load(RT[f32, BM, BN], w, (m, n))}
    t = tiles["x"]
    for op in OPS:
        if op[0] == "unary":
            t = UNARY[op[1]](t)
        elif op[0] == "binary":
            t = BINARY[op[1]](t, tiles[op[2]])
        elif op[0] == "scalar":
            t = t + op[2] if op[1] == "add" else t * op[2]
        elif op[0] == "row":
            t = ROW[op[1]](t)
        else:
            t = t.to(bf16).to(f32)
    hk.store(y, t, (m, n))


KERNEL = hk.kernel(_random_program, name="random_program")
OFFLINE = ("hip:gfx942", "hip:gfx950", "cuda:sm_80", "cuda:sm_90a")


def _emulator_can_run() -> str | None:
    try:
        ok = registry.load("hip").target("gfx942", emulated=True).has("run")
    except Exception as e:  # noqa: BLE001 - a reason to skip
        return str(e)
    return None if ok else "the hip emulator cannot run here"


@PROFILE
@given(ops=st.lists(OP, min_size=1, max_size=6).map(tuple), bm=st.sampled_from([16, 32]),
       bn=st.sampled_from([16, 32, 64]), m=st.integers(1, 70), n=st.integers(1, 70), seed=st.integers(0, 2**31 - 1))
def test_random_programs_agree_across_backends(ops, bm, bn, m, n, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = (torch.empty(m, n).uniform_(-2, 2, generator=g) for _ in range(2))
    consts = dict(BM=bm, BN=bn, OPS=ops)
    grid = (-(-m // bm), -(-n // bn))
    meta = [torch.empty(m, n, device="meta") for _ in range(3)]
    for spec in OFFLINE:                          # compiles, or says clearly why not
        try:
            KERNEL.compile(*meta, backend=spec, **consts)
        except UnsupportedError:
            pass
        except BackendError as e:                 # a missing toolchain is not a property failure
            if "unavailable" not in str(e) and "not installed" not in str(e):
                raise
    ref = torch.full((m, n), float("nan"))
    KERNEL(x, w, ref, grid=grid, backend="reference", **consts)
    assert not torch.isnan(ref).any()
    why = _emulator_can_run()
    if why:
        pytest.skip(why)
    emu = torch.full((m, n), float("nan"))
    KERNEL(x, w, emu, grid=grid, backend="hip:gfx942:emulated", **consts)
    # transcendental approximations (a few ulp) may move a bf16 rounding by one ulp: 2^-7 relative to the
    # largest magnitude the Program produced, elementwise
    scale = ref.abs().max().clamp_min(1.0)
    torch.testing.assert_close(emu, ref, rtol=0, atol=float(scale) * 2.0 ** -7)
