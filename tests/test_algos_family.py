"""Hand-computed checks of the estimator/loss family beyond GRPO + PPO: GAE, REINFORCE++, RLOO, ReMax,
OPO, pass@k, GSPO, CISPO, REINFORCE, KL controllers and penalty, value loss, DAPO shaping."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from helpers import outcome_rewards  # noqa: E402

from lucidrl.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_gae_advantage_return,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_policy_loss_cispo,
    compute_policy_loss_gspo,
    compute_policy_loss_reinforce,
    compute_policy_loss_vanilla,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_value_loss,
    dynamic_sampling_keep_mask,
    explained_variance,
    get_advantage_estimator,
    get_policy_loss,
    list_advantage_estimators,
    list_policy_losses,
    make_kl_controller,
    masked_mean,
    masked_var,
    overlong_reward_penalty,
)

EPS = 1e-6


def _whiten_list(xs: list[float]) -> list[float]:
    """(x - mean) / sqrt(unbiased var + 1e-8), the formula of masked_whiten, on a plain list."""
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def _assert_rows(adv: torch.Tensor, mask: torch.Tensor, per_sample: list[float], atol: float = 1e-6):
    """Each row equals its per-sample value on unmasked tokens and exactly +0.0 elsewhere."""
    for i, v in enumerate(per_sample):
        valid = mask[i].bool()
        assert torch.allclose(adv[i][valid], torch.full((int(valid.sum()),), v, dtype=adv.dtype), atol=atol)
        assert torch.equal(adv[i][~valid], torch.zeros(int((~valid).sum()), dtype=adv.dtype))


# Two groups, interleaved: a = samples 0,2,3,5 (scores 1,0,0,1), b = samples 1,4 (scores 3,1).
SCORES = [1.0, 3.0, 0.0, 0.0, 1.0, 1.0]
LENGTHS = [4, 2, 3, 1, 4, 2]
GROUPS = ["a", "b", "a", "a", "b", "a"]


# ---------------------------------------------------------------------------------------------- GAE


def test_gae_hand_computed_with_padding():
    # row 0 (all valid), gamma .9, lam .8, gamma*lam = .72:
    #   t2: delta = 1 - .7 = .3                A2 = .3
    #   t1: delta = .9*.7 - .6 = .03           A1 = .03 + .72*.3 = .246
    #   t0: delta = .9*.6 - .5 = .04           A0 = .04 + .72*.246 = .21712
    # row 1 (last token padded, its value 9 must be ignored):
    #   t1: delta = 2 - .5 = 1.5               A1 = 1.5
    #   t0: delta = .9*.5 - 1 = -.55           A0 = -.55 + .72*1.5 = .53
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    raw = [0.21712, 0.246, 0.3, 0.53, 1.5]
    expected_ret = torch.tensor([[0.71712, 0.846, 1.0], [1.53, 2.0, 0.0]])
    assert torch.allclose(ret, expected_ret, atol=1e-6)
    w = _whiten_list(raw)
    expected_adv = torch.tensor([[w[0], w[1], w[2]], [w[3], w[4], 0.0]])
    assert torch.allclose(adv, expected_adv, atol=1e-5)
    assert adv[1, 2].item() == 0.0 and ret[1, 2].item() == 0.0


def test_gae_lam1_gamma1_is_reward_to_go_minus_values():
    torch.manual_seed(0)
    bs, T = 6, 7
    rewards = torch.randn(bs, T)
    values = torch.randn(bs, T)
    lengths = torch.tensor([7, 1, 4, 5, 2, 7])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    _, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    # returns - values is the unwhitened advantage: here the Monte-Carlo one.
    assert torch.allclose((ret - values) * mask, (reward_to_go - values) * mask, atol=1e-5)


def test_gae_lam0_is_one_step_td_error():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 1.0, 4.0]])
    _, ret = compute_gae_advantage_return(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.0)
    # delta = r + .5 * V_next - V: [1 + .5 - .5, 2 + 2 - 1, 3 + 0 - 4] = [1, 3, -1]
    assert torch.allclose(ret - values, torch.tensor([[1.0, 3.0, -1.0]]))


def test_gae_skips_interior_masked_token():
    # mask [1, 0, 1], gamma = lam = 1: the masked token's reward 5 and value 7 are ignored.
    #   t2: A = 1 - .4 = .6;  t0: delta = .4 - .2 = .2, A = .2 + .6 = .8;  returns = A + V = [1, 0, 1]
    rewards = torch.tensor([[0.0, 5.0, 1.0], [1.0, 0.0, 0.0]])
    values = torch.tensor([[0.2, 7.0, 0.4], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    _, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(ret[0], torch.tensor([1.0, 0.0, 1.0]))


def test_gae_nan_value_on_padding_does_not_leak():
    values = torch.tensor([[0.1, 0.2, float("nan")], [0.3, float("nan"), float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv, ret = compute_gae_advantage_return(torch.ones(2, 3), values, mask)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


@pytest.mark.parametrize(("name", "value"), [("gamma", 1.5), ("lam", -0.1)])
def test_gae_rejects_gamma_lam_outside_unit_interval(name, value):
    kwargs = {"gamma": 0.9, "lam": 0.9, name: value}
    with pytest.raises(ValueError, match=f"{name} must be in \\[0, 1\\].*got {value}"):
        compute_gae_advantage_return(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), **kwargs)


def test_gae_values_shape_checked():
    with pytest.raises(ValueError, match="values"):
        compute_gae_advantage_return(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


# -------------------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_hand_computed():
    # gamma .5: row 0 rewards [1, 0, 2] -> G = [1 + .5*1, 0 + .5*2, 2] = [1.5, 1, 2]
    #           row 1 rewards [0, 4, 7(pad)] -> G = [2, 4, 0]
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert torch.allclose(ret, torch.tensor([[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]]))
    # whitened over [1.5, 1, 2, 2, 4]: mean 2.1, unbiased var 5.2 / 4 = 1.3
    s = math.sqrt(1.3 + 1e-8)
    expected = torch.tensor([[-0.6 / s, -1.1 / s, -0.1 / s], [-0.1 / s, 1.9 / s, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_reinforce_pp_returns_are_whitened_over_the_mask():
    torch.manual_seed(2)
    rewards = torch.randn(8, 6) * 3 + 5
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 3, 6, 1, 4, 5, 6])[:, None]).float()
    adv, _ = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9)
    assert masked_mean(adv, mask).item() == pytest.approx(0.0, abs=1e-5)
    assert masked_var(adv, mask).item() == pytest.approx(1.0, abs=1e-4)


def test_reinforce_pp_carries_the_return_across_masked_tokens():
    # A tool's output (masked) between two turns, gamma .5: the masked reward 9 is ignored, the running
    # return passes the gap undiscounted (verl 0.9.1), and the masked token's return is 0.
    #   row 0, mask [1, 0, 0, 1], rewards [1, 9, 9, 4]: t3 G = 4; t2, t1 skipped; t0 G = 1 + .5 * 4 = 3
    #   row 1, mask [1, 1, 0, 0] (padding), rewards [2, 2, 7, 7]: t1 G = 2; t0 G = 2 + .5 * 2 = 3
    rewards = torch.tensor([[1.0, 9.0, 9.0, 4.0], [2.0, 2.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 0]])
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert torch.equal(ret, torch.tensor([[3.0, 0.0, 0.0, 4.0], [3.0, 2.0, 0.0, 0.0]]))


def test_reinforce_pp_returns_equal_gae_returns_with_gaps():
    # Both estimators skip masked tokens the same way: with gamma = lam = 1 and values 0, GAE's returns
    # (A + V) are the reward-to-go over unmasked tokens, which is REINFORCE++'s G.
    torch.manual_seed(7)
    rewards = torch.randn(4, 7)
    mask = torch.tensor(
        [[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 0, 1, 0, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]]
    )
    _, ret_rpp = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
    _, ret_gae = compute_gae_advantage_return(rewards, torch.zeros(4, 7), mask, gamma=1.0, lam=1.0)
    assert torch.allclose(ret_rpp, ret_gae, atol=1e-6)
    # and the first token of row 1 collects every later unmasked reward
    assert ret_rpp[1, 0].item() == pytest.approx(rewards[1, [0, 2, 4, 6]].sum().item(), abs=1e-6)


def test_reinforce_pp_nan_reward_on_masked_token_does_not_leak():
    rewards = torch.tensor([[1.0, float("nan"), 2.0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(
        rewards.repeat(2, 1), torch.tensor([[1, 0, 1], [1, 0, 1]]), gamma=1.0
    )
    assert torch.equal(ret[0], torch.tensor([3.0, 0.0, 2.0]))
    assert torch.isfinite(adv).all()


def test_reinforce_pp_rejects_bad_gamma():
    with pytest.raises(ValueError, match="gamma must be in.*got 2"):
        compute_reinforce_plus_plus_outcome_advantage(torch.zeros(2, 2), torch.ones(2, 2), gamma=2)


def test_reinforce_pp_baseline_hand_computed():
    # group means a: .5, b: 2 -> centred [.5, 1, -.5, -.5, -1, .5], then whitened over all 16 tokens.
    rewards, mask = outcome_rewards(SCORES, LENGTHS)
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, GROUPS)
    centred = [0.5, 1.0, -0.5, -0.5, -1.0, 0.5]
    tokens = [c for c, n in zip(centred, LENGTHS, strict=True) for _ in range(n)]
    mean = sum(tokens) / 16  # -1/16
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / 15 + 1e-8)
    _assert_rows(adv, mask, [(c - mean) / std for c in centred], atol=1e-6)
    assert torch.equal(ret, adv)


# --------------------------------------------------------------------------------------------- RLOO


def test_rloo_is_score_minus_mean_of_others():
    # a (n=4): 1 - (0+0+1)/3 = 2/3, 0 - 2/3 = -2/3;  b (n=2): 3 - 1 = 2, 1 - 3 = -2.
    # verl's form n/(n-1) * (score - mean) gives the same: 4/3 * .5 = 2/3, 2 * 1 = 2.
    rewards, mask = outcome_rewards(SCORES, LENGTHS)
    adv, ret = compute_rloo_outcome_advantage(rewards, mask, GROUPS)
    _assert_rows(adv, mask, [2 / 3, 2.0, -2 / 3, -2 / 3, -2.0, 2 / 3])
    assert torch.equal(ret, adv)


def test_rloo_group_sums_to_zero_and_single_sample_keeps_raw_score():
    torch.manual_seed(3)
    scores = torch.randn(12).tolist()
    rewards, mask = outcome_rewards(scores + [4.0], [3] * 12 + [2])
    index = [i % 3 for i in range(12)] + ["lonely"]
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    for g in range(3):
        assert abs(adv[g:12:3, 0].sum().item()) < 1e-5
    assert adv[12, 0].item() == 4.0  # no others: baseline 0, as in verl


# ---------------------------------------------------------------------------------------------- OPO


def test_opo_length_weighted_baseline():
    # a: lengths 4,3,1,2, scores 1,0,0,1 -> b = (4 + 2) / 10 = .6 -> A = .4, -.6, -.6, .4
    # b: lengths 2,4, scores 3,1        -> b = (6 + 4) / 6 = 5/3 -> A = 4/3, -2/3
    rewards, mask = outcome_rewards(SCORES, LENGTHS)
    adv, _ = compute_opo_outcome_advantage(rewards, mask, GROUPS)
    _assert_rows(adv, mask, [0.4, 4 / 3, -0.6, -0.6, -2 / 3, 0.4])
    # length-weighted sums vanish per group; the plain sum does not (lengths differ)
    per_sample = adv[:, 0]
    lengths = torch.tensor(LENGTHS, dtype=torch.float32)
    a = torch.tensor([0, 2, 3, 5])
    assert abs((per_sample[a] * lengths[a]).sum().item()) < 1e-6
    assert abs(per_sample[a].sum().item()) > 0.1


# ----------------------------------------------------------------------------------------- pass@k


PASSK_SCORES = [0.2, 2.0, 0.9, 5.0, 0.5, 1.0, 4.0]
PASSK_INDEX = ["x", "y", "x", "y", "x", "y", "y"]


def test_grpo_passk_only_best_gets_margin():
    # x = [.2, .9, .5]: best sample 2, margin .9 - .5 = .4, std .351188 -> 1.138986
    # y = [2, 5, 1, 4]: best sample 3, margin 5 - 4 = 1, std 1.825742 -> 0.547722
    rewards, mask = outcome_rewards(PASSK_SCORES, [2, 3, 4, 1, 2, 3, 4])
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, PASSK_INDEX)
    _assert_rows(adv, mask, [0.0, 0.0, 1.1389864, 0.5477223, 0.0, 0.0, 0.0], atol=1e-5)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, PASSK_INDEX, norm_adv_by_std_in_grpo=False)
    _assert_rows(adv, mask, [0.0, 0.0, 0.4, 1.0, 0.0, 0.0, 0.0], atol=1e-6)


def test_grpo_passk_tie_gives_zero_and_single_sample_group_is_error():
    rewards, mask = outcome_rewards([1.0, 0.0, 1.0], [1, 2, 3])
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, [0, 0, 0])
    assert torch.equal(adv, torch.zeros_like(adv))
    rewards, mask = outcome_rewards([1.0, 0.0, 1.0], [1, 2, 3])
    with pytest.raises(ValueError, match=r">= 2 samples per group.*\['solo'\]"):
        compute_grpo_passk_outcome_advantage(rewards, mask, ["p", "p", "solo"])


# -------------------------------------------------------------------------------------------- ReMax


def test_remax_hand_computed():
    # row 0: returns = reverse cumsum [0,1,2] = [3, 3, 2]; minus baseline 1.5 -> [1.5, 1.5, .5]
    # row 1: masked reward 5 excluded: returns [3, 0, 0]; minus 2 on unmasked -> [1, -2, 0]
    rewards = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_remax_outcome_advantage(rewards, mask, reward_baselines=torch.tensor([1.5, 2.0]))
    assert torch.equal(ret, torch.tensor([[3.0, 3.0, 2.0], [3.0, 0.0, 0.0]]))
    assert torch.equal(adv, torch.tensor([[1.5, 1.5, 0.5], [1.0, -2.0, 0.0]]))


def test_remax_needs_baselines():
    with pytest.raises(ValueError, match="remax needs reward_baselines"):
        compute_remax_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"reward_baselines must be \(2,\).*got \(3,\)"):
        compute_remax_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3))


# ------------------------------------------------------------------------ every registered estimator


def _estimator_inputs(bs: int = 8, T: int = 5) -> dict:
    """Everything the trainer may pass, by name; NaN values on padding to catch leaks."""
    torch.manual_seed(4)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5, 3, 1])[:bs]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    rewards = torch.randn(bs, T) * mask
    values = torch.where(mask.bool(), torch.randn(bs, T), float("nan"))
    return {
        "token_level_rewards": rewards.requires_grad_(True),
        "response_mask": mask,
        "index": [f"uid-{i // 4}" for i in range(bs)],
        "values": values,
        "gamma": 0.99,
        "lam": 0.95,
        "norm_adv_by_std_in_grpo": True,
        "reward_baselines": torch.randn(bs),
        # the optimal token baselines' inputs from the old-log-prob pass, NaN on padding as well
        "old_log_probs": torch.where(mask.bool(), -torch.rand(bs, T) * 2, float("nan")),
        "sum_pi_squared": torch.where(mask.bool(), torch.rand(bs, T) * 0.5 + 0.1, float("nan")),
    }


def test_every_registered_estimator_shapes_and_exact_zero_mask():
    names = list_advantage_estimators()
    # verl 0.9.1's registered estimators, every one
    expected = {
        "gae",
        "gdpo",
        "gpg",
        "grpo",
        "grpo_passk",
        "grpo_vectorized",
        "opo",
        "optimal_token_baseline",
    }
    expected |= {"reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "rloo_vectorized"}
    assert expected | {"tir_optimal_token_baseline"} <= set(names)
    available = _estimator_inputs()
    mask = available["response_mask"]
    for name in names:
        fn = get_advantage_estimator(name)
        params = inspect.signature(fn).parameters
        required = {p for p, v in params.items() if v.default is inspect.Parameter.empty}
        assert required <= set(available), f"{name} requires inputs the trainer cannot pass: {required}"
        adv, ret = fn(**{k: v for k, v in available.items() if k in params})
        for what, t in (("advantages", adv), ("returns", ret)):
            assert t.shape == (8, 5), (name, what)
            assert not t.requires_grad, (name, what)
            assert torch.isfinite(t).all(), (name, what)
            masked = t[mask == 0]
            assert torch.equal(masked, torch.zeros_like(masked)), (name, what)
            assert not torch.signbit(masked).any(), (name, what)  # +0.0, not -0.0


def test_group_estimators_zero_mean_within_group():
    available = _estimator_inputs()
    rewards, mask, index = available["token_level_rewards"], available["response_mask"], available["index"]
    for fn in (compute_rloo_outcome_advantage,):
        adv, _ = fn(rewards, mask, index)
        for g in range(2):
            assert abs(adv[4 * g : 4 * g + 4, 0].sum().item()) < 1e-5
    # REINFORCE++-baseline is whitened over the batch: zero token mean, unit variance.
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    assert masked_mean(adv, mask).item() == pytest.approx(0.0, abs=1e-5)
    assert masked_var(adv, mask).item() == pytest.approx(1.0, abs=1e-4)


# --------------------------------------------------------------------------------------------- GSPO


def _two_token_row(log_ratios, adv=1.0, masked_extra=True):
    """One response with the given per-token log-ratios (old log-prob -1), plus a masked token."""
    lr = list(log_ratios) + ([5.0] if masked_extra else [])
    old = torch.full((1, len(lr)), -1.0)
    log_prob = (old + torch.tensor([lr])).requires_grad_(True)
    advantages = torch.full((1, len(lr)), adv)
    mask = torch.tensor([[1.0] * len(log_ratios) + ([0.0] if masked_extra else [])])
    return old, log_prob, advantages, mask


def test_gspo_ratio_is_sequence_level_and_shared_by_tokens():
    # per-token ratios e^.1 = 1.105, e^.3 = 1.350; sequence ratio e^((.1 + .3) / 2) = e^.2 = 1.221403
    old, log_prob, adv, mask = _two_token_row([0.1, 0.3])
    loss, m = compute_policy_loss_gspo(old, log_prob, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss.item() == pytest.approx(-math.exp(0.2), abs=1e-6)  # 1.2214 < 1.28: unclipped
    assert m["pg_clipfrac"] == 0.0
    assert m["ppo_kl"] == pytest.approx(-0.2, abs=1e-6)  # token mean of old - new, masked token ignored
    loss.backward()
    # d/dlogp_t of -A * s_t = -A * s, the same for both tokens; seq-mean-token-mean divides by 2
    g = -math.exp(0.2) / 2
    assert torch.allclose(log_prob.grad, torch.tensor([[g, g, 0.0]]), atol=1e-6)


def test_gspo_clips_whole_sequence_where_ppo_clips_one_token():
    old, log_prob, adv, mask = _two_token_row([0.1, 0.3])
    loss, m = compute_policy_loss_gspo(old, log_prob, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)  # s = 1.2214 clipped to 1.2 on both tokens
    assert m["pg_clipfrac"] == 1.0
    loss.backward()
    assert torch.equal(log_prob.grad, torch.zeros(1, 3))
    # token-level PPO on the same input clips only the token with ratio 1.35
    _, m_ppo = compute_policy_loss_vanilla(old, log_prob.detach(), adv, mask)
    assert m_ppo["pg_clipfrac"] == 0.5


def test_gspo_honours_loss_agg_mode():
    # ratio 1 everywhere, loss = -A: seq-mean-token-mean -(1 + 2) / 2; token-mean -(3 + 2) / 4
    log_prob = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = compute_policy_loss_gspo(log_prob, log_prob, adv, mask)
    assert loss.item() == pytest.approx(-1.5)
    loss, _ = compute_policy_loss_gspo(log_prob, log_prob, adv, mask, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(-1.25)


# -------------------------------------------------------------------------------------------- CISPO


def test_cispo_gradient_is_clipped_weight_times_advantage():
    # log-ratios [.5, -.5, .1] -> r = [1.6487, .6065, 1.1052]; clip [.8, 1.28] -> w = [1.28, .8, 1.1052]
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    log_prob = torch.tensor([[-0.5, -1.5, -0.9]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    mask = torch.ones(1, 3)
    loss, m = compute_policy_loss_cispo(old, log_prob, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    # -(1.28 * 1 * -.5 + .8 * -2 * -1.5 + 1.10517 * 3 * -.9) / 3 = 0.407987
    assert loss.item() == pytest.approx(0.4079872, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)
    assert m["ppo_kl"] == pytest.approx(-0.1 / 3, abs=1e-6)
    loss.backward()
    w = torch.tensor([[1.28, 0.8, math.exp(0.1)]])
    # -w * A / 3: clipped tokens keep a (bounded) gradient, unlike PPO
    assert torch.allclose(log_prob.grad, -w * adv / 3, atol=1e-6)
    assert (log_prob.grad != 0).all()


def test_cispo_low_bound_at_or_above_one_means_no_lower_clip():
    old = torch.zeros(1, 1)
    log_prob = torch.tensor([[math.log(0.1)]], requires_grad=True)
    loss, m = compute_policy_loss_cispo(old, log_prob, torch.ones(1, 1), torch.ones(1, 1), clip_ratio_low=1.0)
    assert m["pg_clipfrac"] == 0.0
    loss.backward()
    assert log_prob.grad.item() == pytest.approx(-0.1, abs=1e-6)
    with pytest.raises(ValueError, match="clip_ratio_low must be >= 0.*got -0.1"):
        compute_policy_loss_cispo(old, log_prob, torch.ones(1, 1), torch.ones(1, 1), clip_ratio_low=-0.1)


# ---------------------------------------------------------------------------------------- REINFORCE


def test_reinforce_loss_and_gradient():
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    log_prob = torch.tensor([[-0.5, -2.0, -9.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = compute_policy_loss_reinforce(old, log_prob, adv, mask, clip_ratio_high=0.01)
    # no ratio, no clip: -(2 * -.5 + -1 * -2) / 2 = -.5
    assert loss.item() == pytest.approx(-0.5)
    # ppo_kl = mean(old - new) over unmasked = (-.5 + 0) / 2
    assert m == {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "ppo_kl": pytest.approx(-0.25)}
    loss.backward()
    assert torch.equal(log_prob.grad, torch.tensor([[-1.0, 0.5, 0.0]]))  # -A / 2 unmasked tokens


# ---------------------------------------------------------------------------------- every loss


def test_every_registered_loss_takes_the_actor_kwargs_and_reports_metrics():
    from lucidrl.algos import policy_loss_agg_mode
    from lucidrl.config.schema import ActorConfig, RolloutCorrectionConfig
    from lucidrl.workers.training.actor import policy_loss_kwargs

    names = list_policy_losses()
    # verl 0.9.1's registered policy losses, every one, and lucidrl's reinforce
    expected = {"bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg", "gspo"}
    assert expected | {"kl_cov", "sapo", "vanilla", "reinforce"} <= set(names)
    torch.manual_seed(5)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]).float()
    for name in names:
        cfg = ActorConfig(policy_loss=name, clip_ratio_high=0.28, dro_beta=0.1)
        cfg.loss_agg_mode = policy_loss_agg_mode(name) or "token-mean"
        available = policy_loss_kwargs(
            cfg, RolloutCorrectionConfig(rollout_is="token"), torch.rand(3, 4) + 0.5
        )
        fn = get_policy_loss(name)
        params = inspect.signature(fn).parameters
        # metrics_mask: only bypass_mode's own call of the vanilla loss passes it (its kept tokens)
        given = {"old_log_prob", "log_prob", "advantages", "response_mask", "metrics_mask"}
        assert set(params) - given <= set(available), name
        old = torch.randn(3, 4) - 2
        log_prob = (old + 0.3 * torch.randn(3, 4)).requires_grad_(True)
        loss, metrics = fn(
            old_log_prob=old,
            log_prob=log_prob,
            advantages=torch.randn(3, 4),
            response_mask=mask,
            **{k: v for k, v in available.items() if k in params},
        )
        assert loss.ndim == 0 and loss.requires_grad, name
        assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} <= set(metrics), name
        assert all(isinstance(v, float) for v in metrics.values()), name
        loss.backward()
        assert torch.isfinite(log_prob.grad).all(), name
        assert (log_prob.grad[mask == 0] == 0).all(), name


# ---------------------------------------------------------------------------------------------- KL


def test_adaptive_kl_controller_arithmetic():
    # target .05, horizon 1000, n_steps 100:
    #   kl .06  -> e = .2 (exactly at the clip) -> x (1 + .2 * .1) = 1.02
    #   kl .055 -> e = .1                       -> x 1.01
    #   kl 0    -> e = -1 clipped to -.2        -> x .98
    #   kl 1    -> e = 19 clipped to .2         -> x 1.02
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    expected = 0.1
    for kl, mult in ((0.06, 1.02), (0.055, 1.01), (0.0, 0.98), (1.0, 1.02)):
        ctrl.update(kl, n_steps=100)
        expected *= mult
        assert ctrl.value == pytest.approx(expected, rel=1e-12)
    # the step scales with n_steps / horizon: a full horizon at the clip moves it by 20%
    ctrl = AdaptiveKLController(0.1, 0.05, 1000)
    ctrl.update(10.0, n_steps=1000)
    assert ctrl.value == pytest.approx(0.12)
    with pytest.raises(ValueError, match="current_kl must be finite, got nan"):
        ctrl.update(float("nan"), 10)


def test_fixed_controller_and_factory():
    fixed = make_kl_controller("fixed", 0.3)
    assert isinstance(fixed, FixedKLController)
    fixed.update(100.0, 64)
    assert fixed.value == 0.3
    ada = make_kl_controller("adaptive", 0.1, target_kl=0.02, horizon=500)
    assert isinstance(ada, AdaptiveKLController) and ada.value == 0.1
    with pytest.raises(ValueError, match="needs target_kl and horizon.*horizon=None"):
        make_kl_controller("adaptive", 0.1, target_kl=0.02)
    with pytest.raises(ValueError, match=r"'adaptve'.*'fixed', 'adaptive'"):
        make_kl_controller("adaptve", 0.1)
    with pytest.raises(ValueError, match="horizon must be > 0.*got 0"):
        AdaptiveKLController(0.1, 0.02, 0)
    with pytest.raises(ValueError, match="target_kl must be > 0.*got 0"):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="kl_coef must be >= 0.*got -1"):
        FixedKLController(-1)


def test_apply_kl_penalty_values_and_metrics():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -1.0, -3.0]])
    ref = torch.tensor([[-1.5, -0.5, -1.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # k1: d = logp - ref = [[.5, -.5, 0], [-1, 0, (masked)]]; coef .1
    rewards, m = apply_kl_penalty(scores, logp, ref, mask, kl_coef=0.1, kind="k1")
    assert torch.allclose(rewards, torch.tensor([[-0.05, 0.05, 1.0], [0.1, 2.0, 0.0]]))
    # per-sequence masked means 0 and -.5, batch mean -.25
    assert m["actor/reward_kl_penalty"] == pytest.approx(-0.25)
    assert m["actor/reward_kl_penalty_coeff"] == 0.1
    # k2: .5 d^2 = [[.125, .125, 0], [.5, 0]] -> row means 1/12, 1/4 -> 1/6
    rewards, m = apply_kl_penalty(scores, logp, ref, mask, kl_coef=2.0, kind="k2")
    assert m["actor/reward_kl_penalty"] == pytest.approx(1 / 6)
    assert torch.allclose(rewards, torch.tensor([[-0.25, -0.25, 1.0], [-1.0, 2.0, 0.0]]))


def test_apply_kl_penalty_feeds_adaptive_controller():
    ctrl = make_kl_controller("adaptive", 0.1, target_kl=0.1, horizon=100)
    logp = torch.zeros(4, 2)
    ref = torch.full((4, 2), -0.5)  # k1 = .5 everywhere
    _, m = apply_kl_penalty(torch.zeros(4, 2), logp, ref, torch.ones(4, 2), ctrl.value, "k1")
    ctrl.update(m["actor/reward_kl_penalty"], n_steps=4)  # e = 4 -> .2: x (1 + .2 * 4 / 100)
    assert ctrl.value == pytest.approx(0.1 * 1.008)


# ------------------------------------------------------------------------------------------ critic


def test_value_loss_clipping_branch_and_clipfrac():
    # values .5, clip .2 -> vpred clipped to [.3, .7]
    #   t0 vpred 1.0 R 1.2: (1-1.2)^2 = .04 < (.7-1.2)^2 = .25 -> clipped branch
    #   t1 vpred 2.0 R 0  : 4 > .49 ;  t2 vpred 0 R 3: 9 > 7.29 ;  t3 vpred .6 R 1: .16 = .16
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 0.6, 100.0]], requires_grad=True)
    values = torch.full((1, 5), 0.5)
    returns = torch.tensor([[1.2, 0.0, 3.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, m = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 4 + 9 + 0.16) / 4)  # 1.67625
    assert m == {"vf_clipfrac": 0.25}
    loss.backward()
    # 0.5 * 2 * (vpred - R) / 4 on unclipped tokens; 0 where the clipped (constant) branch wins
    assert torch.allclose(vpreds.grad, torch.tensor([[0.0, 0.5, -0.75, -0.1, 0.0]]), atol=1e-6)


def test_value_loss_rejects_negative_clip():
    with pytest.raises(ValueError, match="cliprange_value must be >= 0.*got -0.5"):
        compute_value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), -0.5)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 6.0, -50.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    garbage = torch.tensor([[0.0, 0.0, 0.0, 1e6], [0.0, 0.0, 1e6, 1e6]])
    assert explained_variance(returns + garbage, returns, mask) == pytest.approx(1.0)
    mean = masked_mean(returns, mask)  # 3.2
    assert explained_variance(torch.full_like(returns, mean.item()), returns, mask) == pytest.approx(
        0.0, abs=1e-6
    )
    # V = R / 2: Var[R / 2] / Var[R] = 1/4
    assert explained_variance(returns / 2, returns, mask) == pytest.approx(0.75)
    assert math.isnan(explained_variance(torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3)))
    # one response token in the whole step: a NaN metric, not an error that loses the step's metrics
    assert math.isnan(explained_variance(torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1, 0]])))
    with pytest.raises(ValueError, match=r"whitening .* runs over all of a step's response tokens"):
        masked_var(torch.ones(1, 2), torch.tensor([[1, 0]]))


# -------------------------------------------------------------------------------------------- DAPO


def test_overlong_penalty_boundary_points():
    # max 20, buffer 4: free up to 16, then -1/4 per token, -factor at 20
    lengths = torch.tensor([0, 16, 17, 18, 20])
    pen = overlong_reward_penalty(lengths, max_response_length=20, buffer_length=4, penalty_factor=1.0)
    assert torch.equal(pen, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    assert not torch.signbit(pen[:2]).any()
    pen = overlong_reward_penalty(torch.tensor([19, 20]), 20, 4, penalty_factor=2.0)
    assert torch.equal(pen, torch.tensor([-1.5, -2.0]))


@pytest.mark.parametrize("buffer", [0, 20, 25])
def test_overlong_buffer_must_be_inside_max(buffer):
    with pytest.raises(
        ValueError, match=f"buffer_length must be in \\(0, max_response_length=20\\).*got {buffer}"
    ):
        overlong_reward_penalty(torch.tensor([5]), 20, buffer)


def test_overlong_length_beyond_max_is_error():
    with pytest.raises(ValueError, match="response length 21 is outside"):
        overlong_reward_penalty(torch.tensor([3, 21]), 20, 4)


def test_dynamic_sampling_keep_mask():
    # a: all 1 (dropped), b: 0 and 1 (kept), c: all .5 (dropped), d: single sample (kept, as verl's)
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 3.0])
    keep, m = dynamic_sampling_keep_mask(scores, ["a", "a", "b", "b", "c", "c", "d"])
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, False, True, True, False, False, True]
    assert m == {"dapo/groups_total": 4, "dapo/groups_kept": 2, "dapo/groups_dropped_all_same": 2}


def test_dynamic_sampling_equal_floats_are_dropped_and_int_scores_work():
    # three equal 0.1s: a std computed through the mean can come out as ~1e-17, not 0
    scores = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.2, 0.1], dtype=torch.float64)
    keep, m = dynamic_sampling_keep_mask(scores, [0, 0, 0, 1, 1, 1])
    assert keep.tolist() == [False, False, False, True, True, True]
    keep, _ = dynamic_sampling_keep_mask(torch.tensor([1, 0, 2, 2]), [0, 0, 1, 1])
    assert keep.tolist() == [True, True, False, False]
