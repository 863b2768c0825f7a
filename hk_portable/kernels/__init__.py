"""Kernels written once against the tile interface.

KERNELS maps the names `hk compile` takes to (module, kernel object). Modules are imported when a
kernel is asked for; each exposes `example_args(device="cpu") -> (args, consts)`, its default
example configuration."""
from __future__ import annotations

import importlib

KERNELS: dict[str, tuple[str, str]] = {
    "gemm": ("hk_portable.kernels.gemm", "gemm_kernel"),
    "gemm_fp8": ("hk_portable.kernels.gemm_fp8", "gemm_fp8_kernel"),
    "attention_fwd": ("hk_portable.kernels.attention", "attention_fwd_kernel"),
    "attention_bwd": ("hk_portable.kernels.attention_bwd", "attention_bwd_dkdv_kernel"),
    "attention_varlen": ("hk_portable.kernels.attention_varlen", "attention_varlen_kernel"),
    "attention_kvcache": ("hk_portable.kernels.attention_kvcache", "attention_kvcache_kernel"),
    "dropout_residual_layernorm": ("hk_portable.kernels.layernorm", "dropout_residual_layernorm_kernel"),
    "layernorm_bwd": ("hk_portable.kernels.layernorm_bwd", "layernorm_bwd_kernel"),
    "rotary": ("hk_portable.kernels.rotary", "rotary_kernel"),
}


def load(name: str):
    """(module, kernel) for a KERNELS name; LookupError that names the choices or the missing module."""
    if name not in KERNELS:
        raise LookupError(f"unknown kernel {name!r}; the library's kernels are: {', '.join(sorted(KERNELS))}")
    module_name, attr = KERNELS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        raise LookupError(f"kernel {name!r}: its module {module_name} is not present in this installation") from None
    return module, getattr(module, attr)


def offered_configs(name: str):
    """(module, kernel, example args, configurations) of a KERNELS name: its example's consts, then what its
    module's `candidates(consts, args)` offers for that example (the configurations a call may run)."""
    module, kern = load(name)
    args, consts = module.example_args()
    configs = [consts]
    if callable(getattr(module, "candidates", None)):
        configs += module.candidates(consts, args)
    return module, kern, args, configs
