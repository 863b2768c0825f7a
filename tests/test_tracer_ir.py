"""The tracer and the Tile IR: printing is stable and readable, hashing is stable and sensitive to
what specialises a kernel, and specialisation traces once per signature."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, ArgumentError, f32
from hk_portable.kernels.gemm import example_args, gemm_kernel

TRACES = []


@hk.kernel
def row_scale(x: GL[2], v: GL[1], y: GL[2], s: float, *, BM: hk.const = 32, BN: hk.const = 32):
    TRACES.append(1)                      # runs only while tracing
    m, n = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[x.dtype, BM, BN], x, (m, n))
    w = hk.load(RV[x.dtype, BM], v, (m,))
    hk.store(y, t * w[:, None] * s, (m, n))


def _args(dtype=torch.float32, shape=(64, 64)):
    return torch.ones(shape, dtype=dtype), torch.ones(shape[0], dtype=dtype), torch.empty(shape, dtype=dtype), 2.0


def _gemm_program(**consts):
    args, cfg = example_args()
    return gemm_kernel.trace(*args, **{**cfg, **consts})


# ------------------------------------------------------------------------------------------ printing
def test_program_text_is_readable():
    text = str(_gemm_program())
    lines = text.splitlines()
    assert lines[0] == ("kernel @gemm_kernel(%0 a: gl<bf16,2>, %1 b: gl<bf16,2>, %2 c: gl<f32,2>) "
                        "consts{A_KM=False, BK=32, BM=64, BN=64, B_NK=False, STAGES=2} warps=4 {")
    assert lines[-1] == "}"
    # one op per line, typed results, attributes in braces, regions indented under their op
    pipe = next(i for i, line in enumerate(lines) if " = pipeline " in line)
    assert lines[pipe].endswith("{stages=2} : rt<f32,64,64>")
    indent = lambda s: len(s) - len(s.lstrip())  # noqa: E731
    assert lines[pipe + 1].strip().startswith("^load(") and indent(lines[pipe + 1]) > indent(lines[pipe])
    compute = next(i for i, line in enumerate(lines) if line.strip().startswith("^compute("))
    assert "mma" in lines[compute + 3] and "{trans_a=False, trans_b=False}" in lines[compute + 3]
    assert lines[compute + 4].strip().startswith("yield %")
    assert any(line.strip().startswith("register_to_global %2,") for line in lines)


def test_printing_is_stable_across_traces_and_kernel_objects():
    def body(x: GL[2], v: GL[1], y: GL[2], s: float, *, BM: hk.const = 32, BN: hk.const = 32):
        m, n = hk.block_idx(0), hk.block_idx(1)
        t = hk.load(RT[x.dtype, BM, BN], x, (m, n))
        hk.store(y, t * hk.load(RV[x.dtype, BM], v, (m,))[:, None] * s, (m, n))

    a = hk.kernel(body, name="same").trace(*_args())
    b = hk.kernel(body, name="same").trace(*_args())
    assert a is not b and str(a) == str(b) and a.hash == b.hash


def test_float_consts_print_exactly():
    @hk.kernel
    def k(y: GL[2], *, V: hk.const):
        hk.store(y, hk.full(RT[f32, 16, 16], V), (0, 0))

    p = k.trace(torch.empty(16, 16), V=0.1)
    assert "consts{V=0.1}" in str(p) and "{value=0.1}" in str(p)
    assert "{value=-inf}" in str(k.trace(torch.empty(16, 16), V=float("-inf")))


# ------------------------------------------------------------------------------------------- hashing
_HASH_SCRIPT = textwrap.dedent("""
    from hk_portable.kernels.gemm import example_args, gemm_kernel
    args, cfg = example_args()
    print(gemm_kernel.trace(*args, **cfg).hash)
""")


def test_hash_is_stable_across_processes():
    hashes = set()
    for seed in ("1", "2"):                       # a different str-hash seed in each process
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _HASH_SCRIPT], env=env, capture_output=True, text=True, check=True)
        hashes.add(out.stdout.strip())
    assert hashes == {_gemm_program().hash}


@pytest.mark.parametrize("change", [dict(BM=32), dict(BK=64), dict(STAGES=3)])
def test_hash_changes_with_consts(change):
    assert _gemm_program(**change).hash != _gemm_program().hash


def test_hash_changes_with_dtypes_and_ranks():
    base = row_scale.trace(*_args(torch.float32))
    assert row_scale.trace(*_args(torch.bfloat16)).hash != base.hash
    x, v, y, s = _args()
    with pytest.raises(ArgumentError, match="argument 'x' must have rank 2"):
        row_scale.trace(x[None], v, y, s)          # GL[2] fixes the rank
    args, cfg = example_args(dtype=torch.float16)
    assert gemm_kernel.trace(*args, **cfg).hash != _gemm_program().hash


# ------------------------------------------------------------------------------------ specialisation
def test_one_trace_per_signature():
    TRACES.clear()
    k = hk.kernel(row_scale.fn, name="row_scale_fresh")          # a fresh Kernel: nothing traced yet
    p1 = k.trace(*_args(torch.float32, (64, 64)))
    p2 = k.trace(*_args(torch.float32, (100, 37)))             # shapes are runtime values: same Program
    assert p1 is p2 and len(TRACES) == 1
    p3 = k.trace(*_args(torch.float16))                        # a dtype specialises
    p4 = k.trace(*_args(torch.float32), BM=16)                 # so does a const
    assert len({id(p1), id(p3), id(p4)}) == 3 and len(TRACES) == 3
    k(*_args(torch.float32, (50, 40)), grid=(2, 2))            # launching reuses the trace
    assert len(TRACES) == 3


def test_runtime_scalars_are_not_specialised():
    TRACES.clear()
    k = hk.kernel(row_scale.fn, name="row_scale_fresh")
    x, v, y, _ = _args()
    assert k.trace(x, v, y, 2.0) is k.trace(x, v, y, 3.5)
    assert len(TRACES) == 1


def test_consts_must_be_hashable():
    with pytest.raises(ArgumentError, match="hk.const 'BM' must be hashable"):
        row_scale.trace(*_args(), BM=[32])


def test_shape_reads_emit_only_the_dims_used():
    p = row_scale.trace(*_args())
    assert "global_dim" not in p.opcodes()
    assert sum(op.opcode == "global_dim" for op in _gemm_program().body.walk()) == 1     # only K = a.shape[1]


def test_traced_values_carry_their_types():
    seen = {}

    @hk.kernel
    def k(x: GL[2], y: GL[2]):
        buf = hk.shared(ST[x.dtype, 16, 32], stages=2)
        t = hk.load(RT[f32, 16, 32], x, (0, 0))
        seen.update(buf=str(buf.type), stage=str(buf[1].type), row=str(hk.row_sum(t).type), rank=x.rank,
                    cast=str(t.to("bf16").type), mask=str((t > 0).type))
        hk.store(y, t, (0, 0))

    k.trace(torch.zeros(16, 32, dtype=torch.bfloat16), torch.zeros(16, 32))
    assert seen == dict(buf="smem<bf16,16,32>x2", stage="st<bf16,16,32>", row="rv<f32,16>", rank=2,
                        cast="rt<bf16,16,32>", mask="rt<bool,16,32>")
