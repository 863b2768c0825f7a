"""The layout pass (codegen/layouts.py): which register values take the fragment layout and which a strip,
and the strip's lane map as the cuda device library implements it (run on the emulated target)."""
from __future__ import annotations

import shutil

import pytest
import torch

import hk_portable as hk
from hk_portable.codegen.layouts import FRAGMENT, Strip, assign_layouts
from hk_portable.interface import GL, RT, RV, ST, bf16, f32


@hk.kernel(num_warps=4)
def norm_like(x: GL[2], w: GL[1], y: GL[2], *, BR: hk.const = 2, BC: hk.const = 1024):
    r = hk.block_idx(0)
    t = hk.load(RT[f32, BR, BC], x, (r, 0))
    t = t - hk.row_max(t)[:, None]
    hk.store(y, (t * hk.load(RV[f32, BC], w, (0,))[None, :]).to(y.dtype), (r, 0))


@hk.kernel(num_warps=4)
def mma_and_free(a: GL[2], c: GL[2], d: GL[2]):
    s = hk.shared(ST[bf16, 32, 32])
    hk.load(s, a, (0, 0))
    acc = hk.mma_AB(s, s, hk.zeros(RT[f32, 32, 32]))
    hk.store(c, hk.exp(acc), (0, 0))                                   # joined to the mma: fragment
    hk.store(d, hk.load(RT[f32, 4, 1024], a, (0, 0)) * 2.0, (0, 0))    # free and wide: a strip


@hk.kernel(num_warps=4)
def loop_carry(x: GL[2], y: GL[1]):
    def body(i, acc):
        return acc + hk.row_sum(hk.load(RT[f32, 1, 2048], x, (0, i)))
    hk.store(y, hk.fori_loop(0, 3, body, hk.zeros(RV[f32, 1])), (0,))


def _layouts(kern, *args, **consts):
    prog = kern.trace(*args, **consts)
    return prog, assign_layouts(prog, prog.num_warps, strips=True)


def _by_shape(lay):
    return {(v.type.space, v.type.shape): l for v, l in lay.items()}


def test_a_free_wide_component_takes_the_strip_with_the_most_warp_rows():
    x = torch.empty(8, 1000)
    _, lay = _layouts(norm_like, x, torch.empty(1000), x)
    assert set(lay.values()) == {Strip(2, 2)}                   # 2 rows: 2 warp-rows of 2 warps each
    _, lay = _layouts(norm_like, x, torch.empty(1000), x, BR=1, BC=2048)
    assert set(lay.values()) == {Strip(1, 4)}
    _, lay = _layouts(norm_like, x, torch.empty(1000), x, BR=16, BC=1024)
    assert set(lay.values()) == {Strip(4, 1)}


def test_tiles_that_do_not_divide_into_chunks_keep_the_fragment_layout():
    x = torch.empty(8, 1000)
    _, lay = _layouts(norm_like, x, torch.empty(1000), x, BR=16, BC=128)   # 128 columns < 32 lanes x 8
    assert set(lay.values()) == {FRAGMENT}
    prog = norm_like.trace(x, torch.empty(1000), x)
    assert set(assign_layouts(prog, 4, strips=False).values()) == {FRAGMENT}   # a backend without strips


def test_an_mma_pins_its_component_and_leaves_the_others_free():
    a = torch.empty(64, 1024, dtype=torch.bfloat16)
    _, lay = _layouts(mma_and_free, a, torch.empty(32, 32), torch.empty(4, 1024))
    by = _by_shape(lay)
    assert by["rt", (32, 32)] is FRAGMENT
    assert by["rt", (4, 1024)] == Strip(4, 1)


def test_loop_carries_share_the_layout_of_their_body():
    _, lay = _layouts(loop_carry, torch.empty(1, 6144), torch.empty(1))
    assert set(lay.values()) == {Strip(1, 4)}


@hk.kernel(num_warps=4)
def _sums(x: GL[2], y: GL[2], rs: GL[1], cs: GL[1], *, TR: hk.const, TC: hk.const):
    t = hk.load(RT[f32, TR, TC], x, (0, 0))
    hk.store(y, t + 0.0, (0, 0))
    hk.store(rs, hk.row_sum(t), (0,))
    hk.store(cs, hk.col_sum(t), (0,))


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                    reason="no host C++ compiler for the cuda emulation")
@pytest.mark.parametrize("tile", [(2, 1024), (1, 2048), (16, 512)])
def test_the_strip_lane_map_holds_each_element_once_at_its_place(tile):
    """Distinct integers through a strip tile on the emulated cuda target: the copy is the identity (each
    element held once, loaded and stored at one place) and the row and column sums are exact (each lane
    knows which row and column its elements are in; the exchanges between warps add each part once)."""
    from hk_portable.backends.cuda import CudaBackend
    be = CudaBackend()
    R, C = tile
    x = torch.arange(R * C, dtype=torch.float32).view(R, C) % 977
    y, rs, cs = torch.full((R, C), float("nan")), torch.full((R,), float("nan")), torch.full((C,), float("nan"))
    prog = _sums.trace(x, y, rs, cs, TR=R, TC=C)
    assert all(isinstance(l, Strip) for l in assign_layouts(prog, 4, strips=True).values())
    _sums(x, y, rs, cs, grid=(1,), backend=be, target=be.target("sm_80", emulated=True), TR=R, TC=C)
    assert torch.equal(y, x)
    assert torch.equal(rs, x.sum(1)) and torch.equal(cs, x.sum(0))


@hk.kernel(num_warps=4)
def _scale_rows(x: GL[2], v: GL[1], y: GL[2], *, TR: hk.const, TC: hk.const):
    t = hk.load(RT[f32, TR, TC], x, (0, 0)) * hk.load(RV[f32, TC], v, (0,))[None, :]
    hk.store(y, t + 1.0, (0, 0))


def test_narrow_strips_deal_short_rows_to_lane_groups_where_the_backend_has_them():
    """Rows too short for a warp's chunks take a narrow strip (lanes per row < 32) only with `narrow` and
    only in a component without column reductions (row reductions shuffle inside a row's lane group);
    otherwise the fragment."""
    x = torch.empty(32, 64)
    prog = _scale_rows.trace(x, torch.empty(64), x, TR=32, TC=64)
    assert set(assign_layouts(prog, 4, strips=True, narrow=True).values()) == {Strip(4, 1, 8)}
    assert set(assign_layouts(prog, 4, strips=True).values()) == {FRAGMENT}
    prog = _scale_rows.trace(x, torch.empty(64), x, TR=16, TC=128)          # 16 lanes a row, 2 rows a warp
    assert set(assign_layouts(prog, 4, strips=True, narrow=True).values()) == {Strip(4, 1, 16)}
    prog = _scale_rows.trace(x, torch.empty(64), x, TR=8, TC=64)            # 8 rows < 16 thread-rows
    assert set(assign_layouts(prog, 4, strips=True, narrow=True).values()) == {FRAGMENT}
    prog = _sums.trace(x, x, torch.empty(32), torch.empty(64), TR=32, TC=64)
    assert set(assign_layouts(prog, 4, strips=True, narrow=True).values()) == {FRAGMENT}
    prog = _row_stats.trace(x, torch.empty(32), torch.empty(32), TR=32, TC=64)     # row reductions only
    assert set(assign_layouts(prog, 4, strips=True, narrow=True).values()) == {Strip(4, 1, 8)}
    assert set(assign_layouts(prog, 4, strips=True).values()) == {FRAGMENT}


@hk.kernel(num_warps=4)
def _row_stats(x: GL[2], s: GL[1], m: GL[1], *, TR: hk.const, TC: hk.const):
    t = hk.load(RT[f32, TR, TC], x, (hk.block_idx(0), 0))
    hk.store(s, hk.row_sum(t * t), (hk.block_idx(0),))
    hk.store(m, hk.row_max(hk.load(RT[f32, TR, TC], x, (hk.block_idx(0), 0), fill=float("-inf"))), (hk.block_idx(0),))


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                    reason="no host C++ compiler for the cuda emulation")
@pytest.mark.parametrize("tile", [(32, 64), (16, 128), (64, 16), (128, 8)])
def test_narrow_strip_row_reductions_stay_inside_each_rows_lane_group(tile):
    """Row sums and maxima of narrow strip tiles (8, 16, 2 and 1 lanes a row) on the emulated cuda target,
    against float64, with ragged rows and columns (read as 0 for the sum, -inf for the max; rows of negatives
    among positive ones): a shuffle leaving the lane group would mix rows."""
    from hk_portable.backends.cuda import CudaBackend
    be = CudaBackend()
    R, C = tile
    rows, cols = 2 * R - 3, max(C - 5, 1)
    x = -torch.rand(rows, cols, dtype=torch.float32) - 0.5
    x[::3] *= -1.0
    s, m = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))
    lay = assign_layouts(_row_stats.trace(x, s, m, TR=R, TC=C), 4, strips=True, narrow=True)
    assert all(isinstance(l, Strip) and l.lr for l in lay.values()), lay
    _row_stats(x, s, m, grid=(2,), backend=be, target=be.target("sm_80", emulated=True), TR=R, TC=C)
    xd = x.double()
    torch.testing.assert_close(s.double(), (xd * xd).sum(1), rtol=1e-6, atol=1e-6)
    assert torch.equal(m.double(), xd.max(1).values)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                    reason="no host C++ compiler for the cuda emulation")
@pytest.mark.parametrize("tile", [(32, 64), (16, 128), (64, 16)])
@pytest.mark.parametrize("where", ["inside", "ragged", "strided"])
def test_the_narrow_strip_lane_map_holds_each_element_once_at_its_place(tile, where):
    """Distinct values through a narrow strip tile and column vector on the emulated cuda target: whole
    chunks, rows past the tensor (fill, dropped stores), columns past it, and a column stride of 2 (element
    accesses instead of 16-byte ones) all land each element once, at its place."""
    from hk_portable.backends.cuda import CudaBackend
    be = CudaBackend()
    R, C = tile
    rows, cols = (R, C) if where != "ragged" else (R - 3, C - 5)
    base = torch.arange(rows * C * 2, dtype=torch.float32).view(rows, 2 * C) % 977
    x = base[:, 0::2][:, :cols] if where == "strided" else base[:, :cols].contiguous()
    v = torch.arange(cols, dtype=torch.float32) % 13
    y = torch.full((rows, cols), float("nan"))
    prog = _scale_rows.trace(x, v, y, TR=R, TC=C)
    lay = assign_layouts(prog, 4, strips=True, narrow=True)
    assert all(isinstance(l, Strip) and l.lr for l in lay.values())
    _scale_rows(x, v, y, grid=(1,), backend=be, target=be.target("sm_80", emulated=True), TR=R, TC=C)
    assert torch.equal(y, x * v[None, :] + 1.0)


@pytest.mark.parametrize("module", ["layernorm", "layernorm_bwd"])
def test_norm_kernels_choose_the_one_pass_strip_on_cuda_and_the_swept_baseline_elsewhere(module):
    """The kernel files offer both shapes; each backend's choice follows its layouts: cuda and hip (every
    target) take the one-pass shape, whose register values are all strips; the reference, which has no
    layouts, keeps the swept baseline."""
    from hk_portable.kernels import load
    mod, kern = load("dropout_residual_layernorm" if module == "layernorm" else "layernorm_bwd")
    args, consts = mod.example_args()
    cands = mod.candidates(consts, args)
    for spec, one_pass in (("cuda:sm_80", True), ("cuda:sm_90a", True), ("hip:gfx942", True),
                           ("hip:gfx950", True), ("reference", False)):
        cfg = kern.choose_config(cands, *args, backend=spec)
        assert bool(cfg.get("ONE_PASS")) == one_pass, (spec, cfg)


def test_a_keyed_config_choice_follows_the_selected_backend(hip_emulator):
    """Wrappers memoise choose_config by `key` on the call fast path's key: a change of backend context must
    give that backend's choice, not the memo of another."""
    from hk_portable.kernels import load
    mod, kern = load("dropout_residual_layernorm")
    args, consts = mod.example_args()
    choose = lambda: kern.choose_config(lambda: mod.candidates(consts, args), *args, key=("test", 1))  # noqa: E731
    for spec, one_pass in (("cuda:sm_80:emulated", True), ("reference", False), ("hip:gfx950:emulated", True),
                           ("reference", False)):
        with hk.use_backend(spec):
            assert bool(choose().get("ONE_PASS")) == one_pass, spec


def test_shared_storage_transposes_operands_whose_k_runs_down_the_rows():
    """gemm's B ([K, N]) and attention's V are column-major; A, Q and K (k already contiguous) are not; a
    buffer with any use besides global loads and such mma reads keeps row-major storage."""
    from hk_portable.codegen.layouts import COL_MAJOR, assign_shared_storage
    from hk_portable.interface import GL, RT, ST, f32
    from hk_portable.kernels import attention
    from hk_portable.kernels.gemm import gemm_kernel

    def buffers(program):
        store = assign_shared_storage(program)
        return [store.get(op.result) is COL_MAJOR for op in program.shared_buffers()]

    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    assert buffers(gemm_kernel.trace(x, x, x.float())) == [False, True]                 # a_s, b_s
    args, cfg = attention.example_args()
    assert buffers(attention.attention_fwd_kernel.trace(*args, **cfg)) == [False, False, True]   # q_s, k_s, v_s

    @hk.kernel
    def also_read(a: GL[2], b: GL[2], c: GL[2]):
        a_s = hk.shared(ST[a.dtype, 64, 64])
        b_s = hk.shared(ST[b.dtype, 64, 64])
        hk.load(a_s, a, (0, 0))
        hk.load(b_s, b, (0, 0))
        acc = hk.mma(a_s, b_s, hk.zeros(RT[f32, 64, 64]))
        hk.store(c, acc + hk.load(RT[b.dtype, 64, 64], b_s).to(f32), (0, 0))

    assert buffers(also_read.trace(x, x, x.float())) == [False, False]


def test_mma_accumulators_take_a_wave_grid_where_the_library_has_one():
    """With grids (hip), a gemm accumulator whose operands are shared tiles is dealt over a wave grid that
    reads the fewest operand rows and columns per warp; without (cuda), it keeps the fragment layout. An
    accumulator that meets a reduction (attention's scores) or a register operand (its PV) stays fragment."""
    from hk_portable.codegen.layouts import WaveGrid, all_grids
    from hk_portable.kernels import attention
    from hk_portable.kernels.gemm import gemm_kernel
    x = torch.zeros(256, 256, dtype=torch.bfloat16)
    for cfg, warps, want in ((dict(BM=64, BN=64), 4, WaveGrid(2, 2)), (dict(BM=128, BN=128), 8, WaveGrid(2, 4)),
                             (dict(BM=128, BN=64), 8, WaveGrid(4, 2)), (dict(BM=16, BN=64), 4, WaveGrid(1, 4)),
                             (dict(BM=32, BN=16), 4, None)):
        p = gemm_kernel.trace(x, x, x.float(), num_warps=warps, **cfg)
        acc = next(op.operands[2] for op in p.body.walk() if op.opcode == "mma")
        lay = assign_layouts(p, warps, strips=True, lanes=64, grids=True)
        assert lay[acc] == (want or FRAGMENT), (cfg, lay[acc])
        assert all_grids(p, lay) == (want is not None)
        assert assign_layouts(p, warps, strips=True)[acc] == FRAGMENT
    args, cfg = attention.example_args()
    p = attention.attention_fwd_kernel.trace(*args, **cfg)
    lay = assign_layouts(p, p.num_warps, strips=True, lanes=64, grids=True)
    assert not any(isinstance(x, WaveGrid) for x in lay.values())
