"""torch.compile(fullgraph=True) of a transformer block on hk ops (zero graph breaks, eager's outputs and
gradients), and a two-layer model trained 20 steps with hk ops against the pure torch version (CPU,
reference backend)."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

from hk_torch_models import assert_follows_curve, loss as _loss, tokens, train, twins


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_block_traces_into_one_graph_with_no_breaks():
    model, _ = twins(1)
    explained = torch._dynamo.explain(model)(tokens()[:, :-1])
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_compiled_block_gives_eager_outputs_and_gradients():
    """AOT autograd over the fake implementations, then the real hk kernels: bit for bit eager's results."""
    torch._dynamo.reset()
    model, _ = twins(1)
    batch = tokens()
    eager = _loss(model, batch)
    eager.backward()
    want = _grads(model)
    model.zero_grad()
    compiled = _loss(torch.compile(model, fullgraph=True, backend="aot_eager"), batch)
    compiled.backward()
    assert torch.equal(compiled, eager)
    for name, grad in _grads(model).items():
        assert torch.equal(grad, want[name]), name


# ~90 s, but the only inductor test a CPU-only run has: not `slow` (which the default run leaves out)
def test_inductor_compiled_block_matches_eager():
    """Inductor (C++ codegen on the CPU, ~90 s here) fuses the torch ops between the hk ops in f32, so results
    agree with eager to bf16 rounding rather than bit for bit."""
    torch._dynamo.reset()
    model, _ = twins(1)
    x = tokens()[:, :-1]
    with torch.no_grad():
        eager = model(x).float()
        compiled = torch.compile(model, fullgraph=True)(x).float()
    assert ((compiled - eager).abs().max() / eager.abs().max()) < 2 ** -6


def test_two_layer_training_follows_the_torch_loss_curve():
    hk_model, torch_model = twins(2)
    assert_follows_curve(train(hk_model), train(torch_model))
