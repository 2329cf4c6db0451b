"""What one update does with its schedule and metrics: the learning rate advances once per RL step (not per
optimizer step), actor/entropy is the sampling policy's, token-weighted over the batch, and a critic step
with a non-finite gradient is skipped and counted as the actor's is."""

from __future__ import annotations

import copy

import pytest
import torch
from test_micro_batches import _rollout_with_varied_lengths

from lucidrl.algos import agg_loss
from lucidrl.batch import Batch
from lucidrl.config.schema import ActorConfig, CriticConfig, OptimConfig
from lucidrl.workers.training.actor import ActorWorker
from lucidrl.workers.training.critic import CriticWorker, load_value_model
from lucidrl.workers.training.optim import NonFiniteLossError


@pytest.fixture(scope="module")
def rollout(kk_data, tiny_model, tiny_tokenizer):
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    out.set("old_log_probs", out["rollout_log_probs"])
    torch.manual_seed(0)
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])
    return model, out


@pytest.mark.slow
def test_warm_up_counts_rl_steps_and_actor_lr_is_the_rate_the_update_used(rollout):
    model, out = rollout
    # 16 samples, mini-batches of 2 prompts x 4 samples, 2 epochs: 4 optimizer steps per update
    cfg = ActorConfig(optim=OptimConfig(lr=1e-2, warmup_steps=4), ppo_mini_batch_size=2, ppo_epochs=2)
    actor = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
    lrs = []
    for _ in range(5):
        lrs.append(actor.update(out)["actor/lr"])
        assert actor.optimizer.param_groups[0]["lr"] == pytest.approx(min(1.0, (len(lrs) + 1) / 4) * 1e-2)
    # before: the schedule stepped per optimizer step, so all of the warm-up passed within the first RL
    # step, and actor/lr reported the next step's rate
    assert lrs == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2])


@pytest.mark.slow
def test_actor_entropy_is_the_sampling_policys_token_mean_over_the_batch(rollout):
    model, out = rollout
    model = copy.deepcopy(model)
    with torch.no_grad():  # a random model's entropy is ln(vocab) everywhere: make it vary by token
        model.get_output_embeddings().weight.mul_(8.0)
    # length-sorted micro-batches of 4 samples hold 29 to 42 tokens: an unweighted mean of their means
    # (the metric before) is not the token mean
    cfg = ActorConfig(optim=OptimConfig(lr=1e-1), ppo_mini_batch_size=4, ppo_micro_batch_size=4)
    actor = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
    old = actor.compute_log_prob(out)
    out = out.select(torch.arange(len(out)))
    out.set("old_log_probs", old["old_log_probs"])
    expected = float(agg_loss(old["entropy"], out["response_mask"], "token-mean"))
    means = [float(agg_loss(old["entropy"][i : i + 4], out["response_mask"][i : i + 4], "token-mean"))
             for i in range(0, 16, 4)]  # fmt: skip
    assert max(means) - min(means) > 0.05 * expected  # so that the weighting matters
    # on-policy (no old-log-prob pass): from the update's own forwards, before its optimizer step
    assert actor.update(out)["actor/entropy"] == pytest.approx(expected, rel=1e-5)
    # where the old-log-prob pass ran, its entropy, though the update moved the weights (lr 0.1)
    fresh = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
    with_pass = out.select(torch.arange(len(out)))
    with_pass.update(old)
    assert fresh.update(with_pass)["actor/entropy"] == pytest.approx(expected, rel=1e-5)
    assert float(agg_loss(actor.compute_log_prob(out)["entropy"], out["response_mask"], "token-mean")) != (
        pytest.approx(expected, rel=1e-3)
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_other_loss_modes_also_log_entropy_and_kl_per_token(rollout, mode):
    """verl's actor/entropy and actor/kl_loss are aggregated as the loss is (under seq-mean-token-sum a
    sum per sequence); collapse detection's thresholds are per token, so the token means are logged
    beside them (from a review: 100 tokens of 0.02 nats read 2.0, and the entropy sign never fired)."""
    model, out = rollout
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    cfg = ActorConfig(optim=OptimConfig(lr=1e-1), ppo_mini_batch_size=4, ppo_micro_batch_size=4,
                      loss_agg_mode=mode, use_kl_loss=True)  # fmt: skip
    width = out["response_mask"].shape[1]  # seq-mean-token-sum-norm's constant
    actor = ActorWorker(
        copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4, response_length=width
    )
    old = actor.compute_log_prob(out)
    mask = out["response_mask"]
    batch = out.select(torch.arange(len(out)))
    batch.set("old_log_probs", old["old_log_probs"])
    # a reference a little off the policy, so that the KL varies by token
    batch.set(
        "ref_log_probs", (old["old_log_probs"] - 0.1 * torch.rand_like(mask, dtype=torch.float32)) * mask
    )
    expected = float(agg_loss(old["entropy"], mask, "token-mean"))
    m = actor.update(batch)  # on-policy: the entropy from the update's own forwards
    assert m["actor/entropy_token_mean"] == pytest.approx(expected, rel=1e-5)
    assert m["actor/entropy"] != pytest.approx(expected, rel=1e-2)  # the loss's aggregate: another unit
    assert 0 < m["actor/kl_loss_token_mean"] < 0.1 and m["actor/kl_loss"] != pytest.approx(
        m["actor/kl_loss_token_mean"], rel=1e-2
    )
    batch.update(old)  # with the old-log-prob pass's entropy
    fresh = ActorWorker(
        copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4, response_length=width
    )
    assert fresh.update(batch)["actor/entropy_token_mean"] == pytest.approx(expected, rel=1e-5)
    token_mean = ActorWorker(
        copy.deepcopy(model), ActorConfig(ppo_mini_batch_size=4), temperature=1.0, samples_per_prompt=4
    )
    assert "actor/entropy_token_mean" not in token_mean.update(batch)  # under token-mean it is actor/entropy


@pytest.mark.slow
def test_a_critic_step_with_a_non_finite_gradient_is_skipped_and_counted(rollout, tiny_model):
    _, out = rollout
    cfg = CriticConfig(optim=OptimConfig(lr=1e-3))
    critic = CriticWorker(
        load_value_model(str(tiny_model["path"])), cfg, mini_batch_prompts=2, samples_per_prompt=4
    )
    batch = out.select(torch.arange(len(out)))
    batch.update(critic.compute_values(batch))
    returns = torch.randn(batch["response_mask"].shape) * batch["response_mask"]
    returns[0, 0] = float("nan")  # in the first of two mini-batches only
    batch.set("returns", returns)
    before = {n: p.detach().clone() for n, p in critic.model.named_parameters()}
    metrics = critic.update(batch)
    assert metrics["critic/nonfinite_skipped"] == 1.0 and critic.nonfinite_skipped == 1
    assert all(torch.isfinite(p).all() for p in critic.model.parameters())
    assert any(not p.equal(before[n]) for n, p in critic.model.named_parameters())  # the second step ran
    batch.set("returns", torch.full_like(returns, float("nan")))
    with pytest.raises(NonFiniteLossError, match="all 2 critic optimizer steps"):
        critic.update(batch)


def _without(batch, key):
    return Batch(
        tensors={k: v for k, v in batch.tensors.items() if k != key},
        non_tensors=dict(batch.non_tensors),
        meta=dict(batch.meta),
    )


@pytest.mark.slow
def test_on_policy_update_takes_the_old_log_probs_from_its_own_forward(rollout):
    """One epoch of one mini-batch: no old-log-prob pass, old = the update's log-probs, detached (verl's
    dp_actor on-policy path). Same optimizer step as with the pass, and the rollout gap still measured."""
    model, out = rollout
    cfg = ActorConfig(optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=4)
    with_pass = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
    passed = out.select(torch.arange(len(out)))
    passed.update(with_pass.compute_log_prob(passed))
    m_pass = with_pass.update(passed)
    own = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
    bare = _without(out, "old_log_probs")
    assert "old_log_probs" not in bare and "rollout_log_probs" in bare
    m_own = own.update(bare)
    # the same gradient (compared before AdamW, which turns a 1e-9 gradient's rounding into a full step)
    pairs = zip(with_pass.model.named_parameters(), own.model.named_parameters(), strict=True)
    for (name, a), (_, b) in pairs:
        assert a.grad is not None and torch.allclose(a.grad, b.grad, atol=1e-7, rtol=1e-4), name
    assert m_own["actor/pg_clipfrac"] == 0.0 and m_own["actor/ppo_kl"] == 0.0
    assert m_own["actor/pg_loss"] == pytest.approx(m_pass["actor/pg_loss"], abs=1e-5)
    # what the trainer reports from the pass (metrics.step_metrics), measured in the update instead
    mask = passed["response_mask"].bool()
    gap = (passed["rollout_log_probs"] - passed["old_log_probs"]).abs()[mask]
    assert m_own["rollout/logprob_diff_max"] == pytest.approx(gap.max().item(), abs=1e-6)
    assert m_own["rollout/logprob_diff_mean"] == pytest.approx(gap.mean().item(), abs=1e-6)
    assert "rollout/logprob_diff_max" not in m_pass  # with the pass, the trainer reports it


def test_an_update_without_old_log_probs_must_be_on_policy(rollout):
    model, out = rollout
    bare = _without(out, "old_log_probs")
    for cfg in (
        ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size=4),  # two mini-batches
        ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size=4, ppo_epochs=2),
    ):
        actor = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
        with pytest.raises(RuntimeError, match="only one epoch of one mini-batch is on-policy"):
            actor.update(bare)


def test_the_old_reuse_key_names_its_replacement():
    from lucidrl.config import ConfigError, load_config

    with pytest.raises(
        ConfigError, match=r"'actor.reuse_rollout_log_probs' .* is gone: write actor.on_policy_skip"
    ):
        load_config(None, ["model.path=/m", "data.train_files=[/t]", "actor.reuse_rollout_log_probs=false"])
