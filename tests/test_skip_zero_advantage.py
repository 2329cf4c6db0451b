"""actor.skip_zero_advantage: samples whose advantages are all 0 (GRPO's tied groups) are left out of the
update's forwards, and the update is the same: the same weights after it, the same loss and gradient norm."""

from __future__ import annotations

import copy

import pytest
import torch

from lucidrl import algos
from lucidrl.config import load_config
from lucidrl.config.errors import ConfigError
from lucidrl.config.schema import ActorConfig, OptimConfig
from lucidrl.workers.training.actor import ActorWorker, per_token_log_probs
from tests.test_micro_batches import _rollout_with_varied_lengths


def _batch_with_tied_groups(kk_data, tiny_model, tok, tied=(1, 3)):
    """4 prompts x 4 samples of varied lengths; the groups in `tied` have advantage 0 everywhere."""
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tok)
    mask = out["response_mask"]
    torch.manual_seed(2)
    adv = torch.randn(len(out), 1)
    for g in tied:
        adv[4 * g : 4 * g + 4] = 0.0
    out.set("advantages", adv.expand_as(mask) * mask)
    return model, out


def _update(model, batches, skip, forwarded, **actor):
    """The weights and each update's metrics after one update on each of `batches`; `forwarded` gets the
    sample count of every micro-batch the updates ran forward and backward."""
    settings = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 4, **actor}
    cfg = ActorConfig(optim=OptimConfig(lr=1e-2, warmup_steps=0), skip_zero_advantage=skip, **settings)
    worker = ActorWorker(copy.deepcopy(model).train(), cfg, temperature=1.0, samples_per_prompt=4)
    micro_step = worker._micro_step

    def counted(ub, *args, **kwargs):
        forwarded.append(len(ub))
        return micro_step(ub, *args, **kwargs)

    worker._micro_step = counted
    metrics = [worker.update(b) for b in batches]
    return {n: p.detach().clone() for n, p in worker.model.named_parameters()}, metrics


def _max_diff(a, b):
    return max((a[n] - b[n]).abs().max().item() for n in a)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_leaving_out_tied_groups_changes_nothing_but_the_rows_forwarded(
    kk_data, tiny_model, tiny_tokenizer, mode
):
    model, out = _batch_with_tied_groups(kk_data, tiny_model, tiny_tokenizer)
    # the rollout engine's log-probs 0.25 off the update's own: the gap reads 0.25 wherever it is measured
    out.set("rollout_log_probs", (per_token_log_probs(model.eval(), out, 16, 1.0, True, True, False)[0] - 0.25)
            * out["response_mask"])  # fmt: skip
    full_rows, kept_rows = [], []
    full, (m_full,) = _update(model, [out], False, full_rows, loss_agg_mode=mode)
    kept, (m_kept,) = _update(model, [out], True, kept_rows, loss_agg_mode=mode)
    # on-policy (no old_log_probs): one forward per micro-batch of the samples with a gradient
    assert sum(full_rows) == 16 and sum(kept_rows) == 8
    moved = _max_diff(full, {n: p for n, p in model.named_parameters()})
    assert moved > 1e-3  # the update did something
    assert _max_diff(full, kept) < 1e-6 * max(1.0, moved), _max_diff(full, kept)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl"):
        assert abs(m_full[key] - m_kept[key]) < 1e-6, (key, m_full[key], m_kept[key])
    assert m_kept["actor/zero_advantage_skipped"] == 0.5 and "actor/zero_advantage_skipped" not in m_full
    # the rollout gap is a mean over the tokens it saw, not diluted by the ones left out
    assert m_full["rollout/logprob_diff_mean"] == pytest.approx(0.25, abs=1e-4)
    assert m_kept["rollout/logprob_diff_mean"] == pytest.approx(0.25, abs=1e-4)


def test_off_policy_epochs_are_the_same_too(kk_data, tiny_model, tiny_tokenizer):
    """With old log-probs from another policy the ratios clip, and a zero advantage still zeroes the term."""
    model, out = _batch_with_tied_groups(kk_data, tiny_model, tiny_tokenizer, tied=(0, 2))
    with torch.no_grad():
        lp, ent = per_token_log_probs(model.eval(), out, 16, 1.0, True, True, False)
    torch.manual_seed(1)
    mask = out["response_mask"]
    out.set("old_log_probs", (lp + 0.3 * torch.randn_like(lp)) * mask)
    out.set("entropy", ent * mask)
    rows_full, rows_kept = [], []
    full, (m_full,) = _update(model, [out], False, rows_full, ppo_epochs=2, ppo_mini_batch_size=2)
    kept, (m_kept,) = _update(model, [out], True, rows_kept, ppo_epochs=2, ppo_mini_batch_size=2)
    assert sum(rows_kept) == sum(rows_full) // 2
    assert m_full["actor/pg_clipfrac"] > 0.01
    assert _max_diff(full, kept) < 1e-6, _max_diff(full, kept)
    assert m_full["actor/entropy"] == m_kept["actor/entropy"]  # from the old-log-prob pass: every sample


def test_an_update_with_nothing_to_learn_still_steps_adamw(kk_data, tiny_model, tiny_tokenizer):
    """A batch where every group tied: no forward at all, and AdamW counts the step as with a zero gradient
    (its bias correction then matches the update that ran the forwards, on the next batch too)."""
    model, out = _batch_with_tied_groups(kk_data, tiny_model, tiny_tokenizer)
    all_tied = copy.deepcopy(out)
    all_tied.set("advantages", torch.zeros_like(out["advantages"]))
    rows_full, rows_kept = [], []
    full, m_full = _update(model, [all_tied, out], False, rows_full)
    kept, m_kept = _update(model, [all_tied, out], True, rows_kept)
    assert sum(rows_kept) == 8 and sum(rows_full) == 32
    assert _max_diff(full, kept) < 1e-6, _max_diff(full, kept)
    assert m_kept[0]["actor/zero_advantage_skipped"] == 1.0 and m_kept[0]["actor/grad_norm"] == 0.0
    assert "actor/entropy" not in m_kept[0] and "actor/entropy" in m_full[0]
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl"):  # as the full update logs them
        assert m_kept[0][key] == m_full[0][key] == 0.0, key


def _row_gradients(fn, mode, rows, old, adv, mask):
    """d loss / d log_prob of `rows` alone, the aggregation's mean over sequences undone."""
    lp = (old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1)))[rows]
    lp.requires_grad_(True)
    loss, _ = fn(old_log_prob=old[rows], log_prob=lp, advantages=adv[rows], response_mask=mask[rows],
                 loss_agg_mode=mode)  # fmt: skip
    if mode != "token-sum":
        loss = loss * (mask[rows].sum(-1) > 0).sum()
    loss.backward()
    return lp.grad


def test_every_inert_policy_loss_gives_a_zero_advantage_sample_no_gradient_and_leaves_the_rest():
    """What registering a loss zero_advantage_inert claims, checked on each: off-policy ratios, rows of
    both kinds in one batch, and the kept rows alone give the same per-row gradients."""
    torch.manual_seed(0)
    bs, T = 6, 5
    mask = (torch.arange(T)[None] < torch.tensor([5, 3, 4, 2, 5, 1])[:, None]).float()
    adv = torch.randn(bs, 1).expand(bs, T).clone()
    adv[[1, 4]] = 0.0
    old = torch.randn(bs, T) * 0.1 - 1.0
    inert = [n for n in algos.list_policy_losses() if algos.policy_loss_zero_advantage_inert(n)]
    assert {"vanilla", "gspo", "cispo", "reinforce", "gpg", "sapo"} <= set(inert)
    for name in inert:
        fn = algos.get_policy_loss(name)
        mode = algos.policy_loss_agg_mode(name) or "token-sum"  # a sum: each row's own term
        every = _row_gradients(fn, mode, list(range(bs)), old, adv, mask)
        assert every[[1, 4]].abs().max() == 0, name
        assert every[[0, 2]].abs().max() > 1e-3, name
        kept = [0, 2, 3, 5]
        assert torch.allclose(every[kept], _row_gradients(fn, mode, kept, old, adv, mask), atol=1e-6), name


BASE = [
    "model.path=unused",
    "data.train_files=[unused.parquet]",
    "rollout.n=4",
    "actor.skip_zero_advantage=true",
]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("actor.use_kl_loss=true", "actor.use_kl_loss=true"),
        ("actor.entropy_coeff=0.01", "actor.entropy_coeff=0.01"),
        ("actor.policy_loss=clip_cov", "actor.policy_loss=clip_cov"),
    ],
)
def test_a_loss_that_reads_zero_advantage_samples_refuses_the_skip(override, named):
    with pytest.raises(ConfigError, match="actor.skip_zero_advantage=true") as e:
        load_config(None, [*BASE, override])
    assert named in str(e.value)
    if "policy_loss" in override:  # and which losses it works with
        assert "sapo, vanilla)" in str(e.value)
    load_config(None, BASE)  # vanilla, no KL, no entropy bonus: accepted


def test_the_skip_loads_with_an_actor_on_several_ranks():
    """Data-parallel ranks run matching forwards (tests/test_data_parallel_cuts.py)."""
    two_ranks = ["trainer.backend=ray", "placement.pools={global: {nodes: 1, devices_per_node: 2}}"]
    assert load_config(None, [*BASE, *two_ranks]).actor.skip_zero_advantage
