"""Tokens per second of transformers' `generate` with hk attention against SDPA, side by side in one process: a
randomly initialised Llama (8 layers, E=2048, 16/4 heads of 128, FF 5632, bf16; no weights downloaded), the same
weights in both, greedy decoding of `--new` tokens after a `--prompt`-token prompt at each batch size. Only the
attention differs (attn_implementation "hk" or "sdpa"). Every decode length is warmed up by one whole generate
before timing; the implementations take turns in each of `--rounds` rounds, in a rotating order; the median
round is reported, with the
GPU time of one generate from CUDA events beside the host clock (two timing methods) and how many of the greedy
tokens agree.

    python benchmarks/generate_tokens.py [--batch 1 8] [--new 128] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def model(impl: str, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                      attn_implementation=impl)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()


def generate(m, ids, new: int) -> torch.Tensor:
    with torch.no_grad():
        return m.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)


def timed(m, ids, new: int) -> tuple[float, float, torch.Tensor]:
    """(host seconds, GPU-event seconds, tokens) of one generate."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    out = generate(m, ids, new)
    end.record()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, start.elapsed_time(end) / 1e3, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--decode-stages", type=int, help="pipeline stages of attention_kvcache's decode blocks "
                    "(an experiment: the library's choice otherwise)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from hk_portable.nn.huggingface import register
    register()
    if args.decode_stages:
        from hk_portable.kernels import attention_kvcache as kv
        chosen = kv.kvcache_config
        kv.kvcache_config = lambda D, R, *a: {**chosen(D, R, *a), **({"STAGES": args.decode_stages} if R <= 16 else {})}
    models = {"hk": model("hk", args.layers), "sdpa": model("sdpa", args.layers)}
    models["sdpa"].load_state_dict(models["hk"].state_dict())
    rows = []
    for b in args.batch:
        ids = torch.randint(3, 32000, (b, args.prompt), generator=torch.Generator().manual_seed(b)).cuda()
        for m in models.values():           # every decode length once: compiles, autotuning, plans
            generate(m, ids, args.new)
        runs = {name: [] for name in models}
        outs = {}
        names = list(models)
        for r in range(args.rounds):        # each round in another order: no implementation always goes first
            for name in names[r % len(names):] + names[:r % len(names)]:
                host, gpu, outs[name] = timed(models[name], ids, args.new)
                runs[name].append((host, gpu))
        row = {"batch": b, "prompt": args.prompt, "new_tokens": args.new, "layers": args.layers,
               "decode_stages": args.decode_stages}
        for name, r in runs.items():
            host = statistics.median(h for h, _ in r)
            gpu = statistics.median(g for _, g in r)
            row[name] = {"tokens_per_s": b * args.new / host, "host_s": host, "event_s": gpu,
                         "methods_agree": abs(host - gpu) <= 0.05 * host, "rounds": r}
        row["hk_over_sdpa"] = row["hk"]["tokens_per_s"] / row["sdpa"]["tokens_per_s"]
        new_hk, new_sdpa = outs["hk"][:, args.prompt:], outs["sdpa"][:, args.prompt:]
        row["greedy_tokens_agree"] = float((new_hk == new_sdpa).float().mean())
        rows.append(row)
        print(f"generate B{b} prompt {args.prompt} +{args.new}: hk {row['hk']['tokens_per_s']:8.1f} tok/s, "
              f"sdpa {row['sdpa']['tokens_per_s']:8.1f} tok/s, hk/sdpa {row['hk_over_sdpa']:.3f} "
              f"(events agree: {row['hk']['methods_agree']}/{row['sdpa']['methods_agree']}; greedy tokens agree "
              f"{row['greedy_tokens_agree']:.2f})", flush=True)
    if args.json:
        import transformers
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "transformers": transformers.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
