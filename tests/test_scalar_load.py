"""hk.load_scalar (opcode global_to_scalar): one int32 element of a tensor as a block-uniform scalar, the
way kernels read cu_seqlens and block tables. Out-of-range indices read the fill and touch no memory.
The op's conformance cases (op/scalar_load/...) run on every backend; here: tracing errors, the
reference semantics against torch indexing, and offline compiles for sm_80 and sm_90a."""
from __future__ import annotations

import copy
import os

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RV, i32
from hk_portable.interface.ir import Op
from hk_portable.interface.verify import VerifyError, verify


@hk.kernel
def _gather(t: GL[3], ix: GL[2], y: GL[2]):
    blk = hk.block_idx(0)
    v = hk.load_scalar(t, (hk.load_scalar(ix, (blk, 0)), hk.load_scalar(ix, (blk, 1)),
                           hk.load_scalar(ix, (blk, 2))), fill=-99)
    hk.store(y, hk.full(RV[i32, 16], v), (blk, 0))


def test_reference_reads_the_element_or_the_fill():
    g = torch.Generator().manual_seed(0)
    t = torch.randint(-1000, 1000, (3, 4, 5), generator=g, dtype=torch.int32)
    t = t.transpose(0, 2)                       # strides that are not row-major: (1, 5, 20)... shape (5, 4, 3)
    idx = [(0, 0, 0), (4, 3, 2), (2, 1, 1), (-1, 0, 0), (5, 0, 0), (0, 4, 0), (0, 0, 3), (0, -2, 1)]
    ix = torch.tensor(idx, dtype=torch.int32)
    y = torch.full((len(idx), 16), 12345, dtype=torch.int32)
    _gather(t, ix, y, grid=(len(idx),), backend="reference")
    want = [int(t[a, b, c]) if 0 <= a < 5 and 0 <= b < 4 and 0 <= c < 3 else -99 for a, b, c in idx]
    assert y[:, 0].tolist() == want and bool((y == y[:, :1]).all())


def test_tracing_errors_name_the_rule():
    def trace(body, *tensors):
        @hk.kernel
        def k(t: GL[2], f: GL[1]):
            body(t, f)
        return k.trace(*tensors)

    t, f = torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2)
    with pytest.raises(TypeError, match="int32 tensors"):
        trace(lambda t, f: hk.load_scalar(f, (0,)), t, f)
    with pytest.raises(TypeError, match="one entry per dimension"):
        trace(lambda t, f: hk.load_scalar(t, (0,)), t, f)
    with pytest.raises(TypeError, match="fill must be an int"):
        trace(lambda t, f: hk.load_scalar(t, (0, 0), fill=1.5), t, f)
    with pytest.raises(TypeError, match="fill must be an int"):
        trace(lambda t, f: hk.load_scalar(t, (0, 0), fill=2**31), t, f)
    with pytest.raises(TypeError, match="index entry 1 must be int32"):
        trace(lambda t, f: hk.load_scalar(t, (0, 1.0)), t, f)


def test_the_verifier_checks_index_count_and_fill():
    p = copy.deepcopy(_gather.trace(torch.zeros(2, 2, 2, dtype=torch.int32), torch.zeros(1, 3, dtype=torch.int32),
                                    torch.zeros(1, 16, dtype=torch.int32)))     # a private copy to break
    op: Op = next(o for o in p.body.walk() if o.opcode == "global_to_scalar" and o.operands[0].type.rank == 3)
    op.attrs["fill"] = 2**40
    p._text = None
    with pytest.raises(VerifyError, match="does not fit in int32"):
        verify(p)
    op.attrs["fill"] = 0
    op.operands = op.operands[:-1]
    p._text = None
    with pytest.raises(VerifyError, match="one index per dimension"):
        verify(p)


def test_generated_code_calls_the_device_api():
    args = (torch.zeros(2, 2, 2, dtype=torch.int32), torch.zeros(1, 3, dtype=torch.int32),
            torch.zeros(1, 16, dtype=torch.int32))
    for spec in ("cuda:sm_80", "hip:gfx942"):
        src = _gather.compile(*args, backend=spec).source
        assert "hk::load_scalar(" in src and ", -99, " in src


def test_scalar_load_programs_compile_offline_for_sm80_and_sm90a():
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")
    from hk_portable.conformance import offline_compile as precompile
    from hk_portable.conformance.cases import all_cases
    cap = precompile.Capture()
    for case in all_cases():
        if case.id.startswith("op/scalar_load/"):
            setup = case.make(torch.Generator().manual_seed(0))
            setup.launch({**setup.inputs, **setup.outputs}, cap)
    progs = {f"{p.name}#{h[:8]}": p for h, p in cap.programs.items()}
    assert len(progs) >= 2
    results = precompile.compile_many(progs, ("sm_80", "sm_90a"), workers=min(2, os.cpu_count() or 1))
    assert not [r for r in results if r["error"]], [r["error"] for r in results if r["error"]][:3]
    assert not [r for r in results if r["resources"]["spill_stores"] or r["resources"]["stack_bytes"]]
