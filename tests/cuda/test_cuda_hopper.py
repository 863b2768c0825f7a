"""sm_90a schedules of the cuda backend: the 128-byte-swizzled block layout, wgmma from shared-memory
descriptors, TMA pipelines with host-encoded tensor maps, and the per-target configuration choice.

Offline tests (NVRTC, no GPU) check what the compiler emits; GPU tests (skipped without one, run by
`pytest -m gpu` on an H200) check the results against float64 on ragged shapes, the cp.async fallback
for tensors TMA cannot describe and the autotuner (CUDA-graph replay of the TMA gemm: test_cuda_gpu.py)."""
from __future__ import annotations

import re

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.cuda import archs, dataflow, occupancy, preferences, schedule, tma
from hk_portable.interface import GL, RT, ST, UnsupportedError, f32
from hk_portable.kernels import attention
from hk_portable.kernels.gemm import candidates as gemm_candidates
from hk_portable.kernels.gemm import gemm, gemm_kernel

CANDIDATES = gemm_candidates({})

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _attention_args(d: int) -> tuple:
    """attention_fwd_kernel's arguments on the meta device: B2 H4 N256, head dim d, no mask."""
    q = _meta(2, 4, 256, d)
    return (q, q, q, q, _meta(2, 4, 256, dtype=torch.float32), 0.1, 0, 0, 0)


def _first_ranked(d: int, masked: bool, n: int = preferences.LONG_BAND) -> dict:
    """The attention candidate the cuda tuning table ranks first for a long sequence (n queries) on sm_90a: what
    the library launches there (the kernel lists every legal candidate; backends/cuda/preferences.py ranks them)."""
    consts = {"D": d, "MASKED": masked}
    prefs = preferences.attention_fwd(consts, (_meta(2, 4, n, d),))
    return preferences.first_ranked(attention.candidates(consts), prefs)


def _attention_program(d: int, masked: bool, candidate: int | None = None):
    """(config, Program) of the attention candidate the library lists at `candidate` for this head dim and mask
    (None: the one the tuning table ranks first for a long sequence)."""
    cfg = _first_ranked(d, masked) if candidate is None else attention.candidates({"D": d, "MASKED": masked})[candidate]
    return cfg, attention.attention_fwd_kernel.trace(*_attention_args(d), **cfg)


def _gemm_artifact(arch: str, **cfg):
    cfg = cfg or gemm_kernel.choose_config(CANDIDATES, _meta(256, 256), _meta(256, 256), _meta(256, 256),
                                           backend=f"cuda:{arch}")
    return gemm_kernel.compile(_meta(300, 256), _meta(256, 520), _meta(300, 520, dtype=torch.float32),
                               backend=f"cuda:{arch}", **cfg), cfg


# ------------------------------------------------------------------------------------- offline
def test_sm90a_gemm_runs_on_tma_and_wgmma_and_sm80_keeps_the_ring():
    art, cfg = _gemm_artifact("sm_90a")
    assert cfg == CANDIDATES[0], "on sm_90a the backend picks the first candidate that runs on TMA + wgmma"
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in art.asm
    assert "cp.async.bulk.tensor.2d" in art.asm and "mbarrier.try_wait.parity" in art.asm
    assert [m["param"] for m in art.launch["tma"]] == [0, 1]
    r = art.resources
    assert r["spill_stores"] == r["spill_loads"] == r["stack_bytes"] == 0
    art80, cfg80 = _gemm_artifact("sm_80")
    assert cfg80 == CANDIDATES[-1], "sm_80 keeps the portable baseline"
    assert "wgmma" not in art80.asm and "cp.async.bulk" not in art80.asm and "tma" not in art80.launch


def test_gemm_is_warp_specialised_and_hands_registers_to_its_consumers():
    art, cfg = _gemm_artifact("sm_90a")
    warps = cfg["num_warps"]
    block, producer, consumer = occupancy.register_split(warps, schedule.PRODUCER_WARPS, archs.ARCHS["sm_90a"])
    assert art.launch["block"][0] == 32 * (warps + schedule.PRODUCER_WARPS)
    assert f"setmaxnreg.dec.sync.aligned.u32 {producer};" in art.asm
    assert f"setmaxnreg.inc.sync.aligned.u32 {consumer};" in art.asm
    assert art.resources["registers"] == block, "the hand-over balances only at exactly this allocation"
    # the Program's barriers name the consumer threads only; the producer warpgroup exits after its loads
    assert f"bar.sync 1, {32 * warps};" in art.asm and "exit;" in art.asm
    assert (block, producer, consumer) == (168, 24, 240)


def _prologue_kernel(into_stage: bool):
    @hk.kernel(num_warps=8)
    def prologue_load(a: GL[2], b: GL[2], c: GL[2], *, BK: hk.const = 64):
        a_s = hk.shared(ST[a.dtype, 128, BK], stages=2)
        b_s = hk.shared(ST[b.dtype, BK, 128], stages=2)
        q = hk.shared(ST[a.dtype, 128, BK])
        hk.load(a_s[0] if into_stage else q, a, (0, 0))     # a tile every step reads, like attention's Q

        def load(k, s):
            hk.load(a_s[s], a, (0, k))
            hk.load(b_s[s], b, (k, 0))

        acc = hk.pipeline(hk.cdiv(a.shape[1], BK), load,
                          lambda k, s, acc: hk.mma(q, b_s[s], hk.mma(a_s[s], b_s[s], acc)),
                          carry=hk.zeros(RT[f32, 128, 128]), stages=2)
        hk.store(c, acc.to(c.dtype), (0, 0))
    return prologue_load


def test_specialisation_rules():
    """A kernel runs warp-specialised on sm_90a when its pipelines are all on TMA at the top level with one
    stage count, its warps are two or more warpgroups, and nothing but the pipelines touches a staged
    buffer (the producer fills those whenever the ring lets it); a prologue tile in a buffer of its own is
    the consumers' to load."""
    hopper, ampere = (hk.get_backend("cuda").target(a) for a in ("sm_90a", "sm_80"))
    args = (_meta(128, 256), _meta(256, 128), _meta(128, 128, dtype=torch.float32))
    assert schedule.plan(_prologue_kernel(False).trace(*args), hopper).producer_warps == schedule.PRODUCER_WARPS
    assert schedule.plan(_prologue_kernel(True).trace(*args), hopper).producer_warps == 0
    gemm_prog = gemm_kernel.trace(*args, **CANDIDATES[0])
    assert schedule.plan(gemm_prog, hopper).producer_warps == schedule.PRODUCER_WARPS
    assert schedule.plan(gemm_prog, ampere).producer_warps == 0
    q, o = _meta(2, 4, 512, 128), _meta(2, 4, 512, 128)
    lse = _meta(2, 4, 512, dtype=torch.float32)
    for cfg in attention.candidates({"D": 128}):      # 8 warps: specialised; the 4-warp baseline is not
        p = attention.attention_fwd_kernel.trace(q, q, q, o, lse, 0.1, 0, 0, 0, **cfg)
        plan = schedule.plan(p, hopper)
        assert len(plan.pipelines) == 2
        assert plan.producer_warps == (schedule.PRODUCER_WARPS if p.num_warps >= 8 else 0), cfg
    # a block of 4 consumer warps would already get 248 registers a thread: no hand-over there
    assert occupancy.register_split(4, schedule.PRODUCER_WARPS, archs.ARCHS["sm_90a"])[2] <= 248


def test_softmax_takes_one_instruction_per_exp2_and_per_bf16_cast():
    """exp2 is one ex2.approx.ftz (flushing results below 2^-126 stays within the exp2 bound) and f32 -> bf16 one
    cvt.rn.bf16.f32 (the core's RNE bits): the H200's attention loop had spent half its instructions on exp2f's
    subnormal fix-up and the integer RNE (docs/perf-notes.md, 2026-12-03). A kernel that would spill with the
    flushing form is rebuilt with exp2f (options["fast_exp2"] says which ran)."""
    q = _meta(2, 4, 256, 128)
    args = (q, q, q, q, _meta(2, 4, 256, dtype=torch.float32), 0.1, 0, 0, 0)
    cfg = _first_ranked(128, False)
    art = attention.attention_fwd_kernel.compile(*args, backend="cuda:sm_90a", **cfg)
    assert "ex2.approx.ftz.f32" in art.asm and "cvt.rn.bf16.f32" in art.asm
    assert art.options["fast_exp2"] is True
    assert "#define HK_FAST_EXP2 1" in art.source


def test_hk_compile_shows_wgmma_and_tma_for_sm90a(capsys):
    from hk_portable import cli
    assert cli.main(["compile", "gemm", "--backend", "cuda", "--target", "sm_90a", "--emit", "ptx"]) == 0
    ptx = capsys.readouterr().out
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert cli.main(["compile", "gemm", "--backend", "cuda", "--target", "sm_90a", "--emit", "lowered"]) == 0
    lowered = capsys.readouterr().out
    assert "pipeline %" in lowered and ": tma," in lowered and "wgmma m64n256k16, async" in lowered
    assert "tensor map 1: param 1 (rank 2, bf16), box 64x64, SWIZZLE_128B" in lowered
    # the named passes in order, and the state after one of them (codegen/lowering.py)
    assert [ln for ln in lowered.splitlines() if ln.startswith("// after pass")] == [
        "// after pass 'layouts'", "// after pass 'variant'", "// after pass 'schedule'"]
    assert cli.main(["compile", "gemm", "--backend", "cuda", "--target", "sm_90a", "--emit", "lowered:after=variant"]) == 0
    partial = capsys.readouterr().out
    assert "// the base schedule: Base(" in partial and "// schedule (cuda backend" not in partial
    assert cli.main(["compile", "gemm", "--backend", "cuda", "--emit", "lowered:after=fusion"]) != 0
    assert "its passes are, in order: layouts, variant, schedule" in capsys.readouterr().err


def test_no_wgmma_serialisation_in_the_async_chain():
    """ptxas serialises wgmma (and says so) when accumulator registers are touched while in flight."""
    from hk_portable.backends.cuda import compiler
    art, _ = _gemm_artifact("sm_90a")
    log = compiler.compile_source(art.source, art.kernel_name, "sm_90a").log
    assert "wgmma" not in log.lower(), log


@hk.kernel(num_warps=4)
def _mma_probe(a: GL[2], b: GL[2], c: GL[2], *, M: hk.const = 64, N: hk.const = 64, K: hk.const = 64,
               TB: hk.const = False):
    a_s = hk.shared(ST[a.dtype, M, K])
    b_s = hk.shared(ST[b.dtype, N, K] if TB else ST[b.dtype, K, N])
    hk.load(a_s, a, (0, 0))
    hk.load(b_s, b, (0, 0))
    acc = hk.mma(a_s, b_s, hk.zeros(RT[f32, M, N]), trans_b=TB)
    hk.store(c, acc, (0, 0))


@hk.kernel(num_warps=4)
def _mma_probe_rs(a: GL[2], b: GL[2], c: GL[2], *, M: hk.const = 64, N: hk.const = 64, K: hk.const = 64,
                  TB: hk.const = False):
    b_s = hk.shared(ST[b.dtype, N, K] if TB else ST[b.dtype, K, N])
    hk.load(b_s, b, (0, 0))
    a_r = hk.load(RT[a.dtype, M, K], a, (0, 0))
    hk.store(c, hk.mma(a_r, b_s, hk.zeros(RT[f32, M, N]), trans_b=TB), (0, 0))


@pytest.mark.parametrize("M,N,K,TB,warps,reg_a", [
    (64, 64, 64, False, 4, False), (64, 64, 64, True, 4, False), (128, 128, 64, False, 8, False),
    (64, 32, 64, False, 4, False), (64, 32, 64, True, 4, False), (64, 64, 32, False, 4, False),
    (32, 64, 64, False, 4, False), (64, 64, 64, False, 2, False), (64, 24, 64, True, 4, False),
    (64, 64, 64, False, 4, True), (128, 128, 32, True, 8, True), (64, 32, 64, False, 4, True),
    (32, 64, 64, False, 4, True)])
def test_python_wgmma_rule_matches_the_library(M, N, K, TB, warps, reg_a):
    """dataflow.wgmma_eligible mirrors wgmma_fits in hk_cuda/wgmma.cuh: the PTX decides."""
    b = _meta(N, K) if TB else _meta(K, N)
    args = (_meta(M, K), b, _meta(M, N, dtype=torch.float32))
    kern = _mma_probe_rs if reg_a else _mma_probe
    prog = kern.trace(*args, M=M, N=N, K=K, TB=TB, num_warps=warps)
    (op,) = [o for o in prog.body.walk() if o.opcode == "mma"]
    art = kern.compile(*args, backend="cuda:sm_90a", M=M, N=N, K=K, TB=TB, num_warps=warps)
    assert ("wgmma.mma_async" in art.asm) == dataflow.wgmma_eligible(op, warps)


def test_tensor_map_params_follow_the_program_params_in_the_ptx_entry():
    art, _ = _gemm_artifact("sm_90a")
    entry = re.search(r"\.entry\s+\w+\((.*?)\)", art.asm, re.S).group(1)
    params = re.findall(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+\w+(?:\[(\d+)\])?", entry)
    n = len(art.launch["params"])
    maps, flag = params[n:n + 2], params[n + 2]
    assert maps == [("64", "b8", "128")] * 2 and flag[1] in ("u32", "s32", "b32")
    first, flag_off, total = tma.layout(art.launch["param_size"], 2)
    assert first % 64 == 0 and flag_off == first + 256 and total == flag_off + 4


def test_tma_describes_only_what_the_hardware_can_read():
    spec = {"param": 0, "rank": 2, "dtype": "bf16", "box_rows": 128, "box_cols": 64}
    x = torch.empty(300, 256, dtype=torch.bfloat16)
    dims, strides, box = tma.describe(x, spec)
    assert dims == [256, 300] and strides == [512] and box == [64, 128]
    assert tma.describe(x.t(), spec) is None                       # inner stride 256
    assert tma.describe(torch.empty(300, 257, dtype=torch.bfloat16)[:, :256], spec) is None   # 514-byte rows
    assert tma.describe(torch.empty(300 * 256 + 1, dtype=torch.bfloat16)[1:].view(300, 256), spec) is None
    spec4 = dict(spec, rank=4)
    y = torch.empty(2, 3, 200, 64, dtype=torch.bfloat16)
    assert tma.describe(y, spec4) == ([64, 200, 3, 2], [128, 200 * 128, 3 * 200 * 128], [64, 128, 1, 1])


def test_configuration_choice_is_per_target_and_memoised():
    args = (_meta(256, 256), _meta(256, 256), _meta(256, 256))
    assert gemm_kernel.choose_config(CANDIDATES, *args, backend="cuda:sm_90a") == CANDIDATES[0]
    assert gemm_kernel.choose_config(CANDIDATES, *args, backend="cuda:sm_80") == CANDIDATES[-1]
    # hip: the first whose accumulator takes a wave grid within the arch's LDS; gfx950's tuning table ranks the
    # 256x256 block with K steps of 32 first (its full-rate 16x16x32 MFMA: backends/hip/preferences.py)
    assert gemm_kernel.choose_config(CANDIDATES, *args, backend="hip:gfx942") == CANDIDATES[1]
    deep_k = next(c for c in CANDIDATES if (c["BM"], c["BN"], c["BK"]) == (256, 256, 32))
    assert gemm_kernel.choose_config(CANDIDATES, *args, backend="hip:gfx950") == deep_k
    assert gemm_kernel.choose_config(CANDIDATES, *args, backend="reference") == CANDIDATES[-1]
    f16 = (_meta(256, 256, dtype=torch.float16),) * 2 + (args[2],)
    assert gemm_kernel.choose_config(CANDIDATES, *f16, backend="cuda:sm_90a") == CANDIDATES[0]
    assert gemm_kernel._configs, "answers are memoised"


@pytest.mark.parametrize("d,masked", [(64, False), (128, False), (128, True)])
def test_attention_runs_both_products_on_wgmma_on_sm90a(d, masked):
    """QKᵀ from shared Q and K stages; PV with P from registers (wgmma's register-A form); K/V on TMA."""
    n = 2048 if d == 64 else 256        # D=64: a long sequence, where the tuning table ranks FA3's 192-row block first
    q = _meta(2, 4, n, d)
    args = (q, q, q, q, _meta(2, 4, n, dtype=torch.float32), 0.1, 0, 0, 0)
    cands = attention.candidates({"D": d, "MASKED": masked})
    cfg = attention.attention_fwd_kernel.choose_config(cands, *args, backend="cuda:sm_90a")
    assert cfg == cands[0]
    if d == 128:                                   # warp-specialised 128x128 blocks, with a mask too
        assert cfg["num_warps"] == 8 and cfg["BM"] == 128 and cfg["BN"] == 128
        assert len(cands) == 4                     # ..., 128x64, hip's 256x64 on 8 waves, the baseline
        hip_cfg = attention.attention_fwd_kernel.choose_config(cands, *args, backend="hip:gfx942")
        assert (hip_cfg["BM"], hip_cfg["BN"], hip_cfg["num_warps"]) == (256, 64, 8) and hip_cfg != cfg
        built = attention.attention_fwd_kernel.compile(*args, backend="cuda:sm_90a", **cfg)
        # the register hand-over where ptxas gave the block what it asked for; the H200's NVRTC 13.0 does not for
        # the masked block (a few more registers), and the backend then builds it without (backend.compile)
        assert ("setmaxnreg.inc" in built.asm) == bool(built.launch.get("hand_over_registers"))
        assert masked or "setmaxnreg.inc" in built.asm
    assert attention.attention_fwd_kernel.choose_config(cands, *args, backend="cuda:sm_80") == cands[-1]
    art = attention.attention_fwd_kernel.compile(*args, backend="cuda:sm_90a", **cfg)
    assert art.asm.count("wgmma.mma_async") >= 2 and "mma.sync" not in art.asm
    assert re.search(r"wgmma\.mma_async\S* \{[^}]*\}, \{%r", art.asm), "PV takes A from registers"
    assert "cp.async.bulk.tensor.4d" in art.asm
    r = art.resources
    # masked 128x128: ptxas parks a few scalars (24 bytes, six stores and six loads outside the key loop, SASS
    # read 2026-12-03); measured faster than the spill-free 128x64 all the same (perf-notes). D64's 192-row block on
    # FA3's schedule (three consumer warpgroups at 160 registers): at most schedule.FA3_SPILL_BYTES[3], measured
    # 8-15 % faster than without FA3 all the same (2026-12-04)
    allowed = 32 if masked and d == 128 else schedule.FA3_SPILL_BYTES[cfg["num_warps"] // schedule.PRODUCER_WARPS]
    assert r["spill_stores"] == r["spill_loads"] and r["stack_bytes"] <= allowed
    lowered = hk.get_backend("cuda").lowered(attention.attention_fwd_kernel.trace(*args, **cfg),
                                             hk.get_backend("cuda").target("sm_90a"))
    # whole key blocks and the edge blocks each get a pipeline (masked: two edges): all on TMA, every mma
    # a staged wgmma
    pipes = 3 if masked else 2
    assert lowered.count(": tma,") == pipes and ": cp_async" not in lowered
    plan = lowered.split("// schedule")[1]
    assert plan.count(", staged (no barrier, waits)") == len(re.findall(r"^mma %", plan, re.M)) == 2 * pipes
    # the view shows the plan compile() tries first: FA3's on two or three consumer warpgroups, persistent, and with
    # a causal band the query blocks longest first
    fa3 = cfg.get("num_warps") in (8, 12)
    assert ("// FA3's schedule" in lowered) is fa3 and ("persistent = True: FA3's persistent grid" in plan) is fa3
    assert ("work_axis = 0: tiles' work grows along block_idx axis 0" in plan) is (fa3 and masked)
    assert ("longest_first = 64: the FA3 variant's" in plan) is fa3


@pytest.mark.parametrize("masked", [False, True])
def test_attention_compute_is_software_pipelined_on_sm90a(masked):
    """FA3's intra-warpgroup overlap (dataflow.Overlap): a step issues QKᵀ of block i, then the rescale and PV
    of block i-1, and runs block i's softmax while PV is on the tensor cores; P (bf16) and alpha cross one step.
    ptxas keeps every wgmma asynchronous: a control-flow merge between an issue and its wait would make it
    serialise all of them (it says so in its log), which the first version of this pass did. Part of the FA3
    variant only (alone it measured slower on the H200, perf-notes 2026-12-03)."""
    from hk_portable.backends.cuda import compiler, schedule
    # masked: the 128x64 candidate (128x128 with the mask and the overlap's carried P spills 336 bytes)
    cfg, program = _attention_program(128, masked, 1 if masked else 0)
    target = hk.get_backend("cuda").target("sm_90a")
    assert not any(pp.overlap for pp in schedule.plan(program, target).pipelines.values())
    plan = schedule.plan(program, target, schedule.FA3())
    overlaps = [pp.overlap for pp in plan.pipelines.values()]
    assert len(overlaps) == (3 if masked else 2) and all(overlaps)
    for ov in overlaps:
        assert ov.head.attrs["trans_b"] and ov.head.operands[0].type.space == "st"       # S = Q Kᵀ from shared
        assert ov.mma.operands[0].type.space == "rt" and ov.tail[-1] is ov.mma           # O += P V, P in registers
        assert sorted((v.type.space, v.type.dtype.name) for v in ov.crossing) == [("rt", "bf16"), ("rv", "f32")]
    art = hk.get_backend("cuda").compile(program, target, {"variant": "fa3"})
    assert art.source.count("hk::ws_consume_overlap_split<") == len(overlaps)
    log = compiler.compile_source(art.source, art.kernel_name, "sm_90a").log
    assert "serialized" not in log and "C7514" not in log, log
    r = art.resources
    assert r["spill_stores"] == r["spill_loads"] == r["stack_bytes"] == 0
    _, gcfg = _gemm_artifact("sm_90a")
    gemm = gemm_kernel.trace(_meta(300, 256), _meta(256, 520), _meta(300, 520, dtype=torch.float32), **gcfg)
    gemm_plan = schedule.plan(gemm, target, schedule.FA3())     # one product: nothing to overlap, the base plan
    assert not any(pp.overlap for pp in gemm_plan.pipelines.values()) and not gemm_plan.persistent


@pytest.mark.parametrize("d, masked", [(128, False), (128, True), (64, False)])
def test_attention_ring_is_split_by_reader(d, masked):
    """The split ring (schedule.RingGroup, part of the FA3 variant): K is read only by QKᵀ and V only by PV, so each
    gets its own full and empty barriers per stage; the producer acquires K's stage once QKᵀ of two steps before
    retired, V's once PV did, and the consumers wait for each just before its product. Q is loaded by the producer
    on a barrier pair of its own (per copy). A GEMM (both operands read by one mma) keeps one barrier pair."""
    from hk_portable.backends.cuda import compiler, schedule
    cfg, program = _attention_program(d, masked)
    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    plan = schedule.plan(program, target, schedule.FA3())
    pipes = list(plan.pipelines.values())
    assert schedule.plan(program, target).ring_groups == 1 and not schedule.plan(program, target).prologue
    assert plan.ring_groups == 2 and all(len(pp.groups) == 2 for pp in pipes) and plan.pingpong
    for pp in pipes:
        k_group, v_group = pp.groups
        assert k_group.reader.attrs["trans_b"] and not v_group.reader.attrs["trans_b"]       # QKᵀ, then P V
        assert k_group.tx_bytes == v_group.tx_bytes == cfg["BN"] * d * 2
    art = be.compile(program, target, {"variant": "fa3"})
    src, n, S, Q = art.source, len(pipes), cfg["STAGES"], plan.prologue_stages
    assert f"hk_full[{2 * S + Q}]" in src and src.count("hk::ws_produce_split<") == n
    # K and V acquired a step each; Q's copies on a ring of their own (the same template where it has two)
    assert src.count(f"hk::ring_acquire<{S}>(") == 2 * n + (Q == S)
    assert src.count(f"hk::ring_acquire<{Q}>(hk_full + {2 * S}, hk_empty + {2 * S}, hk_round, ") == 1
    # each pipeline waits and releases K in its first and later steps and V in its later and last steps; Q once
    assert src.count(f"hk::ring_wait<{S}>(") == src.count(f"hk::ring_release<{S}>(") == 4 * n + (Q == S)
    shared = be.compile(program, target, {"variant": "base"}).source
    assert "hk::ring_acquire<" not in shared and "hk::ws_produce<" in shared
    # the ping-pong: the warpgroups take turns issuing QKᵀ_i and PV_{i-1}; the turns run on across pipelines (every
    # buffer came by TMA: nothing to publish, so no meeting)
    assert src.count(f"hk::ws_consume_overlap_split<{S}, false, false>(") == n
    assert src.count("hk::turn_wait<") == src.count("hk::turn_pass<") == 3 * n     # first, step, last
    groups = program.num_warps // 4
    assert src.count(f"hk::turns_begin<{groups}>();") == src.count(f"hk::turns_end<{groups}>();") == 1
    log = compiler.compile_source(src, art.kernel_name, "sm_90a").log
    assert "serialized" not in log and "C7514" not in log, log
    # Q: the consumers wait for it (or load it themselves where the launch has no tensor maps); the persistent block
    # releases it after its last pipeline, before the epilogue
    assert len(plan.prologue) == 1 and plan.prologue_tx == cfg["BM"] * d * 2
    assert "release_stage(hk_empty + " not in src
    release = f"hk::ring_release<{Q}>(hk_empty + {2 * S}, hk_round);"
    last_pipe = src.rindex("hk::ws_consume_overlap_split<")
    assert src.count(release) == 1 and last_pipe < src.index(release) < src.index("hk::store", last_pipe)
    gemm = gemm_kernel.trace(_meta(300, 256), _meta(256, 520), _meta(300, 520, dtype=torch.float32),
                             **_gemm_artifact("sm_90a")[1])
    assert schedule.plan(gemm, target, schedule.FA3()).ring_groups == 1


def test_fa3_runs_persistent():
    """The FA3 variant's persistent grid: a warp-specialised kernel walks the logical grid's tiles on at most one block
    per SM (the ring runs on across tiles, so the producer loads the next tile during this one's epilogue); the
    launch gets the logical grid as three ints after the tensor maps. The base variant is not persistent, nor is a
    Program FA3 cannot take (it gets the base plan)."""
    args = _attention_args(128)
    cfg, program = _attention_program(128, True)
    be = hk.get_backend("cuda")
    art = be.compile(program, be.target("sm_90a"), {"variant": "fa3"})
    assert art.launch.get("persistent") is True
    assert "hk_tiles.idx<0>(hk_tile)" in art.source and "int hk_grid_z)" in art.source
    # once per block, before each tile loop (producer's, consumers'): the grid's dividers, the invariant scalars
    # (the GQA group Hq // Hkv) and a divider by the group for the key/value head h // group
    assert art.source.count("const hk::tile_grid hk_tiles(hk_grid_x, hk_grid_y, hk_grid_z);") == 2
    loop = art.source.index("for (long long hk_k = 0;; ++hk_k)")
    group = re.search(r"const int (v\d+) = hk::floordiv\((v\d+), (v\d+)\);", art.source)
    assert group and group.start() < loop and f"const hk::divider hk_by_{group[1]}({group[1]});" in art.source
    assert re.search(rf"= hk_by_{group[1]}\.floordiv\(v\d+\);", art.source[loop:])
    assert "#define HK_WORK_AXIS 0" in art.source            # causal: query blocks differ in work, longest first
    _, unmasked = _attention_program(128, False)
    assert "#define HK_WORK_AXIS -1" in be.compile(unmasked, be.target("sm_90a"), {"variant": "fa3"}).source
    assert art.source.count("hk_tile = hk::dealt_tile(hk_k, blockIdx.x, gridDim.x);") == 2   # producer's, consumers'
    flat = be.compile(program, be.target("sm_90a"), {"variant": "base"})
    assert "persistent" not in flat.launch and "hk_tile" not in flat.source and "#define HK_WORK_AXIS -1" in flat.source
    small = attention.attention_fwd_kernel.trace(*args, **attention.candidates({"D": 128, "MASKED": True})[-1])
    assert "persistent" not in be.compile(small, be.target("sm_90a"), {"variant": "fa3"}).launch   # not specialised


def test_persistent_prologue_has_a_copy_per_tile_in_flight():
    """A persistent block keeps two copies of the producer's prologue buffer (attention's Q) where shared memory
    holds them (Plan.prologue_stages): tile t reads copy t % 2, so the producer loads tile t+1's Q while the consumers
    still run tile t, on a barrier pair per copy. prologue_stages=1 is the single copy that waits for the tile's end;
    a block too large for the copy (128x176 at D=128: 240 KiB) keeps one on its own."""
    from hk_portable.codegen import resources
    cfg, program = _attention_program(128, False)
    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    q_bytes = cfg["BM"] * 128 * 2
    two = be.compile(program, target, {"variant": "fa3"})
    one = be.compile(program, target, {"variant": "fa3", "prologue_stages": 1})
    ring = 2 * cfg["STAGES"]                                   # K's and V's barrier pairs come first
    assert f"hk_full[{ring + 2}]" in two.source and f"hk_full[{ring + 1}]" in one.source
    assert two.source.count(f"hk_smem + 0 + hk_round % 2 * {q_bytes});") == 2       # producer's and consumers' view
    assert f"hk::ring_acquire<2>(hk_full + {ring}, hk_empty + {ring}, hk_round, {q_bytes});" in two.source
    assert f"hk::ring_wait<2>(hk_full + {ring}, hk_round);" in two.source
    assert "hk_round % " not in one.source and f"hk::ring_acquire<1>(hk_full + {ring}," in one.source
    assert two.launch["shared_bytes"] == one.launch["shared_bytes"] + resources.round_up(q_bytes, 1024)
    assert two.options["schedule"]["prologue_stages"] == 2
    big_cfg = {**cfg, "BN": 176}
    big = attention.attention_fwd_kernel.trace(*_attention_args(128), **big_cfg)
    assert "hk_round % " not in be.compile(big, target, {"variant": "fa3"}).source           # no room for the copy


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("left_bound", [True, False])
def test_masked_attention_keeps_wgmma_async_and_fa3(d, left_bound):
    """Causal attention on FA3's schedule as the library builds it, with the window's left compare (LEFT_BOUND) and
    without it (a causal mask): ptxas must not serialise the wgmma (C7520/C7514, which cost 30 % on the H200 when the
    leading masked blocks' pipeline was dropped for a causal mask), nor spill; the left compare is gone without it."""
    from hk_portable.backends.cuda import compiler
    cfg = {**_first_ranked(d, True), "LEFT_BOUND": left_bound}
    program = attention.attention_fwd_kernel.trace(*_attention_args(d), **cfg)
    be = hk.get_backend("cuda")
    art = be.compile(program, be.target("sm_90a"), {})
    assert art.options["schedule"]["variant"] == "fa3" and art.resources["spill_stores"] == 0
    assert sum(o.opcode == "pipeline" for o in program.body.ops) == 3        # the leading blocks' pipeline stays
    assert ("&& !v" in art.source) is left_bound                            # the left compare: ~causal_at
    log = compiler.compile_source(art.source, art.kernel_name, "sm_90a").log
    assert not compiler.wgmma_serialized(log) and "C7520" not in log and "C7514" not in log, log
    assert "wgmma_serialized" not in art.resources


def test_wgmma_serialisation_is_read_from_the_ptxas_log():
    """compiler.wgmma_serialized reads ptxas' note (NVRTC 13.5's words, seen on the FA3 attention kernel before A's
    fragments were packed ahead of the fence) and not its neighbours (the injected-arrive note alone is harmless)."""
    from hk_portable.backends.cuda import compiler
    note = ("ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
            "program dependence on compiler-inserted WG.AR in divergent path in the function 'attention_fwd_kernel'")
    arrive = ("ptxas info    : (C7519) warpgroup.arrive is injected in around line 5012 by compiler to allow use of "
              "registers in GMMA in function 'attention_fwd_kernel'")
    assert compiler.wgmma_serialized(note) and not compiler.wgmma_serialized(arrive)


STORE_TMA = "if (hk_tma_ok & 2) hk::store_tma<"


def test_epilogue_stores_whole_tiles_by_tma_where_shared_memory_holds_them():
    """Plan.tma_stores: a specialised kernel's store of a 16-bit tile holding one 16-row block per warp goes through
    shared memory and TMA (each warpgroup its 64 rows in 64-column chunks, box 64x64, two 8 KiB chunk buffers a
    warpgroup) where the launch encoded the output's map (flag bit 2), plain otherwise; the TMA stores are drained
    before the block ends. Shared memory decides: the staging area is given up last (attention at D=128 keeps it and
    the second Q copy: 225 KiB; with 176-key blocks neither); a 128x256 GEMM keeps it beside 4 stages; one chunk wide
    (D=64) takes one buffer a warpgroup; an f32 output (4-byte) keeps plain stores; tma_store=False turns it off."""
    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    cfg, program = _attention_program(128, True)
    art = be.compile(program, target, {"variant": "fa3"})
    assert art.source.count(STORE_TMA) == 1 and art.source.count("hk::store_tma_drain();") == 1
    assert art.source.index(STORE_TMA) < art.source.index("hk::store_tma_drain();")
    maps = art.launch["tma"]
    assert [m["store"] for m in maps] == [False, False, False, True]                 # K, V, Q, then O
    assert maps[-1] == {"param": 3, "rank": 4, "dtype": "bf16", "box_rows": 64, "box_cols": 64, "store": True,
                        "reduce": False, "transpose": False, "bit": tma.STORES_OK}
    assert art.launch["shared_bytes"] <= target.max_shared_bytes and "hk_round % 2" in art.source
    plain = be.compile(program, target, {"variant": "fa3", "tma_store": False})
    assert STORE_TMA not in plain.source and all(not m["store"] for m in plain.launch["tma"])
    assert art.launch["shared_bytes"] == plain.launch["shared_bytes"] + 2 * 2 * 64 * 128
    assert "hk::store_tma<2>(" in art.source
    cfg64, program64 = _attention_program(64, True)
    assert "hk::store_tma<1>(" in be.compile(program64, target, {"variant": "fa3"}).source

    def gemm_source(stages, out_dtype=torch.bfloat16):
        gcfg = dict(BM=128, BN=256, BK=64, STAGES=stages, num_warps=8)
        return be.compile(gemm_kernel.trace(_meta(300, 256), _meta(256, 520), _meta(300, 520, dtype=out_dtype),
                                            **gcfg), target, {}).source
    assert STORE_TMA in gemm_source(4) and STORE_TMA in gemm_source(3)
    big = attention.attention_fwd_kernel.trace(*_attention_args(128), **{**cfg, "BN": 176})
    assert STORE_TMA not in be.compile(big, target, {"variant": "fa3"}).source        # a 176-key ring leaves no room
    assert STORE_TMA not in gemm_source(3, torch.float32)


def test_attention_bwd_adds_dq_by_tma_reduce_without_spills():
    """Plan.tma_reduces (the option tma_reduce, on by default since it ran on an H100, 2026-12-07): the backward's dQ atomic adds (an f32 wgmma accumulator tile, one 16-row block per warp,
    into a parameter the kernel never reads) go through the chunk buffers the epilogue's TMA stores use and one TMA
    reduce-add per 32-column chunk: two maps on the accumulator, as viewed (flag bit 4) and of the tensor its
    transposed view views (bit 8: the D128 kernel adds dQᵀ), the as-viewed chunks added from shared memory where the
    launch encoded neither. The library's sm_90a bf16 configurations keep 0 spills and their shared memory (the f16
    D128 masked build spilled 12 bytes with them: the build search gives them up there, below)."""
    import math
    from hk_portable.kernels import attention_bwd as ab
    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    for D, masked in ((128, True), (128, False), (64, True)):
        B, Hq, Hkv, N = 2, 16, 4, 1024
        q, k = _meta(B, Hq, N, D), _meta(B, Hkv, N, D)
        lse = _meta(B, Hq, N, dtype=torch.float32)
        acc = _meta(B, Hq, N, D, dtype=torch.float32)
        cfg = ab.candidates(dict(D=D, MASKED=masked, ATOMIC_DQ=True))[0]
        args = (q, k, k, q, lse, lse, k, k, acc.transpose(-1, -2) if cfg.get("DQ_T") else acc, 1 / math.sqrt(D),
                0, N, 0)
        program = ab.attention_bwd_dkdv_kernel.trace(*args, **cfg)
        assert not any(m["reduce"] for m in be.compile(program, target, {"tma_reduce": False}).launch["tma"])
        art = be.compile(program, target, {})       # on by default
        maps = art.launch["tma"]
        reduces = [m for m in maps if m["reduce"]]
        # both forms: the tile is 64 columns wide (dQᵀ's 64 queries at D128, dQ's 64 head dims at D64)
        assert [(m["param"], m["transpose"], m["bit"]) for m in reduces] == [(8, False, tma.REDUCE_OK),
                                                                           (8, True, tma.REDUCE_T_OK)]
        assert all((m["dtype"], m["box_rows"], m["box_cols"]) == ("f32", 64, 32) for m in reduces)
        assert "hk::reduce_tma<2>(" in art.source and "hk::reduce_viewed<2>(" in art.source
        assert "hk::atomic_add(" not in art.source
        assert art.resources["spill_stores"] == 0 and art.resources["stack_bytes"] == 0, (D, masked, art.resources)
        assert art.launch["shared_bytes"] <= target.max_shared_bytes
        ptx = art.asm or ""
        assert ptx.count("cp.reduce.async.bulk.tensor.4d") == 4, (D, masked)      # two 32-column chunks a form
    f16 = (_meta(B, Hq, N, 128, dtype=torch.float16), _meta(B, Hkv, N, 128, dtype=torch.float16))
    cfg = ab.candidates(dict(D=128, MASKED=True, ATOMIC_DQ=True))[0]
    args = (f16[0], f16[1], f16[1], f16[0], lse, lse, f16[1], f16[1], acc.transpose(-1, -2), 0.1, 0, N, 0)
    art = be.compile(ab.attention_bwd_dkdv_kernel.trace(*args, **cfg), target, {})
    assert art.resources["spill_stores"] == 0 and "hk::reduce_" not in art.source
    assert art.options["build_tries"][-1]["change"] == "tma_reduce=False"


def test_tensor_map_flag_keeps_loads_on_tma_when_only_a_store_map_fails(monkeypatch):
    """The launch's flag (tma.TensorMaps): bit 1 when every map a kernel reads through was encoded, bit 2 when the
    maps it writes through were too; a read map that fails zeroes everything (the cp.async path), a written one
    only clears bit 2 (plain stores)."""
    specs = [{"param": 0, "rank": 2, "dtype": "bf16", "box_rows": 64, "box_cols": 64, "store": False},
             {"param": 1, "rank": 2, "dtype": "bf16", "box_rows": 64, "box_cols": 64, "store": True}]
    maps = tma.TensorMaps(specs, 16)
    a, b, bad = (torch.empty(64, 64, dtype=torch.bfloat16) for _ in range(3))
    good = {a.data_ptr(): b"\1" * 128, b.data_ptr(): b"\2" * 128}
    monkeypatch.setattr(tma, "encode", lambda t, spec: good.get(t.data_ptr()))
    flag = lambda tail: int.from_bytes(tail[-4:], "little")
    assert flag(maps.tail((a, b))) == tma.LOADS_OK | tma.STORES_OK
    tail = maps.tail((a, bad))
    assert flag(tail) == tma.LOADS_OK and tail[:128] == good[a.data_ptr()] and tail[128:256] == bytes(128)
    assert maps.tail((bad, b)) == bytes(maps.size - maps.first)


def test_fa3_survives_an_nvrtc_log_without_the_ptxas_report(monkeypatch):
    """On the H200 some pytest processes got an empty NVRTC log for the FA3 build (cause unknown): the register
    count the hand-over is checked against then comes from the cubin (compiler.cubin_resources), so FA3's schedule
    is still taken, and the Artifact keeps the log it got."""
    from dataclasses import replace

    from hk_portable.backends.cuda import compiler
    real = compiler.compile_source
    monkeypatch.setattr(compiler, "compile_source", lambda *a, **k: replace(real(*a, **k), log=""))
    cfg, program = _attention_program(128, True)
    be = hk.get_backend("cuda")
    art = be.compile(program, be.target("sm_90a"))
    assert art.options["schedule"]["variant"] == "fa3" and art.launch.get("hand_over_registers")
    assert art.options["ptxas_log"] == "" and art.resources["registers"] == art.launch["hand_over_registers"]


# ----------------------------------------------------------------------------------------- GPU
@pytest.fixture(scope="module")
def hopper():
    be = hk.get_backend("cuda")
    st = be.status()
    if not st.available:
        pytest.skip(f"cuda backend unusable here: {st.reason}")
    if be.default_target().arch != "sm_90a":
        pytest.skip(f"needs an sm_90a GPU, this one is {be.default_target().arch}")
    return be


def _rel_err(out, a, b):
    ref = a.double() @ b.double()
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


@pytest.mark.gpu
# the last three run more tiles than SMs, with fewer k-steps per tile than stages (136: 3 steps, 64: 1 step)
@pytest.mark.parametrize("M,N,K", [(256, 512, 256), (300, 520, 200), (129, 257, 64), (1, 1000, 1000), (1000, 3, 72),
                                   (4000, 4000, 4000), (3000, 3000, 136), (2048, 4096, 64)])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
def test_gemm_on_tma_and_wgmma_matches_float64(hopper, M, N, K, dtype, out_dtype):
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
    gemm(a, b, out, backend="cuda")
    tol = 1e-5 if out_dtype == torch.float32 else 8e-3
    assert _rel_err(out, a, b) < tol


@pytest.mark.gpu
def test_gemm_falls_back_to_the_ring_for_tensors_tma_cannot_read(hopper):
    base = torch.randn(300, 257, device="cuda", dtype=torch.bfloat16)
    a = base[:, :256]                                   # 514-byte rows: no tensor map
    b = torch.randn(256, 130, device="cuda", dtype=torch.bfloat16)
    assert tma.describe(a, {"rank": 2, "dtype": "bf16", "box_rows": 128, "box_cols": 64}) is None
    out = torch.full((300, 130), float("nan"), device="cuda")
    tile = dict(BM=128, BN=256, BK=64, STAGES=4, num_warps=8)   # a named config: no restaging (test_gemm_shapes)
    gemm(a, b, out, backend="cuda", **tile)
    assert _rel_err(out, a, b) < 1e-5
    bt = torch.randn(130, 256, device="cuda", dtype=torch.bfloat16).t()      # column-major B
    gemm(a.contiguous(), bt, out, backend="cuda", **tile)
    assert _rel_err(out, a, bt) < 1e-5


SCHEDULES = {"base": {"variant": "base"}, "auto": {}, "fa3": {"variant": "fa3"},
             "fa3-one-q": {"variant": "fa3", "prologue_stages": 1}}


@pytest.mark.parametrize("d, masked, fa3", [(128, False, True), (128, True, True), (64, False, True)])
def test_backend_takes_fa3_schedule_where_measured(d, masked, fa3):
    """schedule.fa3_variant: attention on two consumer warpgroups, causal or not, gets FA3's schedule (split ring,
    Q on the producer, overlap, ping-pong, persistent grid; +20 % causal on the H200), kept only when the build
    neither spills nor loses the register hand-over; on three (D64's 192-row block, +8-15 % on the H200) a spill of
    at most schedule.FA3_SPILL_BYTES[3] is kept too. A variant the caller names is taken as given."""
    cfg, program = _attention_program(d, masked)
    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    art = be.compile(program, target)
    chosen = art.options["schedule"]
    why = f"{chosen}; built with {art.resources}, launch {art.launch.get('hand_over_registers')}"
    if fa3 and chosen["variant"] != "fa3":
        tried = be.compile(program, target, {"variant": "fa3"})
        why += (f"; FA3 alone: {tried.resources}, hand-over {tried.launch.get('hand_over_registers')}, NVRTC "
                f"{tried.options['nvrtc']} from {tried.options.get('nvrtc_library')}; ptxas log without a report: "
                f"{tried.options.get('ptxas_log', '(had one)')!r}")
    assert (chosen["variant"] == "fa3") is fa3 and ("why" in chosen) is fa3, why
    groups = program.num_warps // schedule.PRODUCER_WARPS
    assert (f"hk::turn_wait<{groups}>();" in art.source) is fa3
    assert bool(art.launch.get("persistent")) is fa3
    if fa3:
        assert art.resources["spill_stores"] <= schedule.FA3_SPILL_BYTES[groups] and art.launch["hand_over_registers"]
        plain = be.compile(program, target, {"variant": "base"})
        assert "hk::turn_wait<" not in plain.source and plain.options["schedule"]["variant"] == "base"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(SCHEDULES))
@pytest.mark.parametrize("d, causal", [(128, False), (128, True), (64, False), (64, True)])
def test_attention_schedules_match_float64(hopper, variant, d, causal):
    """Each ring and schedule the cuda backend can pick for attention, on the GPU against float64: ragged N (a
    partial last key block), causal edges, GQA, the output poisoned first, the tile the library launches."""
    torch.manual_seed(d + causal)
    n = 1000
    q = torch.randn(2, 8, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o = torch.full_like(q, float("nan"))
    lse = torch.full((2, 8, n), float("nan"), device="cuda")
    args = (q, k, v, o, lse, d ** -0.5, 0, n if causal else 0, 0)
    cfg = _first_ranked(d, causal)
    program = attention.attention_fwd_kernel.trace(*args, **cfg)
    art = hopper.compile(program, hopper.target("sm_90a"), SCHEDULES[variant])
    hopper.launch(art, args, (-(-n // cfg["BM"]), 8, 2))
    torch.cuda.synchronize()
    ref, ref_lse = attention.reference(q, k, v, causal=causal)
    assert float((o.double() - ref).abs().max()) < 2e-2
    assert float((lse.double() - ref_lse).abs().max()) < 1e-3


def test_non_specialised_ring_refills_before_computing():
    """The 64x64 attention block (one warpgroup, not specialised) runs its pipelines on TMA; its steps' products wait
    for themselves, so each ring issues the next step's copy before this step computes (+9 % at D64 causal N1024 on
    the H200). On rings of their own (one_ring=False), three pipeline_tma calls."""
    cfg, program = _attention_program(64, True, candidate=-1)
    assert (cfg["BM"], cfg["BN"], cfg["num_warps"] if "num_warps" in cfg else 4) == (64, 64, 4)
    be = hk.get_backend("cuda")
    p = schedule.plan(program, be.target("sm_90a"), schedule.Base(one_ring=False))
    assert not p.producer_warps and {pp.schedule for pp in p.pipelines.values()} == {"tma"}
    assert not any(pp.async_mma for pp in p.pipelines.values()) and not p.ring_runs
    art = be.compile(program, be.target("sm_90a"), {"one_ring": False})
    calls = re.findall(r"hk::pipeline_tma<(\d+), (\d+), (true|false)>\(", art.source)
    assert len(calls) == 3, calls
    assert art.resources["spill_stores"] == 0


def test_consecutive_pipelines_share_one_ring_and_publish_q_with_its_first_copies():
    """schedule._ring_runs: the 64x64 causal block's three pipelines (leading edge, full blocks, diagonal) form one run
    whose trip counts are hoisted before the ring opens, and Q's load is published after the ring's first copies
    (late_publish). The emitted kernel opens the ring once, runs three ring_steps and closes it; without one_ring each
    pipeline has its own ring. The library's build keeps five blocks an SM: where the ring's build
    spills at that count the fill takes separate rings (backend._fill_sm)."""
    be = hk.get_backend("cuda")
    target = be.target("sm_90a")
    q = _meta(16, 16, 1024, 64)
    args = (q, q, q, q, _meta(16, 16, 1024, dtype=torch.float32), 0.125, 0, 2048, 0)
    program = attention.attention_fwd_kernel.trace(*args, **{**attention.config_for(64), "MASKED": True,
                                                             "LEFT_BOUND": False})
    p = schedule.plan(program, target)
    pipes = [o for o in program.body.ops if o.opcode == "pipeline"]
    assert p.ring_runs == (tuple(id(o) for o in pipes),) and len(p.ring_hoist) == 2
    (q_load,) = [o for o in program.body.ops if o.opcode == "global_to_shared"]
    assert p.late_publish == {id(q_load)}
    assert not schedule.plan(program, target, schedule.Base(one_ring=False)).ring_runs
    ring = be.compile(program, target, {"fill_sm": False})
    src = ring.source
    assert src.count("hk::ring_open<") == 1 and src.count("hk::ring_steps<") == 3 and src.count("hk::ring_close<") == 1
    assert src.index("hk::ring_open<") < src.index("hk::publish_copies();") < src.index("hk::ring_steps<")
    assert "hk::pipeline_tma<" not in src and ring.resources["spill_stores"] == 0
    lib = be.compile(program, target)
    assert lib.options["launch_bounds_min_blocks"] == 5 and lib.resources["spill_stores"] == 0, lib.resources
    if "hk::ring_steps<" not in lib.source:
        assert lib.options["schedule"]["one_ring"] is False and lib.source.count("hk::pipeline_tma<") == 3


@hk.kernel(num_warps=4)
def _two_halves_gemm(a: GL[2], b: GL[2], c: GL[2], *, BM: hk.const = 64, BN: hk.const = 64, BK: hk.const = 64):
    """C = A @ B with K walked in two pipelines on one accumulator (each an async wgmma chain): a ring run whose steps
    leave their products in flight, which no library kernel has."""
    m, n = hk.block_idx(0), hk.block_idx(1)
    a_s = hk.shared(ST[a.dtype, BM, BK], stages=2)
    b_s = hk.shared(ST[b.dtype, BK, BN], stages=2)
    kt = hk.cdiv(a.shape[1], BK)
    half = kt // 2

    def blocks(lo, hi, acc):
        def load(k, s):
            hk.load(a_s[s], a, (m, lo + k))
            hk.load(b_s[s], b, (lo + k, n))

        def compute(k, s, acc):
            return hk.mma(a_s[s], b_s[s], acc)

        return hk.pipeline(hi - lo, load, compute, carry=acc, stages=2)

    acc = blocks(half, kt, blocks(0, half, hk.zeros(RT[f32, BM, BN])))
    hk.store(c, acc, (m, n))


def _two_halves_program(m: int, n: int, k: int, device="meta"):
    args = (torch.empty(m, k, dtype=torch.bfloat16, device=device), torch.empty(k, n, dtype=torch.bfloat16, device=device),
            torch.empty(m, n, dtype=torch.float32, device=device))
    return args, _two_halves_gemm.trace(*args)


def test_a_ring_run_of_async_chains_compiles():
    """Two accumulator-chain pipelines of a 4-warp block form one ring run; each keeps its async wgmma (ring_steps
    with ASYNC retires and releases its last step when it ends), and the build neither spills nor loses the ring."""
    _, program = _two_halves_program(300, 520, 1000)
    be = hk.get_backend("cuda")
    p = schedule.plan(program, be.target("sm_90a"))
    assert len(p.ring_runs) == 1 and len(p.ring_runs[0]) == 2 and not p.producer_warps
    assert all(p.pipelines[i].async_mma for i in p.ring_runs[0])
    art = be.compile(program, be.target("sm_90a"), {"fill_sm": False})
    assert art.source.count("hk::ring_steps<2, 16384, true>(") == 2 and art.resources["spill_stores"] == 0


def test_single_stage_pipelines_keep_the_ring():
    """A one-stage TMA pipeline would wait on a copy nobody issued yet (it hung on the H200)."""
    from hk_portable.backends.cuda.backend import CudaBackend
    be = hk.get_backend("cuda")
    args = (_meta(300, 256), _meta(256, 520), _meta(300, 520, dtype=torch.float32))
    prog = gemm_kernel.trace(*args, BM=128, BN=128, BK=64, STAGES=1, num_warps=8)
    p = schedule.plan(prog, be.target("sm_90a"))
    assert [pp.schedule for pp in p.pipelines.values()] == ["cp_async"] and not p.uses_tma
    assert isinstance(be, CudaBackend)


RINGS = {"library": {}, "one-ring": {"fill_sm": False}, "ring-each": {"one_ring": False}}


@pytest.mark.gpu
@pytest.mark.parametrize("ring", list(RINGS))
@pytest.mark.parametrize("mask", ["causal", "window", "none"])
def test_non_specialised_ring_matches_float64(hopper, ring, mask):
    """The 64x64 block's TMA rings on the GPU against float64: the library's build, one ring across its
    pipelines (the build that keeps it: four blocks an SM) or one each; ragged N (a partial last key block), GQA, a
    causal band or a window (up to three pipelines), the outputs poisoned first."""
    torch.manual_seed(7 + len(ring))
    n, d = 1000, 64
    q = torch.randn(2, 8, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o = torch.full_like(q, float("nan"))
    lse = torch.full((2, 8, n), float("nan"), device="cuda")
    causal, window = mask == "causal", ((100, 20) if mask == "window" else None)
    shift, left, right = attention.band(n, n, causal, window, None) or (0, 0, 0)
    args = (q, k, v, o, lse, d ** -0.5, shift, left, right)
    cfg = {**attention.config_for(d), "MASKED": mask != "none", "LEFT_BOUND": mask == "window"}
    program = attention.attention_fwd_kernel.trace(*args, **cfg)
    art = hopper.compile(program, hopper.target("sm_90a"), RINGS[ring])
    assert not art.launch.get("producer_warps") and art.launch.get("tma")
    if ring != "library":               # (the library's own build: one ring where it fits five blocks an SM)
        assert ("hk::ring_steps<" in art.source) is (ring == "one-ring")
    hopper.launch(art, args, (-(-n // cfg["BM"]), 8, 2))
    torch.cuda.synchronize()
    ref, ref_lse = attention.reference(q, k, v, causal=causal, window=window)
    assert float((o.double() - ref).abs().max()) < 2e-2
    assert float((lse.double() - ref_lse).abs().max()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("switches", [{"fill_sm": False}, {"one_ring": False}], ids=["one-ring", "ring-each"])
def test_a_ring_run_of_async_chains_matches_float64(hopper, switches):
    """The ring run whose steps leave their products in flight (test_a_ring_run_of_async_chains_compiles) on the GPU
    against float64: ragged M, N and K (an odd number of key tiles, so the halves differ), the output poisoned."""
    torch.manual_seed(11)
    (a, b, c), program = _two_halves_program(300, 520, 1000, device="cuda")
    a.copy_(torch.randn_like(a, dtype=torch.float32))
    b.copy_(torch.randn_like(b, dtype=torch.float32))
    c.fill_(float("nan"))
    art = hopper.compile(program, hopper.target("sm_90a"), switches)
    hopper.launch(art, (a, b, c), (-(-300 // 64), -(-520 // 64), 1))
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    assert float((c.double() - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.gpu
def test_autotuning_gemm_on_the_gpu_takes_under_a_minute_and_is_reused(hopper, tmp_path, monkeypatch):
    import json
    import time

    from hk_portable.runtime import tuning
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(tuning.ENV, "1")
    tuning.forget()
    gemm_kernel._configs.clear()
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.full((2048, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    gemm(a, b, out, backend="cuda")
    torch.cuda.synchronize()
    assert time.perf_counter() - t0 < 60
    assert _rel_err(out, a, b) < 8e-3
    (entry,) = json.loads((tmp_path / tuning.FILE).read_text()).values()
    be = hk.get_backend("cuda")
    accepted = []                 # what the target's check takes (not hip's 256x256 blocks: they would spill)
    for cfg in CANDIDATES:
        try:
            be.check(gemm_kernel.trace(a, b, out, **cfg), be.target("sm_90a"))
            accepted.append(cfg)
        except UnsupportedError:
            pass
    tile = {k: entry["config"][k] for k in accepted[0]}    # the winner carries the call's layout flags too
    refused = [c for c in CANDIDATES if c not in accepted]
    assert tile in accepted and refused and all(c["BM"] == c["BN"] == 256 for c in refused), refused
    timed = [c for c, _ in entry["ms"]]                  # the backend's proposals (Backend.propose) are timed too
    missed = [cfg for cfg in accepted if not any(all(c.get(k) == v for k, v in cfg.items()) for c in timed)]
    assert not missed, f"candidates the check accepts did not run: {missed} ({entry.get('skipped')})"
    print("autotune gemm 2048^3:", entry)
    tuning.forget()
    gemm_kernel._configs.clear()
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: pytest.fail("a stored winner is not timed again"))
    gemm(a, b, out, backend="cuda")
    gemm_kernel._configs.clear()
    tuning.forget()


@pytest.mark.gpu
@pytest.mark.parametrize("causal,n,d", [(True, 333, 128), (True, 2100, 128), (False, 1024, 128), (False, 200, 64)])
def test_persistent_attention_matches_float64(hopper, causal, n, d):
    """The FA3 variant's persistent grid on the GPU: more tiles than SMs (B8 H24), ragged and causal edges, causal
    tiles in block order (3 query blocks) and longest first (17, built with longest_first=16); the
    output is poisoned first, so a tile no block walked shows as NaN."""
    torch.manual_seed(n)
    q, k, v = (torch.randn(8, 24, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    lse = torch.full((8, 24, n), float("nan"), device="cuda")
    args = (q, k, v, o, lse, d ** -0.5, 0, n if causal else 0, 0)
    cfg = _first_ranked(d, causal)
    program = attention.attention_fwd_kernel.trace(*args, **cfg)
    art = hopper.compile(program, hopper.target("sm_90a"), {"variant": "fa3", "longest_first": 16})
    assert art.launch.get("persistent") is True and "#define HK_LONGEST_FIRST_MIN 16" in art.source
    hopper.launch(art, args, (-(-n // cfg["BM"]), 24, 8))
    torch.cuda.synchronize()
    ref, ref_lse = attention.reference(q, k, v, causal=causal)
    assert float((o.double() - ref).abs().max()) < 2e-2
    assert float((lse.double() - ref_lse).abs().max()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("out_view,d", [("contiguous", 128), ("contiguous", 64), ("unaligned-rows", 128)])
def test_tma_store_epilogue_matches_float64_or_falls_back(hopper, out_view, d):
    """The epilogue's TMA store on the GPU (FA3's schedule, ragged N: the store clips the last query block; more
    tiles than SMs; D=128: two chunks a warpgroup, D=64: 192-query blocks, three warpgroups of one chunk), and an
    output whose 258-byte rows TMA cannot describe: the loads stay on TMA, the kernel stores plainly (flag bit 2
    clear). The output is poisoned first; rows outside it must stay untouched."""
    torch.manual_seed(7)
    n = 1000
    q, k, v = (torch.randn(4, 40, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if out_view == "contiguous":
        o = torch.full_like(q, float("nan"))
    else:
        o = torch.full((4, 40, n, d + 1), float("nan"), device="cuda", dtype=torch.bfloat16)[..., :d]
        assert tma.describe(o, {"rank": 4, "dtype": "bf16", "box_rows": 64, "box_cols": 64}) is None
    lse = torch.full((4, 40, n), float("nan"), device="cuda")
    args = (q, k, v, o, lse, d ** -0.5, 0, 0, 0)
    cfg = _first_ranked(d, False)
    program = attention.attention_fwd_kernel.trace(*args, **cfg)
    art = hopper.compile(program, hopper.target("sm_90a"), {"variant": "fa3"})
    assert STORE_TMA in art.source
    hopper.launch(art, args, (-(-n // cfg["BM"]), 40, 4))
    torch.cuda.synchronize()
    ref, _ = attention.reference(q, k, v)
    assert float((o.double() - ref).abs().max()) < 2e-2
    if out_view != "contiguous":
        assert o.as_strided((4, 40, n), (40 * n * (d + 1), n * (d + 1), d + 1), o.storage_offset() + d).isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("M,N,K", [(300, 520, 200), (4000, 4000, 4000), (129, 1000, 64)])
def test_gemm_with_tma_store_epilogue_matches_float64(hopper, M, N, K, stages):
    """A GEMM whose bf16 output goes out by TMA stores (128x256 tiles: four 64-column chunks a warpgroup through two
    buffers), ragged edges clipped by the tensor map, the output poisoned first."""
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out, backend="cuda", BM=128, BN=256, BK=64, STAGES=stages, num_warps=8)
    assert _rel_err(out, a, b) < 8e-3


@pytest.mark.gpu
@pytest.mark.parametrize("n, nkv, window, align", [(1000, 1000, None, None), (700, 1300, (300, 0), "bottom_right"),
                                                    (500, 500, (40, 0), None), (130, 900, (None, 200), "bottom_right")])
def test_fa3_masked_attention_matches_float64(hopper, n, nkv, window, align):
    """FA3's schedule on the GPU against float64 where a pipeline may have no step: causal, a window whose leading
    masked blocks are many, a window narrower than a key block (no unmasked block), keys past the diagonal; GQA,
    ragged N, more tiles than SMs, the output poisoned first."""
    torch.manual_seed(n)
    d = 128
    q = torch.randn(4, 16, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4, 8, nkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    shift, left, right = attention.band(n, nkv, window is None, window, align)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((4, 16, n), float("nan"), device="cuda")
    args = (q, k, v, o, lse, d ** -0.5, shift, left, right)
    cfg = _first_ranked(d, True)
    program = attention.attention_fwd_kernel.trace(*args, **cfg)
    art = hopper.compile(program, hopper.target("sm_90a"), {"variant": "fa3"})
    assert art.options["schedule"]["variant"] == "fa3"
    hopper.launch(art, args, (-(-n // cfg["BM"]), 16, 4))
    torch.cuda.synchronize()
    ref, ref_lse = attention.reference(q, k, v, causal=window is None, window=window, align=align)
    assert float((o.double() - ref).abs().max()) < 2e-2
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    seen = torch.isfinite(ref_lse)
    assert float((lse.double() - ref_lse)[seen].abs().max()) < 1e-3
