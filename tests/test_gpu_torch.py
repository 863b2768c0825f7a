"""The torch integration on a real GPU (cuda backend): every hk:: op passes torch.library.opcheck on CUDA
tensors, autograd through the hk backward kernels matches float64, a compiled block matches eager, and a
CUDA graph of a training step replays correctly. Skips with the reason on a machine without a GPU."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable import torch_ops  # noqa: F401 - registers the hk:: ops
from hk_portable.kernels import attention_bwd, rotary

pytestmark = pytest.mark.gpu
bf16 = torch.bfloat16


@pytest.fixture(scope="module", autouse=True)
def cuda():
    st = hk.get_backend("cuda").status()
    if not st.available:
        pytest.skip(f"cuda backend unusable here: {st.reason}")


def _t(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(grad)


def _cases():
    cos, sin = rotary.tables(24, 64, device="cuda")
    q, k, v = _t(1, 4, 20, 64, dtype=bf16, grad=True), _t(1, 2, 20, 64, dtype=bf16, grad=True), \
        _t(1, 2, 20, 64, dtype=bf16, grad=True)
    x, r, w, b = _t(10, 96, grad=True), _t(10, 96, dtype=bf16, grad=True), _t(96, grad=True), _t(96, grad=True)
    return {
        "gemm": (torch.ops.hk.gemm.default, (_t(20, 64, dtype=bf16, grad=True), _t(64, 24, dtype=bf16, grad=True))),
        "attention_causal_gqa": (torch.ops.hk.attention.default, (q, k, v, True)),
        "attention_window": (torch.ops.hk.attention.default, (q, k, v, False, [3, -1])),
        "rotary_gptj": (torch.ops.hk.rotary.default, (_t(2, 20, 3, 64, grad=True), cos, sin, "gptj", 2)),
        "layernorm_dropout": (torch.ops.hk.dropout_residual_layernorm.default, (x, r, w, b, 0.1, 7, 3)),
        "rms_norm": (torch.ops.hk.rms_norm.default, (x, r, w, None, 0.0)),
    }


@pytest.mark.parametrize("name", ["gemm", "attention_causal_gqa", "attention_window", "rotary_gptj",
                                  "layernorm_dropout", "rms_norm"])
def test_opcheck_on_cuda(name):
    op, args = _cases()[name]
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("causal,hq,hkv,n,d", [(True, 4, 2, 200, 64), (False, 2, 2, 130, 128)])
def test_attention_gradients_on_cuda_match_float64(causal, hq, hkv, n, d):
    q, k, v = _t(1, hq, n, d, dtype=bf16, grad=True), _t(1, hkv, n, d, dtype=bf16, grad=True), \
        _t(1, hkv, n, d, dtype=bf16, grad=True)
    do = _t(1, hq, n, d, dtype=bf16)
    o, _ = torch.ops.hk.attention(q, k, v, causal)
    o.backward(do)
    refs = attention_bwd.reference(q.detach(), k.detach(), v.detach(), do, causal=causal)
    for name, got, ref in zip("qkv", (q.grad, k.grad, v.grad), refs):
        err = float((got.double() - ref).norm() / ref.norm())
        assert err < 2e-2, (name, err)


def test_cuda_graph_of_a_training_step_replays():
    lin = _t(64, 64, dtype=bf16, grad=True)
    x = _t(128, 64, dtype=bf16)
    cos, sin = rotary.tables(128, 64, device="cuda")

    def step():
        h = torch.ops.hk.gemm(x, lin)
        y = torch.ops.hk.rotary(h.view(1, 128, 1, 64), cos, sin, "neox", 0)
        y.float().square().mean().backward()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            lin.grad = None
            step()
    torch.cuda.current_stream().wait_stream(s)
    lin.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    expect = lin.grad.clone()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    replayed = lin.grad.clone()
    lin.grad = None
    step()
    assert not torch.equal(replayed, expect)                  # new input, new gradient
    assert torch.allclose(replayed.float(), lin.grad.float(), rtol=2e-2, atol=1e-3)


def test_compiled_block_matches_eager_on_cuda():
    from hk_torch_models import DIM, Block
    torch.manual_seed(0)
    block = Block(hk=True).to("cuda", bf16)
    x = torch.randn(2, 32, DIM, device="cuda", dtype=bf16)
    eager = block(x)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(eager, compiled)
