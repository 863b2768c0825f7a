"""hk attention for Hugging Face transformers (optional dependency, imported only here):

    from hk_portable.nn.huggingface import register
    register()                                                      # the name "hk"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hk")

Prefill and the decode steps against a KV cache run on hk attention (GQA without repeating k/v); a decode step
(one query per sequence, no gradient) runs on the split-KV kernel of hk::attention_kvcache, which spreads one
sequence's keys over many blocks (a [B, Hq, 1, D] query has too few rows to fill the GPU otherwise). Masks: the
SDPA mask builder is registered beside it, which gives no mask when the mask is plain causal (no padding,
query length 1 or equal to the key length): hk attention then applies causal masking bottom-right aligned
(the KV-cache convention). A mask it cannot express (padding, sliding windows, packed sequences) arrives
materialised and is refused with a clear error rather than ignored."""
from __future__ import annotations

import torch

from . import functional as F

NAME = "hk"
DECODE_HEAD_DIMS = (64, 128)        # the head dims hk::attention_kvcache takes (others decode through hk::attention)


def hk_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                         is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [B, Hq, N, D], k/v [B, Hkv, Nkv, D] -> ([B, N, Hq, D], None)."""
    if attention_mask is not None:
        raise NotImplementedError("hk attention takes causal or full attention only; this call carries an explicit "
                                  "mask (padding, a sliding window or packed sequences): use attn_implementation="
                                  "'sdpa' for it")
    if dropout:
        raise NotImplementedError(f"hk attention has no attention dropout (got dropout={dropout})")
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("hk attention has no logit softcap")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    n, n_kv = query.shape[2], key.shape[2]
    if n == 1 and query.shape[-1] in DECODE_HEAD_DIMS and not (
            torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)):
        return decode(query, key, value, scaling), None
    causal = causal and n > 1                       # one query row (decode) sees every cached key
    align = "bottom_right" if causal and n != n_kv else None
    o = F.attention(query, key, value, causal=causal, align=align, scale=scaling)
    return o.transpose(1, 2).contiguous(), None


def decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """One query per sequence against all Nkv keys (the cache holds exactly the keys to attend to): q [B, Hq, 1, D],
    k/v [B, Hkv, Nkv, D] -> [B, 1, Hq, D], through hk::attention_kvcache on the caches' [B, Nkv, Hkv, D] views."""
    B, n_kv = query.shape[0], key.shape[2]
    o, _ = torch.ops.hk.attention_kvcache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                          _lengths(B, n_kv, query.device), None, False, scaling)
    return o


_LENGTHS: dict = {}


def _lengths(batch: int, n: int, device) -> torch.Tensor:
    """An int32 [batch] of n on `device`, made once per (batch, n, device) (read-only: no kernel writes it)."""
    key = (batch, n, device)
    t = _LENGTHS.get(key)
    if t is None:
        if len(_LENGTHS) >= 8192:
            _LENGTHS.clear()
        t = _LENGTHS[key] = torch.full((batch,), n, dtype=torch.int32, device=device)
    return t


def register(name: str = NAME) -> str:
    """Register hk attention (and the SDPA mask builder) under `name` in transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, hk_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
