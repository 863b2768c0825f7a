"""hk kernels as torch building blocks: `hk_portable.nn.functional` and drop-in modules.

The modules keep the argument conventions of their torch counterparts (`Linear`, `LayerNorm`, `RMSNorm`) and
add `Attention` (q/k/v/o projections, GQA, causal, optional rotary) and `Rotary`. They call the `hk::` custom
ops (hk_portable.torch_ops), so they work under autograd, torch.compile(fullgraph=True), DDP and FSDP2. The
GEMM and attention kernels take bf16/f16: convert a model with `.to(torch.bfloat16)`."""
from . import functional
from .modules import Attention, LayerNorm, Linear, RMSNorm, Rotary

__all__ = ["functional", "Attention", "LayerNorm", "Linear", "RMSNorm", "Rotary"]
