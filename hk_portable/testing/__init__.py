"""Helpers for testing and measuring hk_portable on machines that lack what they stand in for; not used by the
library itself. They live in the package, not in tests/, so that scripts (benchmarks/) import them as tests do.

  fake_cuda.py  a fake cudrv, a CPU-tensor cuda backend and their installation: the cuda launch path without a GPU
"""
