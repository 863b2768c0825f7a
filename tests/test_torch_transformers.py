"""hk attention in randomly initialised transformers models (no weights downloaded): a GQA Llama (the logits of
its SDPA version, the same greedy generation through the KV cache, training steps through autograd) and a GQA
Qwen2 with a sliding-window layer (the same greedy tokens as SDPA with padding, batch 4, the prompt prefilled in
two chunks and a second chat turn on the same cache, dynamic and static caches; right padding; padded training's
gradients), packed sequences in the Llama, a padded BERT (bidirectional); what hk cannot express is refused."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hk_torch_models import (LLAMA_LOGITS_TOL, QWEN_WINDOW, chat, llama_greedy, llama_ids as _ids,  # noqa: E402
                             llama_logits_error, llama_pair as _pair, llama_train, padded_batch, qwen2_pair,
                             spy_hk_attention)


def test_llama_logits_match_sdpa():
    hk_model, sdpa_model = _pair()
    assert llama_logits_error(hk_model, sdpa_model, _ids()) < LLAMA_LOGITS_TOL


def test_llama_greedy_generation_matches_sdpa(monkeypatch):
    hk_model, sdpa_model = _pair()
    shapes = spy_hk_attention(monkeypatch)
    ours, theirs = llama_greedy(hk_model, _ids()), llama_greedy(sdpa_model, _ids())
    assert torch.equal(ours, theirs)
    # prefill, and the last decode step on the cache (through the split-KV kernel)
    assert (12, 12) in shapes and (1, 17, "decode") in shapes


def test_llama_trains_through_autograd():
    hk_model, _ = _pair()
    losses = llama_train(hk_model, _ids())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
def test_chunked_prefill_and_second_turn_match_sdpa(monkeypatch, padded):
    """Batch 4 (left padding or none), a full and a sliding-window layer: the prompt prefilled in two chunks,
    greedy tokens, a second turn on the same cache: the tokens SDPA gives."""
    hk_model, sdpa_model = qwen2_pair()
    ids, mask = padded_batch((12, 9, 5, 11) if padded else (12,) * 4)
    shapes = spy_hk_attention(monkeypatch)
    ours, theirs = chat(hk_model, ids, mask), chat(sdpa_model, ids, mask)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    _assert_chat_calls(shapes, padded)


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
def test_chat_on_a_static_cache_matches_sdpa(monkeypatch, padded):
    """The same chat on a StaticCache of 32 positions: the keys past the last query are hidden by the causal
    mask (sliced off, or left out of the varlen gather), the sliding layer's static window as transformers keeps it."""
    hk_model, sdpa_model = qwen2_pair()
    ids, mask = padded_batch((12, 9, 5, 11) if padded else (12,) * 4)
    shapes = spy_hk_attention(monkeypatch)
    ours, theirs = chat(hk_model, ids, mask, static=True), chat(sdpa_model, ids, mask, static=True)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    if padded:
        assert {(5, 32, "varlen", None), (6, 32, "varlen", None), (1, 32, "varlen", None)} <= set(shapes)
    else:                   # the static cache's 32 keys cut to the written ones
        assert {(5, 12), (6, 23), (1, 13, "decode"), (1, QWEN_WINDOW, "decode")} <= set(shapes)


def _assert_chat_calls(shapes, padded):
    # the second chunk (5 new tokens on 7 cached), the second turn (the last generated token and 5 more), decode
    full, turn = 12 + 6 + 5, QWEN_WINDOW - 1 + 6          # the sliding layer's cache keeps window - 1 keys
    if padded:              # on the valid tokens through varlen, the sliding layer with its window
        assert {(5, 12, "varlen", None), (5, 12, "varlen", QWEN_WINDOW), (6, full, "varlen", None),
                (1, 13, "varlen", None)} <= set(shapes)
        assert {(6, turn), (1, QWEN_WINDOW, "decode")} <= set(shapes)   # the pads left the window: none there
    else:                   # continuing the cache, bottom-right causal; decode through the split-KV kernel
        assert {(5, 12), (6, full), (6, turn), (1, 13, "decode"), (1, QWEN_WINDOW, "decode")} <= set(shapes)


def test_right_padding_logits_match_sdpa():
    hk_model, sdpa_model = qwen2_pair()
    ids, mask = padded_batch(side="right")
    with torch.no_grad():
        ours, theirs = hk_model(ids, attention_mask=mask).logits, sdpa_model(ids, attention_mask=mask).logits
    valid = mask.bool()     # pad rows: hk gives them 0, SDPA attends to valid keys; neither reaches a valid row
    err = float((ours[valid].float() - theirs[valid].float()).abs().max() / theirs[valid].float().abs().max())
    assert err < LLAMA_LOGITS_TOL


def test_continuation_after_right_padding_matches_sdpa():
    """Right padding, then 3 tokens on the cache: pads lie between each sequence's valid tokens; without a window
    varlen's per-sequence bottom-right causal mask is the model's (Llama: full attention only)."""
    from transformers import DynamicCache
    hk_model, sdpa_model = _pair()
    ids, mask = padded_batch(side="right")
    mask2 = torch.cat([mask, mask.new_ones(4, 3)], 1)
    logits = []
    for model in (hk_model, sdpa_model):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids, attention_mask=mask, past_key_values=cache)
            logits.append(model(ids[:, :3], attention_mask=mask2, past_key_values=cache).logits.float())
    ours, theirs = logits
    assert float((ours - theirs).abs().max() / theirs.abs().max()) < LLAMA_LOGITS_TOL


def test_packed_sequences_match_sdpa_and_run_alone():
    """Sequences packed in a row (position ids restarting, as for training): one varlen sequence per run."""
    hk_model, sdpa_model = _pair()
    ids = _ids()
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]])
    with torch.no_grad():
        ours = hk_model(ids, position_ids=positions, use_cache=False).logits.float()
        theirs = sdpa_model(ids, position_ids=positions, use_cache=False).logits.float()
        alone = hk_model(ids[:1, 5:], use_cache=False).logits.float()     # the second sequence of row 0 alone
    assert float((ours - theirs).abs().max() / theirs.abs().max()) < LLAMA_LOGITS_TOL
    assert float((ours[:1, 5:] - alone).abs().max() / alone.abs().max()) < LLAMA_LOGITS_TOL


def test_bidirectional_encoder_with_padding_matches_sdpa():
    """A random BERT (bidirectional mask): padding through varlen, every row computed as SDPA computes it."""
    from hk_portable.nn.huggingface import register
    register()
    config = transformers.BertConfig(vocab_size=96, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=192, max_position_embeddings=64)
    models = []
    for impl in ("hk", "sdpa"):
        torch.manual_seed(0)
        models.append(transformers.BertModel(config).to(torch.float16).eval())
        models[-1].config._attn_implementation = impl
    ids, mask = padded_batch(side="right")
    with torch.no_grad():
        ours, theirs = (m(ids, attention_mask=mask).last_hidden_state.float() for m in models)
    assert float((ours - theirs).abs().max() / theirs.abs().max()) < LLAMA_LOGITS_TOL


def test_padded_training_gradients_match_sdpa():
    """Padding in training goes through hk::attention_varlen and its backward (the sliding layer's window too)."""
    hk_model, sdpa_model = qwen2_pair()
    ids, mask = padded_batch()
    labels = ids.masked_fill(mask == 0, -100)
    for model in (hk_model, sdpa_model):
        model.train()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
    for (name, ours), theirs in zip(hk_model.named_parameters(), sdpa_model.parameters()):
        if "self_attn" in name:
            err = float((ours.grad.float() - theirs.grad.float()).abs().max() / theirs.grad.float().abs().max())
            assert err < LLAMA_LOGITS_TOL, name


def test_what_hk_cannot_express_is_refused():
    hk_model, _ = _pair()
    dense = torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()
    with pytest.raises(NotImplementedError, match="explicit mask tensor"):
        hk_model(_ids(), attention_mask=dense)                  # a 4-D mask passed in
    from transformers.masking_utils import create_causal_mask
    from hk_portable.nn.huggingface import hk_attention_forward
    x = torch.zeros(2, 12, 128, dtype=torch.bfloat16)                          # a custom overlay on the mask
    mask = create_causal_mask(hk_model.config, x, None, None, and_mask_function=lambda b, h, q, kv: kv != 5)
    q = torch.zeros(2, 2, 12, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="chunked attention"):
        hk_attention_forward(hk_model.model.layers[0].self_attn, q, q[:, :1], q[:, :1], mask)
    qwen, _ = qwen2_pair()
    ids, mask = padded_batch(side="right")                     # right padding, then a continuation: pads between
    from transformers import DynamicCache                     # valid tokens, and a window counting positions
    cache = DynamicCache(config=qwen.config)
    with torch.no_grad():
        qwen(ids, attention_mask=mask, past_key_values=cache)
        with pytest.raises(NotImplementedError, match="sliding window over a padded batch"):
            qwen(ids[:, :3], attention_mask=torch.cat([mask, mask.new_ones(4, 3)], 1), past_key_values=cache)


# ------------------------------------------------- Gemma 2's logit softcap and GPT-OSS's sinks (dense path)
def _gemma2(impl, softcap):
    """A random 2-layer Gemma 2 (a sliding and a full layer) in f16 whose query weights are scaled up so that the
    softcap changes the logits (random init keeps them far below the cap)."""
    config = transformers.Gemma2Config(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                       max_position_embeddings=64, sliding_window=8, attn_logit_softcapping=softcap,
                                       final_logit_softcapping=None, query_pre_attn_scalar=64)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).to(torch.float16)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
    model.config._attn_implementation = impl
    return model.eval()


def _gpt_oss(impl):
    """A random 2-layer GPT-OSS (sliding then full attention, 2 experts) in f16, sinks drawn large enough to
    matter."""
    config = transformers.GptOssConfig(vocab_size=96, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                       max_position_embeddings=64, sliding_window=8, num_local_experts=2,
                                       num_experts_per_tok=1, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).to(torch.float16)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0, 2)
    model.config._attn_implementation = impl
    return model.eval()


def _logits_error(a, b, ids) -> float:
    with torch.no_grad():
        la, lb = a(ids).logits.float(), b(ids).logits.float()
    return ((la - lb).abs().max() / lb.abs().max()).item()


def _same_weights(make, *args):
    from hk_portable.nn.huggingface import register
    register()
    ours, theirs = make("hk", *args), make("eager", *args)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


IDS20 = torch.randint(3, 96, (2, 20), generator=torch.Generator().manual_seed(1))


def test_gemma2_softcap_matches_eager_in_logits_and_greedy_tokens(monkeypatch):
    ours, theirs = _same_weights(_gemma2, 0.5)
    uncapped = _gemma2("eager", None)
    uncapped.load_state_dict(theirs.state_dict())
    assert _logits_error(uncapped, theirs, IDS20) > 0.05          # the cap changes the logits: the test can fail
    assert _logits_error(ours, theirs, IDS20) < 4e-3
    shapes = spy_hk_attention(monkeypatch)
    with torch.no_grad():
        assert torch.equal(ours.generate(IDS20, max_new_tokens=6, do_sample=False),
                           theirs.generate(IDS20, max_new_tokens=6, do_sample=False))
    # the dense kernel for the prompt, the split-KV kernel (with the softcap) for the decode steps
    assert (20, 20) in shapes and (1, 25, "decode") in shapes and not any("varlen" in s for s in shapes)


def test_gpt_oss_sinks_match_eager_with_their_gradient(monkeypatch):
    ours, theirs = _same_weights(_gpt_oss)
    assert _logits_error(ours, theirs, IDS20) < 4e-3
    shapes = spy_hk_attention(monkeypatch)
    with torch.no_grad():
        assert torch.equal(ours.generate(IDS20, max_new_tokens=6, do_sample=False),
                           theirs.generate(IDS20, max_new_tokens=6, do_sample=False))
    assert (1, 25, "decode") in shapes          # decode steps on the split-KV kernel, the sinks in it
    grads = []
    for model in (ours, theirs):
        model.train()
        model.zero_grad()
        model(IDS20, labels=IDS20).loss.backward()
        grads.append(torch.stack([layer.self_attn.sinks.grad.float() for layer in model.model.layers]))
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[0], grads[1], rtol=0.05, atol=0.02 * grads[1].abs().max().item())


# ------------------------------------------ DeepSeek V3's MLA: q/k and v of different head dims (64 and 32 here)
def _deepseek_v3(impl):
    """A random 2-layer DeepSeek V3 (a dense layer, then 4 routed experts) in f16: q/k head dim 32 + 32 (rope), v's
    32; transformers expands the latent KV cache and hands hk k and v of different head dims."""
    config = transformers.DeepseekV3Config(vocab_size=96, hidden_size=128, intermediate_size=128,
                                           moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=32,
                                           qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, n_routed_experts=4,
                                           num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                                           max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config).to(torch.float16)
    model.config._attn_implementation = impl
    return model.eval()


def test_deepseek_v3_mla_head_dims_match_sdpa_with_and_without_padding(monkeypatch):
    """Logits, greedy tokens (decode through the dense kernel: the KV-cache kernel takes one head dim) and a
    left-padded batch (varlen) with v's head dim half of q's: the tokens SDPA gives."""
    from hk_portable.nn.huggingface import register
    register()
    ours, theirs = _deepseek_v3("hk"), _deepseek_v3("sdpa")
    theirs.load_state_dict(ours.state_dict())
    calls = []
    real = torch.ops.hk.attention
    monkeypatch.setattr(torch.ops.hk, "attention", lambda q, k, v, *a, **kw: calls.append(
        (q.shape[-1], v.shape[-1])) or real(q, k, v, *a, **kw), raising=False)
    assert _logits_error(ours, theirs, IDS20) < 4e-3
    assert (64, 32) in calls
    mask = torch.ones_like(IDS20)
    mask[1, :7] = 0
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            assert torch.equal(ours.generate(IDS20, max_new_tokens=6, do_sample=False, pad_token_id=0, **kwargs),
                               theirs.generate(IDS20, max_new_tokens=6, do_sample=False, pad_token_id=0, **kwargs))


@pytest.mark.parametrize("model", ["gemma2", "gpt_oss"])
def test_softcap_and_sinks_over_a_padded_batch_match_eager(monkeypatch, model):
    """Batch 4 with left padding (hk::attention_varlen with softcap or sinks): the valid rows' logits and the greedy
    tokens eager gives, and a training step's gradients (GPT-OSS's sinks, Gemma 2's query projection through the
    softcap's derivative) within 5 % of eager's."""
    ours, theirs = _same_weights(_gemma2, 0.5) if model == "gemma2" else _same_weights(_gpt_oss)
    ids, mask = padded_batch((12, 9, 5, 11))
    shapes = spy_hk_attention(monkeypatch)
    with torch.no_grad():
        la, lb = (m(ids, attention_mask=mask).logits.float() for m in (ours, theirs))
        valid = mask.bool()
        assert ((la - lb)[valid].abs().max() / lb[valid].abs().max()).item() < 4e-3
        assert torch.equal(ours.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0),
                           theirs.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0))
    assert any("varlen" in s for s in shapes)
    grads = []
    for m in (ours, theirs):
        m.train()
        m.zero_grad()
        # the last pad row predicts the first valid token: its output is no model's to define (hk gives pad rows 0,
        # eager an average over masked keys), so that label is left out with the pads'
        first = (mask.cumsum(1) == 1) & (mask == 1)
        labels = ids.masked_fill((mask == 0) | first, -100)
        m(ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append(torch.stack([(layer.self_attn.sinks if model == "gpt_oss" else layer.self_attn.q_proj.weight)
                                  .grad.float() for layer in m.model.layers]))
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[0], grads[1], rtol=0.05, atol=0.02 * grads[1].abs().max().item())
