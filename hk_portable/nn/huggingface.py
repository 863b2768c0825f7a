"""hk attention for Hugging Face transformers (optional dependency, imported only here):

    from hk_portable.nn.huggingface import register
    register()                                                      # the name "hk"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hk")

register() puts two functions under the name: the attention function and hk's own mask function
(transformers' AttentionMaskInterface). The mask function builds no dense mask: it recognises transformers' mask
rules (causal, bidirectional, causal with a sliding window) and returns an `HkMask`, a compact description made
once per forward and mask kind and read by every layer: the rule, the window, the query and key positions, how
many keys a causal mask lets any query see, and, where the 2-D attention mask has padding, where the valid
tokens are (per-sequence lengths and gather indices). Deciding reads a few values on the host (whether there
is padding, the longest sequence, a static cache's query offset): one synchronisation per forward and mask kind
on a GPU, none per layer. The attention function then runs:

- no padding: hk::attention (GQA without repeating k/v), causal bottom-right aligned, so prefill, chunked prefill
  and continuation from a cache with any number of new tokens are one call; sliding windows as the kernel's
  window. The keys a causal mask hides at the end of a static cache are sliced off (a view).
- a decode step (one query per sequence, no gradient): hk::attention_kvcache's split-KV
  kernel on the cache's [B, Nkv, Hkv, D] view and the written keys' length (a [B, Hq, 1, D] query has too few
  rows to fill the GPU otherwise), dynamic or static cache, a sliding window as a slice of the last keys.
- padding (left or right): hk::attention_varlen on the valid tokens gathered per sequence, causal bottom-right
  per sequence; with a causal mask rows of pad tokens give 0 (their keys are hidden from every valid token, as
  in transformers, so no valid token sees the difference).
  A sliding window with padding needs each sequence's valid tokens contiguous (left padding, or right padding
  before any continuation); pads between valid tokens with a window are refused.
- packed sequences (several sequences in a row, position ids restarting, no padding mask and no cache, as
  transformers finds them for training): hk::attention_varlen, one sequence per run, causal (and a window) within it.

Refused with NotImplementedError naming the reason, never run with a different mask: any other mask rule
(chunked attention, block or custom and/or overlays, bidirectional windows, packed sequences with padding or a
cache), a dense mask passed in (a 4-D mask), attention dropout. Gemma 2's softcap and GPT-OSS's sinks (`s_aux`)
run the dense hk::attention on unpadded batches, hk::attention_kvcache on their decode steps, and
hk::attention_varlen on padded or packed ones, forward and backward. transformers' continuous
batching (its paged cache, `generate_batch`) is not served: transformers accepts only "paged|eager", "sdpa" and
flash implementations there and refuses "hk" itself; serving it needs hk registered as a flash-style
implementation (the cu_seq_lens keyword arguments to hk::attention_varlen, the block table to
hk::attention_kvcache with the new keys appended)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ..kernels.attention import HEAD_DIMS
from . import functional as F

NAME = "hk"
DECODE_HEAD_DIMS = HEAD_DIMS        # the head dims hk::attention_kvcache takes (others decode through hk::attention)


@dataclass(frozen=True, eq=False)
class Padded:
    """The valid tokens of a padded batch: query rows (qb, qi) and key rows (kb, kj) (long index pairs into
    [B, N] and [B, Nkv]) in sequence order, their int32 prefix sums per sequence and the longest sequence."""
    qb: torch.Tensor
    qi: torch.Tensor
    kb: torch.Tensor
    kj: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    contiguous: bool            # every sequence's valid keys are consecutive positions (a window counts positions)


@dataclass(frozen=True, eq=False)
class HkMask:
    """What hk's mask function hands to the attention calls of one forward: key position p is seen by query
    position t iff (not causal or p <= t) and (window is None or p > t - window) and p is a valid token. Query i
    is position q_offset + i, key j of the layer's k/v is position kv_offset + j. `keys`: the keys 0 .. keys - 1
    any query may see (a causal mask hides the rest: a static cache's unwritten slots). `padded`: None when every
    one of those keys is valid. `refusal`: why hk cannot run this mask (the attention call raises it)."""
    batch: int
    q_length: int
    kv_length: int
    q_offset: int
    kv_offset: int
    causal: bool = True
    window: int | None = None
    keys: int = 0
    padded: Padded | None = None
    refusal: str | None = None


def hk_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask, scaling: float | None = None, dropout: float = 0.0,
                         is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [B, Hq, N, D], k [B, Hkv, Nkv, D], v [B, Hkv, Nkv, Dv] ->
    ([B, N, Hq, Dv], None)."""
    if dropout:
        raise NotImplementedError(f"hk attention has no attention dropout (got dropout={dropout})")
    # Gemma 2's logit softcap and GPT-OSS's sinks (s_aux, a logit per query head): the dense hk::attention takes
    # both, forward and backward; a padded batch (varlen) does not yet, and is refused below
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    extras = {"softcap": softcap, "sinks": None if sinks is None else sinks.float()}
    sliding = kwargs.get("sliding_window")
    if attention_mask is None:
        # no mask function ran (a model or cache that builds none): the module's own rule, no padding
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        mask = HkMask(query.shape[0], query.shape[2], key.shape[2], key.shape[2] - query.shape[2], 0, causal=causal,
                      window=sliding if causal else None, keys=key.shape[2])
        if sliding is not None and not causal:
            raise NotImplementedError("hk attention takes a sliding window on causal attention only")
    elif isinstance(attention_mask, HkMask):
        mask = attention_mask
    else:
        raise NotImplementedError(
            "hk attention was given an explicit mask tensor (a 4-D mask passed to the model, or a mask made by "
            "another implementation's mask function): it computes its masks from hk's mask function "
            "(register() installs it); use attn_implementation='sdpa' for a custom dense mask")
    if mask.refusal is not None:
        raise NotImplementedError(mask.refusal)
    if is_causal is not None and bool(is_causal) != mask.causal:
        raise NotImplementedError(f"hk attention: the call asks is_causal={is_causal} but the mask is "
                                  f"{'causal' if mask.causal else 'bidirectional'}")
    if sliding is not None and mask.window != sliding:
        raise NotImplementedError(f"hk attention: the layer has sliding_window={sliding} but its mask has "
                                  f"window {mask.window}: the model's mask and layer disagree")
    B, Hq, n, D = query.shape
    if (B, n, key.shape[2]) != (mask.batch, mask.q_length, mask.kv_length):
        raise NotImplementedError(f"hk attention: q {tuple(query.shape)} and k {tuple(key.shape)} do not match the "
                                  f"mask's batch {mask.batch}, query length {mask.q_length} and key length "
                                  f"{mask.kv_length}")
    if mask.padded is not None:
        return _varlen(query, key, value, mask, scaling, **extras), None
    # no padding: keys 0 .. mask.keys - 1, the queries the last n of them when causal
    k, v = key, value
    if mask.keys != key.shape[2]:
        k, v = key[:, :, :mask.keys], value[:, :, :mask.keys]
    window = None if mask.window is None else (mask.window - 1, 0)
    # one query row (decode) sees every key up to its own: causal only to count a window back from the last key
    causal = mask.causal and (n > 1 or window is not None)
    # the KV-cache kernel takes one head dim for keys and values: MLA-shaped layers (v's differs) decode densely
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if n == 1 and D in DECODE_HEAD_DIMS and value.shape[-1] == D and mask.causal and not grad:
        if mask.window is not None and k.shape[2] > mask.window:
            k, v = k[:, :, k.shape[2] - mask.window:], v[:, :, v.shape[2] - mask.window:]
        return decode(query, k, v, scaling, **extras), None
    masked = causal or (window is not None)
    align = "bottom_right" if masked and n != k.shape[2] else None
    o = F.attention(query, k, v, causal=causal, window=window if mask.causal else None, align=align, scale=scaling,
                    **extras)
    return o.transpose(1, 2).contiguous(), None


def decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None, softcap=None,
           sinks=None) -> torch.Tensor:
    """One query per sequence against all Nkv keys (the cache holds exactly the keys to attend to): q [B, Hq, 1, D],
    k/v [B, Hkv, Nkv, D] -> [B, 1, Hq, D], through hk::attention_kvcache on the caches' [B, Nkv, Hkv, D] views
    (a softcap and sinks as the model has them)."""
    B, n_kv = query.shape[0], key.shape[2]
    o, _ = torch.ops.hk.attention_kvcache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                          _lengths(B, n_kv, query.device), None, False, scaling, softcap=softcap,
                                          sinks=sinks)
    return o


def _varlen(query, key, value, mask: HkMask, scaling, softcap=None, sinks=None) -> torch.Tensor:
    """The valid tokens through hk::attention_varlen: q/k/v gathered to [total, H, D] per sequence, the output
    scattered back to [B, N, Hq, D] with zeros in pad rows."""
    p = mask.padded
    if mask.window is not None and not p.contiguous:
        raise NotImplementedError("hk attention: a sliding window over a padded batch whose valid tokens are not "
                                  "consecutive (pads between them): the kernel's window counts packed keys, the "
                                  "model's counts positions; use attn_implementation='sdpa' for it")
    B, Hq, n, D = query.shape
    q = query.transpose(1, 2)[p.qb, p.qi]            # [total_q, Hq, D]
    k = key.transpose(1, 2)[p.kb, p.kj]
    v = value.transpose(1, 2)[p.kb, p.kj]
    window = None if mask.window is None else [mask.window - 1, 0]
    o, _ = torch.ops.hk.attention_varlen(q, k, v, p.cu_q, p.cu_k, p.max_q, p.max_k, mask.causal,
                                         window if mask.causal else None,
                                         "bottom_right" if mask.causal else None, scaling, softcap=softcap,
                                         sinks=sinks)
    out = o.new_zeros(B, n, Hq, value.shape[-1])          # v's head dim
    return torch.index_put(out, (p.qb, p.qi), o)


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


# ------------------------------------------------------------------------------------------ the mask function
def _rule(mask_function) -> tuple[bool, int | None] | None:
    """(causal, window) of a transformers mask function hk can run, or None: causal_mask_function,
    bidirectional_mask_function, and and_masks(sliding_window_overlay(w), causal_mask_function) (what
    sliding_window_causal_mask_function returns), recognised by their code objects, never guessed."""
    from transformers import masking_utils as mu
    if mask_function is mu.causal_mask_function:
        return True, None
    if mask_function is mu.bidirectional_mask_function:
        return False, None
    code = getattr(mask_function, "__code__", None)
    if code is not None and code is mu.and_masks(mu.causal_mask_function).__code__:
        parts = inspect.getclosurevars(mask_function).nonlocals.get("mask_functions", ())
        windows = [f for f in parts if getattr(f, "__code__", None) is mu.sliding_window_overlay(1).__code__]
        rest = [f for f in parts if f not in windows]
        if len(windows) == 1 and rest == [mu.causal_mask_function]:
            w = inspect.getclosurevars(windows[0]).nonlocals.get("sliding_window")
            if isinstance(w, int) and not isinstance(w, bool) and w >= 1:
                return True, w
    return None


def _packed(mask_function, batch: int, n: int) -> tuple[tuple[bool, int | None] | None, Padded | None]:
    """Packed sequences (several per row, found by transformers in position ids that restart): the mask function
    is and_masks(remap_positions_for_packed_sequence(rule, position_ids), packed_sequence_mask_function(ids)).
    Each sequence's positions are consecutive, so its rule holds on packed indices: the rows flattened and one
    varlen sequence per run of ids. Returns (rule, Padded) or (None, None)."""
    from transformers import masking_utils as mu
    code = getattr(mask_function, "__code__", None)
    if code is None or code is not mu.and_masks(mu.causal_mask_function).__code__ or not (
            hasattr(mu, "remap_positions_for_packed_sequence") and hasattr(mu, "packed_sequence_mask_function")):
        return None, None
    parts = inspect.getclosurevars(mask_function).nonlocals.get("mask_functions", ())
    remap_code = mu.remap_positions_for_packed_sequence(mu.causal_mask_function, None).__code__
    ids_code = mu.packed_sequence_mask_function(None).__code__
    if len(parts) != 2 or getattr(parts[0], "__code__", None) is not remap_code or \
            getattr(parts[1], "__code__", None) is not ids_code:
        return None, None
    inner = inspect.getclosurevars(parts[0]).nonlocals.get("mask_function")
    ids = inspect.getclosurevars(parts[1]).nonlocals.get("packed_sequence_mask")
    rule = None if inner is None else _rule(inner)
    if rule is None or not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (batch, n):
        return None, None
    # a global sequence number per token: runs of equal ids in a row, rows one after another
    starts = torch.ones(batch, n, dtype=torch.bool, device=ids.device)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    seq = starts.flatten().cumsum(0) - 1
    lengths = torch.bincount(seq)
    cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    b = torch.arange(batch, device=ids.device).repeat_interleave(n)
    i = torch.arange(n, device=ids.device).repeat(batch)
    longest = int(lengths.max())
    return rule, Padded(b, i, b, i, cu, cu, longest, longest, True)


def hk_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
            mask_function=None, attention_mask: torch.Tensor | None = None, device="cpu", **kwargs) -> HkMask:
    """transformers' mask-interface contract (sdpa_mask's arguments), returning an HkMask instead of a dense mask."""
    from transformers.masking_utils import causal_mask_function
    mask_function = causal_mask_function if mask_function is None else mask_function
    q_offset = int(q_offset)                         # a static cache passes a tensor
    base = dict(batch=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset)
    rule, packed = _rule(mask_function), None
    if rule is None and attention_mask is None and q_offset == kv_offset == 0 and q_length == kv_length:
        rule, packed = _packed(mask_function, batch_size, q_length)
    if rule is None:
        return HkMask(**base, refusal=(
            "hk attention cannot express this mask: transformers asked for a mask rule other than causal, "
            "bidirectional or causal with a sliding window, alone or on packed sequences (chunked attention, block "
            "or custom and/or overlays, packed sequences with padding or a cache); use attn_implementation='sdpa' "
            "for it"))
    causal, window = rule
    if packed is not None:
        return HkMask(**base, causal=causal, window=window, keys=kv_length, padded=packed)
    if causal:
        # keys past the last query's position are hidden; the queries must be key positions (bottom-right)
        keys = min(kv_length, q_offset + q_length - kv_offset)
        if q_offset < kv_offset or keys < q_length:
            return HkMask(**base, causal=causal, window=window, refusal=(
                f"hk attention: queries at positions {q_offset}..{q_offset + q_length - 1} are not the last keys "
                f"of positions {kv_offset}..{kv_offset + kv_length - 1}: not a bottom-right causal mask"))
    else:
        keys = kv_length
    padded = None
    if attention_mask is not None:
        valid = attention_mask.to(device=device, dtype=torch.bool)
        if valid.dim() != 2 or valid.shape[0] != batch_size:
            return HkMask(**base, causal=causal, window=window, refusal=(
                f"hk attention takes a 2-D [batch, length] padding mask, got {tuple(valid.shape)}"))
        end = kv_offset + kv_length
        if valid.shape[1] < end:                     # as transformers pads it: positions past the mask are hidden
            valid = torch.nn.functional.pad(valid, (0, end - valid.shape[1]))
        kvalid = valid[:, kv_offset:kv_offset + keys]
        if not bool(kvalid.all()):
            # causal: the queries are valid tokens or pad rows (0); bidirectional: every query row is computed
            qvalid = valid[:, q_offset:q_offset + q_length] if causal else \
                torch.ones(batch_size, q_length, dtype=torch.bool, device=valid.device)
            padded = _padded(qvalid, kvalid)
    return HkMask(**base, causal=causal, window=window, keys=keys, padded=padded)


def _padded(qvalid: torch.Tensor, kvalid: torch.Tensor) -> Padded:
    """The Padded of bool [B, N] valid queries and [B, keys] valid keys."""
    qb, qi = qvalid.nonzero(as_tuple=True)            # row-major: sequence by sequence, positions ascending
    kb, kj = kvalid.nonzero(as_tuple=True)
    nq, nk = qvalid.sum(1), kvalid.sum(1)
    zero = torch.zeros(1, dtype=torch.int32, device=kvalid.device)
    cu_q = torch.cat([zero, nq.cumsum(0).to(torch.int32)])
    cu_k = torch.cat([zero, nk.cumsum(0).to(torch.int32)])
    # consecutive valid keys: the last valid position minus the first + 1 is the count (no pads between them)
    pos = torch.arange(kvalid.shape[1], device=kvalid.device)
    first = torch.where(kvalid, pos, kvalid.shape[1]).min(1).values
    last = torch.where(kvalid, pos, -1).max(1).values
    contiguous = bool(((nk == 0) | (last - first + 1 == nk)).all())
    return Padded(qb, qi, kb, kj, cu_q, cu_k, int(nq.max()), int(nk.max()), contiguous)


def register(name: str = NAME) -> str:
    """Register hk attention and hk's mask function under `name` in transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, hk_attention_forward)
    AttentionMaskInterface.register(name, hk_mask)
    return name
