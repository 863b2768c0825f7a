"""Code generation shared by the GPU backends: Program -> C++ calling a backend's device library.

The emitter is vendor-neutral; each backend subclasses CStyleEmitter for its prelude and qualifiers
and ships its own device headers implementing the API in DEVICE_API.md."""
from .cstyle import CStyleEmitter, EmittedKernel, assign_vector_axes

__all__ = ["CStyleEmitter", "EmittedKernel", "assign_vector_axes"]
