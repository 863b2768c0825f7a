"""The conformance machinery itself: it covers every opcode, and it catches broken backends (a wrong
result, an unwritten element, a nondeterministic sum, a wrong dropout mask, a modified input); skips
carry reasons and follow declared capabilities; reports have the promised shape."""
from __future__ import annotations

import math

import pytest
import torch

from hk_portable.backends.reference.interpreter import Interpreter
from hk_portable.conformance import kernel_cases, report
from hk_portable.conformance.cases import all_cases
from hk_portable.conformance.runner import (FAILED, PASSED, SKIPPED, Session, case_seed, select_cases)
from hk_portable.interface import Artifact, Backend, BackendStatus, Target, UnsupportedError
from hk_portable.interface import ops
from hk_portable.interface.numerics import philox4x32_10

CASES = {c.id: c for c in all_cases()}
FULL_TARGET = dict(capabilities=("run", "atomics", "dropout"))


class InterpreterBackend(Backend):
    """A test double that runs Programs with a given Interpreter class: mutants of the reference."""

    def __init__(self, name, interpreter=Interpreter, refuse=None, **target):
        self.name, self.interpreter, self.refuse = name, interpreter, refuse
        self._target = Target(backend=name, arch="cpu", **(target or FULL_TARGET))
        self.programs = []

    def status(self):
        return BackendStatus(True)

    def targets(self):
        return [self._target]

    def check(self, program, target):
        self.programs.append(program)
        if self.refuse:
            raise UnsupportedError(self.refuse)

    def compile(self, program, target, options=None):
        return Artifact(self.name, target.arch, program.name, program.hash, payload=program)

    def launch(self, artifact, args, grid, stream=None):
        with torch.no_grad():
            self.interpreter(artifact.payload, args, grid).run()

    def cacheable(self):
        return False


def _run(backend, case_id, seed=0):
    return Session(backend, seed=seed).run_case(CASES[case_id])


# ------------------------------------------------------------------------------------------ mutants
class ExpOneIn2To16Off(Interpreter):
    def op_unary(self, op, active):
        r = super().op_unary(op, active)
        return r * (1 + 2.0 ** -16) if op.attrs["op"] == "exp" else r


class LastBlockStoresNothing(Interpreter):
    def op_register_to_global(self, op, active):
        super().op_register_to_global(op, active & (self.bidx != self.nb - 1))


class NoisySums(Interpreter):
    """Sums off by at most one f32 ulp, differently on every run: within the bound, not deterministic."""
    def op_reduce(self, op, active):
        r = super().op_reduce(op, active)
        if op.attrs["op"] != "sum" or not r.is_floating_point():
            return r
        return torch.nextafter(r, torch.where(torch.rand(r.shape) < 0.5, -math.inf, math.inf).to(r.dtype))


class WrongSeed(Interpreter):
    def op_dropout_mask(self, op, active):
        keep = super().op_dropout_mask(op, active)
        return keep ^ (torch.rand(keep.shape) < 0.01)      # 1% of the mask bits flipped


class WritesItsInput(Interpreter):
    def op_global_to_register(self, op, active):
        gl = self.env[op.operands[0]]
        out = super().op_global_to_register(op, active)
        gl.view(-1)[0] += 1
        return out


def test_a_wrong_transcendental_fails_its_cases_only():
    be = InterpreterBackend("mutant_exp", ExpOneIn2To16Off)
    bad = _run(be, "op/unary/exp/f32/37x70")
    assert bad.status == FAILED and "outside the bound" in bad.reason and bad.max_error > bad.bound
    assert "vs the reference backend" in bad.reason                 # also caught against the reference
    assert _run(be, "op/unary/exp2/f32/37x70").status == PASSED


def test_an_unwritten_element_fails_through_the_poison():
    be = InterpreterBackend("mutant_store", LastBlockStoresNothing)
    r = _run(be, "op/move/gl_rt/f32/37x70")
    assert r.status == FAILED and "differ bitwise" in r.reason and "got nan" in r.reason
    assert _run(be, "op/unary/exp/f32/37x70").status == FAILED       # bounded checks see the NaN too


def test_nondeterminism_fails_even_within_the_bound():
    r = _run(InterpreterBackend("mutant_noise", NoisySums), "op/reduce/row_sum/f32/37x50")
    assert r.status == FAILED
    failed = [c.label for c in r.checks if not c.passed]
    assert failed == ["determinism (same inputs twice)"]


def test_a_dropout_mask_that_differs_by_a_few_bits_fails():
    r = _run(InterpreterBackend("mutant_philox", WrongSeed), "op/mask/dropout_const_p0.25/f32/37x70")
    assert r.status == FAILED and "differ bitwise" in r.reason
    ln = _run(InterpreterBackend("mutant_philox2", WrongSeed), "kernel/dropout_residual_layernorm/bf16/33x1000_p0.1")
    assert ln.status == FAILED


def test_a_kernel_that_modifies_its_input_fails():
    r = _run(InterpreterBackend("mutant_input", WritesItsInput), "op/move/gl_rt/f32/37x70")
    assert r.status == FAILED and "modified its input 'x'" in r.reason


def test_the_faithful_double_passes_and_is_compared_with_the_reference():
    r = _run(InterpreterBackend("faithful"), "kernel/gemm/bf16-bf16/100x70x130")
    assert r.status == PASSED
    assert any(c.label.endswith("vs the reference backend") for c in r.checks)


# ---------------------------------------------------------------------------------- skips and errors
def test_a_target_without_a_capability_skips_with_the_reason():
    be = InterpreterBackend("no_dropout", capabilities=("run", "atomics"), dtypes=("f32", "bf16", "i32"))
    r = _run(be, "op/mask/dropout_const_p0.25/f32/37x70")
    assert r.status == SKIPPED and "lacks what kernel 'mask_dropout_const' needs: capability 'dropout'" in r.reason
    r = _run(be, "op/cast/f32_to_f16/f16/37x70")
    assert r.status == SKIPPED and "dtype f16" in r.reason
    assert be.programs == []                # a declared lack is found before the backend is asked


def test_shared_memory_beyond_the_declared_limit_skips():
    r = _run(InterpreterBackend("small", max_shared_bytes=1024, **FULL_TARGET), "kernel/gemm/bf16-f32/1x1x1")
    assert r.status == SKIPPED and "16384 bytes of shared memory (it declares 1024)" in r.reason


def test_unsupported_without_a_declared_lack_is_a_failure():
    r = _run(InterpreterBackend("refuses", refuse="no reason at all"), "op/unary/exp/f32/37x70")
    assert r.status == FAILED
    assert "UnsupportedError although target cpu declares every capability the case needs: no reason at all" \
        in r.reason


def test_a_missing_kernel_module_is_a_skip_with_the_reason():
    case = kernel_cases._kernel_case("future_kernel", "v", lambda gen: None, "no_such_module")
    r = Session("reference").run_case(case)
    assert r.status == SKIPPED and r.reason == "kernel module not present"
    assert kernel_cases._module_missing("attention") is None and kernel_cases._module_missing("layernorm") is None


# ------------------------------------------------------------------------------------------ coverage
def _variants(program):
    for op in program.body.walk():
        yield (op.opcode,)
        a = op.attrs
        if op.opcode in ("unary", "binary", "compare", "scalar_binary"):
            yield op.opcode, a["op"]
        elif op.opcode == "reduce":
            yield op.opcode, a["op"], a["axis"]
        elif op.opcode == "mma":
            yield op.opcode, a["trans_a"], a["trans_b"], op.operands[0].type.space, op.operands[1].type.space
        elif op.opcode in ("scalar_cast", "broadcast"):
            yield op.opcode, a.get("dtype", a.get("axis"))
        elif op.opcode == "cast":
            yield op.opcode, op.operands[0].type.dtype.name, op.result.type.dtype.name
        elif op.opcode in ("global_to_register", "register_to_global", "atomic_add"):
            tile = op.result if op.opcode == "global_to_register" else op.operands[1]
            yield op.opcode, tile.type.space


def test_every_opcode_and_variant_has_a_conformance_case():
    be = InterpreterBackend("coverage_recorder")
    session = Session(be, seed=0)
    for case in CASES.values():
        session.run_case(case)
    seen = {v for p in be.programs for v in _variants(p)}
    floats = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2")
    expected = {(name[3:],) for name in dir(Interpreter) if name.startswith("op_")}
    expected |= {("unary", o) for o in ops.UNARY + ("not",)}
    expected |= {("binary", o) for o in ops.BINARY_ARITH + ops.BINARY_LOGIC}
    expected |= {("compare", o) for o in ops.BINARY_CMP}
    expected |= {("reduce", o, ax) for o in ops.REDUCE for ax in ("row", "col")}
    expected |= {("mma", ta, tb, sa, sb) for ta in (False, True) for tb in (False, True)
                 for sa in ("st", "rt") for sb in ("st", "rt")}
    expected |= {("scalar_binary", o) for o in ("add", "sub", "mul", "floordiv", "mod", "div", "min", "max")}
    expected |= {("scalar_cast", "f32"), ("scalar_cast", "i32"), ("broadcast", "row"), ("broadcast", "col")}
    expected |= {("cast", s, d) for s in floats + ("i32",) for d in floats + ("i32",) if s != d}
    expected |= {("global_to_register", "rt"), ("global_to_register", "rv"), ("register_to_global", "rt"),
                 ("register_to_global", "rv"), ("shared_to_global",), ("atomic_add", "rt"), ("atomic_add", "rv")}
    assert expected - seen == set()


def test_every_case_has_a_tolerance_and_its_checks_a_bound():
    from hk_portable.conformance.tolerances import TABLE
    names = {name for name, _ in TABLE}
    # a kernel's entries are named "<kernel>.<output>" (attention_fwd.o, attention_fwd.lse, ...)
    uncovered = {c.name for c in CASES.values()
                 if c.name not in names and not any(n.startswith(c.name + ".") for n in names)}
    assert uncovered == set()
    for name, bound in TABLE.items():
        assert bound.reason, name
        assert bound.exact or bound.rel > 0, f"{name}: a bounded entry needs a relative bound"


# ------------------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("counter, key, expected", [
    # Random123's known-answer vectors for philox4x32_10 (kat_vectors)
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_matches_the_random123_known_answers(counter, key, expected):
    words = philox4x32_10(*(torch.tensor([v], dtype=torch.int64) for v in counter + key))
    assert tuple(int(w) for w in words) == expected


# ------------------------------------------------------------------------------------ selection, seeds
def test_selection_by_substring_glob_and_exclusion():
    cases = list(CASES.values())
    gemm = select_cases(cases, "kernel/gemm/")
    assert gemm and all(c.id.startswith("kernel/gemm/") for c in gemm)
    bf16 = select_cases(cases, "kernel/gemm/bf16-*/1x1x1")
    assert [c.id for c in bf16] == ["kernel/gemm/bf16-f32/1x1x1", "kernel/gemm/bf16-bf16/1x1x1"]
    assert len(select_cases(cases, "kernel/gemm/,!bf16")) == len(gemm) - len(select_cases(cases, "kernel/gemm/bf16"))
    assert select_cases(cases, ["op/unary/exp/", "op/unary/log/"]) == select_cases(cases, "op/unary/exp/,op/unary/log/")
    assert select_cases(cases, "no such case") == []


def test_a_case_reruns_alone_with_the_inputs_it_had():
    assert case_seed(5, "op/unary/exp/f32/37x70") == case_seed(5, "op/unary/exp/f32/37x70")
    assert case_seed(5, "op/unary/exp/f32/37x70") != case_seed(6, "op/unary/exp/f32/37x70")
    case = CASES["op/unary/exp/f32/37x70"]
    inputs = [case.make(torch.Generator().manual_seed(case_seed(5, case.id))).inputs["x"] for _ in range(2)]
    assert torch.equal(*inputs) and (inputs[0] != 0).all()


# ------------------------------------------------------------------------------------------- reports
def test_json_report_has_the_promised_shape():
    run = Session("reference", seed=3).run(select_cases(list(CASES.values()), "kernel/gemm/bf16-f32/1x1x1,op/cast/"))
    d = report.to_json(run)
    assert {"backend", "target", "cases", "summary"} <= set(d) and d["backend"] == "reference" and d["target"] == "cpu"
    assert set(d["summary"]) == {"passed", "failed", "skipped"} and sum(d["summary"].values()) == len(d["cases"])
    for c in d["cases"]:
        assert {"id", "kind", "name", "status", "max_error", "bound", "reason"} <= set(c)
        assert c["kind"] in ("op", "kernel") and c["status"] in ("passed", "failed", "skipped")
    assert d["seed"] == 3 and d["versions"]["hk_portable"]
    import json
    json.dumps(d, allow_nan=False)                                    # strict JSON
