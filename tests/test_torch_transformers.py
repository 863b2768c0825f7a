"""hk attention in a randomly initialised transformers Llama (GQA, no weights downloaded): the logits of its
SDPA version, the same greedy generation through the KV cache, and training steps through autograd."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hk_portable.nn.huggingface import register  # noqa: E402


def _llama(attn_implementation):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.config._attn_implementation = attn_implementation
    return model.eval()


def _pair():
    register()
    hk_model, sdpa_model = _llama("hk"), _llama("sdpa")
    sdpa_model.load_state_dict(hk_model.state_dict())
    return hk_model, sdpa_model


def _ids():
    return torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(1))   # no pad, bos or eos id


def test_llama_logits_match_sdpa():
    hk_model, sdpa_model = _pair()
    with torch.no_grad():
        ours, theirs = hk_model(_ids()).logits.float(), sdpa_model(_ids()).logits.float()
    assert ((ours - theirs).abs().max() / theirs.abs().max()) < 2 ** -5


def test_llama_greedy_generation_matches_sdpa(monkeypatch):
    from hk_portable.nn import huggingface
    hk_model, sdpa_model = _pair()
    shapes, attention = [], huggingface.F.attention
    monkeypatch.setattr(huggingface.F, "attention",
                        lambda q, k, v, **kw: shapes.append((q.shape[2], k.shape[2])) or attention(q, k, v, **kw))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ours, theirs = hk_model.generate(_ids(), **kw), sdpa_model.generate(_ids(), **kw)
    assert torch.equal(ours, theirs)
    assert (12, 12) in shapes and (1, 17) in shapes          # prefill, and the last decode step on the cache


def test_llama_trains_through_autograd():
    hk_model, _ = _pair()
    hk_model.train()
    opt = torch.optim.AdamW(hk_model.parameters(), lr=3e-3)
    ids = _ids()
    losses = []
    for _ in range(4):
        loss = hk_model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_explicit_masks_are_refused():
    hk_model, _ = _pair()
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0                                    # left padding: a mask hk attention cannot express
    with pytest.raises(NotImplementedError, match="explicit mask"):
        hk_model(_ids(), attention_mask=mask)
