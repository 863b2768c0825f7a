"""hk attention for Hugging Face transformers (optional dependency, imported only here):

    from hk_portable.nn.huggingface import register
    register()                                                      # the name "hk"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hk")

Prefill and the decode steps against a KV cache run on hk attention (GQA without repeating k/v). Masks: the
SDPA mask builder is registered beside it, which gives no mask when the mask is plain causal (no padding,
query length 1 or equal to the key length): hk attention then applies causal masking bottom-right aligned
(the KV-cache convention). A mask it cannot express (padding, sliding windows, packed sequences) arrives
materialised and is refused with a clear error rather than ignored."""
from __future__ import annotations

import torch

from . import functional as F

NAME = "hk"


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
    causal = causal and n > 1                       # one query row (decode) sees every cached key
    align = "bottom_right" if causal and n != n_kv else None
    o = F.attention(query, key, value, causal=causal, align=align, scale=scaling)
    return o.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Register hk attention (and the SDPA mask builder) under `name` in transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, hk_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
