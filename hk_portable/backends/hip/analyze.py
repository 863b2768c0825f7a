"""The ISA analyser behind `hk analyze KERNEL --backend hip`: how fast can the emitted loop issue?

No AMD GPU exists here, so AMD speed is judged from the assembly the pinned clang emits. For one kernel
this module

  * builds the control-flow graph (blocks start at labels, at LLVM's `; %bb.N:` lines and after
    branches) and finds its natural loops: a back edge is a branch to a block that dominates its source,
    and the loop is its header plus every block reaching the back edge without passing the header. A
    branch backward in the layout is not enough: LLVM rotates loops, placing blocks before the header
    and jumping back to them from the latch. Loops nest by containment (depth 1 = outermost); the main
    loop has the most MFMA (ties: the deeper, then the smaller one);
  * counts each loop's instructions by class (MFMA by variant, VALU, transcendental, SALU, SMEM, LDS
    reads / writes / other with bytes, global/buffer/flat loads, stores and atomics, LDS-DMA loads,
    s_waitcnt and how many wait for vmcnt(0) / lgkmcnt(0), s_barrier, s_setprio, sched barriers) twice:
    `all_paths`, every instruction of the loop once, and `one_trip`, the blocks of one steady-state
    iteration (see one_trip);
  * for the trip, counts the MFMAs between each global load and the s_waitcnt that covers it
    (`load_waits`: does the prefetch overlap the matrix cores?);
  * reports resource use (from the metadata compiler.py parses) and waves per SIMD;
  * computes two issue-rate bounds (costs.py): `bound`, MFMA clocks / max(MFMA, VALU, LDS clocks), against
    the MFMA instructions chosen (a loop of half-rate forms reads 1.0), and `bound_vs_peak`, the loop's MFMA
    FLOPs at the arch's peak rate for their operand kind over the same clocks: the fraction of the chip's
    matrix peak the loop could reach if nothing but instruction issue limited it. Their ratio is the
    `form_efficiency` of the MFMA forms used.

Assumptions (the figures are a static model, not a measurement -- no AMD hardware measured them):
  * `all_paths` counts edge-tile code a full tile skips, so it bounds one iteration's issue from above;
    `one_trip` is chosen by a rule (every MFMA, the most 16-byte loads, no narrower ones, the most LDS
    writes outside EXEC-masked code, the least other work), not by
    knowing which branches the data takes;
  * clocks are per wave per iteration on one SIMD. MFMA and VALU of one SIMD are separate pipes
    (they may overlap), so the slowest pipe bounds the loop. The LDS serves the CU's 4 SIMDs: a
    wave's share is a quarter of the CU's bytes/clock, every SIMD running the same loop;
  * LDS cost is dword-granular: a lane access of fewer than 4 bytes costs a bank cycle like 4 bytes;
    LDS-DMA loads (buffer_load ... lds, global_load_lds_*) count as LDS writes of their bytes;
    all 64 lanes active; bank conflicts are not modelled;
  * dependency stalls, waits for memory, instruction-cache and SALU issue are not modelled.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import compiler
from .archs import ARCHS
from .costs import (
    QUARTER_RATE,
    QUARTER_RATE_CYCLES,
    SIMDS_PER_CU,
    TRANSCENDENTAL,
    VALU_CYCLES,
    clocks,
    mfma_cycles,
    table,
)

# MFMA cycles, the matrix peak and LDS bytes per clock: the arch's row (archs.Arch); VALU, transcendental and
# quarter-rate costs and the clock arithmetic: costs.py, which cites their sources.

# Waves per SIMD: gfx90a and later have one 512-entry register file per lane per SIMD shared by VGPRs
# and AGPRs (a wave holds at most 512: 256 VGPRs + 256 AGPRs, CDNA3/CDNA4 ISA guides), allocated in
# blocks of 8, at most 8 waves per SIMD (LLVM AMDGPUBaseInfo: getVGPRAllocGranule = 8 and
# getMaxWavesPerEU = 8 for gfx90a+; LLVM's `; Occupancy:` agrees, see the tests). LDS per CU: 64 KiB
# gfx942, 160 KiB gfx950 (archs.py).
VGPRS_PER_SIMD_LANE = 512
VGPR_GRANULE = 8
MAX_WAVES_PER_SIMD = 8

# ------------------------------------------------------------------------------------------- parsing
_LABEL = re.compile(r"^([.\w$]+):")
_INSTR = re.compile(r"^\s+([a-z][a-z0-9_]*)\b\s*([^;]*)(?:;(.*))?")
_SCHED = re.compile(r";\s*(sched_barrier|sched_group_barrier|iglp_opt)\b")
_WAIT = re.compile(r"\b(vmcnt|lgkmcnt|expcnt)\((\d+)\)")
_SIZE = re.compile(r"_(dwordx4|dwordx3|dwordx2|dword|b128|b96|b64|b32|b16|b8|u16|i16|u8|i8|"
                   r"ushort|sshort|short|ubyte|sbyte|byte|u32|i32|f32|f64|u64|i64|f16|bf16)(?=_|$)")
_SIZE_BYTES = {"dwordx4": 16, "dwordx3": 12, "dwordx2": 8, "dword": 4, "b128": 16, "b96": 12, "b64": 8,
               "b32": 4, "u32": 4, "i32": 4, "f32": 4, "f64": 8, "u64": 8, "i64": 8, "b16": 2, "u16": 2,
               "i16": 2, "f16": 2, "bf16": 2, "ushort": 2, "sshort": 2, "short": 2, "b8": 1, "u8": 1,
               "i8": 1, "ubyte": 1, "sbyte": 1, "byte": 1}


@dataclass
class Instr:
    line: int            # index in the kernel's text
    op: str
    operands: str
    comment: str = ""    # LLVM's note after the instruction (a spill's "4-byte Folded Spill")


@dataclass
class Block:
    """A basic block: from a label, an LLVM `; %bb.N:` line or the instruction after a branch."""
    name: str
    start: int                                        # line of its first line
    instrs: list[Instr] = field(default_factory=list)
    sched_barriers: int = 0
    succs: list[int] = field(default_factory=list)    # indices into the block list


@dataclass
class Loop:
    """A natural loop: the header and every block that reaches a back edge to it without passing it."""
    header: int
    blocks: set[int]
    latches: set[int]
    depth: int = 1
    parent: int | None = None                         # header of the enclosing loop


def kernel_text(asm: str, name: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The lines of kernel `name` (or of the first function) from its label to its end marker, and
    LLVM's `; Key: value` comments about it (printed after the function: TotalNumVgprs, Occupancy)."""
    lines = asm.splitlines()
    starts = [i for i, ln in enumerate(lines) if _is_function(ln) and (name is None or ln.split(":")[0] == name)]
    if not starts:
        raise ValueError(f"no kernel {name!r} in the assembly" if name else "no function in the assembly")
    body, notes, ended = [], {}, False
    for ln in lines[starts[0]:]:
        if ended and _is_function(ln):
            break
        if ln.startswith(".Lfunc_end") or "; -- End function" in ln:
            ended = True
        if not ended:
            body.append(ln)
        elif m := re.match(r"^; (\w+):\s*(\S+)", ln):
            notes.setdefault(m.group(1), m.group(2))
    return body, notes


def _is_function(line: str) -> bool:
    m = _LABEL.match(line)
    return m is not None and not m.group(1).startswith(".")


_ENDS_BLOCK = ("s_branch", "s_cbranch_", "s_endpgm", "s_setpc", "s_trap")


def parse(lines: list[str]) -> list[Block]:
    """The kernel's basic blocks in layout order, with their successors."""
    blocks: list[Block] = [Block("entry", 0)]
    aliases: dict[str, int] = {}                      # labels of empty blocks: branches to them land on the next
    for i, ln in enumerate(lines):
        label = _LABEL.match(ln)
        bb = re.match(r"^\s*; (%bb\.\d+):", ln)
        if label or bb:
            name = label.group(1) if label else bb.group(1)
            if blocks[-1].instrs or blocks[-1].sched_barriers:
                blocks.append(Block(name, i))
            else:                                     # an empty block: the label names it
                aliases[blocks[-1].name] = len(blocks) - 1
                blocks[-1].name, blocks[-1].start = name, i
        elif _SCHED.search(ln):
            blocks[-1].sched_barriers += 1
        elif (m := _INSTR.match(ln)) and not ln.lstrip().startswith("."):
            if blocks[-1].instrs and blocks[-1].instrs[-1].op.startswith(_ENDS_BLOCK):
                blocks.append(Block(f"line{i}", i))
            blocks[-1].instrs.append(Instr(i, m.group(1), m.group(2).strip(), (m.group(3) or "").strip()))
    index = {**aliases, **{b.name: n for n, b in enumerate(blocks)}}
    for n, b in enumerate(blocks):
        last = b.instrs[-1] if b.instrs else None
        op = last.op if last else ""
        if op == "s_branch" or op.startswith("s_cbranch_"):
            target = last.operands.split(",")[0].strip()
            if target in index:
                b.succs.append(index[target])
        if op not in ("s_branch", "s_endpgm", "s_setpc_b64", "s_trap") and n + 1 < len(blocks):
            b.succs.append(n + 1)
    return blocks


def dominators(blocks: list[Block]) -> list[set[int]]:
    """dom[n]: the blocks that dominate block n (the iterative data-flow algorithm from the entry)."""
    n = len(blocks)
    preds: list[list[int]] = [[] for _ in range(n)]
    for i, b in enumerate(blocks):
        for s in b.succs:
            preds[s].append(i)
    everything = set(range(n))
    dom = [everything for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for i in range(1, n):
            ps = [dom[p] for p in preds[i]]
            new = (set.intersection(*ps) if ps else set()) | {i}
            if new != dom[i]:
                dom[i], changed = new, True
    return dom


def find_loops(blocks: list[Block], dom: list[set[int]]) -> list[Loop]:
    """Natural loops (back edge: an edge to a block that dominates its source), outermost first, with
    depth and parent; back edges to one header make one loop."""
    preds: dict[int, list[int]] = {}
    for i, b in enumerate(blocks):
        for s in b.succs:
            preds.setdefault(s, []).append(i)
    loops: dict[int, Loop] = {}
    for i, b in enumerate(blocks):
        for h in b.succs:
            if h in dom[i]:
                lp = loops.setdefault(h, Loop(h, {h}, set()))
                lp.latches.add(i)
                stack = [i]
                while stack:
                    x = stack.pop()
                    if x not in lp.blocks:
                        lp.blocks.add(x)
                        stack.extend(preds.get(x, []))
    ordered = sorted(loops.values(), key=lambda lp: (-len(lp.blocks), lp.header))
    for lp in ordered:
        outer = [o for o in ordered if o is not lp and lp.blocks < o.blocks]
        lp.depth = len(outer) + 1
        if outer:
            lp.parent = min(outer, key=lambda o: len(o.blocks)).header
    return ordered


def one_trip(blocks: list[Block], loop: Loop, dom: list[set[int]], weight) -> list[int]:
    """The blocks of one steady-state trip around the loop: of the paths from the header to a latch
    (back edges cut), the one with the most MFMA clocks, then the most 16-byte global loads, then the
    most bytes written to LDS, then the fewest other clocks. A prefetching loop loads on every trip but
    the last, and a tile wholly inside its tensor takes the backend's fast path of 16-byte loads
    (global_load_dwordx4 or LDS-DMA) without per-element predicates, so the partial-tile paths are left
    out; a load split around the compute step writes its registers to LDS on the same trips as it loads
    (the LDS writes break the tie with the path that skips them, taken on the last trips only; writes
    under a narrowed EXEC mask, the partial tiles' fills, do not count: exec_masked).
    weight(block) -> (mfma clocks, 16-byte loads, narrower global loads (the partial-tile paths: the
    fewer the better), global atomics (a trip issues its whole tile's atomics, attention_bwd's dQ: a block
    of 4 or more counts for, a partial tile's one-a-block predicated ones against), LDS bytes written, other clocks)."""
    names = {b.name: n for n, b in enumerate(blocks)}

    def succs(x: int) -> list[int]:              # DAG edges: inside the loop, no back edge of any loop
        out = [s for s in blocks[x].succs if s in loop.blocks and s not in dom[x]]
        last = blocks[x].instrs[-1] if blocks[x].instrs else None
        if last is not None and last.op == "s_cbranch_execnz":
            # a forward jump taken while any lane is active: in a trip whose lanes all take one arm of a
            # structurized branch (block-uniform tests LLVM could not prove uniform) the fall-through -- the
            # other arm, run with no lane active -- is not taken
            target = names.get(last.operands.split(",")[0].strip())
            if target in out:
                return [target]
        return out

    def key(b: Block) -> tuple[float, ...]:
        mfma, loads, narrow, atomics, writes, other = weight(b)
        return -mfma, -loads, narrow, -atomics, -writes, other
    best: dict[int, tuple[tuple[float, ...], list[int]]] = {loop.header: (key(blocks[loop.header]),
                                                                         [loop.header])}
    for x in _topological(loop.header, succs):
        if x not in best:
            continue
        total, path = best[x]
        for s in succs(x):
            k = key(blocks[s])
            cand = (tuple(a + b for a, b in zip(total, k)), path + [s])
            if s not in best or cand[0] < best[s][0]:
                best[s] = cand
    ends = [best[x] for x in loop.latches if x in best]
    return min(ends)[1] if ends else sorted(loop.blocks)


def exec_masked(blocks: list[Block]) -> set[int]:
    """Blocks that run under a narrowed EXEC mask: LLVM lays out a divergent `if` as `s_and_saveexec`,
    `s_cbranch_execz END`, the then-blocks, END -- the blocks between such a branch and its target. The
    partial-tile paths (per-lane predicates) live there; one_trip does not count their LDS writes as the
    steady state's (a fill of the tile's edge is not the commit of a full tile)."""
    index = {b.name: n for n, b in enumerate(blocks)}
    out: set[int] = set()
    for n, b in enumerate(blocks):
        last = b.instrs[-1] if b.instrs else None
        if last is not None and last.op == "s_cbranch_execz":
            t = index.get(last.operands.split(",")[0].strip())
            if t is not None and t > n:
                out.update(range(n + 1, t))
    return out


def _topological(start: int, succs) -> list[int]:
    """Reverse postorder of an iterative depth-first search from start (a topological order of a DAG)."""
    order, seen, stack = [], {start}, [(start, iter(succs(start)))]
    while stack:
        x, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            order.append(x)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(succs(nxt))))
    return order[::-1]


# ----------------------------------------------------------------------------------------- counting
def lane_bytes(op: str) -> int:
    """Bytes one lane moves: the first size in the mnemonic, doubled for the ds *2* forms."""
    m = _SIZE.search(op)
    size = _SIZE_BYTES[m.group(1)] if m else 4
    return 2 * size if re.match(r"ds_(read|write|load|store)2", op) else size


CLASSES = ("mfma", "valu", "trans", "salu", "smem", "lds_read", "lds_write", "lds_other", "vmem_load",
           "vmem_lds_dma", "vmem_store", "vmem_atomic", "waitcnt", "barrier", "setprio", "sched_barrier",
           "branch", "nop", "other")


def classify(ins: Instr) -> str:
    op = ins.op
    if op.startswith(("v_mfma_", "v_smfmac_")):
        return "mfma"
    if op.startswith("v_"):
        return "trans" if TRANSCENDENTAL.match(op) else "valu"
    if op.startswith("ds_"):
        if op.startswith(("ds_read", "ds_load")):
            return "lds_read"
        return "lds_write" if op.startswith(("ds_write", "ds_store")) else "lds_other"
    if op.startswith(("global_", "buffer_", "flat_", "scratch_")):
        if is_lds_dma(ins):
            return "vmem_lds_dma"
        kind = "load" if "_load" in op else "store" if "_store" in op else "atomic"
        return f"vmem_{kind}"
    if op.startswith(("s_load", "s_buffer_load", "s_store", "s_dcache", "s_memtime", "s_memrealtime")):
        return "smem"
    special = {"s_waitcnt": "waitcnt", "s_barrier": "barrier", "s_setprio": "setprio", "s_nop": "nop"}
    if op in special or op.startswith("s_waitcnt"):
        return special.get(op, "waitcnt")
    if op == "s_branch" or op.startswith(("s_cbranch_", "s_setpc", "s_swappc")):
        return "branch"
    return "salu" if op.startswith("s_") else "other"


def is_lds_dma(ins: Instr) -> bool:
    """Global -> LDS loads: `buffer_load_* ... lds` and gfx940+ `global_load_lds_*`."""
    return "_load_lds_" in ins.op or (ins.op.startswith("buffer_load") and
                                      re.search(r"(^|\s)lds(\s|$)", ins.operands) is not None)


def is_scratch(ins: Instr) -> bool:
    """A private-memory access: `scratch_*` (flat scratch, what gfx942/gfx950 spill through) or a buffer access
    LLVM marks as a spill or reload (the private segment buffer of targets without flat scratch)."""
    return ins.op.startswith("scratch_") or (ins.op.startswith("buffer_") and
                                             ("Spill" in ins.comment or "Reload" in ins.comment))


def count(instrs: list[Instr], lanes: int, sched_barriers: int = 0) -> dict:
    """Class counts, MFMA variants, LDS bytes per class (of waves of `lanes`) and waits of a list of instructions."""
    counts = dict.fromkeys(CLASSES, 0)
    mfma: dict[str, int] = {}
    lds = {"read": 0, "write": 0, "other": 0}
    lds_cost_bytes = 0          # dword-granular: what the banks serve
    quarter_rate = 0
    waits = {"total": 0, "vmcnt0": 0, "lgkmcnt0": 0}
    scratch = {"load": 0, "store": 0}
    for ins in instrs:
        cls = classify(ins)
        counts[cls] += 1
        if is_scratch(ins):
            scratch["store" if "_store" in ins.op else "load"] += 1
        if cls == "mfma":
            mfma[ins.op] = mfma.get(ins.op, 0) + 1
        elif cls == "valu" and QUARTER_RATE.match(ins.op):
            quarter_rate += 1
        elif cls.startswith("lds_") or cls == "vmem_lds_dma":
            per_lane = lane_bytes(ins.op)
            lds["write" if cls == "vmem_lds_dma" else cls[4:]] += lanes * per_lane
            lds_cost_bytes += lanes * max(per_lane, 4)
        elif cls == "waitcnt":
            waits["total"] += 1
            for counter, n in _WAIT.findall(ins.operands):
                if n == "0" and counter in ("vmcnt", "lgkmcnt"):
                    waits[f"{counter}0"] += 1
    counts["sched_barrier"] = sched_barriers
    return {"counts": counts, "mfma": mfma, "lds_bytes": lds, "lds_cost_bytes": lds_cost_bytes,
            "quarter_rate_valu": quarter_rate, "waits": waits, "scratch": scratch}


# ---------------------------------------------------------------------------------------- resources
def total_vgprs(res: dict, notes: dict[str, str]) -> int:
    """The unified VGPR+AGPR allocation: LLVM's `; TotalNumVgprs:` comment, else align4(vgpr) + agpr."""
    if notes.get("TotalNumVgprs", "").isdigit():
        return int(notes["TotalNumVgprs"])
    vgpr, agpr = res.get("vgpr", 0), res.get("agpr", 0)
    return -(-vgpr // 4) * 4 + agpr if agpr else vgpr


def occupancy(arch: str, vgprs: int, lds_bytes: int, threads: int) -> dict:
    """Waves per SIMD as limited by registers, by LDS, and by the hardware."""
    alloc = -(-max(vgprs, 1) // VGPR_GRANULE) * VGPR_GRANULE
    by_vgpr = min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD_LANE // alloc)
    waves_per_block = -(-max(threads, 1) // ARCHS[arch].wave_size)
    lds_cu = ARCHS[arch].lds_bytes
    if lds_bytes:
        blocks = lds_cu // lds_bytes
        by_lds = min(MAX_WAVES_PER_SIMD, max(1, blocks * waves_per_block // SIMDS_PER_CU) if blocks else 0)
    else:
        by_lds = MAX_WAVES_PER_SIMD
    return {"vgprs_allocated": alloc, "waves_per_simd_by_vgpr": by_vgpr, "waves_per_simd_by_lds": by_lds,
            "waves_per_simd": min(by_vgpr, by_lds), "waves_per_block": waves_per_block,
            "lds_per_cu": lds_cu}


# -------------------------------------------------------------------------------------------- report
def analyze(asm: str, arch: str, kernel: str | None = None, resources: dict | None = None) -> dict:
    """The analysis of one kernel of `asm` compiled for `arch` (JSON-able; see the module docstring).
    `resources`: the compiler's report (compiler.report); read from the assembly's metadata if None."""
    if arch not in ARCHS or not ARCHS[arch].mfma_cycles:
        raise ValueError(f"the ISA analyser knows {', '.join(a for a in ARCHS if ARCHS[a].mfma_cycles)}, not {arch!r}")
    lines, notes = kernel_text(asm, kernel)
    name = kernel or lines[0].split(":")[0]
    if resources is None:
        resources = compiler.parse_metadata(asm).get(name, {}) if ".amdgpu_metadata" in asm else {}
    blocks = parse(lines)
    dom = dominators(blocks)
    loops = [_loop_report(blocks, lp, dom, arch) for lp in find_loops(blocks, dom)]
    main = max(loops, key=lambda lp: (lp["all_paths"]["mfma_count"], lp["depth"], -lp["all_paths"]["instructions"]),
               default=None)
    if main is not None and not main["all_paths"]["mfma_count"]:
        main = None
    for lp in loops:
        lp["main"] = lp is main
    threads = resources.get("max_flat_workgroup_size") or ARCHS[arch].wave_size
    lds = resources.get("lds_bytes", _number(notes.get("LDSByteSize")) or 0)
    llvm = _number(notes.get("Occupancy"))
    return {"kernel": name, "target": arch, "resources": _resources(resources),
            "occupancy": {**occupancy(arch, total_vgprs(resources, notes), lds, threads),
                          "llvm_occupancy": llvm},
            "main_loop": main["header"] if main else None, "loops": loops,
            "costs": table(arch),
            "assumptions": ASSUMPTIONS}


def _loop_report(blocks: list[Block], lp: Loop, dom: list[set[int]], arch: str) -> dict:
    lanes = ARCHS[arch].wave_size

    def tally(ids) -> dict:
        c = count([i for x in ids for i in blocks[x].instrs], lanes, sum(blocks[x].sched_barriers for x in ids))
        return {"blocks": len(ids), "instructions": sum(len(blocks[x].instrs) for x in ids),
                "mfma_count": sum(c["mfma"].values()), **c, "clocks": clocks(c, arch)}

    masked = exec_masked(blocks)

    def weight(b: Block) -> tuple[float, int, int, int, float]:
        c = count(b.instrs, lanes)
        k = clocks(c, arch)
        loads = [i for i in b.instrs if classify(i) in ("vmem_load", "vmem_lds_dma")]
        wide = sum(1 for i in loads if lane_bytes(i.op) >= 16)
        writes = 0 if blocks.index(b) in masked else c["lds_bytes"]["write"]
        atomics = sum(1 for i in b.instrs if classify(i) == "vmem_atomic")
        atomics = atomics if atomics >= 4 else -atomics     # a whole tile's run, or a partial tile's predicated one
        return k["mfma"], wide, len(loads) - wide, atomics, writes, k["valu"] + k["lds"]
    ids = sorted(lp.blocks)
    trip = one_trip(blocks, lp, dom, weight)
    return {"header": blocks[lp.header].name, "depth": lp.depth,
            "parent": blocks[lp.parent].name if lp.parent is not None else None,
            "lines": [blocks[ids[0]].start, max(i.line for x in ids for i in blocks[x].instrs or [Instr(0, "", "")])],
            "all_paths": tally(ids),
            "one_trip": {**tally(trip), "load_waits": load_waits([i for x in trip for i in blocks[x].instrs]),
                         "interleave": interleave([i for x in trip for i in blocks[x].instrs], arch)}}


def scratch_in_loops(report: dict) -> list[str]:
    """Where an analysis (analyze()) finds scratch accesses inside a pipeline loop's steady state: for each loop
    holding MFMAs whose one_trip (the iteration the bounds measure) loads or stores scratch, "HEADER: N scratch
    loads, M stores per trip" (the main loop first). Spills in the prologue or epilogue, or on a loop's
    partial-tile paths only, are not listed: they run once per block or on edge tiles, not every step."""
    out = []
    for lp in sorted(report["loops"], key=lambda lp: not lp["main"]):
        sc = lp["one_trip"]["scratch"]
        if lp["all_paths"]["mfma_count"] and (sc["load"] or sc["store"]):
            out.append(f"{lp['header']}{' (main loop)' if lp['main'] else ''}: {sc['load']} scratch loads, "
                       f"{sc['store']} stores per trip")
    return out


# ------------------------------------------------------------------------------ loads against MFMAs
VMEM_CLASSES = ("vmem_load", "vmem_lds_dma", "vmem_store", "vmem_atomic")


def waits_for(ins: Instr) -> dict[str, int]:
    """The counters an s_waitcnt waits for and their limits ({"vmcnt": 2, "lgkmcnt": 0}); a counter it
    does not name is not waited for. The plain immediate form (`s_waitcnt 0`) waits for everything."""
    named = {counter: int(n) for counter, n in _WAIT.findall(ins.operands)}
    if not named and ins.operands.strip() in ("0", "0x0"):
        return {"vmcnt": 0, "lgkmcnt": 0, "expcnt": 0}
    return named


def load_waits(instrs: list[Instr]) -> dict:
    """Does a loop's prefetch overlap its MFMAs? `instrs`: one steady-state trip in order (one_trip),
    read cyclically (the loop comes back to its start). For each global load of the trip (register or
    LDS-DMA destination), the MFMAs issued after it before the first s_waitcnt that covers it: a vmcnt(N)
    with N below the vector memory instructions issued since (they complete in order), or for a flat load
    also lgkmcnt(0). A load waited for before any MFMA (0) serialises memory latency with the matrix
    cores; HipKittens-style loops issue a step's loads ahead and wait for them after a compute step.
    Returns the loads, each one's MFMA count (None: no covering wait in a whole trip, i.e. waited for at
    a later trip at the earliest), their minimum, and `overlaps_mfma` (every load has an MFMA before its
    wait)."""
    n = len(instrs)
    per_load: list[int | None] = []
    for k, ins in enumerate(instrs):
        if classify(ins) not in ("vmem_load", "vmem_lds_dma"):
            continue
        flat = ins.op.startswith("flat_")
        mfma, younger, covered = 0, 0, False
        for step in range(1, n + 1):
            nxt = instrs[(k + step) % n]
            cls = classify(nxt)
            if cls == "mfma":
                mfma += 1
            elif cls in VMEM_CLASSES:
                younger += 1
            elif cls == "waitcnt":
                w = waits_for(nxt)
                # at most vmcnt(N) in flight: the load, with `younger` issued after it, has landed if N <= younger
                covered = ("vmcnt" in w and w["vmcnt"] <= younger) or (flat and w.get("lgkmcnt") == 0)
                if covered:
                    break
        per_load.append(mfma if covered else None)
    known = [m for m in per_load if m is not None]
    least = min(known) if known else None
    return {"loads": len(per_load), "mfma_before_wait": per_load, "min_mfma_before_wait": least,
            "overlaps_mfma": bool(per_load) and all(m is None or m > 0 for m in per_load)}


# ------------------------------------------------------------------------------ VALU among the MFMAs
def interleave(instrs: list[Instr], arch: str) -> dict:
    """Where a trip's VALU work sits relative to its MFMAs (the clocks above assume the pipes overlap; this
    says whether the order lets them). `instrs`: one trip in issue order.
      * longest_mfma_run: the most MFMAs in a row with no VALU or transcendental between them;
      * one wave issuing in order, alone on its SIMD: an MFMA starts when the matrix core is free and takes one
        issue pass (4 cycles) of the wave, a VALU its cycles (4, 16 transcendental or quarter rate), an `s_nop N`
        N+1 cycles, anything else 1 (memory and waits are not modelled). `valu_hidden`: the fraction of VALU
        clocks issued while an MFMA runs; `trans_under_mfma`: transcendentals issued while one runs;
        `in_order_cycles` the trip's length in that model and `in_order_bound` its MFMA clocks over it (1.0:
        the matrix core never waits for this wave's VALU). A trip whose softmax runs between its two MFMA phases
        hides none of its v_exp; interleaved, it hides most."""
    t = busy = 0.0
    run = longest = 0
    valu = hidden = 0.0
    trans = under = 0
    mfma_total = 0
    for ins in instrs:
        cls = classify(ins)
        if cls == "mfma":
            cyc, _ = mfma_cycles(ins.op, arch)
            start = max(t, busy)
            busy, t = start + cyc, start + VALU_CYCLES
            mfma_total += cyc
            run += 1
            longest = max(longest, run)
        elif cls in ("valu", "trans"):
            c = QUARTER_RATE_CYCLES if cls == "trans" or QUARTER_RATE.match(ins.op) else VALU_CYCLES
            h = min(c, max(0.0, busy - t))
            valu += c
            hidden += h
            if cls == "trans":
                trans += 1
                under += h > 0
            t += c
            run = 0
        elif cls == "nop":
            m = re.match(r"\s*(\d+)", ins.operands)
            t += int(m.group(1)) + 1 if m else 1
        else:
            t += 1
    t = max(t, busy)
    return {"longest_mfma_run": longest, "trans": trans, "trans_under_mfma": under,
            "valu_hidden": round(hidden / valu, 3) if valu else None, "in_order_cycles": round(t),
            "in_order_bound": round(mfma_total / t, 3) if t else None}


ASSUMPTIONS = [
    "all_paths: every instruction of the loop once, whatever branches skip (an upper bound on one iteration)",
    "one_trip: the header-to-latch path with the most MFMA, then the most 16-byte global loads, the fewest "
    "narrower ones, the most LDS bytes written outside EXEC-masked code, then the least other work: a "
    "steady-state iteration over full tiles (the fast path, no per-element predicates)",
    "load_waits: per global load of one_trip, the MFMAs issued before the s_waitcnt that covers it (read "
    "cyclically; vmcnt in issue order); memory latency itself is not modelled",
    "clocks per wave per iteration on one SIMD; MFMA, VALU and LDS overlap; the slowest bounds",
    ("bound: MFMA clocks of the instructions chosen / the slowest pipe's clocks (against the chosen MFMA forms); "
     "bound_vs_peak: the MFMA FLOPs at the arch's peak rate for their operand kind (peak_clocks) / the slowest "
     "pipe's clocks (against the chip); form_efficiency: peak_clocks / MFMA clocks (f8f6f4 costed as fp8)"),
    "LDS: a SIMD's share is a quarter of the CU's bytes/clock; dword-granular; LDS-DMA counts as LDS writes",
    "interleave: one wave issuing the trip in order alone on its SIMD (MFMA: waits for the matrix core, one "
    "4-cycle issue pass; VALU its cycles; s_nop N: N+1; other: 1); how much VALU issues under an MFMA",
    "no dependency stalls, memory latency or SALU issue modelled; no AMD hardware measured these figures",
]


def _number(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _resources(res: dict) -> dict:
    keys = ("vgpr", "agpr", "sgpr", "vgpr_spill", "sgpr_spill", "scratch_bytes", "lds_bytes",
            "max_flat_workgroup_size", "waves", "schedule", "compiler")
    return {k: res[k] for k in keys if k in res}
