"""GPU correctness of what "fast in a model" changed, before anything is timed: the GEMM in its four operand
layouts (ragged and large shapes, outputs poisoned with NaN, against float64), torch.ops.hk.gemm's gradients in
each layout, and the Llama block (hk_portable.nn.blocks) against its plain-torch twin in training, prefill and
decode. Prints a table; exits 1 on any failure. JSON with --json.

    python benchmarks/layout_check.py --json layout_check.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch

BF16 = torch.bfloat16


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def operand(rows, cols, transposed, device, gen):
    shape = (cols, rows) if transposed else (rows, cols)
    t = torch.randn(shape, generator=gen, device=device).to(BF16)
    return t.t() if transposed else t


def gemm_rows(device: str) -> list[dict]:
    from hk_portable.kernels.gemm import gemm
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for (M, N, K), (ta, tb) in itertools.product(((1, 1, 1), (17, 33, 65), (100, 72, 130), (1000, 1000, 1000),
                                                  (4096, 4096, 4096), (8192, 5632, 2048), (333, 4096, 520),
                                                  (64, 5632, 2048), (8, 2048, 2048)),
                                                 itertools.product((False, True), repeat=2)):
        a, b = operand(M, K, ta, device, gen), operand(K, N, tb, device, gen)
        out = torch.full((M, N), float("nan"), device=device, dtype=BF16)
        gemm(a, b, out=out)
        torch.cuda.synchronize()
        err = rel(out, a.double() @ b.double())
        rows.append({"check": f"gemm {M}x{N}x{K} {'t' if ta else 'n'}{'t' if tb else 'n'}", "rel_error": err,
                     "ok": bool(err < 1e-2 and not out.isnan().any())})
    return rows


def gradient_rows(device: str) -> list[dict]:
    rows = []
    gen = torch.Generator(device=device).manual_seed(1)
    for ta, tb in itertools.product((False, True), repeat=2):
        a = operand(512, 384, ta, device, gen).requires_grad_()
        b = operand(384, 256, tb, device, gen).requires_grad_()
        g = torch.randn(512, 256, generator=gen, device=device).to(BF16)
        torch.ops.hk.gemm(a, b).backward(g)
        ea, eb = rel(a.grad, g.double() @ b.double().t()), rel(b.grad, a.double().t() @ g.double())
        rows.append({"check": f"hk::gemm gradients {'t' if ta else 'n'}{'t' if tb else 'n'}",
                     "rel_error": max(ea, eb), "ok": max(ea, eb) < 1e-2})
    return rows


def block_rows(device: str) -> list[dict]:
    from hk_portable.bench_model import _blocks
    rows = []
    ours, theirs = _blocks(device, 4096, dim=2048, num_heads=16, num_kv_heads=4, ffn_dim=5632)
    x = torch.randn(2, 1024, 2048, device=device, dtype=BF16)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ys = [ours(xs[0]), theirs(xs[1])]
    g = torch.randn_like(ys[0])
    for y in ys:
        y.backward(g)
    rows.append({"check": "block forward vs torch block", "rel_error": rel(ys[0], ys[1]), "ok": rel(ys[0], ys[1]) < 2e-2})
    worst = max(rel(p.grad, q.grad) for p, q in zip(ours.parameters(), theirs.parameters()))
    rows.append({"check": "block parameter gradients vs torch block (worst)", "rel_error": worst, "ok": worst < 5e-2})
    rows.append({"check": "block input gradient vs torch block", "rel_error": rel(xs[0].grad, xs[1].grad),
                 "ok": rel(xs[0].grad, xs[1].grad) < 5e-2})
    with torch.no_grad():
        xd = torch.randn(4, 1, 2048, device=device, dtype=BF16)
        kv = [torch.randn(4, 512, 4, 128, device=device, dtype=BF16) for _ in range(2)]
        out = []
        for block in (ours, theirs):
            cache = tuple(t.clone() if block.impl == "hk" else t.transpose(1, 2).contiguous() for t in kv)
            out.append(block.decode(xd, cache, 511))
        rows.append({"check": "block decode vs torch block", "rel_error": rel(out[0], out[1]),
                     "ok": rel(out[0], out[1]) < 2e-2})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import hk_portable.nn  # noqa: F401  (the hk:: ops)
    device = "cuda"
    rows = gemm_rows(device) + gradient_rows(device) + block_rows(device)
    for r in rows:
        print(f"{r['check']:55} {r['rel_error']:10.2e}  {'ok' if r['ok'] else 'FAILED'}")
    failed = [r for r in rows if not r["ok"]]
    print(f"layout_check: {len(rows) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
