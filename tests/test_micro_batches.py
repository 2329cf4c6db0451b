"""Length-sorted, padding-trimmed micro-batches: same log-probs, and the same token-mean gradient however the
mini-batch is cut into micro-batches."""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
import torch

from lucidrl.batch import Batch
from lucidrl.config.schema import ActorConfig, OptimConfig
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.training.actor import ActorWorker, per_token_log_probs
from lucidrl.workers.training.micro_batches import (
    length_sorted_micro_batches,
    loss_weights,
    scatter_rows,
    token_budget_micro_batches,
    trim_response_padding,
)


def _rollout_with_varied_lengths(kk_data, tiny_model, tok, n_prompts=4, n=4, width=20):
    model = load_model(tiny_model["path"])
    samples, _ = load_prompts([kk_data["train"]], tok, max_prompt_length=2048)
    torch.manual_seed(0)
    out = HFRollout(model, tok).generate(
        collate(samples[:n_prompts], tok.pad_token_id), SamplingParams(n=n, max_new_tokens=width)
    )
    # a random model rarely ends early: cut responses to varied lengths, as eos would
    lengths = torch.tensor([3, 20, 7, 12, 5, 9, 2, 16, 11, 4, 6, 8, 13, 10, 1, 15])[: len(out)]
    mask = (torch.arange(out["responses"].shape[1])[None, :] < lengths[:, None]).float()
    out.set("response_mask", mask)
    out.set("responses", torch.where(mask.bool(), out["responses"], tok.pad_token_id))
    out.set("rollout_log_probs", out["rollout_log_probs"] * mask)
    return model, out


def test_trim_cuts_response_columns_only():
    b = Batch(
        tensors={
            "prompts": torch.ones(2, 5, dtype=torch.long),
            "prompt_mask": torch.ones(2, 5),
            "responses": torch.ones(2, 5, dtype=torch.long),
            "response_mask": torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0.0]]),
            "advantages": torch.ones(2, 5),
        }
    )
    t = trim_response_padding(b)
    assert t["prompts"].shape == (2, 5) and t["prompt_mask"].shape == (2, 5)
    assert t["responses"].shape == (2, 3) and t["advantages"].shape == (2, 3)


def _gapped_batch() -> Batch:
    """Two multi-turn samples: sample 0's loss mask ends at column 1 and a tool reply (a gap) follows
    up to column 5; sample 1 is 3 tokens, all its own. Rollout correction rejected sample 1's token 0."""
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    return Batch(
        tensors={
            "prompts": torch.ones(2, 2, dtype=torch.long),
            "prompt_mask": torch.ones(2, 2, dtype=torch.long),
            "responses": torch.arange(16).view(2, 8),
            "response_mask": response_mask,
            "response_attention_mask": attention,
            "loss_mask": torch.tensor([[1, 1, 0, 0, 0, 1, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0]]),
        },
        non_tensors={"uid": ["a", "b"]},
    )


def test_micro_batches_run_on_real_tokens_and_losses_count_the_loss_mask():
    b = _gapped_batch()
    # trimmed to the longest conversation (6), not the last loss token (5) nor the loss-mask count (4)
    assert trim_response_padding(b)["responses"].shape[1] == 6
    # sorted by real length: b (3) before a (6), whatever the loss masks hold
    assert [idx.tolist() for idx, _ in length_sorted_micro_batches(b, 1)] == [[1], [0]]
    # a budget fits a's prompt and all 6 of its tokens, not 4
    with pytest.raises(ValueError, match="one sample is 8 tokens"):
        token_budget_micro_batches(b, 7, length_sorted=True)
    assert [len(mb) for _, mb in token_budget_micro_batches(b, 8, length_sorted=True)] == [1, 1]
    # token-mean weights: loss tokens, a's 3 and b's 2 of the 5
    ubs = [b.select(torch.tensor([0])), b.select(torch.tensor([1]))]
    assert loss_weights(b, ubs, "token-mean") == pytest.approx([3 / 5, 2 / 5])


def test_a_sample_left_out_of_the_loss_is_still_attended_and_measured():
    from lucidrl.batch import response_attention, response_lengths
    from lucidrl.trainer.rewards import leave_out_failed

    b = Batch(
        tensors={
            "response_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
            "reward_failed": torch.tensor([False, True]),
        }
    )
    out = leave_out_failed(b)
    assert out["response_mask"].tolist()[1] == [0, 0, 0, 0]
    assert response_attention(out).tolist()[1] == [1, 1, 0, 0]
    assert response_lengths(out).tolist() == [3, 2]


def test_groups_stay_together_sorted_by_their_longest_response(kk_data, tiny_model, tiny_tokenizer):
    _, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    chunks = length_sorted_micro_batches(out, 8)
    seen = torch.cat([idx for idx, _ in chunks]).tolist()
    assert sorted(seen) == list(range(16))
    # group maxima: p0 20, p1 16, p2 11, p3 15 -> order p2, p3, p1, p0
    assert [out["uid"][i] for i in seen[::4]] == ["p2", "p3", "p1", "p0"]
    assert [mb["responses"].shape[1] for _, mb in chunks] == [15, 20]


@pytest.mark.slow
def test_sorted_log_probs_and_update_match_plain_micro_batches(kk_data, tiny_model, tiny_tokenizer):
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    with torch.no_grad():
        plain = per_token_log_probs(model.eval(), out, 5, 1.0, True, True, False)
        sorted_ = per_token_log_probs(model.eval(), out, 5, 1.0, True, True, True)
    mask = out["response_mask"].bool()
    assert (plain[0] - sorted_[0])[mask].abs().max() < 1e-5
    assert (plain[1] - sorted_[1])[mask].abs().max() < 1e-5

    out.set("old_log_probs", plain[0] * out["response_mask"])
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])

    def gradient(micro, length_sorted, by_samples=False, max_tokens=None):
        cfg = ActorConfig(
            optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=micro,
            length_sorted_micro_batches=length_sorted,
            use_dynamic_bsz=max_tokens is not None, ppo_max_token_len_per_gpu=max_tokens or 1,
        )  # fmt: skip
        actor = ActorWorker(copy.deepcopy(model).train(), cfg, temperature=1.0, samples_per_prompt=4)
        chunks = actor._micro_batches(out)  # what update() runs, minus the optimizer step
        weights = [len(ub) / len(out) for ub in chunks] if by_samples else actor._loss_weights(out, chunks)
        metrics = defaultdict(float)
        for ub, w in zip(chunks, weights, strict=True):
            actor._micro_step(ub, w, metrics)
        widths = [ub["responses"].shape[1] for ub in chunks]
        seen.append(dict(metrics))
        return {n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None}, widths

    seen = []  # each call's metrics, weighted as its loss

    def diff(a, b):
        return max((a[n] - b[n]).abs().max().item() for n in a)

    whole, _ = gradient(16, False)  # one micro-batch: the token mean over the whole mini-batch
    size = max(g.abs().max().item() for g in whole.values())
    assert size > 1e-3
    plain4, widths = gradient(4, False)
    assert widths == [20] * 4
    sorted4, widths = gradient(4, True)
    assert widths == [11, 15, 16, 20]  # each micro-batch cut to its own longest response
    # token-mean is one mean over every token of the mini-batch, however it is cut into micro-batches
    for grads in (plain4, sorted4, gradient(8, True)[0], gradient(2, False)[0]):
        assert diff(whole, grads) < 1e-6 * max(1.0, size), diff(whole, grads)
    # and so are the losses reported (a plain mean of the micro-batches' means, as before, was not)
    assert len(seen) == 5 and seen[0]["actor/pg_loss"] != 0
    for m in seen[1:]:
        for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl"):
            assert abs(m[key] - seen[0][key]) < 1e-6, (key, m[key], seen[0][key])
    # weighting micro-batches by their sample count (verl's) is not: micro-batches hold unequal tokens
    assert diff(whole, gradient(4, False, by_samples=True)[0]) > 1e-4 * size
    # token-budget micro-batches of unequal sample counts: the same gradient too
    prompt = out["prompts"].shape[1]
    budget, widths = gradient(16, True, max_tokens=8 * (prompt + 15))
    assert widths == [15, 16, 20]
    assert diff(whole, budget) < 1e-6 * max(1.0, size), diff(whole, budget)


@pytest.mark.slow
def test_sum_norm_divides_by_the_max_response_length_however_the_batch_is_cut_or_padded(
    kk_data, tiny_model, tiny_tokenizer
):
    """Dr.GRPO's seq-mean-token-sum-norm: a mean over sequences of token sums / data.max_response_length.
    Before, the divisor was the batch's own trimmed width and uneven micro-batches changed sample weights."""
    from lucidrl.workers.training.forward import response_log_probs

    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    with torch.no_grad():
        lp, _ = per_token_log_probs(model.eval(), out, 16, 1.0, False, True, False)
    out.set("old_log_probs", lp * out["response_mask"])
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])

    def gradient(batch, micro, length_sorted, max_tokens=None):
        cfg = ActorConfig(
            optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=micro,
            length_sorted_micro_batches=length_sorted, loss_agg_mode="seq-mean-token-sum-norm",
            use_dynamic_bsz=max_tokens is not None, ppo_max_token_len_per_gpu=max_tokens or 1,
        )  # fmt: skip
        actor = ActorWorker(copy.deepcopy(model).train(), cfg, temperature=1.0, samples_per_prompt=4,
                            response_length=32)  # fmt: skip
        chunks = actor._micro_batches(batch)
        metrics = defaultdict(float)
        for ub, w in zip(chunks, actor._loss_weights(batch, chunks), strict=True):
            actor._micro_step(ub, w, metrics)
        sizes = [len(ub) for ub in chunks]
        return {n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None}, sizes

    def diff(a, b):
        return max((a[n] - b[n]).abs().max().item() for n in a)

    # the hand-written objective: per-sample token sums of the PPO loss, / 32, averaged over the 16 samples
    reference = copy.deepcopy(model).train()
    new_lp, _ = response_log_probs(reference, out, temperature=1.0, with_entropy=False)
    ratio = torch.exp(new_lp - out["old_log_probs"])
    mask = out["response_mask"]
    per_token = torch.maximum(-out["advantages"] * ratio, -out["advantages"] * ratio.clamp(0.8, 1.2))
    ((per_token * mask).sum(-1) / 32).mean().backward()
    hand = {n: p.grad.clone() for n, p in reference.named_parameters() if p.grad is not None}
    size = max(g.abs().max().item() for g in hand.values())

    whole, _ = gradient(out, 16, False)
    assert diff(hand, whole) < 1e-6 * max(1.0, size), diff(hand, whole)
    for grads in (gradient(out, 4, True)[0], gradient(out, 2, False)[0]):
        assert diff(whole, grads) < 1e-6 * max(1.0, size), diff(whole, grads)
    prompt = out["prompts"].shape[1]
    budget, sizes = gradient(out, 16, True, max_tokens=8 * (prompt + 15))
    assert len(set(sizes)) > 1  # micro-batches of unequal sample counts
    assert diff(whole, budget) < 1e-6 * max(1.0, size), diff(whole, budget)
    # the same batch padded wider than its longest response (another step's rollout width): same gradient
    width = out["responses"].shape[1]
    wide = Batch(
        tensors={
            k: torch.nn.functional.pad(
                v, (0, 6), value=tiny_tokenizer.pad_token_id if k == "responses" else 0
            )
            if k != "prompts" and k != "prompt_mask" and v.ndim == 2 and v.shape[1] == width
            else v
            for k, v in out.tensors.items()
        },
        non_tensors=out.non_tensors,
    )
    assert wide["responses"].shape[1] == width + 6
    assert diff(whole, gradient(wide, 16, False)[0]) < 1e-6 * max(1.0, size)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_seq_mean_gradients_do_not_depend_on_where_an_empty_response_lands(
    kk_data, tiny_model, tiny_tokenizer, mode
):
    """agg_loss leaves empty responses (a server or vLLM can return none) out of a micro-batch's mean;
    the micro-batch weights counted every row, so a micro-batch holding one weighed more than its
    sequences and the gradient changed with the micro-batching (from two reviews: 0.11 relative)."""
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    with torch.no_grad():
        lp, _ = per_token_log_probs(model.eval(), out, 16, 1.0, False, True, False)
    out.set("old_log_probs", lp * out["response_mask"])
    torch.manual_seed(3)
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])
    for i in (0, 5):  # two empty responses
        for key in ("response_mask", "old_log_probs", "advantages"):
            out.tensors[key][i] = 0
        out.tensors["responses"][i] = tiny_tokenizer.pad_token_id

    def gradient(micro, length_sorted):
        cfg = ActorConfig(optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=micro,
                          length_sorted_micro_batches=length_sorted, loss_agg_mode=mode,
                          share_prompt_forward=False)  # fmt: skip
        actor = ActorWorker(copy.deepcopy(model).train(), cfg, temperature=1.0, samples_per_prompt=4,
                            response_length=32)  # fmt: skip
        chunks = actor._micro_batches(out)
        metrics = defaultdict(float)
        for ub, w in zip(chunks, actor._loss_weights(out, chunks), strict=True):
            actor._micro_step(ub, w, metrics)
        return torch.cat([p.grad.flatten() for p in actor.model.parameters() if p.grad is not None]), metrics

    whole, m_whole = gradient(16, False)
    assert whole.abs().max() > 1e-3
    for micro, length_sorted in ((2, False), (4, True), (1, False)):
        grads, m = gradient(micro, length_sorted)
        assert ((grads - whole).norm() / whole.norm()).item() < 1e-5, (micro, length_sorted)
        assert m["actor/pg_loss"] == pytest.approx(m_whole["actor/pg_loss"], abs=1e-6)


def _tokens(mb):
    return len(mb) * (mb["prompts"].shape[1] + mb["responses"].shape[1])


@pytest.mark.slow
def test_token_budget_packs_short_groups_together_and_splits_only_what_cannot_fit(
    kk_data, tiny_model, tiny_tokenizer
):
    _, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    prompt = out["prompts"].shape[1]
    # group maxima: p0 20, p1 16, p2 11, p3 15. 8 rows of width 15 fit: p2 and p3 share a micro-batch,
    # p1 (16) and p0 (20) do not fit with anything else
    chunks = token_budget_micro_batches(out, 8 * (prompt + 15), length_sorted=True)
    assert [sorted({out["uid"][i] for i in idx.tolist()}) for idx, _ in chunks] == [
        ["p2", "p3"],
        ["p1"],
        ["p0"],
    ]
    assert [len(mb) for _, mb in chunks] == [8, 4, 4]
    for budget in (prompt + 20, 3 * (prompt + 20), 5 * (prompt + 13), 10**6):
        chunks = token_budget_micro_batches(out, budget, length_sorted=True)
        assert sorted(torch.cat([idx for idx, _ in chunks]).tolist()) == list(range(16))
        assert all(_tokens(mb) <= budget for _, mb in chunks), budget
        for idx, mb in chunks:  # trimmed to the micro-batch's own longest response
            assert mb["responses"].shape[1] == int(out["response_mask"][idx].sum(-1).max())
        # a group that fits the budget on its own is never split between micro-batches
        for g in ("p0", "p1", "p2", "p3"):
            rows = [i for i, u in enumerate(out["uid"]) if u == g]
            if 4 * (prompt + int(out["response_mask"][rows].sum(-1).max())) <= budget:
                assert sum(any(out["uid"][i] == g for i in idx.tolist()) for idx, _ in chunks) == 1
    assert len(token_budget_micro_batches(out, 10**6, length_sorted=True)) == 1
    # without length sorting: batch order, every row at the batch's full response width
    plain = token_budget_micro_batches(out, 6 * (prompt + 20), length_sorted=False)
    assert [len(mb) for _, mb in plain] == [4, 4, 4, 4]  # two groups of 4 would be 8 rows > 6
    assert torch.cat([idx for idx, _ in plain]).tolist() == list(range(16))
    with pytest.raises(ValueError, match=f"one sample is {prompt + 20} tokens"):
        token_budget_micro_batches(out, prompt + 19, length_sorted=True)


@pytest.mark.slow
def test_token_budget_log_probs_match_fixed_micro_batches(kk_data, tiny_model, tiny_tokenizer):
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    prompt = out["prompts"].shape[1]
    with torch.no_grad():
        fixed = per_token_log_probs(model.eval(), out, 4, 1.0, True, True, True)
        budget = per_token_log_probs(
            model.eval(), out, 4, 1.0, True, True, True, max_tokens=3 * (prompt + 20)
        )
    mask = out["response_mask"].bool()
    assert (fixed[0] - budget[0])[mask].abs().max() < 1e-5
    assert (fixed[1] - budget[1])[mask].abs().max() < 1e-5


def test_scatter_rows_restores_order_and_width():
    parts = [
        (torch.tensor([2, 0]), torch.tensor([[1.0], [2.0]])),
        (torch.tensor([1]), torch.tensor([[3.0, 4.0]])),
    ]
    assert scatter_rows(parts, 3, 3).tolist() == [[2, 0, 0], [3, 4, 0], [1, 0, 0]]


@pytest.mark.slow
def test_entropy_is_a_graph_free_metric_unless_it_is_in_the_loss(kk_data, tiny_model, tiny_tokenizer):
    from lucidrl.workers.training.forward import response_log_probs

    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    model.train()
    lp, ent = response_log_probs(model, out, temperature=1.0, with_entropy=True, entropy_grad=False)
    lp2, ent2 = response_log_probs(model, out, temperature=1.0, with_entropy=True, entropy_grad=True)
    assert lp.requires_grad and not ent.requires_grad and ent2.requires_grad
    assert torch.equal(ent, ent2.detach()) and torch.equal(lp.detach(), lp2.detach())

    out.set("old_log_probs", lp.detach() * out["response_mask"])
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])
    grads = []
    for coeff in (0.0, 0.5):  # with a coefficient the entropy bonus must reach the gradient
        cfg = ActorConfig(optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=16,
                          entropy_coeff=coeff)  # fmt: skip
        actor = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
        metrics = defaultdict(float)
        entropy, per_token = actor._micro_step(out, 1.0, metrics)
        assert per_token is None  # token-mean: actor/entropy is the token mean already
        assert entropy > 0 and not entropy.requires_grad
        grads.append(torch.cat([p.grad.flatten() for p in actor.model.parameters() if p.grad is not None]))
    assert (grads[0] - grads[1]).abs().max() > 1e-4


@pytest.mark.slow
def test_critic_token_budget_values_and_gradient_match_one_micro_batch(kk_data, tiny_model, tiny_tokenizer):
    from lucidrl.algos import compute_value_loss
    from lucidrl.config.schema import CriticConfig
    from lucidrl.workers.training.critic import CriticWorker, load_value_model, response_values
    from lucidrl.workers.training.micro_batches import loss_weights

    _, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    value_model = load_value_model(tiny_model["path"])
    torch.nn.init.normal_(value_model.score.weight, std=0.1)  # a head with an opinion, so values differ
    prompt = out["prompts"].shape[1]

    def critic(**kw):
        cfg = CriticConfig(optim=OptimConfig(lr=1e-2), **kw)
        return CriticWorker(copy.deepcopy(value_model), cfg, mini_batch_prompts=4, samples_per_prompt=4)

    budget = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 3 * (prompt + 20)}
    whole = critic(ppo_micro_batch_size=16).compute_values(out)["values"]
    cut = critic(**budget).compute_values(out)["values"]
    assert whole.abs().max() > 1e-3 and (whole - cut).abs().max() < 1e-5
    out.set("values", whole)
    out.set("returns", torch.randn(out["response_mask"].shape) * out["response_mask"])

    def gradient(worker):  # what update() runs for one mini-batch, minus the optimizer step
        ubs = [ub for _, ub in worker._micro_batches(out)]
        for ub, w in zip(ubs, loss_weights(out, ubs, "token-mean"), strict=True):
            loss, _ = compute_value_loss(
                response_values(worker.model, ub),
                ub["returns"],
                ub["values"],
                ub["response_mask"],
                0.5,
                "token-mean",
            )
            (loss * w).backward()
        return len(ubs), torch.cat(
            [p.grad.flatten() for p in worker.model.parameters() if p.grad is not None]
        )

    n1, g1 = gradient(critic(ppo_micro_batch_size=16))
    n2, g2 = gradient(critic(**budget))
    n3, g3 = gradient(critic(ppo_micro_batch_size=4))
    assert n1 == 1 and n2 > 4 and n3 == 4 and g1.abs().max() > 1e-4
    assert (g1 - g2).abs().max() < 1e-6 * max(1.0, g1.abs().max().item())
    assert (g1 - g3).abs().max() < 1e-6 * max(1.0, g1.abs().max().item())


@pytest.mark.slow
def test_token_mean_metrics_do_not_move_with_the_micro_batching_under_seq_mean(
    kk_data, tiny_model, tiny_tokenizer
):
    """Clip fractions and ppo_kl are token means whatever loss_agg_mode is: weighted by sample share
    (the seq-mean loss weights) they moved with ppo_micro_batch_size, as micro-batches hold unequal tokens."""
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    with torch.no_grad():
        lp, _ = per_token_log_probs(model.eval(), out, 16, 1.0, True, True, False)
    torch.manual_seed(1)
    mask = out["response_mask"]
    out.set("old_log_probs", (lp + 0.3 * torch.randn_like(lp)) * mask)  # off-policy: ratios clip
    out.set("advantages", torch.randn(len(out), 1).expand_as(mask) * mask)

    def update(micro):
        cfg = ActorConfig(optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=micro,
                          loss_agg_mode="seq-mean-token-mean", length_sorted_micro_batches=False)  # fmt: skip
        return ActorWorker(copy.deepcopy(model).train(), cfg, temperature=1.0, samples_per_prompt=4).update(
            out
        )

    whole, cut = update(16), update(4)
    assert whole["actor/pg_clipfrac"] > 0.05 and abs(whole["actor/ppo_kl"]) > 1e-3
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_loss"):
        assert abs(whole[key] - cut[key]) < 1e-6, (key, whole[key], cut[key])
