"""hk ops under torch.distributed on two CPU processes (gloo, localhost), with torch's own communication only:
a DDP step gives the gradients of a one-process run over the same global batch, and an FSDP2 (fully_shard)
training step of the two-layer model gives its gradients and its updated parameters."""
from __future__ import annotations

import copy
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from hk_torch_models import loss as _loss, tokens, twins

WORLD = 2
TIMEOUT_S = 240
LR = 0.5                # plain SGD: the update is -LR * grad, so it compares as the gradients do (Adam's first
                        # step is LR * sign(grad), which bf16 rounding flips where a gradient is near zero)


def _batch(rank=None):
    batch = tokens(batch=4, n=16)
    return batch if rank is None else batch.chunk(WORLD)[rank]   # equal shards: the mean of means is the mean


def _init(rank, store_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=WORLD)


def _ddp_rank(rank, store_file, out_dir):
    _init(rank, store_file)
    try:
        model, _ = twins(1)                                   # same seed: same weights on every rank
        ddp = DistributedDataParallel(model)
        _loss(ddp, _batch(rank)).backward()
        torch.save({n: p.grad for n, p in model.named_parameters()}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _fsdp_model():
    """Two layers with f32 master weights; FSDP2's usual recipe gathers them as bf16 (the GEMM and attention
    kernels' dtype) and reduces the gradients in f32."""
    model, _ = twins(2, dtype=torch.float32)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def _fsdp_rank(rank, store_file, out_dir):
    _init(rank, store_file)
    # hk's linear layers must not return views (FSDP2's hooks would miss an in-place op on one): fail on it
    warnings.filterwarnings("error", message=".*returned a view tensor")
    try:
        model = _fsdp_model()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        _loss(model, _batch(rank)).backward()
        out = {"local": {n: tuple(p.to_local().shape) for n, p in model.named_parameters()},
               "grads": {n: p.grad.full_tensor() for n, p in model.named_parameters()}}
        opt.step()
        out["params"] = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path, fn, what):
    ctx = mp.start_processes(fn, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {what} did not finish within {TIMEOUT_S} s")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def _assert_close(name, got, want):
    err = (got.double() - want.double()).abs().max() / want.double().abs().max()
    # bf16 gradients: two half-batch gradients, each rounded to bf16, averaged -> a few bf16 ulps
    assert err < 2 ** -6, f"{name}: relative error {err:.3g}"


def test_ddp_step_gives_the_gradients_of_one_process(tmp_path):
    ranks = _spawn(tmp_path, _ddp_rank, "DDP step")
    model, _ = twins(1)
    _loss(model, _batch()).backward()
    for name, p in model.named_parameters():
        assert torch.equal(ranks[0][name], ranks[1][name]), name           # DDP synchronised them
        _assert_close(name, ranks[0][name], p.grad)


def _one_process_step():
    """The same step without torch.distributed: a bf16 copy of the f32 master weights runs forward and
    backward, and SGD updates the masters with its gradients. Returns (start, gradients, updated)."""
    master, _ = twins(2, dtype=torch.float32)
    start = {n: p.detach().clone() for n, p in master.named_parameters()}
    model = copy.deepcopy(master).to(torch.bfloat16)
    _loss(model, _batch()).backward()
    for p, compute in zip(master.parameters(), model.parameters()):
        p.grad = compute.grad.float()
    torch.optim.SGD(master.parameters(), lr=LR).step()
    return start, {n: p.grad for n, p in master.named_parameters()}, dict(master.named_parameters())


def test_fsdp2_step_gives_the_gradients_and_parameters_of_one_process(tmp_path):
    ranks = _spawn(tmp_path, _fsdp_rank, "FSDP2 step")
    start, grads, updated = _one_process_step()
    for name, p0 in start.items():
        assert ranks[0]["local"][name][0] == -(-p0.shape[0] // WORLD), name    # really sharded: half the rows
        _assert_close(f"grad {name}", ranks[0]["grads"][name], grads[name])
        # the step, gathered from both shards (the update, not the parameter: a step that did nothing would pass)
        _assert_close(f"update {name}", ranks[0]["params"][name] - p0, updated[name].detach() - p0)
