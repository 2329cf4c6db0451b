"""Hand-computed checks of the RL math in lucidrl.algos."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import outcome_rewards  # noqa: E402

from lucidrl.algos import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_grpo_outcome_advantage,
    compute_policy_loss_vanilla,
    entropy_from_logits,
    get_advantage_estimator,
    get_policy_loss,
    kl_penalty,
    list_advantage_estimators,
    list_policy_losses,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    register_advantage_estimator,
)

EPS = 1e-6


# ---------------------------------------------------------------------------------------------- GRPO

# group a = samples 0,2,3,5 with scores 1,0,0,1: mean 0.5, unbiased std sqrt(1/3) = 0.57735
# group b = samples 1,4 with scores 3,1:          mean 2,   unbiased std sqrt(2)   = 1.41421
SCORES = [1.0, 3.0, 0.0, 0.0, 1.0, 1.0]
LENGTHS = [4, 2, 3, 1, 4, 2]
GROUPS_STR = ["a", "b", "a", "a", "b", "a"]
A_HI = 0.5 / (math.sqrt(1 / 3) + EPS)  # 0.866024
B_HI = 1.0 / (math.sqrt(2) + EPS)  # 0.707106
EXPECTED_NORM = [A_HI, B_HI, -A_HI, -A_HI, -B_HI, A_HI]
EXPECTED_NO_NORM = [0.5, 1.0, -0.5, -0.5, -1.0, 0.5]


@pytest.mark.parametrize(
    "index",
    [
        GROUPS_STR,
        np.array(GROUPS_STR, dtype=object),
        [7, 3, 7, 7, 3, 7],
        np.array([7, 3, 7, 7, 3, 7]),
        torch.tensor([7, 3, 7, 7, 3, 7]),
    ],
    ids=["str-list", "str-ndarray", "int-list", "int-ndarray", "int-tensor"],
)
def test_grpo_two_groups_hand_computed(index):
    rewards, mask = outcome_rewards(SCORES, LENGTHS)
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index)
    assert adv.shape == (6, 4) and adv.dtype == torch.float32
    for i, n in enumerate(LENGTHS):
        assert torch.allclose(adv[i, :n], torch.full((n,), EXPECTED_NORM[i]), atol=1e-6)
        assert torch.equal(adv[i, n:], torch.zeros(4 - n))
    assert torch.equal(ret, adv)
    assert abs(EXPECTED_NORM[0] - 0.866024) < 1e-6 and abs(EXPECTED_NORM[1] - 0.707106) < 1e-6


def test_grpo_without_std_is_dr_grpo():
    rewards, mask = outcome_rewards(SCORES, LENGTHS)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, GROUPS_STR, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(adv[:, 0], torch.tensor(EXPECTED_NO_NORM), atol=1e-7)


def test_grpo_matches_torch_std_reference():
    torch.manual_seed(0)
    rewards = torch.randn(12, 5)
    mask = torch.ones(12, 5)
    index = [i % 3 for i in range(12)]
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    scores = rewards.sum(-1)
    for g in range(3):
        s = scores[g::3]
        expected = (s - s.mean()) / (torch.std(s) + EPS)
        assert torch.allclose(adv[g::3, 0], expected, atol=1e-5)


def test_grpo_single_sample_group_uses_mean0_std1():
    rewards, mask = outcome_rewards([1.0, 0.0, 5.0], [2, 2, 3])
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, ["p", "p", "lonely"])
    # lonely: (5 - 0) / (1 + eps) = 4.999995
    assert torch.allclose(adv[2], torch.full((4,), 5.0 / (1 + EPS)).masked_fill(mask[2] == 0, 0.0))
    assert adv[2, 3].item() == 0.0
    # group p: scores 1, 0 -> mean .5, std sqrt(.5) -> +-0.5 / 0.707108 = +-0.707106
    assert adv[0, 0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + EPS), abs=1e-6)


def test_grpo_equal_scores_give_zero_advantage():
    rewards, mask = outcome_rewards([1.0, 1.0, 1.0], [1, 2, 3])
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, [0, 0, 0])
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("score", [0.7, 0.1, 1 / 3])
def test_grpo_tied_scores_that_float32_cannot_average_exactly_still_give_zero(score):
    # 16 x 0.7 in float32: the group mean is off by rounding and the std is ~1e-8, so dividing by
    # std + 1e-6 (verl's way) gives |A| ~ 0.06-0.1, one sign for the whole group
    rewards, mask = outcome_rewards([score] * 16 + [0.0, 1.0], [2] * 18)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, [0] * 16 + [1, 1])
    assert torch.equal(adv[:16], torch.zeros_like(adv[:16]))
    assert adv[16:, 0].tolist() == pytest.approx([-1 / 2**0.5, 1 / 2**0.5], rel=1e-5)


def test_grpo_masked_positions_exactly_zero_and_group_mean_zero():
    torch.manual_seed(1)
    bs, T = 16, 7
    rewards = torch.randn(bs, T)
    lengths = torch.randint(1, T + 1, (bs,))
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    index = [f"uid-{i // 4}" for i in range(bs)]
    for norm in (True, False):
        adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
        masked = adv[mask == 0]
        assert torch.equal(masked, torch.zeros_like(masked))
        assert not torch.signbit(masked).any()  # +0.0, not -0.0
        per_sample = adv[:, 0]
        for g in range(4):
            assert abs(per_sample[4 * g : 4 * g + 4].sum().item()) < 1e-5


def test_grpo_no_grad_and_input_untouched():
    rewards, mask = outcome_rewards(SCORES, LENGTHS)
    rewards.requires_grad_(True)
    before = rewards.detach().clone()
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, GROUPS_STR)
    assert not adv.requires_grad
    assert torch.equal(rewards.detach(), before)


def test_grpo_bad_index_length_names_sizes():
    rewards, mask = outcome_rewards(SCORES, LENGTHS)
    with pytest.raises(ValueError, match="5 group ids.*6 rows"):
        compute_grpo_outcome_advantage(rewards, mask, GROUPS_STR[:5])


def test_grpo_registered():
    assert get_advantage_estimator("grpo") is compute_grpo_outcome_advantage


# ---------------------------------------------------------------------------------------- PPO loss


def _ppo(ratios, advs, mask=None, **kw):
    """PPO loss for given ratios r (old log-prob 0, new log-prob log r) and advantages, one row."""
    log_prob = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    old = torch.zeros_like(log_prob)
    adv = torch.tensor([advs], dtype=torch.float32)
    mask = torch.ones_like(adv) if mask is None else torch.tensor([mask], dtype=torch.float32)
    loss, metrics = compute_policy_loss_vanilla(old, log_prob, adv, mask, **kw)
    return loss, metrics, log_prob


def test_ppo_within_clip_is_plain_ratio_objective():
    # r=1.1, A=2 -> -2.2;  r=0.9, A=-1 -> 0.9;  token-mean -0.65
    loss, m, _ = _ppo([1.1, 0.9], [2.0, -1.0])
    assert loss.item() == pytest.approx(-0.65, abs=1e-6)
    assert m["pg_clipfrac"] == 0.0 and m["pg_clipfrac_lower"] == 0.0


def test_ppo_above_high_with_positive_advantage_is_clipped():
    # r=1.5, A=1 -> -min(1.5, 1.2) = -1.2
    loss, m, _ = _ppo([1.5], [1.0])
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert m["pg_clipfrac"] == 1.0


def test_ppo_below_low_with_negative_advantage_is_clipped():
    # r=0.5, A=-1 -> max(0.5, 0.8) = 0.8 (clipped);  r=0.5, A=+1 -> max(-0.5, -0.8) = -0.5 (not clipped)
    loss, m, _ = _ppo([0.5, 0.5], [-1.0, 1.0])
    assert loss.item() == pytest.approx((0.8 - 0.5) / 2, abs=1e-6)
    assert m["pg_clipfrac"] == 0.5


def test_ppo_dual_clip_bounds_negative_advantage_loss():
    # r=10, A=-2: standard PPO gives max(20, 2.4) = 20; dual clip caps at -A*c = 6
    loss, m, log_prob = _ppo([10.0], [-2.0], clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(6.0, abs=1e-5)
    assert m["pg_clipfrac_lower"] == 1.0
    assert m["pg_clipfrac"] == 0.0  # -A*clip(r)=2.4 is not > -A*r=20
    loss.backward()
    assert log_prob.grad.item() == 0.0
    # r=2.5 < c, A=-2: dual clip inactive, loss = -A*r = 5
    loss, m, _ = _ppo([2.5], [-2.0], clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(5.0, abs=1e-5)
    assert m["pg_clipfrac_lower"] == 0.0


def test_ppo_asymmetric_clip_higher():
    # low=0.2, high=0.28 (DAPO):
    # r=1.25 A=1 -> -1.25 (inside 1.28) | r=1.3 A=1 -> -1.28 | r=0.75 A=-1 -> 0.8 | r=0.85 A=-1 -> 0.85
    loss, m, _ = _ppo(
        [1.25, 1.3, 0.75, 0.85], [1.0, 1.0, -1.0, -1.0], clip_ratio_low=0.2, clip_ratio_high=0.28
    )
    assert loss.item() == pytest.approx((-1.25 - 1.28 + 0.8 + 0.85) / 4, abs=1e-6)
    assert m["pg_clipfrac"] == 0.5
    # the same r=1.25 with the symmetric default 0.2 is clipped to 1.2
    loss, m, _ = _ppo([1.25], [1.0])
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)


def test_ppo_gradient_flows_only_through_unclipped_tokens():
    # tokens: unclipped (r=1.1, A=2), clipped high (r=1.5, A=1), clipped low (r=0.5, A=-1),
    # unclipped (r=0.5, A=1), masked out (r=1.1, A=3)
    ratios, advs = [1.1, 1.5, 0.5, 0.5, 1.1], [2.0, 1.0, -1.0, 1.0, 3.0]
    loss, m, log_prob = _ppo(ratios, advs, mask=[1, 1, 1, 1, 0])
    loss.backward()
    # d(-A r)/d log r = -A r, divided by 4 unmasked tokens
    expected = torch.tensor([[-2.0 * 1.1 / 4, 0.0, 0.0, -1.0 * 0.5 / 4, 0.0]])
    assert torch.allclose(log_prob.grad, expected, atol=1e-6)
    assert m["pg_clipfrac"] == 0.5


def test_ppo_kl_metric_and_mask():
    # old - new over unmasked tokens: (0 - log 2 + 0 - log 0.5) / 2 = 0; masked token ignored
    _, m, _ = _ppo([2.0, 0.5, 100.0], [1.0, 1.0, 1.0], mask=[1, 1, 0])
    assert m["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    _, m, _ = _ppo([math.exp(-0.3), 1.0], [1.0, 1.0])
    assert m["ppo_kl"] == pytest.approx(0.15, abs=1e-6)


def test_ppo_log_ratio_clamped_no_overflow():
    log_prob = torch.tensor([[80.0, -80.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    loss, m = compute_policy_loss_vanilla(old, log_prob, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(log_prob.grad).all()
    assert m["ppo_kl"] == pytest.approx(0.0, abs=1e-6)  # (-20 + 20) / 2 after clamping


def test_ppo_loss_agg_mode_is_forwarded():
    log_prob = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # r = 1 everywhere, loss = -A; seq-mean-token-sum: (-3 + -2) / 2
    loss, _ = compute_policy_loss_vanilla(log_prob, log_prob, adv, mask, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(-2.5)


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_ppo_clip_ratio_c_must_exceed_one(c):
    with pytest.raises(ValueError, match=f"clip_ratio_c must be > 1.*got {c}"):
        _ppo([1.0], [1.0], clip_ratio_c=c)


def test_ppo_shape_mismatch_names_shapes():
    with pytest.raises(ValueError, match="advantages"):
        compute_policy_loss_vanilla(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


def test_ppo_registered():
    assert get_policy_loss("vanilla") is compute_policy_loss_vanilla


# ---------------------------------------------------------------------------------------------- KL


def test_kl_each_kind_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.5]])  # d = logp - ref = [0.5, -0.5]
    for kind in ("k1", "kl"):
        assert torch.allclose(kl_penalty(logp, ref, kind), torch.tensor([[0.5, -0.5]]))
    assert torch.allclose(kl_penalty(logp, ref, "abs"), torch.tensor([[0.5, 0.5]]))
    for kind in ("k2", "mse"):
        assert torch.allclose(kl_penalty(logp, ref, kind), torch.tensor([[0.125, 0.125]]))
    # k3 = exp(-d) + d - 1: exp(-0.5) - 0.5 = 0.1065307, exp(0.5) - 1.5 = 0.1487213
    for kind in ("k3", "low_var_kl"):
        assert torch.allclose(kl_penalty(logp, ref, kind), torch.tensor([[0.1065307, 0.1487213]]), atol=1e-6)


def test_kl_identical_policies_are_zero():
    logp = torch.randn(3, 4)
    for kind in ("k1", "abs", "k2", "k3"):
        assert torch.equal(kl_penalty(logp, logp, kind), torch.zeros(3, 4))


def test_k3_clamped_at_ten_with_finite_gradient():
    # ref - logp = 15: exp(15) - 16 = 3.27e6 -> 10;  ref - logp = 2: e^2 - 3 = 4.389 (unclamped)
    logp = torch.tensor([[-15.0, -2.0, 100.0]], requires_grad=True)
    ref = torch.tensor([[0.0, 0.0, -100.0]])
    kl = kl_penalty(logp, ref, "k3")
    assert kl[0, 0].item() == 10.0
    assert kl[0, 1].item() == pytest.approx(math.exp(2) - 3, rel=1e-6)
    assert kl[0, 2].item() == 10.0  # ref - logp = -200 clamped to -20: e^-20 + 19 -> 10
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0].item() == 0.0


def test_kl_unknown_kind_lists_kinds():
    with pytest.raises(ValueError, match=r"'k4'.*'k1'.*'low_var_kl'"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


# ------------------------------------------------------------------------------------- aggregation

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 2.5
        ("seq-mean-token-sum", (6 + 4) / 2),  # 5
        ("seq-mean-token-mean", (2 + 4) / 2),  # 3
        ("seq-mean-token-sum-norm", (6 / 3 + 4 / 3) / 2),  # 1.667, T = 3: a mean over sequences
    ],
)
def test_agg_loss_modes_hand_computed(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.5),
        ("seq-mean-token-sum", 5.0),  # empty row 3 left out of the mean: not 10 / 3
        ("seq-mean-token-mean", 3.0),  # not 6 / 3
        ("seq-mean-token-sum-norm", 5 / 3),
    ],
)
def test_agg_loss_empty_sequence_excluded(mode, expected):
    loss = torch.cat([LOSS, torch.tensor([[7.0, 8.0, 9.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_all_empty_is_zero_with_grad(mode):
    loss = torch.randn(2, 3, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 3))


def test_agg_loss_grad_weights_tokens_by_mode():
    loss = LOSS.clone().requires_grad_(True)
    agg_loss(loss, MASK, "seq-mean-token-mean").backward()
    # row 0: 1/3 per token / 2 seqs; row 1: 1 token / 2 seqs
    expected = torch.tensor([[1 / 6, 1 / 6, 1 / 6], [0.5, 0.0, 0.0]])
    assert torch.allclose(loss.grad, expected)


def test_agg_loss_unknown_mode_lists_modes():
    with pytest.raises(ValueError, match=r"'token_mean'.*'token-mean'.*'seq-mean-token-sum-norm'"):
        agg_loss(LOSS, MASK, "token_mean")


def test_masked_mean_and_whiten():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.5)
    assert torch.allclose(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 3.5]))
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    assert masked_var(x, mask).item() == pytest.approx(5 / 3)  # unbiased var of 1,2,3,4
    w = masked_whiten(x, mask)
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(w, mask).item() == pytest.approx(1.0, abs=1e-5)
    w_keep = masked_whiten(x, mask, shift_mean=False)
    assert masked_mean(w_keep, mask).item() == pytest.approx(2.5, abs=1e-5)
    with pytest.raises(ValueError, match="at least 2 unmasked.*got 1"):
        masked_whiten(x, torch.tensor([[1, 0, 0], [0, 0, 0]]))


# ----------------------------------------------------------------------------------------- logprob


def _naive_logprobs(logits, labels):
    probs = torch.softmax(logits.double(), dim=-1)
    return torch.log(probs).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _naive_entropy(logits):
    p = torch.softmax(logits.double(), dim=-1)
    return -(p * torch.log(p)).sum(-1)


def test_logprobs_match_naive_softmax_fp32():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11) * 4
    labels = torch.randint(0, 11, (3, 5))
    out = logprobs_from_logits(logits, labels)
    assert out.shape == (3, 5) and out.dtype == torch.float32
    assert torch.allclose(out.double(), _naive_logprobs(logits, labels), atol=1e-5)


def test_logprobs_gradient_matches_log_softmax():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 7, requires_grad=True)
    labels = torch.randint(0, 7, (2, 4))
    logprobs_from_logits(logits, labels).sum().backward()
    ref_logits = logits.detach().clone().requires_grad_(True)
    torch.log_softmax(ref_logits, -1).gather(-1, labels.unsqueeze(-1)).sum().backward()
    assert torch.allclose(logits.grad, ref_logits.grad, atol=1e-6)


def test_logprobs_and_entropy_bf16_computed_in_float32():
    torch.manual_seed(2)
    logits = (torch.randn(2, 6, 300) * 5).to(torch.bfloat16)
    labels = torch.randint(0, 300, (2, 6))
    lp = logprobs_from_logits(logits, labels)
    ent = entropy_from_logits(logits)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    # same values as the float32 computation on the (exactly representable) upcast logits
    assert torch.allclose(lp.double(), _naive_logprobs(logits.float(), labels), atol=1e-5)
    assert torch.allclose(ent.double(), _naive_entropy(logits.float()), atol=1e-5)
    # and not what bf16 arithmetic gives
    bf16_lp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert not torch.allclose(lp, bf16_lp.float(), atol=1e-4)
    # gradients reach bf16 logits
    logits.requires_grad_(True)
    logprobs_from_logits(logits, labels).sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16


def test_entropy_matches_naive_and_bounds():
    torch.manual_seed(3)
    logits = torch.randn(2, 3, 9) * 3
    ent = entropy_from_logits(logits)
    assert torch.allclose(ent.double(), _naive_entropy(logits), atol=1e-5)
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8), abs=1e-6)
    peaked = torch.tensor([[[1000.0, 0.0, 0.0]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)


def test_logprobs_shape_mismatch():
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


# ---------------------------------------------------------------------------------------- registry


def test_registry_lists_builtins():
    assert "grpo" in list_advantage_estimators()
    assert "vanilla" in list_policy_losses()


def test_registry_unknown_name_suggests_closest_and_lists():
    with pytest.raises(ValueError, match=r"'grpoo'.*Did you mean 'grpo'\?.*Registered: \[.*'grpo'"):
        get_advantage_estimator("grpoo")
    with pytest.raises(ValueError, match=r"'vanila'.*Did you mean 'vanilla'\?.*Registered"):
        get_policy_loss("vanila")
    with pytest.raises(ValueError, match=r"Unknown policy loss 'zzz'\. Registered"):
        get_policy_loss("zzz")


def test_registry_rejects_a_second_function_under_a_taken_name():
    with pytest.raises(ValueError, match="'grpo' is already registered"):

        @register_advantage_estimator("grpo")
        def other_grpo(token_level_rewards, response_mask, index):  # pragma: no cover
            return token_level_rewards, token_level_rewards
