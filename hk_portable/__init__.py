"""hk_portable: tile kernels written once, run on AMD (HIP), NVIDIA (CUDA) and the CPU reference.

    import hk_portable as hk
    from hk_portable.interface import GL, RT, ST, f32
"""
__version__ = "0.1.0"

from .interface import (GL, RT, RV, ST, ArgumentError, BackendError, HKError, Kernel, Program, TraceError,  # noqa: E402
                        UnsupportedError, bf16, const, f16, f32, fp8e4m3, fp8e5m2, i32, kernel)
from .interface.ops import (abs, atomic_add, block_idx, bounds_mask, cast, causal_mask, cdiv,  # noqa: E402
                            col_max, col_min, col_sum, dropout_mask, exp, exp2, fori_loop, full, load, log,
                            log2, logical_not, max, maximum, min, minimum, mma, mma_AB, mma_ABt, mma_AtB,
                            mma_AtBt, neg, neg_inf, num_blocks, pipeline, range, relu, row_max, row_min, row_sum,
                            rsqrt, shared, sigmoid, sqrt, store, tanh, where, zeros)


def use_backend(name: str):
    """Context manager: kernels in this block run on backend `name` (unless a call names one)."""
    from .backends import registry
    return registry.use_backend(name)


# hk.backends(): every installed backend with whether it can run here and why not (list of BackendInfo).
# It is the hk_portable.backends package, which is callable (see its docstring for why).
from . import backends  # noqa: E402


def get_backend(name: str):
    from .backends import registry
    return registry.get(name, require_available=False)
