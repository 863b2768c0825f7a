"""A DDP training step with hk ops: DistributedDataParallel over torchrun's processes against one process.

    torchrun --nproc_per_node=N benchmarks/ddp_step.py [--device cuda|cpu] [--steps 10] [--json PATH]
             [--batch 8] [--seq 32]

e.g. on one GPU: torchrun --nproc_per_node=1 benchmarks/ddp_step.py; on two CPU processes (tests/test_ddp_step.py):
torchrun --nproc_per_node=2 benchmarks/ddp_step.py --device cpu --steps 3

The model is the tests' two-layer transformer (tests/hk_torch_models.py, rebuilt here so that a benchmark does
not import tests): embedding, two blocks of x + attn(rmsnorm(x)) (GQA 2/1 heads of 64, neox rotary, causal)
and h + down(silu(up(rmsnorm(h)))), a final RMSNorm and a linear head, all hk_portable.nn modules, in bf16,
seeded identically on every rank (DDP also broadcasts rank 0's weights). Every rank trains `--steps` SGD steps
on its equal shard of one fixed global batch (backend nccl on cuda, gloo on cpu); rank 0 then trains an
identical model without DDP on the whole global batch and compares the per-step losses and the final
parameters (TOLERANCES below). It prints one JSON object (also written to --json): world size, device name,
both loss curves, the largest parameter difference, pass/fail, the median step time and the hk share of it.
The exit code is 0 only when the comparison passes (every rank gets rank 0's verdict).

Every process turns NVLink multicast off before torch.distributed starts (os.environ, here): NCCL_NVLS_ENABLE=0
(NCCL's NVLink SHARP collectives), TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (torch's symmetric memory),
NVSHMEM_DISABLE_NVLS=1 (NVSHMEM's): the lent multi-GPU machines do not offer multicast objects.

Timing: each step's wall clock (cuda: synchronised at its end), the median over the steps after the first
(the first compiles the kernels). The hk share comes from `--profile-steps` further DDP steps under
torch.profiler (after the comparison's snapshot, so they change nothing compared): the time of the top-level
hk:: op events (autograd's backward calls included) per step, on cuda their kernels' device time (the profiler
ties hk's cuLaunchKernel launches to the op that made them) over the median step time, on cpu their CPU time
(the reference backend runs in the op) over the profiled steps' wall clock. `hk_host_share` is the hk ops' CPU
time over the profiled wall clock on either device (launch cost: what dominates a model this small on a GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_var] = _value          # before torch (and NCCL) read them

import torch                                                    # noqa: E402
import torch.distributed as dist                                # noqa: E402
from torch import nn                                            # noqa: E402
from torch.nn.parallel import DistributedDataParallel           # noqa: E402

import hk_portable.nn as hnn                                    # noqa: E402

VOCAB, DIM, HEADS, KV_HEADS, HIDDEN, LAYERS = 64, 128, 2, 1, 128, 2   # the tests' model; head dim 64
LR = 0.5    # plain SGD: an update is -LR * grad, so the runs differ as their gradients do (Adam's early steps
            # are ~LR * sign(grad), which bf16 rounding flips where a gradient is near zero)
# bf16 weights and compute: the two runs' gradients differ by bf16 rounding (each rank's half-batch gradient
# is rounded, then averaged by the all-reduce, vs one full-batch gradient), and where a step moves a weight by
# about half a bf16 ulp such a difference picks the neighbouring value; over 10 steps these compound. Losses
# (f32 from bf16 logits): within one bf16 ulp, 2^-7 relative (+ 2^-10 absolute); measured 2^-12 on gloo at
# world size 2. Parameters: each tensor's largest difference in bf16 ulps of its largest weight, at most 16;
# measured 4.5 (o_proj; gloo, world size 2, 10 steps). A DDP that summed instead of averaging, or did not
# all-reduce, moves weights by the update's size (~40 such ulps) and the loss by more than 2^-7.
TOLERANCES = {"loss_rel": 2 ** -7, "loss_abs": 2 ** -10, "param_ulps": 16}


class Block(nn.Module):
    def __init__(self, max_positions):
        super().__init__()
        self.attn_norm, self.mlp_norm = hnn.RMSNorm(DIM, eps=1e-6), hnn.RMSNorm(DIM, eps=1e-6)
        self.attn = hnn.Attention(DIM, HEADS, KV_HEADS, rotary=True, max_positions=max_positions)
        self.up, self.down = hnn.Linear(DIM, HIDDEN, bias=False), hnn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.down(nn.functional.silu(self.up(self.mlp_norm(h))))


class TinyLM(nn.Module):
    def __init__(self, max_positions):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(max_positions) for _ in range(LAYERS))
        self.norm, self.head = hnn.RMSNorm(DIM, eps=1e-6), hnn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model(seq, device):
    torch.manual_seed(0)                                     # the same weights on every rank and for rank 0's twin
    return TinyLM(seq).to(device, torch.bfloat16)


def loss_of(model, batch):
    """Next-token cross-entropy in f32 of batch [B, seq + 1]."""
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model, params, batch, steps, device):
    """`steps` SGD steps on one batch; (losses as a tensor, each step's seconds)."""
    opt = torch.optim.SGD(params, lr=LR)
    losses, seconds = [], []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        value = loss_of(model, batch)
        value.backward()                                     # DDP all-reduces (averages) the gradients in here
        opt.step()
        sync(device)
        seconds.append(time.perf_counter() - start)
        losses.append(value.detach())
    return torch.stack(losses).double(), seconds


def hk_times(ddp, params, batch, steps, device):
    """(hk device seconds, hk CPU seconds, wall seconds) per step over `steps` profiled DDP steps."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        train(ddp, params, batch, steps, device)
        wall = time.perf_counter() - start

    def nested(e):                                           # inside another hk op: counted with that one
        p = e.cpu_parent
        while p is not None and not p.name.startswith("hk::"):
            p = p.cpu_parent
        return p is not None

    top = [e for e in prof.events() if e.name.startswith("hk::") and not nested(e)]
    device_us = sum(getattr(e, "device_time_total", 0) for e in top)   # torch >= 2.4's name
    cpu_us = sum(e.cpu_time_total for e in top)
    return device_us * 1e-6 / steps, cpu_us * 1e-6 / steps, wall / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences), split evenly over the ranks")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.steps < 1 or args.profile_steps < 1:
        sys.exit(f"--steps and --profile-steps must be 1 or more, got {args.steps} and {args.profile_steps}")
    if args.batch % world:
        sys.exit(f"--batch {args.batch} must be a multiple of the world size {world} (equal shards: the mean of "
                 f"the shards' mean losses is the global mean)")
    if args.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        torch.set_num_threads(1)                             # one core per process: the ranks share the machine
        device = torch.device("cpu")
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    try:
        gen = torch.Generator().manual_seed(1)
        batch = torch.randint(0, VOCAB, (args.batch, args.seq + 1), generator=gen).to(device)
        shard = batch.chunk(world)[rank]

        model = make_model(args.seq, device)
        start_params = {n: p.detach().clone() for n, p in model.named_parameters()}
        ddp = DistributedDataParallel(model, device_ids=[local] if cuda else None)
        ddp_losses, seconds = train(ddp, ddp.parameters(), shard, args.steps, device)
        dist.all_reduce(ddp_losses)                          # sum of the shards' mean losses (gloo has no AVG)
        ddp_losses /= world
        final = {n: p.detach().clone() for n, p in model.named_parameters()}   # before the profiled steps
        # DDP keeps the replicas equal: check it (rank 0's copy is the one compared below)
        flat = torch.cat([p.flatten() for p in final.values()])
        mine = flat.clone()
        dist.broadcast(flat, 0)
        same = torch.tensor([int(torch.equal(flat, mine))], device=device)
        dist.all_reduce(same, dist.ReduceOp.MIN)
        hk_device, hk_cpu, profiled_wall = hk_times(ddp, ddp.parameters(), shard, args.profile_steps, device)

        passed = torch.tensor([0], device=device)
        if rank == 0:
            twin = make_model(args.seq, device)
            one_losses, _ = train(twin, twin.parameters(), batch, args.steps, device)
            loss_diff = (ddp_losses - one_losses).abs()
            loss_ok = bool((loss_diff <= TOLERANCES["loss_rel"] * one_losses.abs() + TOLERANCES["loss_abs"]).all())
            max_abs, max_ulps = 0.0, 0.0
            for name, p in twin.named_parameters():
                diff = float((final[name].double() - p.detach().double()).abs().max())
                ulp = 2.0 ** (torch.frexp(p.detach().float().abs().max()).exponent.item() - 8)   # bf16: 8 bits
                max_abs, max_ulps = max(max_abs, diff), max(max_ulps, diff / ulp)
            learns = bool(one_losses[-1] < one_losses[0])    # the comparison means something: training moved
            ok = loss_ok and max_ulps <= TOLERANCES["param_ulps"] and learns and bool(same)
            passed.fill_(int(ok))
            step_s = statistics.median(seconds[1:] or seconds)
            result = {
                "world_size": world, "device": device.type,
                "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
                "torch": torch.__version__, "steps": args.steps, "global_batch": args.batch, "seq": args.seq,
                "model": f"TinyLM {LAYERS} layers, dim {DIM}, heads {HEADS}/{KV_HEADS}, mlp {HIDDEN}, vocab {VOCAB}, "
                         f"bf16, SGD lr {LR}",
                "losses_ddp": ddp_losses.tolist(), "losses_single": one_losses.tolist(),
                "max_loss_diff": float(loss_diff.max()), "max_param_diff": max_abs,
                "max_param_diff_ulps": max_ulps, "ranks_identical": bool(same), "tolerances": TOLERANCES,
                "learns": learns, "pass": ok,
                "step_times_ms": [s * 1e3 for s in seconds], "median_step_ms": step_s * 1e3,
                "hk_share": (hk_device / step_s) if cuda else hk_cpu / profiled_wall,
                "hk_share_method": ("hk:: ops' kernel device time (torch.profiler) per step / median step time"
                                    if cuda else
                                    "hk:: ops' CPU time (torch.profiler) / wall clock of the profiled steps"),
                "hk_host_share": hk_cpu / profiled_wall, "profile_steps": args.profile_steps,
            }
            text = json.dumps(result, indent=1)
            print(text)
            if args.json:
                with open(args.json, "w") as f:
                    f.write(text + "\n")
        dist.broadcast(passed, 0)                            # every rank exits with rank 0's verdict
        return 0 if int(passed) else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 2.13's CPU profiler (the profiled steps) leaves a thread that aborted about half the processes at
    # interpreter exit ("terminate called without an active exception", after every check and the process group's
    # teardown; 6 of 6 clean without the profiler): leave without the interpreter's teardown
    os._exit(code)
