"""The tile interface: everything a kernel file may import."""
from . import dtypes
from .backend import Artifact, Backend, BackendStatus, Target
from .dtypes import bf16, bool_, f16, f32, fp8e4m3, fp8e5m2, i32
from .errors import ArgumentError, BackendError, HKError, TraceError, UnsupportedError
from .ir import Program
from .kernel import Kernel, kernel
from .types import GL, RT, RV, ST, const

__all__ = ["GL", "RT", "RV", "ST", "const", "kernel", "Kernel", "Program", "Backend", "BackendStatus",
           "Target", "Artifact", "bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32", "bool_", "dtypes",
           "HKError", "TraceError", "ArgumentError", "UnsupportedError", "BackendError"]
