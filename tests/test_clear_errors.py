"""Clear errors: each names what was wrong (the argument, the value) and what was expected."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import (GL, RT, Artifact, ArgumentError, Backend, BackendStatus, Target,
                                   TraceError, UnsupportedError, f32)
from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.gemm import gemm, gemm_kernel
from hk_portable.kernels.layernorm import dropout_residual_layernorm


def bf16(*shape, device="cpu"):
    return torch.randn(*shape, device=device).to(torch.bfloat16)


@hk.kernel
def scale_rows(x: GL[2], y: GL[2], s: float):
    m = hk.block_idx(0)
    hk.store(y, hk.load(RT[x.dtype, 16, 16], x, (m, 0)) * s, (m, 0))


# ---------------------------------------------------------------------------------------- arguments
def test_wrong_dtype_names_the_argument():
    with pytest.raises(ArgumentError, match=r"gemm: 'b' must be bfloat16 or float16, got torch.float32"):
        gemm(bf16(4, 4), torch.randn(4, 4))
    with pytest.raises(ArgumentError, match=r"argument 'x': torch dtype torch.int64 has no hk_portable equivalent"):
        scale_rows(torch.zeros(4, 4, dtype=torch.int64), torch.zeros(4, 4), 1.0, grid=(1,))
    with pytest.raises(ArgumentError, match=r"'x' must be bf16, f16 or f32, got torch.float64"):
        dropout_residual_layernorm(torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64),
                                   torch.ones(8), torch.zeros(8))


def test_wrong_runtime_scalar_names_the_argument():
    with pytest.raises(ArgumentError, match=r"argument 's' must be a Python float, got 'two'"):
        scale_rows(torch.zeros(4, 4), torch.zeros(4, 4), "two", grid=(1,))


def test_wrong_shape_names_the_arguments():
    with pytest.raises(ArgumentError, match=r"'a' is \(4, 5\) and 'b' is \(4, 4\): a.shape\[1\] must equal "
                                            r"b.shape\[0\]"):
        gemm(bf16(4, 5), bf16(4, 4))
    with pytest.raises(ArgumentError, match=r"head dim D must be a multiple of 8 from 32 to 256, got 36"):
        attention_fwd(bf16(1, 1, 8, 36), bf16(1, 1, 8, 36), bf16(1, 1, 8, 36))
    with pytest.raises(ArgumentError, match=r"'bias' must have shape \(8,\), got \(7,\)"):
        dropout_residual_layernorm(bf16(2, 8), bf16(2, 8), torch.ones(8), torch.zeros(7))


def test_wrong_rank_names_the_argument():
    with pytest.raises(ArgumentError, match=r"gemm_kernel: argument 'a' must have rank 2, got shape \(2, 4, 4\)"):
        gemm_kernel(bf16(2, 4, 4), bf16(4, 4), torch.zeros(4, 4), grid=(1, 1))
    with pytest.raises(ArgumentError, match=r"attention_fwd: 'k' must be a 4-D tensor \[B, H, N, D\], got \(8, 64\)"):
        attention_fwd(bf16(1, 1, 8, 64), bf16(8, 64), bf16(1, 1, 8, 64))
    with pytest.raises(ArgumentError, match=r"argument 'x' must have rank 1 to 4, got shape \(\)"):
        scale_rows(torch.tensor(1.0), torch.zeros(4, 4), 1.0, grid=(1,))


def test_tensors_on_a_device_the_backend_cannot_use_name_the_argument():
    # 'meta' tensors have no data: the reference refuses them rather than "run" and compute nothing (named
    # here: no backend claims 'meta', which test_selection covers)
    with pytest.raises(ArgumentError, match=r"argument 'x' is on meta, which the 'reference' backend cannot use"):
        scale_rows(torch.empty(4, 4, device="meta"), torch.empty(4, 4, device="meta"), 1.0, grid=(1,),
                   backend="reference")


def test_tensors_on_different_devices_name_both_arguments():
    # a backend that takes tensors on any device (the default) still needs them all on one
    with pytest.raises(ArgumentError, match=r"tensor arguments are on different devices \('x' on cpu, 'y' on meta\)"):
        scale_rows(torch.zeros(4, 4), torch.empty(4, 4, device="meta"), 1.0, grid=(1,), backend=SmallSharedBackend())


def test_overlapping_output_names_the_arguments():
    a = bf16(8, 8)
    with pytest.raises(ArgumentError, match=r"output 'out' overlaps argument 'a'"):
        gemm(a, bf16(8, 8), out=a)


def test_bad_grid_is_named():
    with pytest.raises(ArgumentError, match=r"grid\[1\] must be an int in \[0, 2\*\*31\), got -1"):
        scale_rows(torch.zeros(4, 4), torch.zeros(4, 4), 1.0, grid=(1, -1))


# ------------------------------------------------------------------------------- target limits
class SmallSharedBackend(Backend):
    """A target with 4 KiB of shared memory whose check() refuses bigger kernels, as a GPU backend would."""
    name = "small_shared"
    TARGET = Target(backend="small_shared", arch="tiny", max_shared_bytes=4096, capabilities=("run",))

    def status(self):
        return BackendStatus(True)

    def targets(self):
        return [self.TARGET]

    def check(self, program, target):
        need = sum(op.result.type.nbytes for op in program.body.walk() if op.opcode == "alloc_shared")
        if need > target.max_shared_bytes:
            raise UnsupportedError(f"kernel '{program.name}' needs {need} bytes of shared memory; target "
                                   f"{target.arch} has {target.max_shared_bytes}")

    def compile(self, program, target, options=None):
        return Artifact(self.name, target.arch, program.name, program.hash, payload=program)

    def launch(self, artifact, args, grid, stream=None):
        raise AssertionError("launch must not be reached for a kernel the target cannot take")

    def cacheable(self):
        return False


def test_tile_shapes_the_target_cannot_take_are_refused_before_launch():
    with pytest.raises(UnsupportedError, match=r"'gemm_kernel' needs 16384 bytes of shared memory; target tiny "
                                               r"has 4096"):
        gemm(bf16(64, 64), bf16(64, 64), backend=SmallSharedBackend())


def test_a_target_the_backend_does_not_have_is_named():
    with pytest.raises(UnsupportedError, match=r"backend 'reference' has no target 'sm_90a'; "
                                               r"its targets are \['cpu'\]"):
        gemm_kernel(bf16(4, 4), bf16(4, 4), torch.zeros(4, 4), grid=(1, 1), target="sm_90a")


# --------------------------------------------------------------------------------------- tracing
def test_python_if_on_a_traced_value_points_to_where():
    @hk.kernel
    def k(x: GL[2], y: GL[2]):
        t = hk.load(RT[f32, 16, 16], x, (0, 0))
        if hk.row_max(t):
            t = -t
        hk.store(y, t, (0, 0))

    with pytest.raises(TraceError, match=r"Python control flow \(if/while/and/or/not\) on a traced value \(rv<f32,16>\)"
                                         r".*hk.where"):
        k.trace(torch.zeros(16, 16), torch.zeros(16, 16))


def test_python_if_on_a_traced_scalar_is_caught_too():
    @hk.kernel
    def k(x: GL[2], y: GL[2]):
        if x.shape[0] > 16:
            pass

    with pytest.raises(TraceError, match="comparing traced scalars"):
        k.trace(torch.zeros(16, 16), torch.zeros(16, 16))


def test_if_on_a_const_specialises_instead():
    @hk.kernel
    def k(x: GL[2], y: GL[2], *, NEG: hk.const = False):
        t = hk.load(RT[f32, 16, 16], x, (0, 0))
        if NEG:
            t = -t
        hk.store(y, t, (0, 0))

    x = torch.rand(16, 16) + 1
    y = torch.zeros(16, 16)
    k(x, y, grid=(1,), NEG=True)
    assert torch.equal(y, -x)


def test_a_loop_body_that_rebinds_a_variable_instead_of_returning_the_carry():
    @hk.kernel
    def k(x: GL[2], y: GL[2]):
        acc = hk.zeros(RT[f32, 16, 16])

        def body(j, unused):
            nonlocal acc                                  # the mistake: a carry must be returned
            acc = acc + hk.load(RT[f32, 16, 16], x, (0, j))
            return unused

        hk.fori_loop(0, hk.cdiv(x.shape[1], 16), body, 0)
        hk.store(y, acc, (0, 0))

    with pytest.raises(TraceError, match=r"was made inside a loop or pipeline body \('body'\) and is used outside it"
                                         r".*must return its new values as the carry"):
        k.trace(torch.zeros(16, 64), torch.zeros(16, 16))


def test_a_loop_body_that_appends_to_an_outer_list_is_caught():
    @hk.kernel
    def k(x: GL[2], y: GL[1]):
        rows = []

        def body(j, c):
            rows.append(hk.row_sum(hk.load(RT[f32, 16, 16], x, (0, j))))
            return c

        hk.fori_loop(0, 2, body, 0)
        hk.store(y, rows[0], (0,))

    with pytest.raises(TraceError, match="used outside it by 'register_to_global'"):
        k.trace(torch.zeros(16, 32), torch.zeros(16))


def test_a_carry_that_changes_type_is_named():
    @hk.kernel
    def k(x: GL[2], y: GL[2]):
        acc = hk.fori_loop(0, 2, lambda j, a: a.to("bf16"), hk.zeros(RT[f32, 16, 16]))
        hk.store(y, acc, (0, 0))

    with pytest.raises(TraceError, match=r"carry element 0 changed type from rt<f32,16,16> to rt<bf16,16,16>"):
        k.trace(torch.zeros(16, 16), torch.zeros(16, 16))


def test_mismatched_tile_types_are_named():
    @hk.kernel
    def k(x: GL[2], y: GL[2]):
        hk.store(y, hk.load(RT[f32, 16, 16], x, (0, 0)) + hk.load(RT[f32, 16, 32], x, (0, 0)), (0, 0))

    with pytest.raises(TypeError, match=r"'add': operand types differ: rt<f32,16,16> vs rt<f32,16,32>"):
        k.trace(torch.zeros(16, 32), torch.zeros(16, 16))


def test_a_tile_index_that_is_not_int32_is_named():
    @hk.kernel
    def k(x: GL[2], y: GL[2], s: float):
        hk.store(y, hk.load(RT[f32, 16, 16], x, (0, s)), (0, 0))

    with pytest.raises(TypeError, match=r"^load: index entry 1 must be int32, got f32$"):
        k.trace(torch.zeros(16, 16), torch.zeros(16, 16), 1.0)


def test_using_ops_outside_a_kernel_is_explained():
    with pytest.raises(TraceError, match="only be used inside an @hk.kernel body"):
        hk.zeros(RT[f32, 16, 16])


def test_shared_to_register_load_needs_the_shared_dtype():
    import hk_portable as hk
    from hk_portable.interface import GL, RT, ST, bf16, f32

    @hk.kernel
    def k(x: GL[2], y: GL[2]):
        s = hk.shared(ST[bf16, 16, 16])
        hk.load(s, x, (0, 0))
        hk.store(y, hk.load(RT[f32, 16, 16], s), (0, 0))

    x, y = torch.randn(16, 16).to(torch.bfloat16), torch.empty(16, 16)
    with pytest.raises(TypeError, match=r"RT\[bf16, 16, 16\].*cast after loading"):
        k(x, y, grid=(1,))


def test_overlap_check_agrees_with_the_byte_spans_of_strided_views():
    """check_no_overlap (each tensor's span once, a contiguous tensor's from its numel) against the spans computed
    element by element, on views of one buffer: contiguous slices, transposes, strided and empty views."""
    from hk_portable.interface.kernel import check_no_overlap
    base = torch.zeros(64, 64)
    views = [base[:8], base[4:12], base[8:16], base[:, :8], base[:, 60:], base.t()[:4], base[::2, ::3], base[1::2],
             base[16:16], base[40:48].t(), base.view(-1)[100:300], base[63:, 63:]]

    def spans(t):
        if not t.numel():
            return None
        offs = sum(torch.arange(s).view([-1 if d == i else 1 for d in range(t.dim())]) * st
                   for i, (s, st) in enumerate(zip(t.shape, t.stride())))
        lo = t.data_ptr() + int(offs.min()) * t.element_size()
        return lo, t.data_ptr() + int(offs.max()) * t.element_size() + t.element_size()

    for i, a in enumerate(views):
        for j, b in enumerate(views):
            if i == j:
                continue
            sa, sb = spans(a), spans(b)
            expect = sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]
            try:
                check_no_overlap("f", {"out": a}, {"x": b})
                got = False
            except ArgumentError:
                got = True
            assert got == expect, (i, j, sa, sb)


def test_wrappers_with_call_plans_still_name_a_non_tensor_argument():
    """attention_fwd and the norms memoise per call signature; an argument that is not a tensor never reaches
    the memo's key (an AttributeError there would hide the argument's name)."""
    import torch

    from hk_portable.interface import ArgumentError
    from hk_portable.kernels.attention import attention_fwd
    from hk_portable.kernels.layernorm import dropout_residual_rmsnorm
    with pytest.raises(ArgumentError, match="'q' must be a 4-D tensor"):
        attention_fwd("q", 1, 2)
    with pytest.raises(ArgumentError, match="'x' must be a 2-D tensor"):
        dropout_residual_rmsnorm([1], None, 3)
    with pytest.raises(ArgumentError, match="'weight' must have shape"):
        dropout_residual_rmsnorm(torch.ones(2, 4), None, "w")
