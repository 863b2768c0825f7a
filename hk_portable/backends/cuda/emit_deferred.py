"""The cuda emitter's rendering of deferred wgmma waits (schedule.py decides them: deferred.py, Plan.compute_orders):
a compute region emitted in the plan's order, each MMA_DEFERRED product waited for (wgmma.wait_group N, then a fence on
its result) right before the first op that reads it, writes a shared buffer it reads or holds a region, and the rest
at the step's end. A mixin of CudaEmitter (codegen.py), which keeps `_pending` and `_producers`.
"""
from __future__ import annotations

from ...interface import opcodes
from . import archs, dataflow


class DeferredWaits:
    def compute_region(self, creg) -> None:
        pipe = next((o for o in self.p.body.walk() if o.opcode == "pipeline" and o.regions[1] is creg), None)
        order = self.plan.compute_orders.get(id(pipe)) if pipe is not None else None
        if order is None:
            return super().compute_region(creg)
        ops = {id(o): o for o in creg.ops}
        self._producers = {r.id: o for o in self.p.body.walk() for r in o.results}
        self._pending = []
        self.emit_ops([ops[i] for i in order])
        self._retire(len(self._pending))            # the step's products, before its carry is yielded
        self._pending = None

    def _retire(self, n: int) -> None:
        """Waits for the first n products in flight (the groups issued after them may stay) and fences their
        results, so nothing reading them moves above the wait."""
        if n <= 0:
            return
        self.line(f"hk::wgmma_wait<{len(self._pending) - n}>();")
        for m in self._pending[:n]:
            self.line(f"hk::fence_operand({self.name(m.result)});")
        self._pending = self._pending[n:]

    def before_op(self, op) -> None:
        if not self._pending:
            return
        reads = {v.id for v in op.operands} | {v.id for r in op.regions for v in dataflow.free_values(r, self._producers)}
        written = {dataflow.buffer_of(v, self._producers) for v in op.operands} if opcodes.writes_shared(op.opcode) else set()
        written.discard(None)
        n = 0
        for k, m in enumerate(self._pending):
            if (m.result.id in reads or op.regions
                    or written & {dataflow.buffer_of(v, self._producers) for v in m.operands[:2]}):
                n = k + 1
        self._retire(n)

    def after_op(self, op) -> None:
        if self._pending is None or op.opcode != "mma":
            return
        if self.plan.mma_modes.get(id(op)) == dataflow.MMA_DEFERRED:
            self._pending.append(op)
        elif archs.of(self.target).async_tensor_core and dataflow.wgmma_eligible(op, self.p.num_warps):
            for m in self._pending:                 # a standalone or staged wgmma waited for every group
                self.line(f"hk::fence_operand({self.name(m.result)});")
            self._pending = []
