"""The newcomer table (issues 14 and 41): what a new user tried, what they should get, and what they got.

Each row is one input; `got` is the outcome in one line (the value's summary, or the error's type and first line).
A row passes when every piece of `expected` is in `got` and nothing in it is a traceback. Run with `-s` to print
the whole table. The cache-file rows that need fresh processes live in test_cache_files.py; the per-entry-point
bad-input rows in test_bad_inputs.py."""
from __future__ import annotations

import ctypes
import os
import textwrap

import pytest
import torch

import hk_portable as hk
import hk_portable.torch_ops
from hk_portable.interface import GL, RT, bf16, f32


def bf(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


@hk.kernel
def copy(x: GL[2], y: GL[2]):
    m = hk.block_idx(0)
    hk.store(y, hk.load(RT[f32, 16, 16], x, (m, 0)), (m, 0))


@hk.kernel
def wrong_arity(x: GL[2], y: GL[2]):
    t = hk.load(RT[f32, 16, 16], x, (0, 0))
    hk.store(y, hk.fori_loop(0, 4, lambda i: t, t), (0, 0))


@hk.kernel
def matmul(a: GL[2], b: GL[2], c: GL[2], *, BM: hk.const = 16, BN: hk.const = 16, BK: hk.const = 16):
    """The README's fori_loop example: body(i, *carry), the trip count from a.shape[1] inside the kernel."""
    m, n = hk.block_idx(0), hk.block_idx(1)

    def step(k, acc):
        return hk.mma(hk.load(RT[bf16, BM, BK], a, (m, k)), hk.load(RT[bf16, BK, BN], b, (k, n)), acc)
    acc = hk.fori_loop(0, hk.cdiv(a.shape[1], BK), step, hk.zeros(RT[f32, BM, BN]))
    hk.store(c, acc, (m, n))


def _cli(*argv) -> str:
    """hk ARGV's outcome: exit status and its last stderr line."""
    import contextlib
    import io

    from hk_portable.cli import main
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(list(argv))
        except SystemExit as e:
            rc = e.code
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    text = err.getvalue()
    return f"exit {rc}: " + (lines[-1] if lines else out.getvalue()[:80]) + (" [Traceback]" if "Traceback" in text else "")


def _matmul():
    a, b = bf(40, 48), bf(48, 24)
    c = torch.empty(40, 24)
    matmul(a, b, c, grid=(hk.cdiv(40, 16), hk.cdiv(24, 16)), backend="reference")
    return "ok" if torch.allclose(c, a.float() @ b.float(), atol=1e-2, rtol=1e-2) else "wrong values"


def _hk_backend_fallback(monkeypatch):
    from hk_portable.kernels.gemm import gemm
    monkeypatch.setenv("HK_BACKEND", "cuda,reference")
    out = gemm(bf(16, 16), bf(16, 16))
    return f"ok: ran, {tuple(out.shape)}"


def _two_kernel_module(tmp_path):
    mod = tmp_path / "two_kernels.py"
    mod.write_text(textwrap.dedent("""
        import torch, hk_portable as hk
        from hk_portable.interface import GL, RT, f32
        @hk.kernel
        def first(x: GL[2], y: GL[2]):
            hk.store(y, hk.load(RT[f32, 16, 16], x, (0, 0)), (0, 0))
        @hk.kernel
        def second(x: GL[1], y: GL[1]):
            pass
        def example_args_first(device="cpu"):
            return (torch.zeros(16, 16), torch.zeros(16, 16)), {}
        def example_args_second(device="cpu"):
            return (torch.zeros(16), torch.zeros(16)), {}
    """))
    return " | ".join(_cli("compile", f"{mod}:{k}", "--backend", "reference", "--emit", "ir", "-o",
                           str(tmp_path / f"{k}.ir")) for k in ("first", "second"))


def _nested_tuning(tmp_path, monkeypatch):
    from hk_portable.kernels.gemm import gemm
    from hk_portable.runtime import tuning
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / tuning.FILE).write_text("[" * 100_000 + "]" * 100_000)
    monkeypatch.setenv("HK_CACHE_DIR", str(root))
    return f"ok: {tuple(gemm(bf(16, 16), bf(16, 16), backend='reference').shape)}"


def _no_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return False
    except OSError:
        return True


def _backends_reason() -> str:
    import contextlib
    import io
    import json

    from hk_portable.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["backends", "--json"])
    return next(b["reason"] for b in json.loads(out.getvalue()) if b["name"] == "cuda")


def _summary(out: torch.Tensor) -> str:
    return f"ok: {tuple(out.shape)} {'zeros' if not out.float().any() else 'nonzero'}"


NO_GPU = not torch.cuda.is_available()
ROWS = [   # (id, what the newcomer tried, expected pieces of the outcome, how: (tmp_path, monkeypatch) -> got)
    ("gemm-K0", "torch.ops.hk.gemm(a[4,0], b[0,4])", ["ok", "(4, 4)", "zeros"],
     lambda t, m: _summary(torch.ops.hk.gemm(bf(4, 0), bf(0, 4), backend="reference"))),
    ("rms-weight", "torch.ops.hk.rms_norm(x[4,64], None, weight[32])", ["ArgumentError", "'weight'"],
     lambda t, m: torch.ops.hk.rms_norm(bf(4, 64), None, bf(32), backend="reference")),
    ("rms-D0", "torch.ops.hk.rms_norm(x[4,0], None, weight[0])", ["ArgumentError", "'x'"],
     lambda t, m: torch.ops.hk.rms_norm(bf(4, 0), None, bf(0), backend="reference")),
    ("bool-tensor", "copy(x.bool(), y)", ["ArgumentError", "'x'", "torch.float32"],
     lambda t, m: copy(torch.zeros(16, 16, dtype=torch.bool), torch.zeros(16, 16), grid=(1,), backend="reference")),
    ("expanded-out", "copy(x, torch.zeros(1,16).expand(16,16))", ["ArgumentError", "'y'", "stride"],
     lambda t, m: copy(torch.zeros(16, 16), torch.zeros(1, 16).expand(16, 16), grid=(1,), backend="reference")),
    ("fori-arity", "hk.fori_loop(0, 4, lambda i: t, t)", ["TraceError", "body(i, *carry)", "<lambda>(i)"],
     lambda t, m: wrong_arity(torch.zeros(16, 16), torch.zeros(16, 16), grid=(1,), backend="reference")),
    ("fori-readme", "the README's fori_loop + x.shape[1] example", ["ok"], lambda t, m: _matmul()),
    ("compile-arg", "hk compile gemm --arg M=-5", ["exit 2", "M=-5"],
     lambda t, m: _cli("compile", "gemm", "--backend", "reference", "--emit", "ir", "--arg", "M=-5")),
    ("compile-o", "hk compile gemm -o missing_dir/x", ["exit 2", "missing_dir/x", "No such file"],
     lambda t, m: _cli("compile", "gemm", "--backend", "reference", "--emit", "ir", "-o", str(t / "missing_dir/x"))),
    ("two-kernels", "hk compile mod.py:first / mod.py:second (example_args_<kernel>)", ["exit 0", "wrote ir"],
     lambda t, m: _two_kernel_module(t)),
    ("nested-tuning", "gemm with a 100000-deep tuning.json in the cache", ["ok"],
     lambda t, m: _nested_tuning(t, m)),
    *([("bench-cuda", "hk bench --device cuda (no GPU)", ["exit 2", "--device cuda"],
        lambda t, m: _cli("bench", "--device", "cuda", "--quick")),
       ("hk-backend", "HK_BACKEND=cuda,reference gemm (no GPU)", ["ok: ran"],
        lambda t, m: _hk_backend_fallback(m))] if NO_GPU else []),
    *([("no-driver", "hk backends on a machine with no NVIDIA driver", ["no NVIDIA driver"],
        lambda t, m: _backends_reason())] if _no_driver() else []),
]
_GOT: dict[str, tuple[str, str, str]] = {}


def _outcome(fn, tmp_path, monkeypatch) -> str:
    try:
        v = fn(tmp_path, monkeypatch)
    except Exception as e:  # noqa: BLE001 - the outcome is the row's "got"
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return v if isinstance(v, str) else f"ok: {type(v).__name__}"


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_newcomer_row(row, tmp_path, monkeypatch):
    rid, tried, expected, fn = row
    got = _outcome(fn, tmp_path, monkeypatch)
    _GOT[rid] = (tried, " & ".join(expected), got)
    assert all(piece in got for piece in expected) and "Traceback" not in got, \
        f"{tried}: expected {expected}, got {got!r}"


def test_print_the_table(capsys):
    """The table itself (pytest -s shows it): every input tried, expected, got."""
    with capsys.disabled():
        if os.environ.get("HK_NEWCOMER_TABLE"):
            print("\n| tried | expected | got |\n|---|---|---|")
            for tried, expected, got in _GOT.values():
                print(f"| {tried} | {expected} | {got[:120]} |")
    assert len(_GOT) <= len(ROWS)
