"""A library wrapper's decisions per call signature (`hk.CallPlans`): what its checks established and its
configuration choice decided (the layout, the configuration, the grid), so a repeat call with the same signature is
its views and its launch. Bounded, oldest out. A key holds what the decisions read of the arguments (shapes, strides,
dtypes, devices, flags, the `backend=` argument); `key()` adds what selects the backend besides them (the use_backend
context, HK_BACKEND), as the call fast path's key does."""
from __future__ import annotations

from .selection import selection_key

SIZE = 4096


class CallPlans:
    def __init__(self, size: int = SIZE):
        self.size = size
        self._plans: dict = {}

    def key(self, *parts) -> tuple:
        return (*parts, selection_key())

    def get(self, key):
        """The plan of `key`, None where there is none (or the key holds an unhashable value: no plan for it)."""
        try:
            return self._plans.get(key)
        except TypeError:
            return None

    def put(self, key, plan):
        """Stores and returns `plan` (an unhashable key stores nothing)."""
        try:
            self._plans[key] = plan
        except TypeError:
            return plan
        if len(self._plans) > self.size:
            self._plans.pop(next(iter(self._plans)))
        return plan
