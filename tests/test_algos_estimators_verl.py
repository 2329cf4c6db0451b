"""Hand-computed checks of the estimators verl 0.9.1 added beyond the classic family: GPG, GDPO, the
optimal token baselines (position-aligned and multi-turn), and the vectorized aliases."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import outcome_rewards  # noqa: E402

from lucidrl.algos import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
    compute_rloo_outcome_advantage,
    get_advantage_estimator,
)


def _whiten(xs: list[float]) -> list[float]:
    """(x - mean) / sqrt(unbiased var + 1e-8) on a plain list: masked_whiten's formula."""
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


# ---------------------------------------------------------------------------------------------- GPG


def test_gpg_is_group_centred_score_times_batch_share_of_nonzero_scores():
    # scores [1, 0, 0, 1 | 2, 0], groups a (4) and b (2): 3 non-zero scores of 6 -> alpha = 6 / 3 = 2
    #   a: mean .5 -> 2 * [.5, -.5, -.5, .5] = [1, -1, -1, 1];  b: mean 1 -> 2 * [1, -1] = [2, -2]
    rewards, mask = outcome_rewards([1.0, 0.0, 0.0, 1.0, 2.0, 0.0], [3, 1, 2, 3, 2, 1])
    adv, ret = compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "a", "a", "b", "b"])
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0, 2.0, -2.0]).unsqueeze(-1) * mask
    assert torch.allclose(adv, expected, atol=1e-6) and torch.equal(adv, ret)
    assert not torch.signbit(adv[mask == 0]).any()


def test_gpg_tied_group_is_exactly_zero_and_single_sample_keeps_its_score():
    # scores [.7, .7 | 1, 0 | 3]: 4 non-zero of 5 -> alpha 5/4; the tied group c gets exactly 0,
    # d: mean .5 -> 5/4 * [.5, -.5]; the single sample e: baseline 0 -> 5/4 * 3
    rewards, mask = outcome_rewards([0.7, 0.7, 1.0, 0.0, 3.0], [1, 1, 1, 1, 1])
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, ["c", "c", "d", "d", "e"])
    assert torch.equal(adv[:2], torch.zeros(2, 4))
    assert torch.allclose(adv[2:, 0], torch.tensor([0.625, -0.625, 3.75]), atol=1e-6)


# --------------------------------------------------------------------------------------------- GDPO


def test_gdpo_normalises_each_component_in_its_group_then_whitens_the_batch():
    # one group of 4 single-token responses, two components, weights [1, .5]:
    #   k1 = [1, 0, 0, 1]: mean .5, unbiased std sqrt(1/3) -> A1 = +-.5 / (sqrt(1/3) + 1e-6)
    #   k2 = [0, 0, 0, 4]: mean 1, unbiased std 2           -> A2 = [-1, -1, -1, 3] / (2 + 1e-6)
    comps = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 4.0]])
    mask = torch.ones(4, 1)
    adv, ret = compute_gdpo_outcome_advantage(
        torch.zeros(4, 1), mask, ["g"] * 4, reward_components=comps, reward_weights=[1.0, 0.5]
    )
    a1 = [s * 0.5 / (math.sqrt(1 / 3) + 1e-6) for s in (1, -1, -1, 1)]
    a2 = [d / (2 + 1e-6) for d in (-1, -1, -1, 3)]
    expected = _whiten([x + 0.5 * y for x, y in zip(a1, a2, strict=True)])
    assert torch.allclose(adv[:, 0], torch.tensor(expected), atol=1e-5) and torch.equal(adv, ret)


def test_gdpo_gives_each_component_the_same_say_whatever_its_scale():
    # GRPO on the total lets the wide component decide; GDPO does not: scaling one component by 100
    # leaves its advantages as they were (up to the 1e-6 in the std's denominator)
    comps = torch.tensor([[1.0, 0.0], [0.0, 0.3], [1.0, 0.1], [0.0, 0.2], [1.0, 0.0], [0.0, 0.5]])
    rewards, mask = outcome_rewards([0.0] * 6, [2, 3, 1, 4, 2, 3])
    index = ["a", "a", "a", "b", "b", "b"]
    small, _ = compute_gdpo_outcome_advantage(rewards, mask, index, reward_components=comps)
    wide, _ = compute_gdpo_outcome_advantage(
        rewards, mask, index, reward_components=comps * torch.tensor([1.0, 100.0])
    )
    assert torch.allclose(small, wide, atol=1e-4)
    summed, _ = compute_grpo_outcome_advantage(
        torch.zeros_like(rewards).index_put_((torch.arange(6), torch.zeros(6, dtype=torch.long)), comps.sum(-1)),
        mask, index,
    )  # fmt: skip
    assert not torch.allclose(summed, small, atol=1e-2)


def test_gdpo_without_components_is_grpo_on_the_score_then_whitened():
    rewards, mask = outcome_rewards([1.0, 0.0, 0.0, 1.0, 2.0, 0.5], [3, 1, 2, 3, 2, 1])
    index = ["a", "a", "a", "a", "b", "b"]
    adv, _ = compute_gdpo_outcome_advantage(rewards, mask, index)
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    tokens = grpo[mask.bool()].tolist()
    assert torch.allclose(adv[mask.bool()], torch.tensor(_whiten(tokens)), atol=1e-5)
    with pytest.raises(ValueError, match="2 reward component.*1 weight"):
        compute_gdpo_outcome_advantage(
            rewards, mask, index, reward_components=torch.ones(6, 2), reward_weights=[1.0]
        )


# ------------------------------------------------------------------------------- optimal token baseline


def _otb_group():
    """Two samples of one prompt, three positions (see test_otb_hand_computed for the numbers)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # pi = .5 and sum pi^2 = .5 in row 0 -> w = 1 - 1 + .5 = .5; pi = .25, sum pi^2 = .25 -> w = .75
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]]))
    spsq = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]])
    return rewards, mask, ["g", "g"], old, spsq


def test_otb_hand_computed():
    # G0 = [1, 1, 1], G1 = [0, 0, -]; W0 = [.5, 1, 1.5], W1 = [.75, 1.5, -]
    #   B_0 = (1 * .5) / (.5 + .75) = .4;  B_1 = 1 / 2.5 = .4;  B_2 = 1.5 / 1.5 = 1
    # zero tail: row 0 is the unique longest (3 > 2), its baseline from position 2 on is 0
    rewards, mask, index, old, spsq = _otb_group()
    adv, ret = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    assert torch.allclose(adv, torch.tensor([[0.6, 0.6, 1.0], [-0.4, -0.4, 0.0]]), atol=1e-6)
    assert torch.equal(ret, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq, handle_zero_tail=False)
    assert adv[0, 2].item() == pytest.approx(0.0, abs=1e-6)  # 1 - B_2


def test_otb_scales_weights_by_squared_importance_weights():
    # rho = 2 on row 1 -> its w = .75 * 4 = 3, W1 = [3, 6]: B_0 = .5 / 3.5 = 1/7, B_1 = 1 / 7
    rewards, mask, index, old, spsq = _otb_group()
    rho = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq, rho)
    assert torch.allclose(adv, torch.tensor([[6 / 7, 6 / 7, 1.0], [-1 / 7, -1 / 7, 0.0]]), atol=1e-6)


def test_otb_single_sample_group_has_no_baseline():
    rewards, mask, _, old, spsq = _otb_group()
    adv, ret = compute_optimal_token_baseline_advantage(rewards, mask, ["a", "b"], old, spsq)
    assert torch.equal(adv, ret)


def _multi_turn_group():
    """Row 0 has a tool token at position 1 (masked); row 1 ends one token early."""
    rewards = torch.tensor([[0.0, 5.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0]])
    old = torch.log(torch.tensor([[0.5] * 4, [0.25] * 4]))
    spsq = torch.tensor([[0.5] * 4, [0.25] * 4])
    return rewards, mask, ["g", "g"], old, spsq


def test_tir_otb_aligns_samples_by_their_kth_model_token():
    # compacted: G0 = [1, 1, 1] (the masked reward 5 is ignored), W0 = [.5, 1, 1.5];
    #            G1 = [0, 0, 0], W1 = [.75, 1.5, 2.25]  ->  B_k = W0 / (W0 + W1) = .4 for every k
    # both have 3 model tokens (no zero tail); advantages go back to the positions they came from
    rewards, mask, index, old, spsq = _multi_turn_group()
    adv, ret = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    assert torch.allclose(adv, torch.tensor([[0.6, 0.0, 0.6, 0.6], [-0.4, -0.4, -0.4, 0.0]]), atol=1e-6)
    assert torch.equal(ret, torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))


def test_otb_aligns_by_position_where_tir_aligns_by_model_token():
    # by position: t1 only row 1 is unmasked (row 0's tool token): B = 0; t2: W0 = 1, W1 = 2.25,
    # B = 1 / 3.25; t3 only row 0: B = 1.5 / 1.5 = 1 (equal lengths, so no zero tail)
    rewards, mask, index, old, spsq = _multi_turn_group()
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spsq)
    expected = torch.tensor([[0.6, 0.0, 1 - 1 / 3.25, 0.0], [-0.4, 0.0, -1 / 3.25, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_tir_otb_leaves_empty_responses_out_of_the_group():
    rewards, mask, _, old, spsq = _multi_turn_group()
    rewards = torch.cat([rewards, torch.zeros(1, 4)])
    mask = torch.cat([mask, torch.zeros(1, 4, dtype=mask.dtype)])
    old, spsq = torch.cat([old, old[:1]]), torch.cat([spsq, spsq[:1]])
    adv, _ = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, ["g"] * 3, old, spsq)
    assert torch.allclose(adv[:2], torch.tensor([[0.6, 0.0, 0.6, 0.6], [-0.4, -0.4, -0.4, 0.0]]), atol=1e-6)
    assert torch.equal(adv[2], torch.zeros(4))


# ------------------------------------------------------------------------------------------ aliases


def test_vectorized_names_are_the_same_functions():
    assert get_advantage_estimator("grpo_vectorized") is compute_grpo_outcome_advantage
    assert get_advantage_estimator("rloo_vectorized") is compute_rloo_outcome_advantage


# ------------------------------------------------------------------------------- sum of squared probs


def test_sum_pi_squared_from_logits_hand_computed():
    # logits [0, log 3] -> pi [1/4, 3/4] -> 1/16 + 9/16; at temperature 2: logits / 2 -> pi [1, sqrt 3] / (1 + sqrt 3)
    from lucidrl.algos.logprob import sum_pi_squared_from_logits

    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert sum_pi_squared_from_logits(logits).item() == pytest.approx(10 / 16, abs=1e-6)
    s3 = math.sqrt(3.0)
    assert sum_pi_squared_from_logits(logits, 2.0).item() == pytest.approx((1 + 3) / (1 + s3) ** 2, abs=1e-6)
    assert sum_pi_squared_from_logits(logits.bfloat16()).dtype == torch.float32


@pytest.mark.parametrize("head_chunk_tokens", [0, 7])
def test_the_log_prob_pass_gives_sum_pi_squared_of_the_models_distribution(
    kk_data, tiny_model, tiny_tokenizer, head_chunk_tokens
):
    from lucidrl.workers.training.actor import per_token_log_probs, per_token_log_probs_and_sum_pi_squared
    from lucidrl.workers.training.forward import sequence_inputs
    from tests.test_micro_batches import _rollout_with_varied_lengths

    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    model.eval()
    mask = out["response_mask"].bool()
    with torch.no_grad():
        lp, ent, spsq = per_token_log_probs_and_sum_pi_squared(
            model, out, 5, 0.7, True, True, head_chunk_tokens=head_chunk_tokens
        )
        lp_plain, ent_plain = per_token_log_probs(model, out, 16, 0.7, True, True, True)
        ids, attn, pos = sequence_inputs(out)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        probs = torch.softmax(logits[:, -out["responses"].shape[1] - 1 : -1].float() / 0.7, dim=-1)
    assert (spsq - probs.square().sum(-1))[mask].abs().max() < 1e-5
    assert (lp - lp_plain)[mask].abs().max() < 1e-5 and (ent - ent_plain)[mask].abs().max() < 1e-5
