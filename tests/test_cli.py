"""The `hk` command: its forms, its JSON, its exit codes, and one-line errors without tracebacks."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from hk_portable import __version__
from hk_portable.cli import main

from hk_test_plugins import RECORDING_BACKEND

MUTANT_BACKEND = """
import torch
from hk_portable.backends.reference.interpreter import Interpreter
from hk_portable.interface import Artifact, Backend, BackendStatus, Target


class _OffByOneUlpExp(Interpreter):
    def op_unary(self, op, active):
        r = super().op_unary(op, active)
        return r * (1 + 2.0 ** -16) if op.attrs["op"] == "exp" else r


class Mutant(Backend):
    name = "mutant"

    def status(self):
        return BackendStatus(True)

    def targets(self):
        return [Target(backend="mutant", arch="cpu", capabilities=("run", "atomics", "dropout"))]

    def compile(self, program, target, options=None):
        return Artifact("mutant", target.arch, program.name, program.hash, payload=program)

    def launch(self, artifact, args, grid, stream=None):
        _OffByOneUlpExp(artifact.payload, args, grid).run()

    def cacheable(self):
        return False
"""


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"hk_portable {__version__}"


def test_backends_json(capsys):
    rc, out, _ = run(capsys, "backends", "--json")
    infos = {b["name"]: b for b in json.loads(out)}
    assert rc == 0
    assert {"reference", "cuda", "hip"} <= set(infos)
    for b in infos.values():
        assert {"name", "available", "reason", "targets"} <= set(b)
        assert isinstance(b["available"], bool) and isinstance(b["targets"], list)
        assert (b["reason"] is None) == b["available"]
    assert infos["reference"]["available"] and infos["reference"]["targets"] == ["cpu"]


def test_backends_table_names_every_backend(capsys):
    rc, out, _ = run(capsys, "backends")
    assert rc == 0 and all(name in out for name in ("reference", "cuda", "hip"))


def test_conformance_subset_passes_and_writes_json(capsys, tmp_path):
    path = tmp_path / "report.json"
    rc, out, _ = run(capsys, "conformance", "--backend", "reference", "-k", "kernel/gemm/bf16-f32,op/cast/f32_to",
                     "--json", str(path), "--seed", "7")
    assert rc == 0 and "CONFORMS" in out and "kernel/gemm/bf16-f32/17x33x65" in out
    d = json.loads(path.read_text())
    assert d["backend"] == "reference" and d["target"] == "cpu" and d["seed"] == 7
    assert d["summary"] == {"passed": len(d["cases"]), "failed": 0, "skipped": 0} and len(d["cases"]) == 9


def test_conformance_exits_1_when_a_case_fails(capsys, fake_plugins):
    fake_plugins.module("hk_fake_mutant", MUTANT_BACKEND)
    fake_plugins.distribution("hk-fake-mutant", {"mutant": "hk_fake_mutant:Mutant"})
    rc, out, _ = run(capsys, "conformance", "--backend", "mutant", "-k", "op/unary/exp/f32,op/unary/exp2/f32",
                     "--problems-only")
    assert rc == 1 and "DOES NOT CONFORM: 2 passed, 2 failed" in out
    assert "op/unary/exp/f32/37x70" in out and "op/unary/exp2/f32/37x70" not in out


@pytest.mark.parametrize("argv, message", [
    (["conformance", "--backend", "nope"], "hk conformance: error: no backend named 'nope'; installed backends:"),
    (["conformance", "--backend", "reference", "--target", "gfx942"],
     "hk conformance: error: backend 'reference' has no target 'gfx942'; its targets: cpu"),
    (["conformance", "--backend", "reference", "--emulate"],
     "hk conformance: error: backend 'reference' has no emulated target; its targets: cpu"),
    (["conformance", "--backend", "reference", "-k", "no such case"],
     "hk conformance: error: no conformance case matches -k 'no such case'"),
    (["compile", "gemm", "--backend", "nope", "--emit", "ir"], "hk compile: error: no backend named 'nope'"),
    (["compile", "gemm", "--backend", "reference", "--target", "sm_90a", "--emit", "ir"],
     "hk compile: error: backend 'reference' has no target 'sm_90a'"),
    (["compile", "gemm", "--backend", "reference", "--emit", "source"],
     "hk compile: error: the reference backend interprets the Tile IR and produces no source; use --emit ir"),
    (["conformance", "--backend", "hip:gfx950:emu"],
     "hk conformance: error: backend spec 'hip:gfx950:emu': expected NAME, NAME:ARCH or NAME:ARCH:emulated"),
    (["conformance", "--backend", "reference:gfx942"],
     "hk conformance: error: backend 'reference' has no target 'gfx942'; its targets: cpu"),
    (["conformance", "--backend", "reference:cpu", "--target", "gfx942"],
     "hk conformance: error: backend spec 'reference:cpu' names target cpu, but the target given is gfx942"),
    (["compile", "gemm", "--backend", "reference:", "--emit", "ir"],
     "hk compile: error: backend spec 'reference:': expected NAME, NAME:ARCH or NAME:ARCH:emulated"),
    (["compile", "gemm", "--backend", "reference:sm_90a", "--emit", "ir"],
     "hk compile: error: backend 'reference' has no target 'sm_90a'; its targets are ['cpu']"),
    (["compile", "gemm", "--backend", "reference:cpu:emulated", "--emit", "ir"],
     "hk compile: error: backend 'reference' has no emulated target 'cpu'"),
    (["compile", "softmax", "--backend", "reference", "--emit", "ir"],
     "hk compile: error: unknown kernel 'softmax'; the library's kernels are: attention_bwd, attention_fwd, "
     "attention_kvcache, attention_varlen, dropout_residual_layernorm, gemm"),
])
def test_errors_are_one_clean_line(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_broken_and_unusable_backends_are_clean_errors(capsys, fake_plugins):
    fake_plugins.module("hk_fake_backends", RECORDING_BACKEND)
    fake_plugins.distribution("hk-fake-broken", {"broken": "hk_fake_no_such_module:Backend",
                                                  "unusable": "hk_fake_backends:Unusable"})
    rc, _, err = run(capsys, "conformance", "--backend", "broken")
    assert rc == 2 and err.startswith("hk conformance: error: backend 'broken' failed to load: ModuleNotFoundError")
    rc, _, err = run(capsys, "conformance", "--backend", "unusable")
    assert rc == 2 and err == ("hk conformance: error: backend 'unusable' cannot run kernels here: the test says it "
                               "has no device\n")


@pytest.mark.parametrize("kernel", ["gemm", "attention_fwd", "dropout_residual_layernorm"])
def test_compile_emits_the_ir_of_each_library_kernel(capsys, kernel):
    from hk_portable import kernels
    module, k = kernels.load(kernel)
    args, consts = module.example_args(device="cpu")
    rc, out, _ = run(capsys, "compile", kernel, "--backend", "reference", "--target", "cpu", "--emit", "ir")
    assert rc == 0 and out == str(k.trace(*args, **consts))


def test_compile_writes_to_a_file(capsys, tmp_path):
    path = tmp_path / "gemm.ir"
    rc, out, err = run(capsys, "compile", "gemm", "--backend", "reference", "--emit", "ir", "-o", str(path))
    assert rc == 0 and out == "" and path.read_text().startswith("kernel @gemm_kernel(") and str(path) in err


def test_compile_shows_the_lowering_after_a_named_pass(capsys):
    """--emit lowered prints the Program and each pass's annotation; lowered:after=PASS stops after PASS; a pass the
    backend has not, a backend without passes and a suffix on another kind are each one clear line."""
    rc, out, _ = run(capsys, "compile", "gemm", "--backend", "hip", "--target", "gfx942", "--emit", "lowered:after=plan")
    assert rc == 0 and out.startswith("kernel @gemm_kernel(") and "// after pass 'plan'" in out
    assert "// plan (hip backend, hip:gfx942): {" in out and "// layouts (8 waves of 64)" in out
    rc, _, err = run(capsys, "compile", "gemm", "--backend", "hip", "--emit", "lowered:after=schedule")
    assert rc != 0 and "no lowering pass 'schedule'" in err and "its passes are, in order: plan" in err
    rc, _, err = run(capsys, "compile", "gemm", "--backend", "reference", "--emit", "lowered:after=plan")
    assert rc != 0 and "backend 'reference' has no lowering passes" in err
    with pytest.raises(SystemExit) as e:               # argparse's own refusal: usage and the reason, exit 2
        main(["compile", "gemm", "--backend", "reference", "--emit", "ir:after=plan"])
    assert e.value.code == 2 and "invalid choice: 'ir:after=plan'" in capsys.readouterr().err


def test_conformance_and_compile_take_a_backend_spec(capsys):
    rc, out, _ = run(capsys, "conformance", "--backend", "reference:cpu", "-k", "op/cast/f32_to_bf16", "--seed", "7")
    assert rc == 0 and "on backend reference, target cpu" in out and "CONFORMS" in out
    rc, spelled_once, _ = run(capsys, "compile", "gemm", "--backend", "reference:cpu", "--emit", "ir")
    rc2, spelled_twice, _ = run(capsys, "compile", "gemm", "--backend", "reference", "--target", "cpu", "--emit", "ir")
    assert rc == rc2 == 0 and spelled_once == spelled_twice


@pytest.mark.parametrize("argv", [["--backend", "hip:gfx950:emulated"],
                                  ["--backend", "hip", "--target", "gfx950", "--emulate"],
                                  ["--backend", "hip:gfx950", "--emulate"]])
def test_conformance_on_an_emulated_target_by_spec_or_by_flags(hip_emulator, capsys, argv):
    rc, out, _ = run(capsys, "conformance", *argv, "-k", "op/cast/f32_to_bf16", "--seed", "7")
    assert rc == 0 and "on backend hip, target gfx950 (emulated)" in out and "CONFORMS" in out


def test_compile_for_a_hip_target_by_spec_or_by_flag(hip_emulator, capsys):
    rc, spelled_once, _ = run(capsys, "compile", "gemm", "--backend", "hip:gfx942:emulated", "--emit", "source")
    rc2, spelled_twice, _ = run(capsys, "compile", "gemm", "--backend", "hip", "--target", "gfx942", "--emit", "source")
    assert rc == rc2 == 0 and spelled_once == spelled_twice and "for gfx942" in spelled_once


def test_argparse_rejects_an_unknown_emit(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compile", "gemm", "--backend", "reference", "--emit", "llvm"])
    assert e.value.code == 2 and "invalid choice: 'llvm'" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("hk") is None, reason="the `hk` console script is not installed (pip install -e .)")
def test_console_script_runs_without_tracebacks():
    ok = subprocess.run(["hk", "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == f"hk_portable {__version__}"
    bad = subprocess.run(["hk", "conformance", "--backend", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "no backend named 'nope'" in bad.stderr


def test_help_and_version_import_no_torch():
    """`hk --help` answers without importing torch (the package's names load at first use): it took 3 s."""
    import sys
    code = ("import sys; from hk_portable.cli import main\n"
            "for argv in (['--help'], ['--version'], ['compile', '--help'], ['bench', '--help']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage: hk" in r.stdout and "--emit" in r.stdout and "--budget" in r.stdout
