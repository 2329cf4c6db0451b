"""actor.head_chunk_tokens: the LM head, log-prob and entropy on chunks of response tokens, never the
whole (samples, response length, vocabulary) logits; same numbers and gradients as the whole-batch path."""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
import torch

from lucidrl.config import ConfigError, config_from_dict
from lucidrl.config.schema import ActorConfig, OptimConfig
from lucidrl.workers.training.actor import ActorWorker, ReferenceWorker, per_token_log_probs
from lucidrl.workers.training.forward import check_chunkable_head, response_log_probs
from tests.test_micro_batches import _rollout_with_varied_lengths


@pytest.mark.slow
@pytest.mark.parametrize("share_prompt", [True, False])
def test_chunked_log_probs_and_entropy_equal_the_whole_batch_path(
    kk_data, tiny_model, tiny_tokenizer, share_prompt
):
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    model.eval()
    mask = out["response_mask"].bool()
    with torch.no_grad():
        lp, ent = response_log_probs(
            model, out, temperature=0.7, with_entropy=True, share_prompt=share_prompt
        )
        for chunk in (1, 7, 10_000):
            lp_c, ent_c = response_log_probs(
                model,
                out,
                temperature=0.7,
                with_entropy=True,
                share_prompt=share_prompt,
                head_chunk_tokens=chunk,
            )
            assert (lp - lp_c)[mask].abs().max() < 1e-5 and (ent - ent_c)[mask].abs().max() < 1e-5
            # outside the response mask nothing is computed: 0, not a log-prob of padding
            assert (lp_c[~mask] == 0).all() and (ent_c[~mask] == 0).all()


def test_the_head_never_sees_more_than_a_chunk_of_tokens(kk_data, tiny_model, tiny_tokenizer, monkeypatch):
    from lucidrl.algos import head_logprob

    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    check_chunkable_head(model)  # its one probe forward of six tokens (whole), done once per model
    seen, chunk_logits = [], head_logprob._ChunkLogits.__call__

    def spy(self, h):
        seen.append(h.shape)
        return chunk_logits(self, h)

    monkeypatch.setattr(head_logprob._ChunkLogits, "__call__", spy)
    handle = model.get_output_embeddings().register_forward_hook(lambda m, args, o: seen.append("module"))
    try:
        with torch.no_grad():
            per_token_log_probs(model.eval(), out, 16, 1.0, True, True, True, head_chunk_tokens=7)
    finally:
        handle.remove()
    assert seen and all(shape != "module" and len(shape) == 2 and shape[0] <= 7 for shape in seen), seen
    assert sum(shape[0] for shape in seen) == int(out["response_mask"].sum())  # response tokens only, once


@pytest.mark.slow
@pytest.mark.parametrize("entropy_coeff", [0.0, 0.5])
def test_chunked_update_has_the_whole_batch_gradient(kk_data, tiny_model, tiny_tokenizer, entropy_coeff):
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    with torch.no_grad():
        lp, _ = per_token_log_probs(model.eval(), out, 16, 1.0, False, True, True)
    out.set("old_log_probs", lp * out["response_mask"])
    torch.manual_seed(1)
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])

    def gradient(chunk):
        cfg = ActorConfig(optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=16,
                          entropy_coeff=entropy_coeff, head_chunk_tokens=chunk)  # fmt: skip
        actor = ActorWorker(copy.deepcopy(model).train(), cfg, temperature=0.8, samples_per_prompt=4)
        metrics = defaultdict(float)
        metrics["actor/entropy"] = float(actor._micro_step(out, 1.0, metrics)[0])
        grads = {n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None}
        return grads, metrics

    whole, m_whole = gradient(0)
    chunked, m_chunked = gradient(5)
    assert whole.keys() == chunked.keys() and "model.embed_tokens.weight" in whole  # tied head: reached
    size = max(g.abs().max().item() for g in whole.values())
    assert size > 1e-3
    assert max((whole[n] - chunked[n]).abs().max().item() for n in whole) < 1e-5 * max(1.0, size)
    for key in ("actor/pg_loss", "actor/entropy"):
        assert abs(m_whole[key] - m_chunked[key]) < 1e-5


def test_models_the_chunked_head_cannot_serve_are_refused(tiny_model):
    from lucidrl.models import load_model

    model = load_model(tiny_model["path"])
    wrapped = torch.nn.Sequential(model)  # stands in for DDP: no get_decoder / get_output_embeddings
    with pytest.raises(ValueError, match=r"needs a plain HuggingFace causal LM.*actor.head_chunk_tokens=0"):
        ReferenceWorker(wrapped, micro_batch_size=4, temperature=1.0, head_chunk_tokens=8)
    from torch.distributed.fsdp import FSDPModule

    sharded = copy.deepcopy(model)  # fully_shard swaps in such a class; no process group needed here
    sharded.__class__ = type(f"FSDP{type(model).__name__}", (FSDPModule, type(model)), {})
    with pytest.raises(ValueError, match=r"not supported with FSDP2 yet .*FSDPQwen2ForCausalLM"):
        ReferenceWorker(sharded, micro_batch_size=4, temperature=1.0, head_chunk_tokens=8)
    capped = copy.deepcopy(model)
    capped.config.final_logit_softcapping = 30.0  # Gemma 2's: logits are not just the head's output
    with pytest.raises(ValueError, match=r"final_logit_softcapping in its config"):
        ActorWorker(capped, ActorConfig(head_chunk_tokens=8), temperature=1.0, samples_per_prompt=1)
    with pytest.raises(ConfigError, match=r"'actor.head_chunk_tokens' .* must be >= 0 .* got -1"):
        config_from_dict({"actor": {"head_chunk_tokens": -1}})
    # a transform in the forward that no config name says (Falcon-H1's lm_head_multiplier was missing
    # from the list: 0.16 nats off): found by comparing the two on a few tokens
    cls = type(model)

    class Scaled(cls):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.25
            return out

    scaled = load_model(tiny_model["path"])
    scaled.__class__ = Scaled
    with pytest.raises(
        ValueError, match=r"differ by up to [0-9.e-]+: a transform in its forward.*head_chunk_tokens=0"
    ):
        ActorWorker(scaled, ActorConfig(head_chunk_tokens=8), temperature=1.0, samples_per_prompt=1)
    ActorWorker(
        load_model(tiny_model["path"]),
        ActorConfig(head_chunk_tokens=8),
        temperature=1.0,
        samples_per_prompt=1,
    )


@pytest.mark.slow
def test_no_logits_are_kept_for_the_backward_pass(kk_data, tiny_model, tiny_tokenizer):
    """With gradients, each chunk is checkpointed: autograd keeps its input, never its (tokens, V) logits."""
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    model.train()
    vocab = model.get_output_embeddings().weight.shape[0]

    def kept_logit_elements(chunk):
        kept = []

        def pack(t):
            if t.ndim >= 2 and t.shape[-1] == vocab and t.shape[-2] != model.config.hidden_size:
                kept.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, ent = response_log_probs(
                model, out, temperature=1.0, with_entropy=True, entropy_grad=True, head_chunk_tokens=chunk
            )
        (lp.sum() + ent.sum()).backward()
        return sum(kept)

    assert kept_logit_elements(0) > 0  # the whole-batch path keeps (samples, R, V) logits and softmax
    assert kept_logit_elements(7) == 0
