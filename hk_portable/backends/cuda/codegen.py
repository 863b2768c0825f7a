"""Program -> CUDA C++ for NVRTC: the shared C-style emitter plus this backend's prelude (the device
library inlined, so the source is header-free), launch bounds, and the checks of what the library takes.

The emitter renders the schedule's plan (schedule.py) and the block's footprint (footprint.py: warps, layouts,
the library's shared scratch, the arena); it decides nothing of its own.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from ...codegen import library, resources
from ...codegen.cstyle import CStyleEmitter, EmittedKernel
from ...interface.backend import Target
from ...interface.ir import Program, TileType
from . import archs, dataflow, footprint, tma, wgmma
from .emit_deferred import DeferredWaits
from .footprint import BUFFER_ALIGN, base_slack, num_warps, scratch_bytes
from .plan import Plan

HEADER = Path(__file__).with_name("include") / "hk_cuda.cuh"
LIBRARY = library.DeviceLibrary(HEADER, Path(__file__))
header_text = LIBRARY.text              # the device library inlined: the prelude of every kernel
library_hash = LIBRARY.fingerprint      # part of the compile cache key


class CudaEmitter(DeferredWaits, CStyleEmitter):
    lanes = 32
    smem_align = BUFFER_ALIGN
    strip_layouts = True
    narrow_strips = True

    def __init__(self, target: Target, plan: Plan):
        self.target = target
        self.plan = plan                        # schedule.plan's decisions for the Program this renders
        self._tma_loads: dict[int, int] | None = None      # while emitting a TMA load lambda
        self._in_flight: set[int] = set()                   # mma ops left in flight (an Overlap's step)
        self._ring_loads: dict[int, tuple] = {}             # split ring: TMA load op id -> (group, its bytes)
        self._acquired: set[int] = set()                    # split ring: groups acquired in this load lambda
        self._emitted_prologue: list = []                   # prologue loads the producer issued so far (this tile)
        self._late_publish = False                          # loads issued whose wait the next ring_open does
        self._pending: list | None = None                   # a deferring compute region's wgmma in flight (DeferredWaits)
        self._producers: dict = {}

    def register_layouts(self, program: Program) -> dict:
        return dict(self.plan.layouts)          # the layout pass ran once, for the plan (a copy: the base emitter's)

    def fuses_masks(self, v) -> bool:
        return True            # hk::where_at and the mask predicates take any register-tile layout (masks.cuh)

    # ---- a softmax's scale folded into its row max and its exp2 argument (Plan.folded_scales)
    def op_reduce(self, op):
        if id(op) not in self.plan.folded_scales:
            return super().op_reduce(op)
        x, c = self.plan.folded_scales[id(op)]
        self._result(op, f"hk::reduce_scaled({{dst}}, {self.name(x)}, {self.name(c)});")

    def op_binary(self, op):
        if id(op) not in self.plan.folded_scales:
            return super().op_binary(op)
        if op.attrs["op"] == "sub":               # the mul itself is not emitted: its two readers fold it
            x, c, v = self.plan.folded_scales[id(op)]
            self._result(op, f"hk::fms_rows({{dst}}, {self.name(x)}, {self.name(c)}, {self.name(v)});")

    # ---- the schedule pass's decisions (schedule.py)
    def extra_params(self) -> list[str]:
        out = []
        if self.plan.uses_tma:
            out = [f"const __grid_constant__ hk::tmap hk_tm{i}" for i in range(len(self.plan.tensor_maps))]
            out.append("int hk_tma_ok")
        if self.plan.persistent:            # the logical grid: the launch runs at most one block per SM over it
            out += ["int hk_grid_x", "int hk_grid_y", "int hk_grid_z"]
        return out

    def launch_extras(self) -> dict:
        out = {"tma": [m.to_json() for m in self.plan.tensor_maps]} if self.plan.uses_tma else {}
        if self.plan.hand_over:
            out["hand_over_registers"] = self.plan.hand_over.block
        if self.plan.persistent:
            out["persistent"] = True
        if self.plan.producer_warps:
            out["producer_warps"] = self.plan.producer_warps   # a specialised block: it runs alone on its SM
        if self.plan.dispatch_axis is not None:
            out["dispatch_axis"] = self.plan.dispatch_axis     # heaviest first (hk::heavy_first_idx)
        if self.plan.ring_runs:
            out["ring_runs"] = len(self.plan.ring_runs)        # pipelines sharing one ring (schedule._ring_runs)
        return out

    def op_block_idx(self, op):
        if not self.plan.persistent:
            return super().op_block_idx(op)
        self.line(f"const int {self.name(op.result)} = hk_tiles.idx<{op.attrs['axis']}>(hk_tile);")

    def op_num_blocks(self, op):
        if not self.plan.persistent:
            return super().op_num_blocks(op)
        self.line(f"const int {self.name(op.result)} = hk_grid_{'xyz'[op.attrs['axis']]};")

    def mma_template_args(self, op):
        mode = dataflow.MMA_ASYNC if id(op) in self._in_flight else self.plan.mma_modes.get(id(op), dataflow.MMA_STANDALONE)
        base = super().mma_template_args(op)
        if mode == dataflow.MMA_DEFERRED:       # the library's MODE 2: left in flight (before_op waits for it)
            mode = dataflow.MMA_ASYNC
        return base if mode == dataflow.MMA_STANDALONE else f"{base}, {mode}"

    def op_global_to_shared(self, op):
        if self._tma_loads is None or id(op) not in self._tma_loads:
            return super().op_global_to_shared(op)
        st, gl, *idx = op.operands
        bar = "hk_bar"
        if id(op) in self._ring_loads:          # split ring: the group's stage, acquired before its first copy
            g, tx = self._ring_loads[id(op)]
            bar = f"hk_bar{g}"
            if g not in self._acquired:
                self._acquired.add(g)
                self.line(f"hk::u64* {bar} = hk::ring_acquire<{self._stages}>({self._ring('full', g)}, "
                          f"{self._ring('empty', g)}, hk_it, {tx});")
        self.line(f"hk::tma_load({self.name(st)}, hk_tm{self._tma_loads[id(op)]}, {bar}, {self.args(idx)});")

    # ---- a split ring (plan.RingGroup): each group of staged buffers waits and releases on its own
    def _ring(self, which: str, g: int) -> str:
        return f"hk_{which} + {g * self._stages}"

    def _ring_wait(self, g: int, it: str = "hk_it") -> None:
        self.line(f"hk::ring_wait<{self._stages}>({self._ring('full', g)}, {it});")

    def _ring_release(self, g: int, it: str = "hk_it") -> None:
        self.line(f"hk::ring_release<{self._stages}>({self._ring('empty', g)}, {it});")

    def emit_ops(self, ops, in_pipeline_load: bool = False) -> None:
        if self._hoisted:                       # computed before the tile loop (_tiles)
            ops = [o for o in ops if id(o) not in self._hoisted]
        if self.plan.prologue and any(id(o) in self.plan.prologue for o in ops):
            for op in ops:                      # only the consumers emit these (the producer: _prologue_load)
                if id(op) in self.plan.prologue:
                    self._prologue_wait(op, in_pipeline_load)
                else:
                    self.emit_ops([op], in_pipeline_load)
            return
        if self.plan.ring_runs and not in_pipeline_load:
            return self._emit_around_rings(ops)
        return super().emit_ops(ops, in_pipeline_load)

    def _emit_around_rings(self, ops) -> None:
        """Ops one at a time, as a run's ring_open may hoist some (Plan.ring_hoist); the loads in
        Plan.late_publish are issued without their wait and barrier: the run's ring_open publishes them after
        its own first copies (hk::publish_copies)."""
        for op in ops:
            if id(op) in self._hoisted:
                continue
            if id(op) in self.plan.late_publish:
                self.line("hk::sync();")           # earlier readers of the buffer are done
                getattr(self, "op_" + op.opcode)(op)
                self._late_publish = True
            else:
                super().emit_ops([op])

    @property
    def _stages(self) -> int:
        return next(op.attrs["stages"] for op in self.p.body.walk() if op.opcode == "pipeline")

    def op_pipeline(self, op):
        pp = self.plan.pipelines.get(id(op))
        if pp is None or pp.schedule != "tma":
            return super().op_pipeline(op)
        n, *inits = op.operands
        lreg, creg = op.regions
        carry = self._carry_vars(op, inits)
        uid = self.pipeline_uid(op)
        self.load_lambda(f"hk_load{uid}", lreg)
        stages, async_mma = op.attrs["stages"], "true" if pp.async_mma else "false"
        if self.plan.producer_warps and pp.groups:
            self._split_consumer(op, pp, carry, uid)
            return self._prologue_release(op)
        if self.plan.producer_warps:     # the consumers' side; the producer's is in _specialised_body
            self.compute_lambda(f"hk_compute{uid}", creg, carry)
            self.line(f"if (hk_tma_ok != 0) hk::ws_consume<{stages}, {async_mma}>({self.name(n)}, hk_it, "
                      f"hk_full, hk_empty, hk_compute{uid});")
            self.line(f"else hk::pipeline<{stages}>({self.name(n)}, hk_load{uid}, hk_compute{uid});")
            return self._prologue_release(op)
        run = next((r for r in self.plan.ring_runs if id(op) in r), None)
        if run is not None:
            return self._ring_pipeline(op, pp, run, carry)
        self._tma_load_lambda(op, pp)
        self.compute_lambda(f"hk_compute{uid}", creg, carry)
        self.line(f"hk::pipeline_tma<{stages}, {pp.tx_bytes}, {async_mma}>({self.name(n)}, hk_tma_ok != 0, "
                  f"hk_load{uid}, hk_load_tma{uid}, hk_compute{uid});")

    # ---- a run of pipelines on one ring (schedule._ring_runs; hk::ring_open / ring_steps / ring_close)
    def _ring_pipeline(self, op, pp, run: tuple, carry: list[str]) -> None:
        """One pipeline of a run: the run's first opens the ring (every pipeline's load lambdas, its trip counts and
        the loader by global step are emitted there), each runs its steps, the last closes the ring. Without
        tensor maps each pipeline runs on its own cp.async ring, as outside a run."""
        pipes = {id(o): o for o in self.p.body.ops if o.opcode == "pipeline"}
        r, stages, uid = self.plan.ring_runs.index(run), op.attrs["stages"], self.pipeline_uid(op)
        full, empty, it = f"hk_rfull{r}", f"hk_rempty{r}", f"hk_rit{r}"
        count = {p: f"hk_rn{r}_{k}" for k, p in enumerate(run)}
        if id(op) == run[0]:
            first, last = (self.p.body.ops.index(pipes[p]) for p in (run[0], run[-1]))
            hoisted = set(self.plan.ring_hoist)
            hoist = [o for o in self.p.body.ops[first:last] if id(o) in hoisted]
            self.emit_ops(hoist)                   # later pipelines' trip counts, before the ring's first copies
            self._hoisted = self._hoisted | {id(o) for o in hoist}
            for p in run:                          # (each pipeline's cp.async form: op_pipeline, at its place)
                o = pipes[p]
                self._tma_load_lambda(o, self.plan.pipelines[p])
                n = self.name(o.operands[0])
                self.line(f"const int {count[p]} = {n} > 0 ? {n} : 0;")
            self.line(f"const int hk_rtotal{r} = {' + '.join(count.values())};")
            self.line(f"auto hk_rload{r} = [&](int hk_t, int hk_s, hk::u64* hk_bar) {{")
            for p in run[:-1]:
                self.line(f"  if (hk_t < {count[p]}) return hk_load_tma{self.pipeline_uid(pipes[p])}(hk_t, hk_s, hk_bar);")
                self.line(f"  hk_t -= {count[p]};")
            self.line(f"  hk_load_tma{self.pipeline_uid(pipes[run[-1]])}(hk_t, hk_s, hk_bar);")
            self.line("};")
            self.line(f"__shared__ hk::u64 {full}[{stages}], {empty}[{stages}];")
            self.line(f"int {it} = 0;")
            self.line(f"if (hk_tma_ok != 0) hk::ring_open<{stages}, {pp.tx_bytes}>({full}, {empty}, hk_rtotal{r}, hk_rload{r});")
            if self._late_publish:
                self.line("hk::publish_copies();   // the loads before the run, in flight with its first copies")
                self._late_publish = False
        self.compute_lambda(f"hk_compute{uid}", op.regions[1], carry)
        async_mma = "true" if pp.async_mma else "false"
        self.line(f"if (hk_tma_ok != 0) hk::ring_steps<{stages}, {pp.tx_bytes}, {async_mma}>({full}, {empty}, {it}, "
                  f"hk_rtotal{r}, {count[id(op)]}, hk_rload{r}, hk_compute{uid});")
        self.line(f"else hk::pipeline<{stages}>({count[id(op)]}, hk_load{uid}, hk_compute{uid});")
        if id(op) == run[-1]:
            self.line(f"if (hk_tma_ok != 0) hk::ring_close<{stages}>({full}, {empty});")

    def _split_consumer(self, op, pp, carry: list[str], uid: int) -> None:
        """The consumers of a pipeline on FA3's split ring: the step lambdas wait for each group's stage and release
        it where the head and the tail are issued and retired (_overlap_step); the cp.async fallback skips the ring."""
        n, stages = self.name(op.operands[0]), op.attrs["stages"]
        creg = op.regions[1]
        self.compute_lambda(f"hk_compute{uid}", creg, carry)
        self._overlap_lambdas(creg, pp.overlap, carry, uid)
        bracket = "false" if self.plan.free_turns else "true"
        publish = ", false" if self.plan.free_turns else ""
        self.line(f"if (hk_tma_ok != 0) {{ hk::ws_consume_overlap_split<{stages}, {bracket}{publish}>({n}, hk_it, "
                  f"hk_first{uid}, hk_step{uid}, hk_last{uid}); hk::fence_operand({carry[pp.overlap.carry]}); }}")
        self.line(f"else hk::pipeline<{stages}>({n}, hk_load{uid}, hk_compute{uid});")

    def _overlap_lambdas(self, creg, ov: dataflow.Overlap, carry: list[str], uid: int) -> None:
        """The software-pipelined form of a compute region (dataflow.Overlap): `hk_tail<uid>(s)` runs the
        tail on stage s from the snapshots of the crossing values; `hk_step<uid>(i, s)` issues the head, runs
        the previous step's tail (stage prev), waits for the head only, runs the rest of the step while the
        tail's product is in flight, retires it and snapshots what its own tail will read; `hk_first<uid>`
        is step 0, with no tail before it; `hk_last<uid>` the last step's tail. No branch separates an issue from
        its wait: ptxas serialises every wgmma of the kernel when a control-flow merge might read an accumulator
        in flight."""
        acc = carry[ov.carry]
        snaps = [(v, f"hk_x{uid}_{k}") for k, v in enumerate(ov.crossing)]
        for v, snap in snaps:
            self.line(f"{self.ctype(v.type, v)} {snap};")
        self._in_flight = {id(ov.head), id(ov.mma)}
        try:
            self.line(f"auto hk_tail{uid} = [&](int {self.name(creg.args[1])}) {{")
            self.indent += 1
            self._bind_args([creg.args[2 + ov.carry], *(v for v, _ in snaps)], [acc, *(n for _, n in snaps)])
            self.emit_ops(ov.tail)
            self.line(f"{acc} = {self.name(ov.mma.result)};")
            self.indent -= 1
            self.line("};")
            self._overlap_step(f"hk_first{uid}", creg, ov, carry, snaps, None)
            self._overlap_step(f"hk_step{uid}", creg, ov, carry, snaps, f"hk_tail{uid}")
            self._overlap_last(f"hk_last{uid}", f"hk_tail{uid}", acc)
        finally:
            self._in_flight = set()

    def _turn(self, edge: str) -> None:
        self.line(f"hk::turn_{edge}<{self.p.num_warps // 4}>();")

    def _overlap_last(self, name: str, tail: str, acc: str) -> None:
        """A split ring's last tail: wait for its V (group 1), issue it in turn, retire it, release V."""
        self.line(f"auto {name} = [&](int hk_s) {{")
        self.indent += 1
        self._ring_wait(1)
        self._turn("wait")
        self.line(f"{tail}(hk_s);")
        self._turn("pass")
        self.line("hk::wgmma_wait<0>();")
        self.line(f"hk::fence_operand({acc});")
        self._ring_release(1)
        self.indent -= 1
        self.line("};")

    def _overlap_step(self, name: str, creg, ov: dataflow.Overlap, carry: list[str], snaps, tail: str | None):
        """Step 0 (tail None) or step i of the software-pipelined compute on the split ring (group 0 read by the
        head, group 1 by the tail): wait for K of this step and V of the last before the products are issued (in
        this warpgroup's turn), release K once the head retired, V once the tail did."""
        ci, cs = (self.name(a) for a in creg.args[:2])
        self.line(f"auto {name} = [&](int {ci}, int {cs}" + (", int hk_prev) {" if tail else ") {"))
        self.indent += 1
        self._bind_args(creg.args[2:], carry)
        in_tail = {id(o) for o in ov.tail}
        step = [o for o in creg.ops if id(o) not in in_tail]
        h = next(k for k, o in enumerate(step) if o is ov.head) + 1
        self._ring_wait(0)
        if tail:
            self._ring_wait(1, "hk_it - 1")
        self._turn("wait")
        self.emit_ops(step[:h])
        if tail:
            self.line(f"{tail}(hk_prev);")
        self._turn("pass")
        self.line(f"hk::wgmma_wait<{1 if tail else 0}>();")
        self.line(f"hk::fence_operand({self.name(ov.head.result)});")
        self._ring_release(0)
        late = {id(o) for o in ov.late}
        late_results = {r.id for o in ov.late for r in o.results}
        self.emit_ops([o for o in step[h:] if id(o) not in late])
        if tail:
            self.line("hk::wgmma_wait<0>();")
            self.line(f"hk::fence_operand({carry[ov.carry]});")
            # the late ops' f32 inputs pass the fence too, or the compiler hoists them above the wait
            inputs = {v.id: v for o in ov.late for v in o.operands if _fenceable(v) and v.id not in late_results}
            for v in inputs.values():
                self.line(f"hk::fence_operand({self.name(v)});")
            self._ring_release(1, "hk_it - 1")
        self.emit_ops(ov.late)
        for v, snap in snaps:
            self.line(f"{snap} = {self.name(v)};")
        self._yield_some(creg, carry, [k for k in range(len(carry)) if k != ov.carry])
        self.indent -= 1
        self.line("};")

    def _yield_some(self, creg, carry: list[str], keep: list[int]) -> None:
        """The yields of carries `keep` (a yield that is itself a carry argument goes through a temporary)."""
        for k in keep:
            self.line(f"auto hk_tmp{k} = {self.name(creg.yields[k])};")
        for k in keep:
            self.line(f"{carry[k]} = hk_tmp{k};")

    def _tma_load_lambda(self, op, pp) -> None:
        """The TMA form of a load region; on a split ring it takes (i, s) and acquires each group's stage."""
        self._tma_loads = pp.tma_loads
        self._ring_loads = {g2s: (k, g.tx_bytes) for k, g in enumerate(pp.groups) for g2s in g.loads}
        self._acquired = set()
        try:
            self.load_lambda(f"hk_load_tma{self.pipeline_uid(op)}", op.regions[0],
                             "" if pp.groups else ", hk::u64* hk_bar")
        finally:
            self._tma_loads, self._ring_loads = None, {}

    # ---- a warp-specialised kernel (Plan.producer_warps: schedule._not_specialisable)
    def region(self, reg, in_pipeline_load: bool = False) -> None:
        if self.plan.producer_warps and reg is self.p.body:
            return self._specialised_body(reg)
        return super().region(reg, in_pipeline_load)

    def _specialised_body(self, body) -> None:
        """One ring of stage barriers for every pipeline; the producer warpgroup runs the Program's scalars
        and each pipeline's TMA loads into the ring, then exits; the consumers run the Program with each
        pipeline waiting on the ring (or, where the launch could not encode the tensor maps, the ring of
        cp.async copies, the producer having left at once)."""
        stages = self._stages
        bars = stages * self.plan.ring_groups + (self.plan.prologue_stages if self.plan.prologue else 0)
        _, producer, consumer = self.plan.hand_over or (0, 0, 0)     # setmaxnreg's counts (0: no hand-over)
        self.line(f"__shared__ hk::u64 hk_full[{bars}], hk_empty[{bars}];")
        self.line(f"hk::ws_init<{bars}>(hk_full, hk_empty);")
        self.line("int hk_it = 0;                     // steps of the ring so far")
        self.line("if (hk::producer_thread()) {")
        self.indent += 1
        self.line(f"hk::setmaxnreg_dec<{producer}>();")
        self.line("if (hk_tma_ok != 0 && threadIdx.x == HK_NUM_THREADS) {")
        self.indent += 1
        with self._tiles():
            for op in body.ops:
                if id(op) in self.plan.producer_runs:
                    self.emit_ops([op])
                elif id(op) in self.plan.prologue:
                    self._prologue_load(op)
                elif op.opcode == "pipeline":
                    pp = self.plan.pipelines[id(op)]
                    self._tma_load_lambda(op, pp)
                    if pp.groups:
                        self.line(f"hk::ws_produce_split<{stages}>({self.name(op.operands[0])}, hk_it, "
                                  f"hk_load_tma{self.pipeline_uid(op)});")
                        continue
                    self.line(f"hk::ws_produce<{stages}, {pp.tx_bytes}>({self.name(op.operands[0])}, hk_it, "
                              f"hk_full, hk_empty, hk_load_tma{self.pipeline_uid(op)});")
        self.indent -= 1
        self.line("}")
        self.line("hk::exit_thread();")
        self.indent -= 1
        self.line("}")
        self.line(f"hk::setmaxnreg_inc<{consumer}>();")
        if self.plan.free_turns:
            self._turns("begin", "the ping-pong's turns run on across pipelines and tiles")
        with self._tiles():
            super().region(body)
            if self.plan.persistent and self.plan.tma_fed:
                self.line("if (hk_tma_ok == 0) hk::sync();  // the consumers loaded this tile's buffers themselves")
            elif self.plan.persistent:
                self.line("hk::sync();                      // every consumer is done with this tile's buffers")
        if self.plan.tma_stores or self.plan.tma_reduces:
            self.line(f"if (hk_tma_ok & {tma.STORES_OK | tma.REDUCE_OK | tma.REDUCE_T_OK}) hk::store_tma_drain();"
                      "   // the TMA stores and adds have read shared memory")
        if self.plan.free_turns:
            self._turns("end", "warpgroup 0 takes the last hand-over back: every turn barrier balances")

    def _turns(self, edge: str, why: str) -> None:
        self.line(f"hk::turns_{edge}<{self.p.num_warps // 4}>();   // {why}")

    # ---- loads before the pipelines, on the producer (Plan.prologue: attention's Q)
    def arena(self, program: Program, buffers: list) -> tuple[list[int], int]:
        offsets, total = resources.arena_layout(footprint.slots(self.p, self.plan, buffers), self.smem_align)
        if len(offsets) > len(buffers):
            self._store_stage = offsets.pop()           # the TMA stores' staging area
        return offsets, total

    def op_register_to_global(self, op):
        """A store the schedule put on TMA (Plan.tma_stores), where the launch encoded its tensor map; else plain."""
        if id(op) not in self.plan.tma_stores:
            return super().op_register_to_global(op)
        gl, src, *idx = op.operands
        bufs = footprint.tma_store_buffers(self.p, self.plan)
        self.line(f"if (hk_tma_ok & {tma.STORES_OK}) hk::store_tma<{bufs}>(hk_smem + {self._store_stage}, hk_tm{self.plan.tma_stores[id(op)]}, "
                  f"{self.name(src)}, {self.args(idx)});")
        self.line("else")
        self.indent += 1
        super().op_register_to_global(op)
        self.indent -= 1

    def publishes(self, write, after) -> bool:
        """A register -> shared store right before a standalone wgmma: the wgmma's own fence.proxy.async and barrier
        (hk::mma_wgmma MODE 0) make the store visible to every consumer and to the tensor cores, so the store's
        barrier after it would be a second one in a row (attention_bwd's dSᵀ before dQ: one barrier a step fewer)."""
        return (write.opcode == "register_to_shared" and after is not None and after.opcode == "mma"
                and archs.of(self.target).async_tensor_core and dataflow.wgmma_eligible(after, self.p.num_warps)
                and self.plan.mma_modes.get(id(after), dataflow.MMA_STANDALONE) == dataflow.MMA_STANDALONE
                and id(after) not in self._in_flight)

    def op_atomic_add(self, op):
        """An add the schedule put on TMA reduce-add (Plan.tma_reduces): the transposed form where the launch encoded
        that map, else the as-viewed chunks, added by TMA where the launch encoded that map and by every thread from
        shared memory where neither (two code paths: a third, the atomics from registers, cost spills)."""
        if id(op) not in self.plan.tma_reduces:
            return super().op_atomic_add(op)
        gl, src, *idx = op.operands
        bufs = footprint.tma_store_buffers(self.p, self.plan)
        stage, args = f"hk_smem + {self._store_stage}", f"{self.name(src)}, {self.args(idx)}"
        viewed, transposed = self.plan.tma_reduces[id(op)]
        if transposed >= 0:
            self.line(f"if (hk_tma_ok & {tma.REDUCE_T_OK}) hk::reduce_tma<{bufs}>({stage}, hk_tm{transposed}, "
                      f"{args});")
            self.line("else")
        self.line(f"    hk::reduce_viewed<{bufs}>({stage}, (hk_tma_ok & {tma.REDUCE_OK}) ? &hk_tm{viewed} : nullptr, "
                  f"{self.name(gl)}, {args});")

    def op_alloc_shared(self, op):
        """A prologue buffer with copies: this tile's copy (hk_round counts the block's tiles)."""
        if self.plan.prologue_stages == 1 or id(op) not in self.plan.prologue_buffers:
            return super().op_alloc_shared(op)
        stride = footprint.prologue_stride(op.result)
        self.line(f"{self.decl(op.result)}(hk_smem + {self.smem_offsets[op.result]} + "
                  f"hk_round % {self.plan.prologue_stages} * {stride});   // this tile's copy")

    @property
    def _prologue_bar(self) -> int:
        return self._stages * self.plan.ring_groups

    def _prologue_load(self, op) -> None:
        """The producer's side: acquire the prologue's barrier pair for this tile (once the consumers released
        the last tile's), then the TMA copy."""
        if not self._emitted_prologue:          # the tile's first prologue load acquires the pair
            self.line(f"hk::u64* hk_pbar = hk::ring_acquire<{self.plan.prologue_stages}>(hk_full + {self._prologue_bar}, "
                      f"hk_empty + {self._prologue_bar}, hk_round, {self.plan.prologue_tx});")
        self._emitted_prologue.append(op)
        st, gl, *idx = op.operands
        self.line(f"hk::tma_load({self.name(st)}, hk_tm{self.plan.prologue[id(op)]}, hk_pbar, {self.args(idx)});")

    def _prologue_wait(self, op, in_pipeline_load: bool) -> None:
        """The consumers' side: wait for the producer's copy; without tensor maps, load it themselves."""
        self.line(f"if (hk_tma_ok != 0) hk::ring_wait<{self.plan.prologue_stages}>(hk_full + {self._prologue_bar}, hk_round);")
        self.line("else {")
        self.indent += 1
        super().emit_ops([op], in_pipeline_load)
        self.indent -= 1
        self.line("}")

    def _prologue_release(self, op) -> None:
        """After the last pipeline reading the prologue's buffers (persistent blocks only: nobody waits otherwise)."""
        pipes = [o for o in self.p.body.ops if o.opcode == "pipeline"]
        if self.plan.prologue and self.plan.persistent and op is pipes[-1]:
            self.line(f"if (hk_tma_ok != 0) hk::ring_release<{self.plan.prologue_stages}>(hk_empty + {self._prologue_bar}, "
                      "hk_round);   // this copy may take a later tile's Q")

    @contextmanager
    def _tiles(self):
        """A persistent kernel's loop over its tiles around what is emitted inside (nothing otherwise);
        `hk_round` counts the tiles this block walked (the prologue barrier's phase); hk::dealt_tile deals them."""
        self._emitted_prologue = []
        if not self.plan.persistent:
            if self.plan.prologue:
                self.line("const int hk_round = 0;")
            yield
            return
        # once per block: the grid's dividers, the tile-invariant scalars and dividers by them
        self.line("const hk::tile_grid hk_tiles(hk_grid_x, hk_grid_y, hk_grid_z);")
        invariant = set(self.plan.tile_invariant)
        ops, divisors = [o for o in self.p.body.ops if id(o) in invariant], self.plan.tile_dividers
        self.emit_ops(ops)
        for v in divisors:
            self.line(f"const hk::divider {self._divider_name(v)}({self.name(v)});")
        self._hoisted, self._dividers = frozenset(id(o) for o in ops), frozenset(divisors)
        self.line("for (long long hk_k = 0;; ++hk_k) {")
        self.indent += 1
        self.line("const long long hk_tile = hk::dealt_tile(hk_k, blockIdx.x, gridDim.x);")
        self.line("if (hk_tile >= hk_tiles.count) break;")
        if self.plan.prologue:
            self.line("const int hk_round = (int)hk_k;")
        try:
            yield
        finally:
            self._hoisted, self._dividers = frozenset(), frozenset()
        self.indent -= 1
        self.line("}")

    _hoisted: frozenset = frozenset()          # ops _tiles emitted before the loop
    _dividers: frozenset = frozenset()         # values a divider built before the loop divides by

    def _divider_name(self, v) -> str:
        return f"hk_by_{self.name(v)}"

    def op_scalar_binary(self, op):
        a, b = op.operands
        if op.attrs["op"] in ("floordiv", "mod") and b in self._dividers:
            fn = "floordiv" if op.attrs["op"] == "floordiv" else "floormod"
            self.line(f"const {self.decl(op.result)} = {self._divider_name(b)}.{fn}({self.name(a)});")
            return
        super().op_scalar_binary(op)

    def num_threads(self, program: Program) -> int:
        return num_warps(program, self.target) * self.lanes

    def block_threads(self, program: Program) -> int:
        return self.num_threads(program) + self.plan.producer_warps * self.lanes

    def kernel_qualifiers(self, num_threads: int) -> str:
        min_blocks = self.plan.min_blocks
        bounds = f"{num_threads}, {min_blocks}" if min_blocks else f"{num_threads}"
        return f"extern \"C\" __global__ __launch_bounds__({bounds})"

    def smem_arena(self, shared_bytes: int) -> str:
        return f"HK_SMEM_ARENA(hk_smem, {shared_bytes});"

    def prelude(self, program: Program, num_threads: int, shared_bytes: int) -> str:
        warps = self.num_threads(program) // self.lanes
        scratch = scratch_bytes(program, warps, self.layouts)
        arch = self.target.arch
        return "\n".join([
            f"// generated by hk_portable's cuda backend for {arch}; device library {library_hash()}",
            f"#define HK_NUM_THREADS {warps * self.lanes}",
            f"#define HK_NUM_WARPS {warps}",
            f"#define HK_PRODUCER_WARPS {self.plan.producer_warps}",
            f"#define HK_SCRATCH_OFFSET {resources.scratch_offset(shared_bytes)}",
            f"#define HK_SCRATCH_BYTES {scratch}",
            f"#define HK_ASYNC_TENSOR_CORE {1 if archs.of(self.target).async_tensor_core else 0}",
            f"#define HK_BLOCK_GROUPED {1 if self.plan.grouped_blocks else 0}",
            f"#define HK_WORK_AXIS {-1 if self.plan.work_axis is None else self.plan.work_axis}",
            f"#define HK_DISPATCH_AXIS {-1 if self.plan.dispatch_axis is None else self.plan.dispatch_axis}",
            f"#define HK_LONGEST_FIRST_MIN {self.plan.longest_first}",
            f"#define HK_FAST_EXP2 {1 if self.plan.fast_exp2 else 0}",
            "#define HK_SMEM_ARENA(name, bytes) unsigned char* name = hk::smem_base()",
            header_text(),
            wgmma.render(program),
        ])


def _fenceable(v) -> bool:
    """A value hk::fence_operand takes: an f32 register tile in the fragment layout."""
    t = v.type
    return isinstance(t, TileType) and t.space == "rt" and t.dtype.name == "f32"


def emit(program: Program, target: Target, plan: Plan) -> tuple[EmittedKernel, int]:
    """The generated kernel and the dynamic shared memory it launches with (buffers + scratch): `program` rendered
    by `plan`, schedule.plan's for it on `target`."""
    em = CudaEmitter(target, plan)
    out = em.emit(program)
    warps = em.num_threads(program) // em.lanes
    return out, resources.shared_bytes(out.shared_bytes, scratch_bytes(program, warps, em.layouts)) + base_slack(target)
