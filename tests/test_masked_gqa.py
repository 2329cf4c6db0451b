"""Grouped-query attention under a padding mask without repeat_kv's copies on the CPU
(precision.masked_gqa): the same log-probs, gradients and samples, and the switch put back."""

from __future__ import annotations

import os

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa

from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model
from lucidrl.models.precision import FORCE_GQA, compute_context, masked_gqa
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.training.forward import response_log_probs
from tests.test_micro_batches import _rollout_with_varied_lengths


@pytest.fixture
def kv_copies(monkeypatch):
    """How many times transformers copied key/value heads (repeat_kv with more than one copy)."""
    calls = []
    real = sdpa.repeat_kv

    def spy(hidden_states, n_rep):
        if n_rep > 1:
            calls.append(n_rep)
        return real(hidden_states, n_rep)

    monkeypatch.setattr(sdpa, "repeat_kv", spy)
    monkeypatch.delenv(FORCE_GQA, raising=False)
    return calls


def _log_probs_and_grads(model, batch, share_prompt):
    model.zero_grad(set_to_none=True)
    with compute_context(model, None):
        lp, _ = response_log_probs(
            model, batch, temperature=1.0, with_entropy=False, share_prompt=share_prompt
        )
    (lp * batch["response_mask"]).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("share_prompt", [False, True])
def test_training_forwards_attend_without_copies_and_compute_the_same(
    kk_data, tiny_model, tiny_tokenizer, kv_copies, monkeypatch, share_prompt
):
    model, batch = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # a GQA model
    assert batch["prompt_mask"].min() == 0  # left padding: the forward has a mask
    kv_copies.clear()
    lp, grads = _log_probs_and_grads(model, batch, share_prompt)
    assert kv_copies == []  # no repeat_kv in any layer
    assert FORCE_GQA not in os.environ  # put back after the forward

    monkeypatch.setenv(FORCE_GQA, "0")  # the user's value wins: transformers copies the heads
    lp_copied, grads_copied = _log_probs_and_grads(model, batch, share_prompt)
    assert len(kv_copies) == 2 * model.config.num_hidden_layers * (2 if share_prompt else 1)
    assert os.environ[FORCE_GQA] == "0"
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(lp[mask], lp_copied[mask], rtol=0, atol=1e-5)
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_copied[name], rtol=1e-4, atol=1e-6, msg=name)


def test_decoding_prefills_without_copies_and_samples_the_same(
    kk_data, tiny_model, tiny_tokenizer, kv_copies, monkeypatch
):
    model = load_model(tiny_model["path"])
    samples, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=2048)
    prompts = collate(samples[:4], tiny_tokenizer.pad_token_id)

    def sample():
        torch.manual_seed(3)
        return HFRollout(model, tiny_tokenizer).generate(prompts, SamplingParams(n=2, max_new_tokens=12))

    out = sample()
    assert kv_copies == []
    monkeypatch.setenv(FORCE_GQA, "0")
    copied = sample()
    assert len(kv_copies) == 2 * model.config.num_hidden_layers  # the prefill's, once per layer
    assert torch.equal(out["responses"], copied["responses"])
    torch.testing.assert_close(out["rollout_log_probs"], copied["rollout_log_probs"], rtol=0, atol=1e-5)


def test_the_switch_is_put_back_when_the_forward_raises(monkeypatch):
    monkeypatch.delenv(FORCE_GQA, raising=False)
    with pytest.raises(RuntimeError, match="boom"), masked_gqa():
        assert os.environ[FORCE_GQA] == "1"
        raise RuntimeError("boom")
    assert FORCE_GQA not in os.environ
