"""hk_portable: tile kernels written once, run on AMD (HIP), NVIDIA (CUDA) and the CPU reference.

    import hk_portable as hk
    from hk_portable.interface import GL, RT, ST, f32
"""
from .version import __version__  # noqa: E402,F401

from .interface import (GL, RT, RV, ST, ArgumentError, BackendError, HKError, Program, TraceError,  # noqa: E402
                        UnsupportedError, bf16, const, f16, f32, fp8e4m3, fp8e5m2, i32)
from .interface.ops import (abs, atomic_add, block_idx, bounds_mask, cast, causal_mask, cdiv,  # noqa: E402
                            col_max, col_min, col_sum, dropout_mask, exp, exp2, fori_loop, full, load, load_scalar,
                            log,
                            log2, logical_not, max, maximum, min, minimum, mma, mma_AB, mma_ABt, mma_AtB,
                            mma_AtBt, neg, neg_inf, num_blocks, pipeline, range, relu, row_max, row_min, row_sum,
                            rsqrt, shared, sigmoid, sqrt, store, tanh, where, zeros)
# hk.kernel and hk.use_backend("hip:gfx942:emulated"): the runtime (selection, compiling, launching)
from .runtime import Kernel, kernel, use_backend  # noqa: E402
from .runtime.precompile import precompile  # noqa: E402  (every kernel a step launches, compiled in parallel)
from .runtime.tuning import bucket as shape_bucket  # noqa: E402  (autotuning: a call's shape bucket)
from .runtime.plans import CallPlans  # noqa: E402  (a wrapper's decisions per call signature)
from .runtime.devices import compute_units  # noqa: E402  (SMs / CUs of a tensor's device, to size a grid)
from .runtime.opfast import constant as constant_table  # noqa: E402  (a table made once, passed on every call)


# hk.backends(): every installed backend with whether it can run here and why not (list of BackendInfo).
# It is the hk_portable.backends package, which is callable (see its docstring for why).
from . import backends  # noqa: E402


def get_backend(name: str):
    """The installed backend `name`, loaded (whether or not it can run kernels here)."""
    from .runtime import registry
    return registry.get(name, require_available=False)
