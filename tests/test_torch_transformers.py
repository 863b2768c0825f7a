"""hk attention in a randomly initialised transformers Llama (GQA, no weights downloaded): the logits of its
SDPA version, the same greedy generation through the KV cache, and training steps through autograd."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hk_torch_models import (LLAMA_LOGITS_TOL, llama_greedy, llama_ids as _ids,  # noqa: E402
                             llama_logits_error, llama_pair as _pair, llama_train, spy_hk_attention)


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


def test_explicit_masks_are_refused():
    hk_model, _ = _pair()
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0                                    # left padding: a mask hk attention cannot express
    with pytest.raises(NotImplementedError, match="explicit mask"):
        hk_model(_ids(), attention_mask=mask)
