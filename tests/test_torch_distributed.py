"""A DDP step with hk ops on two CPU processes (gloo, localhost) gives the gradients of a one-process run over
the same global batch."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from hk_torch_models import VOCAB, tokens, twins

WORLD = 2
TIMEOUT_S = 240


def _loss(model, batch):
    logits = model(batch[:, :-1])
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def _ddp_rank(rank, store_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=WORLD)
    try:
        model, _ = twins(1)                                   # same seed: same weights on every rank
        ddp = DistributedDataParallel(model)
        shard = tokens(batch=4, n=16).chunk(WORLD)[rank]      # equal shards: the mean of means is the mean
        _loss(ddp, shard).backward()
        torch.save({n: p.grad for n, p in model.named_parameters()}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path):
    ctx = mp.start_processes(_ddp_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the DDP step did not finish within {TIMEOUT_S} s")


def test_ddp_step_gives_the_gradients_of_one_process(tmp_path):
    _spawn(tmp_path)
    model, _ = twins(1)
    _loss(model, tokens(batch=4, n=16)).backward()
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for name, p in model.named_parameters():
        assert torch.equal(ranks[0][name], ranks[1][name]), name           # DDP synchronised them
        err = (ranks[0][name].double() - p.grad.double()).abs().max() / p.grad.double().abs().max()
        # bf16 gradients: DDP averages two half-batch gradients, each rounded to bf16 -> a few bf16 ulps
        assert err < 2 ** -6, f"{name}: relative error {err:.3g}"
