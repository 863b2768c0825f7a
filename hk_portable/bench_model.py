"""`hk bench` families that time what users run rather than one kernel:

- `block`: a Llama-style decoder block (hk_portable.nn.blocks.LlamaBlock) built from hk modules against the same
  block in plain torch (cuBLAS, SDPA/cuDNN, F.rms_norm) and against torch.compile of that torch block, same
  weights: a training step (forward + backward), prefill (forward, no grad), and decode (one token per sequence
  against a KV cache). Each entry carries a profiler table of where the GPU time goes and the copy kernels a step
  launches.
- `host`: the torch ops at tiny, launch-bound sizes, hk's against the torch op each replaces: the time per call
  is the host's (`host_ms_per_call` beside it says so).
"""
from __future__ import annotations

import re

import torch

from .bench import Bound, Case, rel_error

BF16 = torch.bfloat16
LLAMA = dict(dim=2048, num_heads=16, num_kv_heads=4, ffn_dim=5632)      # the block: B=2, N=4096
COPY_KERNEL = re.compile(r"copy", re.I)


def block_flops(mode: str, batch: int, n: int, dim: int, num_heads: int, num_kv_heads: int, ffn_dim: int,
                context: int) -> float:
    """Matrix FLOPs of one step: the projections and the MLP (2 per multiply-add), attention's two products
    (causal: half the square for training and prefill; decode reads the whole context). Training is forward +
    backward: 3x the projections, 2.5x attention (FlashAttention's count: the backward recomputes QKᵀ)."""
    tokens = batch * n
    kv_dim = dim * num_kv_heads // num_heads
    linear = 2.0 * tokens * (dim * dim * 2 + 2 * dim * kv_dim + 3 * dim * ffn_dim)
    if mode == "decode":
        attn = 4.0 * batch * num_heads * context * (dim // num_heads)
    else:
        attn = 4.0 * batch * num_heads * n * n * (dim // num_heads) / 2
    return 3.0 * linear + 3.5 * attn if mode == "train" else linear + attn


def _blocks(device: str, max_positions: int, **shape):
    from .nn.blocks import LlamaBlock
    torch.manual_seed(0)
    hk_block = LlamaBlock(**shape, impl="hk", max_positions=max_positions).to(device, BF16)
    with torch.no_grad():
        for p in hk_block.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    torch_block = LlamaBlock(**shape, impl="torch", max_positions=max_positions).to(device, BF16)
    torch_block.load_state_dict(hk_block.state_dict())
    return hk_block, torch_block


def _profile_table(fns: dict, steps: int = 3, top: int = 12) -> dict:
    """Per function: its top GPU kernels over `steps` calls (name, calls, ms a step) and the copy kernels a step
    launches; on the CPU, nothing."""
    if not torch.cuda.is_available():
        return {}
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for name, fn in fns.items():
        fn(0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn(0)
            torch.cuda.synchronize()
        rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "cuda_time_total", 0)]
        time_of = lambda e: getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)  # noqa: E731
        rows.sort(key=time_of, reverse=True)
        total = sum(time_of(e) for e in rows) / steps / 1e3
        out[name] = {"gpu_ms_per_step": total,
                     "kernels": [{"name": e.key[:160], "calls_per_step": e.count / steps,
                                  "ms_per_step": time_of(e) / steps / 1e3} for e in rows[:top]],
                     "copy_kernels_per_step": sum(e.count for e in rows if COPY_KERNEL.search(e.key)) / steps}
    return out


def block_case(mode: str, batch: int = 2, n: int = 4096, *, decode_batch: int = 64, context: int = 4096,
               compile_baseline: bool = True, **shape) -> Case:
    """The block in `mode` ("train", "prefill" or "decode"): hk against plain torch and torch.compile of it."""
    shape = {**LLAMA, **shape}
    b, tokens = (decode_batch, 1) if mode == "decode" else (batch, n)
    work = block_flops(mode, b, tokens, **shape, context=context)

    def make(device):
        hk_block, torch_block = _blocks(device, max(context, n), **shape)
        compiled = None
        if compile_baseline and device == "cuda" and mode != "decode":
            compiled = torch.compile(torch_block)
        x = torch.randn(b, tokens, shape["dim"], device=device, dtype=BF16)
        kv_shape = (b, context, shape["num_kv_heads"], shape["dim"] // shape["num_heads"])
        kv = [torch.randn(kv_shape, device=device, dtype=BF16) for _ in range(2)] if mode == "decode" else []
        caches = {}

        def run(block, impl_name):
            if mode == "train":
                xg = x.detach().requires_grad_()
                params = [p for p in block.parameters()]
                grad = torch.ones_like(x) / x.numel() ** 0.5

                def fn(i):
                    y = block(xg)
                    torch.autograd.grad(y, [xg, *params], grad)
                    return y
            elif mode == "prefill":
                def fn(i):
                    with torch.no_grad():
                        return block(x)
            else:
                if impl_name not in caches:     # one cache content for both, in each impl's layout
                    caches[impl_name] = tuple(t.clone() if impl_name == "hk" else t.transpose(1, 2).contiguous()
                                              for t in kv)
                cache = caches[impl_name]

                def fn(i):
                    with torch.no_grad():
                        return block.decode(x, cache, context - 1)
            return fn

        hk_fn = run(hk_block, "hk")
        baselines = {"torch (cuBLAS, SDPA, F.rms_norm)": run(torch_block, "torch")}
        if compiled is not None:
            baselines["torch.compile(torch block)"] = run(compiled, "torch")

        def check():
            ours, theirs = hk_fn(0), baselines["torch (cuBLAS, SDPA, F.rms_norm)"](0)
            return rel_error(ours.float(), theirs.double())

        def profile():
            return _profile_table({"hk": hk_fn, "torch": baselines["torch (cuBLAS, SDPA, F.rms_norm)"]})
        return Bound(hk_fn, baselines, check, 1, profile=profile)
    size = dict(mode=mode, batch=b, n=tokens, context=context if mode == "decode" else tokens, **shape)
    return Case("block", f"llama block {mode} B{b} N{tokens}" + (f" ctx{context}" if mode == "decode" else ""),
                work, "TFLOP/s", make, size, sweep=(mode,))


# ------------------------------------------------------------------------------------------------- host
def host_case(op: str) -> Case:
    """One torch op at a launch-bound size, hk's (through torch.ops.hk) against torch's: per-call time."""
    def make(device):
        import torch.nn.functional as TF

        from .kernels.rotary import tables
        from .nn import functional as F
        g = torch.Generator(device="cpu").manual_seed(0)
        rnd = lambda *s: torch.randn(*s, generator=g).to(device, BF16)      # noqa: E731
        if op == "gemm":
            x, w = rnd(8, 256), rnd(256, 256)
            ours, theirs = (lambda i: F.linear(x, w)), (lambda i: TF.linear(x, w))
        elif op == "attention":        # one decode-sized call: a query per head against 256 keys
            q, k, v = rnd(1, 8, 1, 128), rnd(1, 8, 256, 128), rnd(1, 8, 256, 128)
            ours = lambda i: F.attention(q, k, v)                                         # noqa: E731
            theirs = lambda i: TF.scaled_dot_product_attention(q, k, v)                  # noqa: E731
        elif op == "rms_norm":
            x, w = rnd(8, 1024), rnd(1024)
            ours, theirs = (lambda i: F.rms_norm(x, (1024,), w)), (lambda i: TF.rms_norm(x, (1024,), w))
        elif op == "rotary":
            x = rnd(1, 8, 8, 128)
            cos, sin = tables(64, 128, device=device)

            def theirs(i):
                x1, x2 = x.float().chunk(2, -1)
                c, s = cos[:8].view(1, 8, 1, 64), sin[:8].view(1, 8, 1, 64)
                return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(BF16)
            ours = lambda i: F.rotary(x, cos, sin)                                        # noqa: E731
        else:
            raise ValueError(f"host_case: no op {op!r}")
        return Bound(ours, {f"torch {op}": theirs}, lambda: rel_error(ours(0).float(), theirs(0).double()))
    return Case("host", f"op call {op} (launch-bound)", 1.0, "kcall/s", make, dict(op=op), sweep=(op,), by_batch=True)


HOST_OPS = ("gemm", "attention", "rms_norm", "rotary")


def model_cases(device: str, quick: bool = False) -> list[Case]:
    """The block family (the issue's shapes on a GPU, a tiny block on the CPU) and the host family."""
    host = [host_case(op) for op in HOST_OPS]
    if device != "cuda":
        tiny = dict(dim=256, num_heads=2, num_kv_heads=1, ffn_dim=256)
        return [block_case(m, 1, 64, decode_batch=2, context=64, **tiny) for m in ("train", "prefill", "decode")] + host
    modes = ("train",) if quick else ("train", "prefill", "decode")
    return [block_case(m) for m in modes] + host
