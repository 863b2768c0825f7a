"""The opcode table and the verifier: every opcode has a rule everywhere it must (interpreter, C++
emitters, verifier, a conformance op case), every Program the library and the conformance suite make
verifies, and malformed Programs are rejected with errors that name the op and the rule."""
from __future__ import annotations

import copy
import importlib
import subprocess
import sys

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.cuda.codegen import CudaEmitter
from hk_portable.backends.hip.codegen import HipEmitter
from hk_portable.backends.reference.interpreter import Interpreter
from hk_portable.codegen.cstyle import CStyleEmitter
from hk_portable.conformance.cases import all_cases
from hk_portable.conformance.runner import OPCODE_CAPABILITIES
from hk_portable import Kernel
from hk_portable.interface import GL, RT, ST, Artifact, Backend, BackendStatus, Target, TraceError, f32
from hk_portable.interface import dtypes as D
from hk_portable.interface import opcodes
from hk_portable.interface.ir import GlobalType, Op, Param, Program, ScalarType, TileType, Value
from hk_portable.interface.tracer import Builder, emit
from hk_portable.interface.verify import RULES, VerifyError, verify

LIBRARY = ("gemm", "attention", "layernorm")


# ------------------------------------------------------------------------------------------- the table
def test_the_table_is_plain_printable_data():
    assert len(opcodes.OPCODES) == len(set(opcodes.OPCODES)) == len(opcodes.OPS)
    text = opcodes.describe()
    for name in opcodes.OPCODES:
        assert f"\n{name}(" in "\n" + text
    mma = str(opcodes.TABLE["mma"])
    assert ("mma(a: rt|st<bf16|f16|fp8e4m3|fp8e5m2>, b: rt|st<bf16|f16|fp8e4m3|fp8e5m2>, acc: rt<f32>) -> rt<f32>"
            in mma)
    assert "trans_a: bool" in mma and "reads shared" in mma and "role: contraction" in mma
    assert "role: move (global -> register)" in str(opcodes.TABLE["global_to_register"])
    with pytest.raises(Exception):
        opcodes.TABLE["mma"].name = "other"                    # frozen
    out = subprocess.run([sys.executable, "-m", "hk_portable.interface.opcodes"], capture_output=True, text=True,
                         check=True).stdout
    assert out == text


def test_names_say_the_data_path():
    """A move's path (source, destination) is its name, source_to_destination (atomic_add is named for the add it
    does on the way), and its effects: it reads memory at its source and writes memory at its destination."""
    assert not {"load_gl", "load_st", "st_to_rt", "rt_to_st", "store_gl", "sbin", "scast"} & set(opcodes.OPCODES)
    assert opcodes.moves() == {s.name for s in opcodes.OPS if s.path} == {s.name for s in opcodes.OPS
                                                                          if s.role == opcodes.MOVE}
    for name in opcodes.moves():
        src, dst = opcodes.TABLE[name].path
        assert src != dst and {src, dst} <= set(opcodes.SPACES)
        assert name == f"{src}_to_{dst}" or name == "atomic_add"
        e = opcodes.TABLE[name].effects
        assert (src in ("global", "shared")) == (src in e.reads) and (dst in ("global", "shared")) == (dst in e.writes)
    assert opcodes.TABLE["atomic_add"].path == ("register", "global")
    assert opcodes.moves("global", ("register", "scalar")) == {"global_to_register", "global_to_scalar"}
    assert opcodes.moves_between("register", "shared") == {"register_to_shared", "shared_to_register"}
    with pytest.raises(ValueError, match="not a space: registers"):
        opcodes.moves("global", "registers")


def test_the_runner_takes_its_capabilities_from_the_table():
    assert OPCODE_CAPABILITIES == opcodes.capabilities() == {"atomic_add": "atomics", "dropout_mask": "dropout"}


# ------------------------------------------------------------------------------------------- coverage
@pytest.mark.parametrize("cls", [Interpreter, CStyleEmitter, CudaEmitter, HipEmitter],
                         ids=["interpreter", "cstyle", "cuda", "hip"])
def test_every_opcode_has_a_rule(cls):
    cov = opcodes.coverage(cls)
    assert cov, str(cov)


def test_every_opcode_has_a_verifier_rule():
    assert set(RULES) == set(opcodes.OPCODES)


def test_a_class_missing_a_rule_is_refused_when_defined():
    with pytest.raises(TypeError, match="no rule for mma"):
        class NoMma(Interpreter):
            op_mma = None
    with pytest.raises(TypeError, match="rules for opcodes the table does not have: load_gl"):
        class Stale(Interpreter):
            def op_load_gl(self, op, active):
                pass


class _Recorder(Backend):
    """Records the Programs of every launch and runs nothing: tracing the suite stays cheap."""
    name = "recorder"

    def __init__(self):
        self.programs: dict[str, Program] = {}

    def status(self):
        return BackendStatus(True)

    def targets(self):
        return [Target(backend=self.name, arch="cpu", capabilities=("run", "atomics", "dropout"))]

    def check(self, program, target):
        self.programs[program.hash] = program

    def compile(self, program, target, options=None):
        return Artifact(self.name, target.arch, program.name, program.hash)

    def launch(self, artifact, args, grid, stream=None):
        pass

    def cacheable(self):
        return False


def _programs_of(cases) -> list[Program]:
    rec = _Recorder()
    for case in cases:
        setup = case.make(torch.Generator().manual_seed(0))
        setup.launch({**setup.inputs, **setup.outputs}, rec)
    return list(rec.programs.values())


@pytest.fixture(scope="module")
def op_case_programs():
    return _programs_of([c for c in all_cases() if c.kind == "op"])


def test_every_opcode_has_a_conformance_op_case(op_case_programs):
    seen = set().union(*(p.opcodes() for p in op_case_programs))
    assert set(opcodes.OPCODES) - seen == set()


def test_every_conformance_program_verifies(op_case_programs):
    kernel_programs = _programs_of([c for c in all_cases() if c.kind == "kernel" and not c.missing])
    assert len(op_case_programs) > 100 and len(kernel_programs) >= 3
    for p in op_case_programs + kernel_programs:
        verify(p)


@pytest.mark.parametrize("module", LIBRARY)
def test_every_library_kernel_verifies(module):
    mod = importlib.import_module(f"hk_portable.kernels.{module}")
    kernels = {name: k for name, k in vars(mod).items() if isinstance(k, Kernel)}
    assert kernels
    for name, k in kernels.items():        # a kernel's own example_args_<name> where it has one (hk compile's rule)
        args, cfg = getattr(mod, f"example_args_{name}", mod.example_args)()
        verify(k.trace(*args, **cfg))


# ------------------------------------------------------------------------------- malformed programs
@hk.kernel
def _piped(x: GL[2], y: GL[2], *, BM: hk.const = 32, BN: hk.const = 32):
    m = hk.block_idx(0)
    once = hk.shared(ST[x.dtype, BM, BN])
    ring = hk.shared(ST[x.dtype, BM, BN], stages=2)
    hk.load(once, x, (m, 0))
    t = hk.load(RT[x.dtype, BM, BN], x, (m, 0))

    def load(j, s):
        hk.load(ring[s], x, (m, j))

    def compute(j, s, acc):
        return acc + hk.load(RT[x.dtype, BM, BN], ring[s])

    acc = hk.pipeline(hk.cdiv(x.shape[1], BN), load, compute, carry=t, stages=2)
    u = hk.fori_loop(0, 2, lambda i, a: a * 2.0, acc)
    hk.store(y, hk.exp(u) + hk.load(RT[x.dtype, BM, BN], once), (m, 0))


def _fresh():
    """A private copy of a traced Program to break (the kernel's cached one stays intact)."""
    x = torch.zeros(64, 64)
    p = copy.deepcopy(_piped.trace(x, x))
    verify(p)
    return p


def _find(p: Program, opcode: str, region=None) -> Op:
    return next(op for op in (region or p.body).walk() if op.opcode == opcode)


def _rejects(p: Program, *fragments: str) -> str:
    p._text = None
    with pytest.raises(VerifyError) as e:
        verify(p)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, msg
    return msg


def _names(op: Op) -> list[str]:
    """What an error about `op` must contain: the opcode and its result id (if it has one)."""
    return [f"'{op.opcode}'"] + ([f"%{op.results[0].id}"] if op.results else [])


def test_an_unknown_opcode_is_rejected():
    p = _fresh()
    op = _find(p, "unary")
    op.opcode = "frobnicate"
    _rejects(p, "unknown opcode 'frobnicate'", *_names(op))


def test_wrong_operand_types_are_rejected():
    p = _fresh()
    op = _find(p, "unary")
    op.operands = (p.body.args[0],)                       # a tensor where a tile belongs
    _rejects(p, "operand 0 (x) is gl<f32,2>; it must be rt|rv", *_names(op))

    p = _fresh()
    op = _find(p, "binary")
    m = _find(p, "block_idx").result
    op.operands = (op.operands[0], m)
    _rejects(p, "operand 1 (b) is i32", *_names(op))


def test_a_wrong_operand_count_and_a_wrong_result_type_are_rejected():
    p = _fresh()
    op = _find(p, "register_to_global")
    op.operands = op.operands[:-1]                         # one index short of the tensor's rank
    _rejects(p, "needs one index per dimension of the rank-2 tensor, got 1", "'register_to_global'")

    p = _fresh()
    op = _find(p, "unary")
    op.results[0].type = op.results[0].type.with_(dtype=D.bf16)
    _rejects(p, "expected rt<f32,32,32> (the operand's type), got rt<bf16,32,32>", *_names(op))


def test_a_yield_with_the_wrong_carry_types_is_rejected():
    p = _fresh()
    loop = _find(p, "for")
    (body,) = loop.regions
    body.yields = [body.args[0]]                          # the i32 counter, not the rt carry
    _rejects(p, "^body must yield the carry's types (rt<f32,32,32>), yields (i32)", *_names(loop))

    p = _fresh()
    pipe = _find(p, "pipeline")
    pipe.regions[0].yields = [pipe.regions[0].args[0]]    # a load region yields nothing
    _rejects(p, "^load yields nothing, got (i32)", *_names(pipe))


def test_ops_outside_their_allowed_region_are_rejected():
    p = _fresh()
    alloc = _find(p, "alloc_shared")
    again = Op("alloc_shared", (), (Value(10_000, alloc.result.type, p.body),))
    _find(p, "for").regions[0].ops.insert(0, again)
    _rejects(p, "may appear only at the top level of the kernel, not in ^body", *_names(again))

    p = _fresh()                                          # a global store inside the pipeline's load region
    store = _find(p, "register_to_global")
    pipe = _find(p, "pipeline")
    store.operands = (store.operands[0], _find(p, "global_to_register").result, *store.operands[2:])
    p.body.ops.remove(store)
    pipe.regions[0].ops.append(store)
    _rejects(p, "may not appear in a pipeline's load region", "'register_to_global'")

    p = _fresh()                                          # a shared write there that is not ring[s]
    first = _find(p, "global_to_shared")
    p.body.ops.remove(first)
    pipe = _find(p, "pipeline")
    pipe.regions[0].ops.append(first)
    _rejects(p, "shared memory is written only as buf[s]", "'global_to_shared'", "^body/^load")


def test_bad_attributes_are_rejected():
    p = _fresh()
    op = _find(p, "unary")
    op.attrs["op"] = "cube"
    _rejects(p, "attribute op='cube' is not allowed; it must be op=neg|abs|exp", *_names(op))

    p = _fresh()
    op = _find(p, "pipeline")
    op.attrs["schedule"] = "fast"
    _rejects(p, "has no attribute 'schedule' (its attributes: stages)", *_names(op))

    p = _fresh()
    op = _find(p, "global_to_register")
    del op.attrs["fill"]
    _rejects(p, "needs attribute 'fill'", *_names(op))

    p = _fresh()
    op = _find(p, "global_dim")
    op.attrs["index"] = 2
    _rejects(p, "index 2 is out of range for a rank-2 tensor", *_names(op))


def test_a_value_used_where_it_is_not_visible_is_rejected():
    p = _fresh()
    loop = _find(p, "for")
    inner = loop.regions[0].ops[-1].result                 # made inside the loop body
    op = _find(p, "unary")                                 # used after the loop
    op.operands = (inner,)
    _rejects(p, f"operand 0 (%{inner.id}) is not visible here", *_names(op))

    p = _fresh()                                           # used before it is defined
    m = _find(p, "block_idx")
    p.body.ops.remove(m)
    p.body.ops.append(m)
    _rejects(p, f"(%{m.result.id}) is not visible here")


def test_a_hand_built_program_is_checked_too():
    b = Builder()
    x = b.new_value(GlobalType(D.bf16, 2))
    b.body.args = [x]
    i = b.emit("scalar_const", (), [ScalarType(D.i32)], {"value": 0}).result
    a = b.emit("global_to_register", (x, i, i), [TileType("rt", D.bf16, (32, 32))], {"fill": 0.0}).result
    acc = b.emit("fill", (), [TileType("rt", D.f32, (32, 16))], {"value": 0.0}).result
    mma = b.emit("mma", (a, a, acc), [TileType("rt", D.f32, (32, 16))], {"trans_a": False, "trans_b": False})
    p = Program("hand", [Param("x", x.type)], b.body, {})
    _rejects(p, "the accumulator must be 32x32, got rt<f32,32,16>", *_names(mma))
    mma.operands = (a, a, b.emit("fill", (), [TileType("rt", D.f32, (32, 32))], {"value": 0.0}).result)
    b.body.ops.insert(len(b.body.ops) - 2, b.body.ops.pop())          # the new fill before the mma
    mma.results[0].type = TileType("rt", D.f32, (32, 32))
    verify(p)
    b.body.ops.append(Op("scalar_const", (), (i,), {"value": 0}))
    _rejects(p, f"value %{i.id} is defined twice")
    b.body.ops.pop()
    b.body.ops.append(Op("scalar_const", (), (b.new_value(ScalarType(D.f32)),), {"value": 1}))
    _rejects(p, "value 1 does not match the result type f32")


def test_the_tracer_refuses_an_unknown_opcode():
    @hk.kernel
    def k(x: GL[2]):
        emit("load_gl", [x], [TileType("rt", f32, (16, 16))])

    with pytest.raises(TraceError, match="unknown opcode 'load_gl'"):
        k.trace(torch.zeros(4, 4))


def test_verify_runs_before_the_backend_check():
    p = _fresh()
    _find(p, "unary").attrs["op"] = "cube"
    p._text = None
    rec = _Recorder()
    with pytest.raises(VerifyError):
        _piped.compile_for(p, rec)
    assert rec.programs == {}
    assert issubclass(VerifyError, TraceError)


def test_tracing_a_pipeline_whose_load_breaks_the_rules_fails_with_the_rule():
    @hk.kernel
    def writes_global(x: GL[2], y: GL[2]):
        ring = hk.shared(ST[x.dtype, 32, 32], stages=2)

        def load(j, s):
            hk.load(ring[s], x, (0, j))
            hk.store(y, hk.load(RT[x.dtype, 32, 32], x, (0, j)), (0, j))

        hk.pipeline(2, load, lambda j, s: (), stages=2)

    @hk.kernel
    def wrong_stages(x: GL[2]):
        ring = hk.shared(ST[x.dtype, 32, 32], stages=3)
        hk.pipeline(2, lambda j, s: hk.load(ring[s], x, (0, j)), lambda j, s: (), stages=2)

    x = torch.zeros(64, 64)
    with pytest.raises(VerifyError, match="'register_to_global': may not appear in a pipeline's load region"):
        writes_global.trace(x, x)
    with pytest.raises(TraceError, match=r"'global_to_shared': in a pipeline's load region shared memory is written "
                                         r"only as buf\[s\].*stages=2"):
        wrong_stages.trace(x)


def test_roles_read_off_the_table():
    """The opcode roles the lowering reads (opcodes.SCALAR_OPS and what derives from it: cuda's TMA load regions and
    producer warpgroup, the persistent grid's tile-invariant scalars) come from the table's types and effects; a new
    scalar opcode joins them by its entry alone. Pinned here so a table change that moves one is seen."""
    from hk_portable.backends.cuda import schedule
    from hk_portable.codegen import patterns
    from hk_portable.interface import opcodes
    assert opcodes.SCALAR_OPS == {"scalar_const", "scalar_binary", "scalar_cast", "block_idx", "num_blocks",
                                  "global_dim"}
    assert patterns.TILE_INVARIANT_OPS == opcodes.SCALAR_OPS - {"block_idx"}
    assert schedule.PRODUCER_OPS == opcodes.SCALAR_OPS | {"global_to_scalar", "alloc_shared", "shared_stage"}
    for name in opcodes.SCALAR_OPS:
        s = opcodes.spec(name)
        assert s.effects == opcodes.NO_EFFECTS and not s.regions


ROLE_SETS = {           # each derived set, pinned: a table change that moves an opcode between them is seen here
    "SHARED_VIEW_OPS": {"alloc_shared", "shared_stage"},
    "UNIFORM_OPS": {"fill", "splat"},
    "POSITIONAL_OPS": {"causal_mask", "bounds_mask", "dropout_mask"},
    "ELEMENTWISE_OPS": {"unary", "binary", "compare", "where", "cast"},
    "ALONG_AXIS_OPS": {"broadcast", "reduce"},
    "CONTRACTION_OPS": {"mma"},
    "CONTROL_OPS": {"for", "pipeline"},
}


@pytest.mark.parametrize("name", sorted(ROLE_SETS))
def test_each_role_set_is_what_the_table_says(name):
    role = getattr(opcodes, name.removesuffix("_OPS"))
    assert getattr(opcodes, name) == {s.name for s in opcodes.OPS if s.role == role} == ROLE_SETS[name]


def test_every_opcode_has_one_role_and_roles_agree_with_the_types():
    """The declared roles against what the types, effects and regions say on their own."""
    def kinds(specs) -> set[str]:
        return {k for t in specs for k in t.kinds}
    tiles, scalars = {opcodes.RT, opcodes.RV}, {opcodes.I32, opcodes.F32}
    ops = {s.name: s for s in opcodes.OPS if s.role in opcodes.ROLES}
    assert set(ops) == set(opcodes.OPCODES)
    by_role = {r: {n for n, s in ops.items() if s.role == r} for r in opcodes.ROLES}
    assert by_role[opcodes.SCALAR] == opcodes.SCALAR_OPS                       # read off the types
    assert by_role[opcodes.CONTROL] == {n for n, s in ops.items() if s.regions}
    assert by_role[opcodes.SHARED_VIEW] == {n for n, s in ops.items()
                                            if s.results and kinds(s.results) <= {opcodes.SMEM, opcodes.ST}}
    made_from_scalars = {n for n, s in ops.items() if s.results and kinds(s.results) <= tiles
                         and kinds(o.type for o in s.operands) <= scalars}
    assert by_role[opcodes.UNIFORM] | by_role[opcodes.POSITIONAL] == made_from_scalars
    assert all(ops[n].results[0].dtypes == ("bool",) for n in by_role[opcodes.POSITIONAL])
    tile_to_tile = {n for n, s in ops.items() if s.results and kinds(s.results) <= tiles
                    and s.operands and kinds(o.type for o in s.operands) <= tiles}
    assert by_role[opcodes.ELEMENTWISE] | by_role[opcodes.ALONG_AXIS] == tile_to_tile
    assert by_role[opcodes.ALONG_AXIS] == {n for n in tile_to_tile if ops[n].attr("axis")}


def test_the_lowerings_opcode_sets_are_roles_and_named_exceptions():
    """The sets a layout or a schedule decides by, read off the roles, pinned to the lists they replaced (a table
    change that moves one is seen here, and the generated kernels did not change when they were derived)."""
    from hk_portable.backends.cuda import dataflow
    from hk_portable.codegen import layouts, patterns
    assert layouts.PINNED_TO_FRAGMENT == {"mma", "shared_to_register", "register_to_shared"}
    assert layouts.SHARE_A_LAYOUT == {"unary", "binary", "compare", "where", "cast", "broadcast", "reduce"}
    assert layouts.GRID_OPS == {"fill", "splat", "unary", "binary", "cast", "global_to_register",
                                "register_to_global", "atomic_add", "pipeline", "for", "mma", "broadcast"}
    assert layouts.GRID_VECTOR_OPS == {"fill", "splat", "unary", "binary", "cast", "global_to_register", "broadcast"}
    from hk_portable.backends.hip import patterns as hip_patterns
    assert hip_patterns.EPILOGUE_OPS == {"fill", "splat", "unary", "binary", "cast", "global_to_register", "broadcast"}
    # register_to_shared and (vectors') global_to_register since 2026-12-07: attention_bwd's dSᵀ store, lse and delta
    assert layouts.TFRAG_OPS == {"fill", "splat", "unary", "binary", "compare", "where", "cast", "broadcast",
                                 "reduce", "mma", "causal_mask", "bounds_mask", "register_to_global", "pipeline", "for",
                                 "register_to_shared", "global_to_register"}
    assert dataflow.TAIL_OPS == {"mma", "binary", "unary", "broadcast", "fill", "splat", "cast", "where",
                                 "shared_stage"}
    assert patterns.MASK_LEAVES == {"causal_mask", "bounds_mask"}
    assert {n for n in opcodes.OPCODES if opcodes.writes_shared(n)} == {"global_to_shared", "register_to_shared"}
