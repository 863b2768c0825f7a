"""hk kernels as torch custom ops (namespace `hk`), visible to torch.compile, autograd and torch.distributed.

    torch.ops.hk.gemm(a, b, out_dtype=None)                                  -> c  (a [..., K], b [K, N])
    torch.ops.hk.gemm_fp8(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)  -> c  (fp8 a [M, K], b [K, N])
    torch.ops.hk.attention(q, k, v, causal, window, align, scale, backend, softcap, sinks) -> (o, lse)
    torch.ops.hk.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window,
                                  align, scale)                              -> (o, lse)
    torch.ops.hk.attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits)
                                                                             -> (o, lse)   (forward only)
    torch.ops.hk.rotary(x, cos, sin, layout, offset, heads_first, inverse)   -> y
    torch.ops.hk.dropout_residual_layernorm(x, residual, weight, bias, p, seed, offset, eps) -> (y, h)
    torch.ops.hk.rms_norm(x, residual, weight, bias, p, seed, offset, eps)   -> (y, h)

Each op calls the library kernel's wrapper (hk_portable/kernels) with no backend unless `backend=` names one,
so the runtime's selection rules apply at run time: an `hk.use_backend(...)` block, HK_BACKEND, else the
backend that claims the tensors' device (CPU tensors: the reference). Launches go on the current stream.
Each op has a fake implementation (shapes, dtypes and strides of what the wrapper allocates, nothing run),
so torch.compile traces through it without a graph break.

The ops are defined on the dispatcher directly (`torch.library.Library`: a schema, one implementation for every
device, a fake, an Autograd kernel of our own with register_autograd's contract: `_Op.register_autograd`), not through
`torch.library.custom_op`: custom_op's per-call wrapper imports torch._dynamo at an op's first call (2.4 s and
542 modules on a CPU, in a process that never compiles) and checks aliasing on every call. Every op here
returns fresh tensors, never a view of an input, as its schema (no alias annotations) says.

Autograd: gemm_fp8 has none (like torch._scaled_mm); gemm differentiates through two hk gemms, rotary through the inverse rotation, attention through
the attention_bwd kernels, attention_varlen through the varlen backward kernels (attention_kvcache is forward
only) and the two normalisations through the layernorm_bwd kernels: all hk kernels (the
attention and norm backwards are ops of their own, hk::attention_backward and hk::norm_backward, so that
autograd graphs stay traceable by torch.compile). Saved tensors are
minimal: attention keeps q, k, v, o, lse; the norms keep h and the weight (the statistics are recomputed
from h, the dropout mask regenerated from its seed, never stored).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .interface.errors import ArgumentError
from .runtime import opfast
from .kernels import attention as _attention
from .kernels import attention_bwd as _attention_bwd
from .kernels import attention_kvcache as _attention_kvcache
from .kernels import attention_varlen as _attention_varlen
from .kernels import gemm as _gemm
from .kernels import gemm_fp8 as _gemm_fp8
from .kernels import layernorm as _layernorm
from .kernels import layernorm_bwd as _layernorm_bwd
from .kernels import rotary as _rotary

_LIB = torch.library.Library("hk", "DEF")
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
# what may lie below the Autograd key besides a device: if the highest of these is a device key (CPU, CUDA; a ROCm
# build's tensors are CUDA), no mode, subclass, functionalisation or conjugate view sits between the call and the
# device kernel, so calling the implementation directly is what the redispatch would do
_BELOW_AUTOGRAD = _AFTER_AUTOGRAD.remove(torch._C.DispatchKey.ADInplaceOrView)
_DEVICE_KEYS = frozenset((torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA))
_any_requires_grad = getattr(torch._C, "_any_requires_grad", None) or (
    lambda *args: any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))


class _Op:
    """An op `hk::<name>` with the schema of `fn`'s annotations, `fn` its implementation on every device; the
    surface of torch.library.custom_op's result (call it; register_fake; register_autograd)."""

    def __init__(self, fn):
        self.name, self.__doc__, self.fn = fn.__name__, fn.__doc__, fn
        _LIB.define(self.name + torch.library.infer_schema(fn, mutates_args=()))
        _LIB.impl(self.name, opfast.recordable(self.name, fn), "CompositeExplicitAutograd")
        self.op = getattr(torch.ops.hk, self.name).default
        self.defaults = tuple(a.default_value for a in self.op._schema.arguments)

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)

    def register_fake(self, fake):
        torch.library.register_fake(f"hk::{self.name}", fake, lib=_LIB)
        return fake

    def register_autograd(self, backward, *, setup_context) -> None:
        """The op's Autograd kernel: torch.library.register_autograd's contract (setup_context(ctx, inputs, output),
        backward(ctx, *grads) -> a gradient or None per input), in a kernel that costs a call needing no gradient
        one check: it then calls the implementation itself where nothing lies between it and the device (no
        second boxed dispatch), and redispatches below autograd otherwise (fake tensors, modes, functionalisation)."""
        fn, op, defaults = self.fn, self.op, self.defaults

        def forward(ctx, *args):
            keyset, args = args[-1], args[:-1]
            with torch._C._AutoDispatchBelowAutograd():
                out = op.redispatch(keyset & _AFTER_AUTOGRAD, *args)
            ctx.hk_inputs = len(args)
            setup_context(ctx, args + defaults[len(args):], out)     # the dispatcher drops trailing defaults
            return out

        def backward_(ctx, *grads):
            needs = ctx.needs_input_grad
            ctx.needs_input_grad = needs[:-1]
            try:
                grads_in = backward(ctx, *grads)
            finally:
                ctx.needs_input_grad = needs
            return (*grads_in[:ctx.hk_inputs], None)

        function = type(f"hk_{self.name}_autograd", (torch.autograd.Function,),
                        {"forward": staticmethod(forward), "backward": staticmethod(backward_)})

        def autograd_kernel(keyset, *args):
            if torch.is_grad_enabled() and _any_requires_grad(*args):
                return function.apply(*args, keyset)
            if (keyset & _BELOW_AUTOGRAD).highestPriorityTypeId() in _DEVICE_KEYS:
                return fn(*args)
            with torch._C._AutoDispatchBelowAutograd():
                return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)

        _LIB.impl(self.name, autograd_kernel, "Autograd", with_keyset=True)


# ------------------------------------------------------------------------------------------------ gemm
_rows = _gemm.rows_of


@_Op
def gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None,
         backend: str | None = None) -> torch.Tensor:
    """a @ b with f32 accumulation; a [..., K] (as matmul: [K] gives [N]), b [K, N] (bf16 or f16, any
    strides; a transposed view of either runs the kernel's transposed-operand form, no copy); out [..., N] in
    out_dtype or a's. The op takes the leading dims itself, so that linear layers return a fresh tensor as
    torch's do, not a view of one (FSDP2 warns on a module output that is a view: an in-place op on it would
    bypass the hook that gathers the parameters for the backward)."""
    return _gemm.matmul(a, b, out_dtype, backend)


@gemm.register_fake
def _(a, b, out_dtype=None, backend=None):
    _rows(a)
    return a.new_empty(_gemm.matmul_shape(a, b), dtype=out_dtype or a.dtype)


def _gemm_setup(ctx, inputs, output):
    a, b, _, backend = inputs
    ctx.save_for_backward(a, b)
    ctx.backend = backend


def _gemm_backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    g = grad_c.to(a.dtype)          # the kernel takes one 16-bit dtype for both operands
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:     # dA = dC @ Bᵀ: Bᵀ a view; b = W.t() makes it W itself, row-major
        grad_a = torch.ops.hk.gemm(g, b.t(), a.dtype, ctx.backend)
    if ctx.needs_input_grad[1]:     # dB = Aᵀ @ dC over all leading dims (rows); Aᵀ a view (the kernel's A_KM form)
        rows_a, rows_g = _rows(a), _rows(g)
        if _gemm.is_transposed_view(b):     # b = W.t(): W's gradient dCᵀ A, row-major as W is, so autograd copies nothing
            grad_b = torch.ops.hk.gemm(rows_g.t(), rows_a, b.dtype, ctx.backend).t()
        else:
            grad_b = torch.ops.hk.gemm(rows_a.t(), rows_g, b.dtype, ctx.backend)
    return grad_a, grad_b, None, None


gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup)


# -------------------------------------------------------------------------------------------- gemm_fp8
@_Op
def gemm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16, backend: str | None = None) -> torch.Tensor:
    """(a @ b) * scale_a * scale_b: a [M, K], b [K, N] in float8_e4m3fn / float8_e5m2 (any pair), scales f32
    per tensor (1 element) or per row of a / column of b; torch._scaled_mm's convention. No autograd: fp8
    training recipes quantise in their own code and call this op for each product."""
    return _gemm_fp8.gemm_fp8(a, b, scale_a, scale_b, out_dtype=out_dtype, backend=backend)


@gemm_fp8.register_fake
def _(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, backend=None):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ArgumentError(f"hk::gemm_fp8: 'a' and 'b' must be [M, K] and [K, N], got {tuple(a.shape)} and "
                            f"{tuple(b.shape)}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


# ------------------------------------------------------------------------------------------- attention
def _window(window: Sequence[int] | None):
    """The op's window (a list of two ints, -1 for an unbounded side) as the wrapper's (left, right)."""
    return None if window is None else tuple(int(w) for w in window)


@_Op
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              window: Sequence[int] | None = None, align: str | None = None, scale: float | None = None,
              backend: str | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of softmax(q kᵀ · scale [+ mask]) v; q [B, Hq, N, D], k [B, Hkv, Nkv, D], v [B, Hkv, Nkv, Dv] (GQA;
    Dv may differ from D: o is [B, Hq, N, Dv]),
    bf16/f16; window = [left, right] with -1 unbounded; lse f32 [B, Hq, N] (natural log). softcap c > 0: each
    scaled logit s becomes c * tanh(s / c) before the mask; sinks f32 [Hq]: a logit per head in each row's
    softmax denominator (lse includes it). Both differentiate: dS times 1 - tanh² under softcap (in the
    attention_bwd kernels), and the sinks' gradient (torch_ops)."""
    return _attention.attention_fwd(q, k, v, causal=causal, window=_window(window), align=align, scale=scale,
                                    softcap=softcap, sinks=sinks, backend=backend)


@attention.register_fake
def _(q, k, v, causal=False, window=None, align=None, scale=None, backend=None, softcap=None, sinks=None):
    _attention.softcap_value(softcap, "hk::attention")
    if sinks is not None:
        _attention.check_sinks(sinks, q, "hk::attention")
    B, H, N, _ = q.shape
    return _attention.output_like(q, v.shape[-1]), q.new_empty((B, H, N), dtype=torch.float32)


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, window, align, scale, _, softcap, sinks = inputs
    o, lse = output
    ctx.softcap = softcap
    ctx.save_for_backward(q, k, v, o, lse, *(() if sinks is None else (sinks,)))
    ctx.mask = (causal, _window(window), align)
    ctx.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ctx.backend = inputs[7]


@_Op
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                       do: torch.Tensor, dlse: torch.Tensor | None = None, causal: bool = False,
                       window: Sequence[int] | None = None, align: str | None = None, scale: float | None = None,
                       backend: str | None = None,
                       softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of hk::attention through the attention_bwd kernels (an op of its own, so that autograd
    graphs stay traceable by torch.compile); softcap: the forward's."""
    return _attention_bwd.attention_bwd(q, k, v, o, lse, do, causal=causal, window=_window(window), align=align,
                                        scale=scale, dlse=dlse, softcap=softcap, backend=backend)


@attention_backward.register_fake
def _(q, k, v, o, lse, do, dlse=None, causal=False, window=None, align=None, scale=None, backend=None,
      softcap=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _unit_inner(t: torch.Tensor) -> torch.Tensor:
    """t itself where its last dim is unit-stride (the kernels take any other strides: the gradient of o in a
    block's [B, N, H, D] layout needs no copy), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _attention_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, *sinks = ctx.saved_tensors
    causal, window, align = ctx.mask
    do = torch.zeros_like(o) if grad_o is None else _unit_inner(grad_o.to(o.dtype))
    dlse = None if grad_lse is None else grad_lse.float()
    dq = dk = dv = dsinks = None
    if any(ctx.needs_input_grad[:3]):
        # with sinks, lse includes the sink: P = exp(s - lse) are the key columns' probabilities and O has no sink
        # term, so dS = P (dP - delta) is unchanged and the dense backward kernels give dq, dk, dv as they are
        dq, dk, dv = attention_backward(q, k, v, o, lse, do, dlse, causal, None if window is None else list(window),
                                        align, ctx.scale, ctx.backend, ctx.softcap)
    if sinks and ctx.needs_input_grad[9]:
        dsinks = _sinks_grad(sinks[0].view(1, -1, 1), lse, (do.float() * o.float()).sum(-1), dlse, dim=(0, 2))
    return dq, dk, dv, None, None, None, None, None, None, dsinks


def _sinks_grad(sink, lse, delta, dlse, dim):
    """d loss / d sink_h = sum over rows of P_sink (dlse - delta): d lse / d sink = P_sink = exp(sink - lse), and
    d O / d sink = -P_sink O, so dO . dO/d sink = -P_sink delta with delta = rowsum(dO * O). `sink` broadcasts
    against lse (and delta, dlse); `dim`: the dims summed (all but the heads). torch, f32."""
    g = -delta if dlse is None else dlse - delta
    return (torch.exp(sink - lse) * g).sum(dim)


attention.register_autograd(_attention_backward, setup_context=_attention_setup)


# ------------------------------------------------------------------------------- serving attention
@_Op
def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     window: Sequence[int] | None = None, align: str | None = None, scale: float | None = None,
                     backend: str | None = None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's varlen forward: q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] packed,
    cu_seqlens int32 [B + 1]; (o [total_q, Hq, Dv], lse f32 [Hq, total_q]). softcap, sinks: hk::attention's.
    Differentiable through hk::attention_varlen_backward (softcap's derivative in its kernels, sinks' in torch)."""
    return _attention_varlen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              causal=causal, window=_window(window), align=align, scale=scale,
                                              softcap=softcap, sinks=sinks, backend=backend)


@attention_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, window=None, align=None,
      scale=None, backend=None, softcap=None, sinks=None):
    _attention.softcap_value(softcap, "hk::attention_varlen")
    if sinks is not None:
        _attention.check_sinks(sinks, q, "hk::attention_varlen")
    return _attention.output_like(q, v.shape[-1]), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _attention_varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, window, align, scale, backend, softcap, sinks = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output, *(() if sinks is None else (sinks,)))
    ctx.args = (max_q, max_k, causal, window, align, scale, backend)
    ctx.softcap = softcap
    ctx.same_cu = cu_q is cu_k          # one tensor for q and k: the forward needed no alignment, nor does this


@_Op
def attention_varlen_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                              do: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                              max_seqlen_q: int, max_seqlen_k: int, dlse: torch.Tensor | None = None,
                              causal: bool = False, window: Sequence[int] | None = None, align: str | None = None,
                              scale: float | None = None, backend: str | None = None,
                              softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of hk::attention_varlen through the varlen backward kernels (no atomics); softcap: the
    forward's."""
    return _attention_varlen.attention_varlen_bwd(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                  max_seqlen_k, causal=causal, window=_window(window), align=align,
                                                  scale=scale, dlse=dlse, softcap=softcap, backend=backend)


@attention_varlen_backward.register_fake
def _(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dlse=None, causal=False,
      window=None, align=None, scale=None, backend=None, softcap=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_varlen_backward(ctx, grad_o, grad_lse):
    q, k, v, cu_q, cu_k, o, lse, *sinks = ctx.saved_tensors
    max_q, max_k, causal, window, align, scale, backend = ctx.args
    do = torch.zeros_like(o) if grad_o is None else grad_o.to(o.dtype).contiguous()
    dlse = None if grad_lse is None else grad_lse.float().contiguous()
    cu_k_arg = cu_q if ctx.same_cu else cu_k
    dq = dk = dv = dsinks = None
    if any(ctx.needs_input_grad[:3]):   # with sinks: as the dense backward (lse includes the sink; dS unchanged)
        dq, dk, dv = attention_varlen_backward(q, k, v, o, lse, do, cu_q, cu_k_arg, max_q, max_k, dlse, causal,
                                               window, align, scale, backend, ctx.softcap)
    if sinks and ctx.needs_input_grad[13]:
        dsinks = _sinks_grad(sinks[0].view(-1, 1), lse, (do.float() * o.float()).sum(-1).t(), dlse, dim=1)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, dsinks


attention_varlen.register_autograd(_attention_varlen_backward, setup_context=_attention_varlen_setup)


@_Op
def attention_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                      block_table: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
                      num_splits: int | None = None, backend: str | None = None, softcap: float | None = None,
                      sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention against a paged (block_table) or contiguous KV cache, split-KV: q [B, Nq, Hq, D];
    (o [B, Nq, Hq, D], lse f32 [B, Hq, Nq]); softcap, sinks: hk::attention's. Forward only (decode and prefill
    against a cache)."""
    return _attention_kvcache.attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal=causal,
                                                scale=scale, num_splits=num_splits, softcap=softcap, sinks=sinks,
                                                backend=backend)


@attention_kvcache.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=False, scale=None, num_splits=None, backend=None,
      softcap=None, sinks=None):
    B, Nq, Hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, Hq, Nq), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------- rotary
@_Op
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "neox", offset: int = 0,
           heads_first: bool = False, inverse: bool = False, backend: str | None = None) -> torch.Tensor:
    """x [B, N, H, D] ([B, H, N, D] with heads_first) rotated by the f32 tables cos/sin [positions, D/2] at
    positions offset..offset+N; layout "neox" or "gptj"; inverse rotates back (the backward). The tables are
    constants: autograd gives them no gradient."""
    return _rotary.rotary(x, cos, sin, layout=layout, offset=offset, heads_first=heads_first, inverse=inverse,
                          backend=backend)


@rotary.register_fake
def _(x, cos, sin, layout="neox", offset=0, heads_first=False, inverse=False, backend=None):
    return torch.empty_like(x)


def _rotary_setup(ctx, inputs, output):
    _, cos, sin, layout, offset, heads_first, inverse, backend = inputs
    ctx.save_for_backward(cos, sin)
    ctx.args = (layout, offset, heads_first, not inverse, backend)


def _rotary_backward(ctx, grad_y):
    cos, sin = ctx.saved_tensors
    # a rotation's gradient is the opposite rotation; the tables are constants (no gradient)
    return torch.ops.hk.rotary(grad_y, cos, sin, *ctx.args), None, None, None, None, None, None, None


rotary.register_autograd(_rotary_backward, setup_context=_rotary_setup)


# --------------------------------------------------------------------------------------- normalisations
def _no_h(x, residual, p) -> bool:
    """A plain norm (no residual, no dropout): h would be x itself, so the kernel writes none and the op returns an
    empty h (an op's outputs never alias its inputs); autograd saves x in its place."""
    return residual is None and p == 0


def _norm(fn, x, residual, weight, bias, p, seed, offset, eps, backend):
    y, h = fn(x, residual, weight, bias, p=p, seed=seed, offset=offset, eps=eps, backend=backend)
    return (y, x.new_empty(0)) if _no_h(x, residual, p) else (y, h)


@_Op
def dropout_residual_layernorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                               bias: torch.Tensor | None = None, p: float = 0.0, seed: int = 0, offset: int = 0,
                               eps: float = 1e-5, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h): h = dropout(x, p; Philox seed/offset) + residual, y = layernorm(h) * weight (+ bias); x, residual
    [rows, d]; seed and offset < 2**63 (the schema's int). residual None: none; then with p = 0 (a plain norm)
    h is x and comes back empty ([0])."""
    return _norm(_layernorm.dropout_residual_layernorm, x, residual, weight, bias, p, seed, offset, eps, backend)


@_Op
def rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None = None,
             p: float = 0.0, seed: int = 0, offset: int = 0, eps: float = 1e-6,
             backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h): h = dropout(x, p) + residual, y = h / sqrt(mean(h²) + eps) * weight (+ bias); residual None and
    p = 0: h comes back empty, as for hk::dropout_residual_layernorm."""
    return _norm(_layernorm.dropout_residual_rmsnorm, x, residual, weight, bias, p, seed, offset, eps, backend)


def _norm_fake(x, residual, weight, bias=None, p=0.0, seed=0, offset=0, eps=1e-5, backend=None):
    return torch.empty_like(x), (x.new_empty(0) if _no_h(x, residual, p) else torch.empty_like(x))


def _norm_setup(rms: bool):
    def setup(ctx, inputs, output):
        x, residual, weight, bias, p, seed, offset, eps, backend = inputs
        # h (x itself for a plain norm) and w: enough to recompute the statistics
        ctx.save_for_backward(x if _no_h(x, residual, p) else output[1], weight)
        ctx.has_residual = residual is not None
        ctx.args = (rms, p, seed, offset, eps, x.dtype, x.dtype if residual is None else residual.dtype,
                    None if bias is None else bias.dtype, backend)
    return setup


@_Op
def norm_backward(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, dh: torch.Tensor | None, rms: bool,
                  p: float, seed: int, offset: int, eps: float, x_dtype: torch.dtype, residual_dtype: torch.dtype,
                  bias_dtype: torch.dtype | None = None,
                  backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dresidual, dweight, dbias) of hk::dropout_residual_layernorm (rms=False) or hk::rms_norm through the
    layernorm_bwd kernels. bias_dtype: None without a bias; dbias is then [0] (an op returns tensors, not None).
    Only the bias's presence and dtype enter the backward, not its values."""
    bias = None if bias_dtype is None else torch.empty(h.shape[1], dtype=bias_dtype, device=h.device)
    fn = _layernorm_bwd.dropout_residual_rmsnorm_bwd if rms else _layernorm_bwd.dropout_residual_layernorm_bwd
    dx = torch.empty(h.shape, dtype=x_dtype, device=h.device)
    dres = torch.empty(h.shape, dtype=residual_dtype, device=h.device)
    dx, dres, dw, db = fn(dy, h, weight, bias, dh=dh, p=p, seed=seed, offset=offset, eps=eps, dx=dx,
                          dresidual=dres, backend=backend)
    return dx, dres, dw, h.new_empty((0,), dtype=weight.dtype) if db is None else db


@norm_backward.register_fake
def _(dy, h, weight, dh, rms, p, seed, offset, eps, x_dtype, residual_dtype, bias_dtype=None, backend=None):
    db = h.new_empty((0,), dtype=weight.dtype) if bias_dtype is None else h.new_empty((h.shape[1],), dtype=bias_dtype)
    return (h.new_empty(h.shape, dtype=x_dtype), h.new_empty(h.shape, dtype=residual_dtype),
            h.new_empty((h.shape[1],), dtype=weight.dtype), db)


def _norm_backward(ctx, grad_y, grad_h):
    h, weight = ctx.saved_tensors
    rms, p, seed, offset, eps, x_dtype, res_dtype, bias_dtype, backend = ctx.args
    dy = torch.zeros_like(h) if grad_y is None else grad_y.contiguous()
    dh = None if grad_h is None or grad_h.numel() != h.numel() else grad_h.contiguous()
    dx, dres, dw, db = norm_backward(dy, h, weight, dh, rms, p, seed, offset, eps, x_dtype, res_dtype, bias_dtype,
                                     backend)
    return (dx, dres if ctx.has_residual else None, dw, None if bias_dtype is None else db,
            None, None, None, None, None)


for _op, _rms in ((dropout_residual_layernorm, False), (rms_norm, True)):
    _op.register_fake(_norm_fake)
    _op.register_autograd(_norm_backward, setup_context=_norm_setup(_rms))
