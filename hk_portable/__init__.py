"""hk_portable: tile kernels written once, run on AMD (HIP), NVIDIA (CUDA) and the CPU reference.

    import hk_portable as hk
    from hk_portable.interface import GL, RT, ST, f32

The names below are imported at first use (PEP 562), so that a tool that needs only the package's version or
its command line (`hk --help`) does not pay for importing torch.
"""
from .version import __version__  # noqa: F401

_INTERFACE = ("GL RT RV ST ArgumentError BackendError HKError Program TraceError UnsupportedError bf16 const f16 f32 "
              "fp8e4m3 fp8e5m2 i32 tunable")
_OPS = ("abs atomic_add block_idx bounds_mask cast causal_mask cdiv col_max col_min col_sum dropout_mask exp exp2 "
        "fori_loop full load load_scalar log log2 logical_not max maximum min minimum mma mma_AB mma_ABt mma_AtB "
        "mma_AtBt neg neg_inf num_blocks pipeline range relu row_max row_min row_sum rsqrt shared sigmoid sqrt store "
        "tanh where zeros")
# public name -> (module, its name there)
_LAZY = {
    **{n: ("interface", n) for n in _INTERFACE.split()},
    **{n: ("interface.ops", n) for n in _OPS.split()},
    # hk.kernel and hk.use_backend("hip:gfx942:emulated"): the runtime (selection, compiling, launching)
    "Kernel": ("runtime", "Kernel"), "kernel": ("runtime", "kernel"), "use_backend": ("runtime", "use_backend"),
    "precompile": ("runtime.precompile", "precompile"),       # every kernel a step launches, compiled in parallel
    "shape_bucket": ("runtime.tuning", "bucket"),             # autotuning: a call's shape bucket
    "CallPlans": ("runtime.plans", "CallPlans"),              # a wrapper's decisions per call signature
    "compute_units": ("runtime.devices", "compute_units"),    # SMs / CUs of a tensor's device, to size a grid
    "constant_table": ("runtime.opfast", "constant"),         # a table made once, passed on every call
}
# hk.backends(): every installed backend with whether it can run here and why not (list of BackendInfo); it is the
# hk_portable.backends package, which is callable (see its docstring for why). Every submodule loads as an attribute.
_HERE = __path__[0]


def __getattr__(name: str):
    import importlib
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
    elif _is_submodule(name):
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _is_submodule(name: str) -> bool:
    import os
    return name.isidentifier() and (os.path.isdir(os.path.join(_HERE, name))
                                    or os.path.isfile(os.path.join(_HERE, f"{name}.py")))


def __dir__():
    return sorted({*globals(), *_LAZY})


def get_backend(name: str):
    """The installed backend `name`, loaded (whether or not it can run kernels here)."""
    from .runtime import registry
    return registry.get(name, require_available=False)
