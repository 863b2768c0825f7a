"""The torch integration on a real GPU (cuda backend): every hk:: op passes torch.library.opcheck on CUDA
tensors, autograd through the hk backward kernels matches float64, a compiled block matches eager, CUDA
graphs of a small step and of a whole training step of the two-layer model replay correctly, the two-layer
model's 20-step loss curve follows the pure torch one, a random transformers Llama with hk attention
gives SDPA's logits and greedy generation and trains, and a random Qwen2 with a sliding-window layer gives SDPA's
tokens with padding, chunked prefill and a second turn on the cache. The model code is tests/hk_torch_models.py,
which the CPU tests run on the reference backend. Skips with the reason on a machine without a GPU."""
from __future__ import annotations

import copy

import pytest
import torch

import hk_portable as hk
from hk_portable import torch_ops  # noqa: F401 - registers the hk:: ops
from hk_portable.kernels import attention_bwd, rotary
from hk_torch_models import (LLAMA_LOGITS_TOL, assert_follows_curve, chat, llama_greedy, llama_ids, llama_logits_error,
                             llama_pair, llama_train, padded_batch, qwen2_pair, spy_hk_attention, tokens, train,
                             training_step, twins)

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


# ------------------------------------------------------------ the two-layer model of tests/hk_torch_models.py
def test_two_layer_training_follows_the_torch_loss_curve_on_cuda():
    """The CPU test's 20 steps and tolerance (test_torch_compile.py), hk's cuda kernels against torch's."""
    hk_model, torch_model = (m.to("cuda") for m in twins(2))
    assert_follows_curve(train(hk_model, device="cuda"), train(torch_model, device="cuda"))


LR = 1e-2               # AdamW moves a bf16 weight of 0.05 by ~40 ulps a step: a step left out of the graph shows


def _warm_up(model, opt, batch, steps=3):
    """Eager steps on a side stream before the capture (torch's recipe for graphs of whole steps): the kernels
    compile and get their configurations, and AdamW allocates its state, outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            training_step(model, opt, batch)
    torch.cuda.current_stream().wait_stream(side)


def _eager_twin(model, opt):
    """A copy of the model and of its optimizer state, stepped eagerly beside the graph."""
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=LR, capturable=True)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))   # a copy: load_state_dict may keep the tensors
    return twin, twin_opt


def _capture(model, opt, batch):
    opt.zero_grad(set_to_none=True)          # the captured backward allocates the gradients in the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = training_step(model, opt, batch)
    return graph, loss


def test_cuda_graph_of_a_whole_training_step_replays_the_eager_step():
    """Embedding, RMS norms, rotary, GQA attention, gemms: forward, backward and AdamW(capturable=True) in one
    graph. Each replay on a new batch equals the same step run eagerly on a twin with the same parameters
    and optimizer state: the same loss, the same parameters after two steps."""
    model = twins(2)[0].to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, capturable=True)
    static = tokens(batch=4, n=16, device="cuda")
    _warm_up(model, opt, static)
    twin, twin_opt = _eager_twin(model, opt)
    start = [p.detach().clone() for p in model.parameters()]
    graph, static_loss = _capture(model, opt, static)
    replayed = []
    for seed in (5, 6):
        batch = tokens(batch=4, n=16, seed=seed, device="cuda")
        static.copy_(batch)
        graph.replay()
        twin_opt.zero_grad(set_to_none=True)
        eager = training_step(twin, twin_opt, batch).item()
        replayed.append(static_loss.item())
        assert abs(replayed[-1] - eager) <= 1e-3 * eager, (replayed[-1], eager)
    assert replayed[0] != replayed[1]                          # each replay read its batch
    for (name, p), p0, q in zip(model.named_parameters(), start, twin.parameters()):
        assert not torch.equal(p, p0), f"{name}: the replays did not step it"
        # one bf16 ulp: attention's dQ is summed with atomic adds, in an order that may differ between runs
        torch.testing.assert_close(p, q, rtol=2 ** -7, atol=1e-5, msg=name)


# ------------------------------------------------------------------- transformers Llama (GQA, random weights)
@pytest.fixture
def transformers():
    return pytest.importorskip("transformers")


def test_llama_with_hk_attention_on_cuda_gives_sdpa_logits_and_generation(transformers, monkeypatch):
    """The CPU test's model and tolerance (test_torch_transformers.py): prefill and KV-cache decode on hk."""
    hk_model, sdpa_model = llama_pair("cuda")
    ids = llama_ids("cuda")
    shapes = spy_hk_attention(monkeypatch)
    assert llama_logits_error(hk_model, sdpa_model, ids) < LLAMA_LOGITS_TOL
    ours, theirs = llama_greedy(hk_model, ids), llama_greedy(sdpa_model, ids)
    assert torch.equal(ours, theirs), (ours, theirs)
    # prefill, and the last decode step on the cache (through the split-KV kernel)
    assert (12, 12) in shapes and (1, 17, "decode") in shapes


def test_llama_with_hk_attention_trains_on_cuda(transformers):
    hk_model, _ = llama_pair("cuda")
    losses = llama_train(hk_model, llama_ids("cuda"))
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
def test_qwen2_chat_on_cuda_gives_sdpa_tokens(transformers, padded):
    """The CPU acceptance test's model and chat (test_torch_transformers.py): batch 4, a sliding-window layer, a
    prompt prefilled in two chunks, a second turn on the same cache; then a static cache's generation."""
    hk_model, sdpa_model = qwen2_pair("cuda")
    ids, mask = padded_batch((12, 9, 5, 11) if padded else (12,) * 4, device="cuda")
    ours, theirs = chat(hk_model, ids, mask), chat(sdpa_model, ids, mask)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1]), (ours, theirs)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        ours, theirs = hk_model.generate(ids, **kw), sdpa_model.generate(ids, **kw)
    assert torch.equal(ours, theirs), (ours, theirs)


def _to_cuda(x):
    return x.cuda() if isinstance(x, torch.Tensor) else x


def test_opcheck_of_the_fp8_and_serving_ops_on_cuda():
    """gemm_fp8 (without the schema test: torch's allclose has no fp8 kernel), attention_varlen and its
    backward, attention_kvcache: the CPU cases of tests/test_torch_ops.py on CUDA tensors."""
    from test_torch_ops import _serving_opcheck_cases
    a = (torch.randn(40, 64, device="cuda") * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(24, 64, device="cuda") * 2).to(torch.float8_e5m2).t()
    sa, sb = torch.tensor([0.5], device="cuda"), torch.rand(24, device="cuda") + 0.5
    torch.library.opcheck(torch.ops.hk.gemm_fp8.default, (a, b, sa, sb),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    for name, (op, args) in _serving_opcheck_cases().items():
        args = tuple(_to_cuda(x) for x in args)
        args = tuple(x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.is_leaf and x.requires_grad
                     else x for x in args)
        torch.library.opcheck(op, args)


def _replay_cases():
    """Fresh arguments per call for each op the models call, at sizes that take the TMA paths on sm_90a."""
    from hk_portable.kernels.rotary import tables
    cos, sin = tables(256, 128, device="cuda")
    seqlens = torch.tensor([700, 1000], device="cuda", dtype=torch.int32)
    return {
        "gemm nn": lambda: (torch.ops.hk.gemm, (_t(256, 512, dtype=bf16), _t(512, 384, dtype=bf16))),
        "gemm nt (Linear)": lambda: (torch.ops.hk.gemm, (_t(2, 128, 512, dtype=bf16), _t(384, 512, dtype=bf16).t())),
        "gemm tn (weight grad)": lambda: (torch.ops.hk.gemm, (_t(512, 256, dtype=bf16).t(), _t(512, 384, dtype=bf16))),
        "attention causal gqa": lambda: (torch.ops.hk.attention,
                                         (_t(1, 8, 512, 128, dtype=bf16), _t(1, 2, 512, 128, dtype=bf16),
                                          _t(1, 2, 512, 128, dtype=bf16), True)),
        "attention decode": lambda: (torch.ops.hk.attention, (_t(4, 8, 1, 128, dtype=bf16),
                                                              _t(4, 8, 300, 128, dtype=bf16),
                                                              _t(4, 8, 300, 128, dtype=bf16))),
        "attention_kvcache": lambda: (torch.ops.hk.attention_kvcache,
                                      (_t(2, 1, 8, 128, dtype=bf16), _t(2, 1024, 2, 128, dtype=bf16),
                                       _t(2, 1024, 2, 128, dtype=bf16), seqlens)),
        "rotary": lambda: (torch.ops.hk.rotary, (_t(2, 64, 8, 128, dtype=bf16), cos, sin, "neox", 3)),
        "rms_norm": lambda: (torch.ops.hk.rms_norm, (_t(64, 2048, dtype=bf16), None, _t(2048, dtype=bf16))),
        "layernorm residual": lambda: (torch.ops.hk.dropout_residual_layernorm,
                                       (_t(64, 1024, dtype=bf16), _t(64, 1024, dtype=bf16), _t(1024), _t(1024))),
    }


REPLAY_CASES = ["gemm nn", "gemm nt (Linear)", "gemm tn (weight grad)", "attention causal gqa", "attention decode",
                "attention_kvcache", "rotary", "rms_norm", "layernorm residual"]


@pytest.mark.parametrize("name", REPLAY_CASES)
def test_op_replay_gives_the_python_paths_results_on_cuda(name):
    """Op replay (runtime/opfast.cpp) against the Python path on the same fresh arguments, bit for bit, with the
    allocator's free blocks poisoned first (a replay that skipped a launch, wrote through stale pointers or tensor
    maps, or missed an output would show)."""
    from hk_portable.runtime import opfast
    make = _replay_cases()[name]
    opfast.load()
    if opfast._module is None:
        pytest.skip(f"op replay unavailable: {opfast.reason()}")
    replays = opfast.stats()["replays"]
    for call in range(4):
        op, args = make()
        torch.full((64 << 20,), float("nan"), device="cuda")      # freed at once: a poisoned block to reuse
        with torch.inference_mode():
            got = op(*args)
            opfast.block_opened(1)
            try:
                want = op(*args)
            finally:
                opfast.block_opened(-1)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
            assert torch.equal(g, w) or (g.isnan() == w.isnan()).all() and torch.equal(g.nan_to_num(), w.nan_to_num()), \
                f"{name}: call {call} differs from the Python path"
    assert opfast.stats()["replays"] >= replays + 2, f"{name}: not replayed ({opfast.last_refusal()})"
