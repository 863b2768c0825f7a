"""Bad input, everywhere (issue 14, item 6): every public entry point given a wrong dtype, rank, shape or
device, overlapping outputs, non-finite scalars, zero-size dimensions or a negative/huge grid answers with
an error that names the argument. tests/test_clear_errors.py checks the messages' wording for a few of
these; this is the table of every case tried.

Each row: (entry point, case, call, error type, text the message must contain: the argument's name)."""
from __future__ import annotations

import math

import pytest
import torch

import hk_portable as hk
import hk_portable.torch_ops  # noqa: F401  (registers torch.ops.hk)
from hk_portable.interface import GL, RT, ArgumentError, f32
from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.attention_bwd import attention_bwd
from hk_portable.kernels.attention_kvcache import attention_kvcache
from hk_portable.kernels.attention_varlen import attention_varlen, attention_varlen_bwd
from hk_portable.kernels.gemm import gemm
from hk_portable.kernels.gemm_fp8 import gemm_fp8
from hk_portable.kernels.layernorm import dropout_residual_layernorm, dropout_residual_rmsnorm
from hk_portable.kernels.layernorm_bwd import dropout_residual_layernorm_bwd, dropout_residual_rmsnorm_bwd
from hk_portable.kernels.rotary import rotary, tables

REF = dict(backend="reference")


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


@hk.kernel
def copy2(x: GL[2], y: GL[2], s: float, n: int):
    m = hk.block_idx(0)
    hk.store(y, hk.load(RT[f32, 16, 16], x, (m, 0)) * s, (m, 0))


@hk.kernel
def fori_arity(x: GL[2], y: GL[2]):
    t = hk.load(RT[f32, 16, 16], x, (0, 0))
    hk.store(y, hk.fori_loop(0, 4, lambda i: t, t), (0, 0))     # the body takes (i, carry)


def _copy(grid=(1,), s=1.0, n=0, x=None, y=None):
    x = torch.zeros(16, 16) if x is None else x
    return lambda: copy2(x, torch.zeros(16, 16) if y is None else y, s, n, grid=grid, **REF)


def _attn(**kw):
    q = kw.pop("q", bf16(1, 2, 16, 64))
    k = kw.pop("k", bf16(1, 2, 16, 64))
    v = kw.pop("v", bf16(1, 2, 16, 64))
    return lambda: attention_fwd(q, k, v, **REF, **kw)


def _attn_bwd(**kw):
    q, k, v = bf16(1, 2, 16, 64), bf16(1, 2, 16, 64), bf16(1, 2, 16, 64)
    o, lse = torch.zeros_like(q), torch.zeros(1, 2, 16)
    args = dict(q=q, k=k, v=v, o=o, lse=lse, do=torch.zeros_like(q))
    over = {n: kw.pop(n) for n in list(kw) if n in args}
    args.update(over)
    return lambda: attention_bwd(args["q"], args["k"], args["v"], args["o"], args["lse"], args["do"], **REF, **kw)


CU = torch.tensor([0, 5, 16], dtype=torch.int32)


def _varlen(**kw):
    args = dict(q=bf16(16, 2, 64), k=bf16(16, 1, 64), v=bf16(16, 1, 64), cu_q=CU, cu_k=CU, max_q=11, max_k=11)
    args.update({n: kw.pop(n) for n in list(kw) if n in args})
    return lambda: attention_varlen(*args.values(), **REF, **kw)


def _varlen_bwd(**kw):
    q, k = bf16(16, 2, 64), bf16(16, 1, 64)
    args = dict(q=q, k=k, v=bf16(16, 1, 64), o=torch.zeros_like(q), lse=torch.zeros(2, 16), do=torch.zeros_like(q),
                cu_q=CU, cu_k=CU, max_q=11, max_k=11)
    args.update({n: kw.pop(n) for n in list(kw) if n in args})
    return lambda: attention_varlen_bwd(*args.values(), **REF, **kw)


def _kvcache(**kw):
    args = dict(q=bf16(2, 1, 4, 64), k_cache=bf16(5, 16, 2, 64), v_cache=bf16(5, 16, 2, 64),
                cache_seqlens=torch.tensor([3, 20], dtype=torch.int32),
                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    args.update({n: kw.pop(n) for n in list(kw) if n in args})
    return lambda: attention_kvcache(*args.values(), **REF, **kw)


def _ln_bwd(fn=dropout_residual_layernorm_bwd, **kw):
    args = dict(dy=bf16(4, 64), h=bf16(4, 64), weight=torch.ones(64), bias=torch.zeros(64), backend="reference")
    args.update(kw)
    dy, h, weight, bias = (args.pop(k) for k in ("dy", "h", "weight", "bias"))
    return lambda: fn(dy, h, weight, bias, **args)


def _ln(fn=dropout_residual_layernorm, **kw):
    x = kw.pop("x", bf16(4, 64))
    r = kw.pop("residual", bf16(4, 64))
    w = kw.pop("weight", torch.ones(64))
    b = kw.pop("bias", torch.zeros(64))
    return lambda: fn(x, r, w, b, **REF, **kw)


def _rot(**kw):
    x = kw.pop("x", bf16(1, 8, 2, 64))
    cos, sin = tables(8, 64)
    cos, sin = kw.pop("cos", cos), kw.pop("sin", sin)
    return lambda: rotary(x, cos, sin, **REF, **kw)


ONE = torch.ones(1)


def E4(*shape):
    return torch.zeros(*shape).to(torch.float8_e4m3fn)


def _fp8_overlap():
    buf = torch.zeros(64, dtype=torch.float32)
    a = buf[:16].view(torch.uint8).view(torch.float8_e4m3fn).view(8, 8)
    return gemm_fp8(a, E4(8, 2), ONE, ONE, out=buf[:16].view(8, 2), **REF)


def _op(name, *args, **kw):
    return lambda: getattr(torch.ops.hk, name)(*args, **kw)


x44 = bf16(4, 4)
nan, inf = math.nan, math.inf

CASES = [
    # ---- a user's hk.kernel (the launch path every entry point shares)
    ("kernel", "dtype", _copy(x=torch.zeros(16, 16, dtype=torch.int64)), ArgumentError, "'x'"),
    ("kernel", "rank", _copy(x=torch.zeros(16)), ArgumentError, "'x'"),
    ("kernel", "bool_input", _copy(x=torch.zeros(16, 16, dtype=torch.bool)), ArgumentError, "'x'"),     # issue 41
    ("kernel", "bool_output", _copy(y=torch.zeros(16, 16, dtype=torch.bool)), ArgumentError, "torch.float32"),
    ("kernel", "expanded_output", _copy(y=torch.zeros(1, 16).expand(16, 16)), ArgumentError, "'y'"),
    ("kernel", "overlapping_output", _copy(y=torch.zeros(40).as_strided((16, 16), (1, 1))), ArgumentError, "'y'"),
    ("kernel", "fori_loop_arity", lambda: fori_arity(torch.zeros(16, 16), torch.zeros(16, 16), grid=(1,), **REF),
     hk.TraceError, "body(i, *carry)"),
    ("kernel", "not_a_tensor", _copy(x=[[0.0]]), ArgumentError, "'x'"),
    ("kernel", "scalar_type", _copy(s="one"), ArgumentError, "'s'"),
    ("kernel", "int_too_big", _copy(n=2**31), ArgumentError, "'n'"),
    ("kernel", "int_is_bool", _copy(n=True), ArgumentError, "'n'"),
    ("kernel", "device", _copy(y=torch.empty(16, 16, device="meta")), ArgumentError, "'y'"),
    ("kernel", "grid_negative", _copy(grid=(-1,)), ArgumentError, "grid"),
    ("kernel", "grid_huge", _copy(grid=(2**31,)), ArgumentError, "grid"),
    ("kernel", "grid_float", _copy(grid=(1.5,)), ArgumentError, "grid"),
    ("kernel", "grid_rank", _copy(grid=(1, 1, 1, 1)), ArgumentError, "grid"),
    ("kernel", "grid_empty", _copy(grid=()), ArgumentError, "grid"),
    ("kernel", "grid_bool", _copy(grid=(True,)), ArgumentError, "grid"),
    # ---- gemm
    ("gemm", "dtype", lambda: gemm(torch.randn(4, 4), x44, **REF), ArgumentError, "'a'"),
    ("gemm", "dtype_mix", lambda: gemm(x44, x44.half(), **REF), ArgumentError, "'b'"),
    ("gemm", "rank", lambda: gemm(bf16(4), x44, **REF), ArgumentError, "'a'"),
    ("gemm", "shape", lambda: gemm(bf16(4, 5), x44, **REF), ArgumentError, "'b'"),
    ("gemm", "out_shape", lambda: gemm(x44, x44, out=torch.empty(4, 5), **REF), ArgumentError, "'out'"),
    ("gemm", "overlap", lambda: gemm(x44, bf16(4, 4), out=x44, **REF), ArgumentError, "'out'"),
    ("gemm", "device", lambda: gemm(x44, bf16(4, 4).to("meta"), **REF), ArgumentError, "'b'"),
    # ---- gemm_fp8
    ("gemm_fp8", "dtype", lambda: gemm_fp8(x44, E4(4, 4), ONE, ONE, **REF), ArgumentError, "'a'"),
    ("gemm_fp8", "fnuz", lambda: gemm_fp8(E4(4, 4).view(torch.float8_e4m3fnuz), E4(4, 4), ONE, ONE, **REF),
     ArgumentError, "'a'"),
    ("gemm_fp8", "rank", lambda: gemm_fp8(E4(4), E4(4, 4), ONE, ONE, **REF), ArgumentError, "'a'"),
    ("gemm_fp8", "shape", lambda: gemm_fp8(E4(4, 5), E4(4, 4), ONE, ONE, **REF), ArgumentError, "'b'"),
    ("gemm_fp8", "scale_dtype", lambda: gemm_fp8(E4(4, 4), E4(4, 4), ONE.double(), ONE, **REF), ArgumentError,
     "'scale_a'"),
    ("gemm_fp8", "scale_shape", lambda: gemm_fp8(E4(4, 4), E4(4, 4), ONE, torch.ones(3), **REF), ArgumentError,
     "'scale_b'"),
    ("gemm_fp8", "out_dtype", lambda: gemm_fp8(E4(4, 4), E4(4, 4), ONE, ONE, out=torch.empty(4, 4, dtype=torch.int32),
                                               **REF), ArgumentError, "'out'"),
    ("gemm_fp8", "overlap", lambda: _fp8_overlap(), ArgumentError, "'out'"),
    ("gemm_fp8", "device", lambda: gemm_fp8(E4(4, 4), E4(4, 4).to("meta"), ONE, ONE, **REF), ArgumentError, "'b'"),
    ("torch.ops.hk.gemm_fp8", "dtype", _op("gemm_fp8", x44, E4(4, 4), ONE, ONE, backend="reference"),
     ArgumentError, "'a'"),
    # ---- attention forward
    ("attention_fwd", "dtype", _attn(q=torch.randn(1, 2, 16, 64)), ArgumentError, "'q'"),
    ("attention_fwd", "dtype_mix", _attn(v=bf16(1, 2, 16, 64).half()), ArgumentError, "v"),
    ("attention_fwd", "rank", _attn(k=bf16(16, 64)), ArgumentError, "'k'"),
    ("attention_fwd", "head_dim", _attn(q=bf16(1, 2, 16, 32)), ArgumentError, "D"),
    ("attention_fwd", "heads", _attn(k=bf16(1, 3, 16, 64), v=bf16(1, 3, 16, 64)), ArgumentError, "heads"),
    ("attention_fwd", "zero_len", _attn(q=bf16(1, 2, 0, 64)), ArgumentError, "N"),
    ("attention_fwd", "scale_nan", _attn(scale=nan), ArgumentError, "scale"),
    ("attention_fwd", "scale_inf", _attn(scale=inf), ArgumentError, "scale"),
    ("attention_fwd", "window", _attn(causal=True, window=(-2, 0)), ArgumentError, "window"),
    ("attention_fwd", "align", _attn(causal=True, align="middle"), ArgumentError, "align"),
    ("attention_fwd", "out_shape", _attn(out=torch.empty(1)), ArgumentError, "'out'"),
    ("attention_fwd", "lse_dtype", _attn(lse=torch.empty(1, 2, 16, dtype=torch.bfloat16)), ArgumentError, "'lse'"),
    ("attention_fwd", "device", _attn(v=bf16(1, 2, 16, 64).to("meta")), ArgumentError, "'v'"),
    # ---- attention backward
    ("attention_bwd", "dtype", _attn_bwd(do=torch.zeros(1, 2, 16, 64)), ArgumentError, "'do'"),
    ("attention_bwd", "lse_shape", _attn_bwd(lse=torch.zeros(1, 2, 15)), ArgumentError, "'lse'"),
    ("attention_bwd", "o_shape", _attn_bwd(o=bf16(1, 2, 16, 128)), ArgumentError, "'o'"),
    ("attention_bwd", "scale_nan", _attn_bwd(scale=nan), ArgumentError, "scale"),
    # ---- layernorm / rmsnorm
    ("layernorm", "dtype", _ln(x=torch.zeros(4, 64, dtype=torch.float64)), ArgumentError, "'x'"),
    ("layernorm", "rank", _ln(x=bf16(64)), ArgumentError, "'x'"),
    ("layernorm", "residual_shape", _ln(residual=bf16(4, 63)), ArgumentError, "'residual'"),
    ("layernorm", "weight_shape", _ln(weight=torch.ones(63)), ArgumentError, "'weight'"),
    ("layernorm", "weight_dtype", _ln(weight=torch.ones(64, dtype=torch.int32)), ArgumentError, "'weight'"),
    ("layernorm", "p_nan", _ln(p=nan), ArgumentError, "'p'"),
    ("layernorm", "p_one", _ln(p=1.0), ArgumentError, "'p'"),
    ("layernorm", "eps_nan", _ln(eps=nan), ArgumentError, "'eps'"),
    ("layernorm", "eps_inf", _ln(eps=inf), ArgumentError, "'eps'"),
    ("layernorm", "eps_zero", _ln(eps=0.0), ArgumentError, "'eps'"),
    ("layernorm", "seed", _ln(seed=-1), ArgumentError, "'seed'"),
    ("layernorm", "offset", _ln(offset=2**64), ArgumentError, "'offset'"),
    ("layernorm", "zero_width", _ln(x=bf16(4, 0), residual=bf16(4, 0), weight=torch.ones(0), bias=torch.zeros(0)),
     ArgumentError, "'x'"),
    ("layernorm", "overlap", (lambda x: _ln(x=x, out=x))(bf16(4, 64)), ArgumentError, "'out'"),
    ("layernorm", "device", _ln(weight=torch.ones(64, device="meta")), ArgumentError, "'weight'"),
    ("rmsnorm", "eps_nan", _ln(dropout_residual_rmsnorm, eps=nan), ArgumentError, "'eps'"),
    ("rmsnorm", "bias_shape", _ln(dropout_residual_rmsnorm, bias=torch.zeros(3)), ArgumentError, "'bias'"),
    # ---- rotary
    ("rotary", "dtype", _rot(x=torch.zeros(1, 8, 2, 64, dtype=torch.float64)), ArgumentError, "'x'"),
    ("rotary", "rank", _rot(x=bf16(8, 64)), ArgumentError, "'x'"),
    ("rotary", "head_dim", _rot(x=bf16(1, 8, 2, 48)), ArgumentError, "D"),
    ("rotary", "table_dtype", _rot(cos=torch.zeros(8, 32, dtype=torch.bfloat16)), ArgumentError, "'cos'"),
    ("rotary", "table_short", _rot(offset=1), ArgumentError, "'cos'"),
    ("rotary", "offset", _rot(offset=-1), ArgumentError, "'offset'"),
    ("rotary", "layout", _rot(layout="zigzag"), ArgumentError, "layout"),
    ("rotary", "device", _rot(sin=torch.zeros(8, 32, device="meta")), ArgumentError, "'sin'"),
    ("rotary", "out_overlap", (lambda x: _rot(x=x, out=x))(bf16(1, 8, 2, 64)), ArgumentError, "'out'"),
    # ---- serving attention: variable-length batches and KV caches
    ("attention_varlen", "dtype", _varlen(q=torch.zeros(16, 2, 64)), ArgumentError, "'q'"),
    ("attention_varlen", "rank", _varlen(k=bf16(1, 16, 1, 64)), ArgumentError, "'k'"),
    ("attention_varlen", "cu_dtype", _varlen(cu_q=CU.long()), ArgumentError, "'cu_seqlens_q'"),
    ("attention_varlen", "cu_decreasing", _varlen(cu_k=torch.tensor([0, 9, 5], dtype=torch.int32)), ArgumentError,
     "'cu_seqlens_k'"),
    ("attention_varlen", "max_seqlen", _varlen(max_k=-3), ArgumentError, "'max_seqlen_k'"),
    ("attention_varlen", "scale_nan", _varlen(scale=nan), ArgumentError, "'scale'"),
    ("attention_varlen", "window", _varlen(window=(3,)), ArgumentError, "window"),
    ("attention_varlen", "align", _varlen(causal=True, align="middle"), ArgumentError, "align"),
    ("attention_varlen", "out_overlap", (lambda q: _varlen(q=q, out=q))(bf16(16, 2, 64)), ArgumentError, "'out'"),
    ("attention_varlen_bwd", "lse_shape", _varlen_bwd(lse=torch.zeros(2, 15)), ArgumentError, "'lse'"),
    ("attention_varlen_bwd", "do_dtype", _varlen_bwd(do=torch.zeros(16, 2, 64)), ArgumentError, "'do'"),
    ("attention_varlen_bwd", "dq_overlap", (lambda q: _varlen_bwd(q=q, dq=q))(bf16(16, 2, 64)), ArgumentError,
     "'dq'"),
    ("attention_kvcache", "q_rank", _kvcache(q=bf16(1, 4, 64)), ArgumentError, "'q'"),
    ("attention_kvcache", "cache_dtype", _kvcache(v_cache=torch.zeros(5, 16, 2, 64)), ArgumentError, "'v_cache'"),
    ("attention_kvcache", "seqlens_dtype", _kvcache(cache_seqlens=torch.tensor([3, 20])), ArgumentError,
     "'cache_seqlens'"),
    ("attention_kvcache", "seqlens_capacity", _kvcache(cache_seqlens=torch.tensor([3, 33], dtype=torch.int32)),
     ArgumentError, "cache_seqlens"),
    ("attention_kvcache", "table_shape", _kvcache(block_table=torch.zeros(3, 2, dtype=torch.int32)), ArgumentError,
     "'block_table'"),
    ("attention_kvcache", "page_size", _kvcache(k_cache=bf16(5, 8, 2, 64), v_cache=bf16(5, 8, 2, 64)),
     ArgumentError, "page_size"),
    ("attention_kvcache", "num_splits", _kvcache(num_splits=0), ArgumentError, "'num_splits'"),
    ("attention_kvcache", "scale_inf", _kvcache(scale=inf), ArgumentError, "'scale'"),
    ("attention_kvcache", "out_overlap", (lambda q: _kvcache(q=q, out=q))(bf16(2, 1, 4, 64)), ArgumentError, "'out'"),
    # ---- torch.ops.hk (the same checks reach torch users)
    ("torch.ops.hk.attention_varlen", "cu_dtype",
     _op("attention_varlen", bf16(16, 2, 64), bf16(16, 1, 64), bf16(16, 1, 64), CU.long(), CU, 11, 11,
         backend="reference"), ArgumentError, "'cu_seqlens_q'"),
    ("torch.ops.hk.attention_varlen_backward", "lse_shape",
     _op("attention_varlen_backward", bf16(16, 2, 64), bf16(16, 1, 64), bf16(16, 1, 64), bf16(16, 2, 64),
         torch.zeros(3, 16), bf16(16, 2, 64), CU, CU, 11, 11, backend="reference"), ArgumentError, "'lse'"),
    ("torch.ops.hk.attention_kvcache", "num_splits",
     _op("attention_kvcache", bf16(2, 1, 4, 64), bf16(5, 16, 2, 64), bf16(5, 16, 2, 64),
         torch.tensor([3, 20], dtype=torch.int32), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), num_splits=-1,
         backend="reference"), ArgumentError, "'num_splits'"),
    ("torch.ops.hk.gemm", "dtype", _op("gemm", torch.randn(4, 4), x44, backend="reference"), ArgumentError, "'a'"),
    ("torch.ops.hk.attention", "scale_nan", _op("attention", bf16(1, 2, 16, 64), bf16(1, 2, 16, 64),
                                                 bf16(1, 2, 16, 64), scale=nan, backend="reference"),
     ArgumentError, "scale"),
    ("torch.ops.hk.attention_backward", "scale_inf",
     _op("attention_backward", *(bf16(1, 2, 16, 64) for _ in range(4)), torch.zeros(1, 2, 16), bf16(1, 2, 16, 64),
         scale=inf, backend="reference"), ArgumentError, "scale"),
    ("torch.ops.hk.rotary", "rank", _op("rotary", bf16(8, 64), *tables(8, 64), backend="reference"),
     ArgumentError, "'x'"),
    ("torch.ops.hk.dropout_residual_layernorm", "eps_nan",
     _op("dropout_residual_layernorm", bf16(4, 64), bf16(4, 64), torch.ones(64), torch.zeros(64), eps=nan,
         backend="reference"), ArgumentError, "'eps'"),
    ("torch.ops.hk.rms_norm", "weight_shape",
     _op("rms_norm", bf16(4, 64), bf16(4, 64), torch.ones(3), backend="reference"), ArgumentError, "'weight'"),
    ("torch.ops.hk.norm_backward", "dy_shape",
     _op("norm_backward", bf16(4, 63), bf16(4, 64), torch.ones(64), None, False, 0.0, 0, 0, 1e-5, torch.bfloat16,
         torch.bfloat16, torch.float32, backend="reference"), ArgumentError, "'dy'"),
    # ---- layernorm / rmsnorm backward
    ("layernorm_bwd", "h_rank", _ln_bwd(h=bf16(64)), ArgumentError, "'h'"),
    ("layernorm_bwd", "dy_dtype", _ln_bwd(dy=torch.zeros(4, 64, dtype=torch.float64)), ArgumentError, "'dy'"),
    ("layernorm_bwd", "dh_shape", _ln_bwd(dh=bf16(4, 63)), ArgumentError, "'dh'"),
    ("layernorm_bwd", "weight_shape", _ln_bwd(weight=torch.ones(63)), ArgumentError, "'weight'"),
    ("layernorm_bwd", "p_one", _ln_bwd(p=1.0), ArgumentError, "'p'"),
    ("layernorm_bwd", "eps_zero", _ln_bwd(eps=0.0), ArgumentError, "'eps'"),
    ("layernorm_bwd", "dx_shape", _ln_bwd(dx=bf16(4, 63)), ArgumentError, "'dx'"),
    ("layernorm_bwd", "overlap", (lambda t: _ln_bwd(dy=t, dx=t))(bf16(4, 64)), ArgumentError, "'dx'"),
    ("rmsnorm_bwd", "eps_nan", _ln_bwd(dropout_residual_rmsnorm_bwd, eps=nan), ArgumentError, "'eps'"),
]


@pytest.mark.parametrize("entry,case,call,error,names", CASES, ids=[f"{e}-{c}" for e, c, *_ in CASES])
def test_bad_input_names_the_argument(entry, case, call, error, names):
    with pytest.raises(error) as info:
        call()
    assert names in str(info.value), f"{entry} {case}: the message does not name {names}: {info.value}"


def test_every_public_kernel_function_is_in_the_table():
    import hk_portable.kernels as K
    public = {"gemm", "gemm_fp8", "attention_fwd", "attention_bwd", "layernorm", "rmsnorm", "rotary", "layernorm_bwd",
              "rmsnorm_bwd", "attention_varlen", "attention_varlen_bwd", "attention_kvcache"}
    assert public <= {e for e, *_ in CASES}
    assert set(K.KERNELS) - {"dropout_residual_layernorm"} <= public | {"kernel"}
    ops = {n for n in dir(torch.ops.hk) if not n.startswith("_") and n != "name"}
    assert {f"torch.ops.hk.{n}" for n in ops} <= {e for e, *_ in CASES}


ZERO_SIZE_THAT_IS_DEFINED = [       # (what, call, expected shape, expected values or None for empty)
    ("gemm M=0", lambda: gemm(bf16(0, 4), x44, **REF), (0, 4)),
    ("gemm N=0", lambda: gemm(x44, bf16(4, 0), **REF), (4, 0)),
    ("gemm K=0", lambda: gemm(bf16(4, 0), bf16(0, 4), **REF), (4, 4)),          # an empty sum: zeros
    ("gemm_fp8 M=0", lambda: gemm_fp8(E4(0, 4), E4(4, 4), ONE, ONE, **REF), (0, 4)),
    ("gemm_fp8 K=0", lambda: gemm_fp8(E4(4, 0), E4(0, 4), ONE, ONE, **REF), (4, 4)),
    ("attention B=0", lambda: _attn(q=bf16(0, 2, 16, 64), k=bf16(0, 2, 16, 64), v=bf16(0, 2, 16, 64))()[0],
     (0, 2, 16, 64)),
    ("layernorm rows=0", lambda: _ln(x=bf16(0, 64), residual=bf16(0, 64))()[0], (0, 64)),
    ("rotary N=0", lambda: rotary(bf16(1, 0, 2, 64), *tables(8, 64), **REF), (1, 0, 2, 64)),
]


@pytest.mark.parametrize("what,call,shape", ZERO_SIZE_THAT_IS_DEFINED, ids=[w for w, *_ in ZERO_SIZE_THAT_IS_DEFINED])
def test_zero_size_dims_with_a_defined_answer_give_it(what, call, shape):
    out = call()
    assert tuple(out.shape) == shape
    assert out.numel() == 0 or torch.equal(out.float(), torch.zeros(shape))


# ---------------------------------------------------------------------------------------------- CLI
CLI_CASES = [
    (["compile", "no_such_kernel", "--backend", "reference", "--emit", "ir"], "no_such_kernel"),
    (["compile", "gemm", "--backend", "no_such_backend", "--emit", "ir"], "no_such_backend"),
    (["compile", "gemm", "--backend", "hip:gfx9999", "--emit", "source"], "gfx9999"),
    (["compile", "gemm", "--backend", "cuda::", "--emit", "ir"], "cuda::"),
    (["compile", "gemm", "--backend", "reference", "--emit", "hsaco"], "hsaco"),
    (["compile", "/nonexistent/dir/mod.py:k", "--backend", "reference", "--emit", "ir"], "mod.py"),
    (["compile", "gemm", "--backend", "reference"], "--emit"),
    (["compile", "gemm", "--backend", "hip:gfx942", "--emit", "hsaco"], "-o"),
    (["compile", "gemm", "--backend", "reference", "--emit", "ir", "--arg", "M=-5"], "M=-5"),              # issue 41
    (["compile", "gemm", "--backend", "reference", "--emit", "ir", "-o", "missing_dir/x"], "missing_dir/x"),
    *([(["bench", "--device", "cuda", "--quick"], "--device cuda")] if not torch.cuda.is_available() else []),
]


@pytest.mark.parametrize("argv,names", CLI_CASES, ids=[" ".join(a[1:3]) + f" {i}" for i, (a, _) in enumerate(CLI_CASES)])
def test_cli_bad_input_names_the_argument(argv, names, capsys):
    from hk_portable.cli import main
    try:
        rc = main(argv)
    except SystemExit as e:           # argparse's own refusals
        rc = e.code
    out = capsys.readouterr()
    assert rc not in (0, None), f"hk {' '.join(argv)} succeeded"
    assert names in out.err + out.out, f"hk {' '.join(argv)}: the message does not name {names}: {out.err}"
    assert "Traceback" not in out.err
