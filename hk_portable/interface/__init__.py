"""The tile interface: everything a kernel file may import. Nothing here imports the runtime (selection,
compiling, launching), a backend or the cache: those build on this layer, never the reverse."""
from . import dtypes
from .backend import Artifact, Backend, BackendStatus, Target
from .dtypes import bf16, bool_, f16, f32, fp8e4m3, fp8e5m2, i32
from .errors import ArgumentError, BackendError, HKError, TraceError, UnsupportedError
from .ir import Program
from .kernel import KernelDef, check_no_overlap
from .tunables import Tunable, tunable
from .types import GL, RT, RV, ST, const

__all__ = ["GL", "RT", "RV", "ST", "const", "KernelDef", "check_no_overlap", "Tunable", "tunable", "Program", "Backend",
           "BackendStatus", "Target", "Artifact", "bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32", "bool_",
           "dtypes", "HKError", "TraceError", "ArgumentError", "UnsupportedError", "BackendError"]
