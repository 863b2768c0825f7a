"""Pipeline load cursors on buffer resources (issue 10, item 2; hk_hip/global_shared.h, make_cursor): each step
builds a raw buffer resource from scalars and loads at per-lane offsets computed once; rows past the tensor's
end read 0 by the resource's range check. Ragged shapes must stay exact either way: rows past the end through
the range check with a zero fill (a walk along the columns), element by element with any other fill and on a
walk's ragged last step (the peeled step).
Each case runs on the emulator (both archs) against the reference backend."""
from __future__ import annotations

import re

import pytest
import torch

import hk_portable as hk
from hk_portable import kernels
from hk_portable.backends.hip import HipBackend, codegen, compiler, schedule
from hk_portable.backends.hip.archs import make_target
from hk_portable.backends.reference import ReferenceBackend
from hk_portable.interface import GL, RT, ST, f32
from hk_portable.runtime import cache


@hk.kernel(num_warps=4, name="walk_sum")
def walk_sum(x: GL[2], y: GL[2], *, R: hk.const = 32, C: hk.const = 64, ROWS: hk.const = True,
             FILL: hk.const = 0.0, STAGES: hk.const = 3):
    """The sum of the tiles a pipeline walks: down the rows of column block b (ROWS) or along the columns of
    row block b; every loaded element (fills included) reaches the output."""
    b = hk.block_idx(0)
    buf = hk.shared(ST[x.dtype, R, C], stages=STAGES)

    def load(i, s):
        hk.load(buf[s], x, (i, b) if ROWS else (b, i), fill=FILL)

    def compute(i, s, acc):
        return acc + hk.load(RT[x.dtype, R, C], buf[s]).to(f32)

    n = hk.cdiv(x.shape[0] if ROWS else x.shape[1], R if ROWS else C)
    acc = hk.pipeline(n, load, compute, carry=hk.zeros(RT[f32, R, C]), stages=STAGES)
    hk.store(y, acc, (0, b) if ROWS else (b, 0))


# (rows, cols): down the rows, 200 = 6 x 32 + 8 (the last step ragged: peeled) and 136 = 2 x 64 + 8 (the last
# column block partial: element by element); along the columns, 72 = 2 x 32 + 8 (the last row block's rows
# past the end: the range check) and 200 = 3 x 64 + 8 (the last step ragged: peeled)
SHAPES = {True: (200, 136), False: (72, 200)}


def _inputs(rows_walk: bool):
    M, N = SHAPES[rows_walk]
    out = (32, -(-N // 64) * 64) if rows_walk else (-(-M // 32) * 32, 64)
    return [torch.randn(M, N).to(torch.bfloat16), torch.full(out, float("nan"))]


def _grid(rows_walk: bool):
    M, N = SHAPES[rows_walk]
    return (-(-N // 64),) if rows_walk else (-(-M // 32),)


class Pinned(HipBackend):
    def __init__(self, arch):
        self._t = make_target(arch, runs=True, emulated=True)

    def default_target(self):
        return self._t


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("rows_walk", [True, False])
@pytest.mark.parametrize("fill", [0.0, -2.0])
def test_ragged_walks_are_exact(arch, rows_walk, fill):
    from hk_portable.backends.hip import emulator
    if not emulator.available()[0]:
        pytest.skip(emulator.available()[1])
    outs = []
    for be in (ReferenceBackend(), Pinned(arch)):
        torch.manual_seed(0)
        args = _inputs(rows_walk)
        walk_sum(*args, grid=_grid(rows_walk), backend=be, ROWS=rows_walk, FILL=fill)
        outs.append(args[1])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-6, atol=1e-6, equal_nan=True)


def test_a_short_wait_is_caught_with_range_checked_rows():
    """gfx950's LDS-DMA steps are waited for by count. A block whose rows run past the end loads by the same
    buffer loads as a whole one (the range check pads it; it does not drain the counters as the element path
    does), so a wait one step short is caught there too: only the last row block runs here."""
    from hk_portable.backends.hip import emulator
    if not emulator.available()[0]:
        pytest.skip(emulator.available()[1])
    be = Pinned("gfx950")
    x, y = _inputs(False)
    x, y = x[64:], y[64:]                              # 8 rows: one block of 32, 24 rows past the end
    art = be.compile(walk_sum.trace(x, y, ROWS=False), be.default_target())
    old, new = "wait_oldest<LD, AHEAD - 1>(", "wait_oldest<LD, AHEAD>("
    assert art.source.count(old) == 1 and "hk::split<" in art.source
    be.launch(art, [x, y], (1,))                       # as generated: no error
    ref = torch.zeros(32, 64)
    for j in range(0, 200, 64):
        t = x[:, j:j + 64].float()
        ref[:t.shape[0], :t.shape[1]] += t
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    art.source = art.source.replace(old, new)
    with pytest.raises(emulator.EmulatorError, match="missing s_waitcnt"):
        be.launch(art, [x, y], (1,))


def test_the_fill_reaches_the_cursor():
    """make_cursor sees the load's fill: with a zero fill the range check pads the ragged rows."""
    prog = walk_sum.trace(*_inputs(True), FILL=-2.0)
    plan = schedule.make_plan(prog, make_target("gfx942", runs=False))
    src = codegen.emit(prog, plan).source
    assert re.search(r"hk::make_cursor<hk::st<hk::bf16, 32, 64>, 0>\(v\d+, -2\.0f, ", src), src[-3000:]


needs_clang = pytest.mark.skipif(not compiler.available()[0], reason=compiler.available()[1])


@needs_clang
@pytest.mark.parametrize("arch,load", [("gfx942", r"buffer_load_dwordx4 v\[\d+:\d+\], v\d+, s\[\d+:\d+\], 0 offen$"),
                                       ("gfx950", r"buffer_load_dwordx4 v\d+, s\[\d+:\d+\], 0 offen lds$")])
@pytest.mark.parametrize("kernel,example", [("gemm", {}), ("attention_fwd", {"D": 128})])
def test_the_library_kernels_load_through_buffer_resources(kernel, example, arch, load):
    """gemm's and attention's main loops load by buffer loads at fixed per-lane offsets, the resource in scalar
    registers (gfx942: into registers; gfx950: LDS-DMA for row-major tiles), with no flat or global load left,
    and without a waterfall loop (what the compiler does with a resource it cannot prove uniform)."""
    module, k = kernels.load(kernel)
    args, consts = module.example_args(device="cpu", **example)
    be = HipBackend()
    art = cache.compile_cached(be, k.trace(*args, **consts), make_target(arch, runs=False, compile_only=True))
    loops = be.analyze(art)["loops"]
    main_loop = next(lp for lp in loops if lp["main"])
    lo, hi = main_loop["lines"]
    body = [ln.split(";")[0].strip() for ln in art.asm.splitlines()[lo - 1:hi]]
    assert any(re.match(load, ln) for ln in body)
    assert not any(re.match(r"(global|flat)_load_(dwordx4|lds)", ln) for ln in body)
    assert not any(lp["parent"] == main_loop["header"] for lp in loops)      # a waterfall is an inner loop
