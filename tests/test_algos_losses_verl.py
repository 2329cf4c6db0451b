"""Hand-computed checks of the policy losses, KL kinds and aggregation verl 0.9.1 added: SAPO, GMPO,
DPPO (TV and KL), Clip-Cov, KL-Cov, DRO, GPG's loss, the "+" KL kinds, token-sum, loss_scale_factor,
and the importance weights every loss takes."""

from __future__ import annotations

import math

import pytest
import torch

from lucidrl.algos import (
    agg_loss,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_kl_cov,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss,
    kl_penalty,
    policy_loss_agg_mode,
)
from lucidrl.algos.aggregation import norm_width
from lucidrl.batch import Batch
from lucidrl.workers.training.micro_batches import loss_weights


def _leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).requires_grad_(True)


# --------------------------------------------------------------------------------------------- SAPO


def test_sapo_gate_at_ratio_one_is_the_policy_gradient():
    # r = 1: gate = sigmoid(0) * 4 / tau = 2 / tau; tau_pos 1 for A = 1, tau_neg 2 for A = -1
    #   losses [-2 * 1, -(2/2) * -1] = [-2, 1], seq-mean-token-mean -> -.5
    #   d/dlp (-A * 4 sigmoid(tau (r - 1)) / tau) = -A * 4 * sigmoid'(0) * r = -A -> [-1, 1] / 2 tokens
    old = torch.tensor([[-1.0, -2.0]])
    log_prob = _leaf([[-1.0, -2.0]])
    loss, m = compute_policy_loss_sapo(old, log_prob, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
                                       tau_pos=1.0, tau_neg=2.0)  # fmt: skip
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-0.5, 0.5]]), atol=1e-6)
    assert m == {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "ppo_kl": 0.0}


def test_sapo_gate_fades_smoothly_away_from_one():
    # r = e^.5 (A = 1, tau 1): loss = -sigmoid(e^.5 - 1) * 4, gradient -4 sigmoid'(e^.5 - 1) e^.5
    r = math.exp(0.5)
    sig = 1 / (1 + math.exp(-(r - 1)))
    log_prob = _leaf([[0.5]])
    loss, _ = compute_policy_loss_sapo(torch.zeros(1, 1), log_prob, torch.ones(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-4 * sig, abs=1e-6)
    loss.backward()
    assert log_prob.grad.item() == pytest.approx(-4 * sig * (1 - sig) * r, abs=1e-6)
    # less than the unclipped surrogate's -A r (its gradient r), but not 0 as past PPO's clip at 1.2
    assert 0 < -log_prob.grad.item() < r


def test_sapo_and_geo_mean_aggregate_per_sequence():
    assert policy_loss_agg_mode("sapo") == policy_loss_agg_mode("geo_mean") == "seq-mean-token-mean"
    assert policy_loss_agg_mode("vanilla") is None and policy_loss_agg_mode("gspo") is None
    with pytest.raises(ValueError, match="loss_agg_mode=seq-mean-token-mean"):
        compute_policy_loss_sapo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                 loss_agg_mode="token-mean")  # fmt: skip


# --------------------------------------------------------------------------------------------- GMPO


def test_geo_mean_clips_log_ratios_and_takes_the_geometric_mean():
    # row 0, A = 1, log-ratios [.1, .5] clipped to [-.4, .4] -> [.1, .4]; ratio e^.25; loss -e^.25
    # row 1, A = -1, log-ratios [-.1, -.5]: the pessimistic side keeps min(-d, -clip(d)) = [.1, .4],
    #   so d' = [-.1, -.4], ratio e^-.25, loss +e^-.25;  mean over the two responses
    old = torch.zeros(2, 3)
    log_prob = _leaf([[0.1, 0.5, 9.0], [-0.1, -0.5, 9.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    loss, m = compute_policy_loss_geo_mean(old, log_prob, adv, mask)
    assert loss.item() == pytest.approx((-math.exp(0.25) + math.exp(-0.25)) / 2, abs=1e-6)
    loss.backward()
    # only the unclipped first tokens carry gradient: d(-A e^{mean d'})/dd_0 = -A e^{...} / 2, / 2 responses
    expected = torch.tensor([[-math.exp(0.25) / 4, 0.0, 0.0], [math.exp(-0.25) / 4, 0.0, 0.0]])
    assert torch.allclose(log_prob.grad, expected, atol=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.25) and m["pg_clipfrac_lower"] == pytest.approx(0.25)


def test_geo_mean_weights_a_sequence_by_the_geometric_mean_of_its_importance_weights():
    # weights [4, 1] on a response: geometric mean 2 -> the loss doubles
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    plain, _ = compute_policy_loss_geo_mean(*args)
    weighted, _ = compute_policy_loss_geo_mean(*args, rollout_is_weights=torch.tensor([[4.0, 1.0]]))
    assert weighted.item() == pytest.approx(2 * plain.item(), abs=1e-5)


# --------------------------------------------------------------------------------------------- DPPO


def _dppo_case():
    # p_old = .5 everywhere; new p [.8, .6, .2, .45, .1] with A [1, 1, -1, -1, 1]
    old = torch.log(torch.full((1, 5), 0.5))
    log_prob = torch.log(torch.tensor([[0.8, 0.6, 0.2, 0.45, 0.1]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])
    return old, log_prob, adv, torch.ones(1, 5)


def test_dppo_tv_masks_tokens_that_moved_too_far_their_advantages_way():
    # p - p_old = [.3, .1, -.3, -.05, -.4], thresholds .2: outside are token 0 (A > 0, +.3) and
    # token 2 (A < 0, -.3); token 4 moved against its advantage's push and stays inside.
    # loss_t = -A * sg[min(r, c)] * log p on inside tokens, r = p / .5 = [1.6, 1.2, .4, .9, .2]
    old, log_prob, adv, mask = _dppo_case()
    loss, m = compute_policy_loss_dppo_tv(old, log_prob, adv, mask, clip_ratio_c=1.1)
    # r truncated at 1.1: token 1's 1.2 -> 1.1
    expected = (-1.1 * math.log(0.6) + 0.9 * math.log(0.45) - 0.2 * math.log(0.1)) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[0.0, -1.1, 0.0, 0.9, -0.2]]) / 5, atol=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(2 / 5)  # outside the trust region
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 5)  # inside and truncated (token 1)


def test_dppo_kl_uses_the_tokens_binary_kl():
    # KL(p_old || p) of the binary distribution: p = .8 or .2 -> .5 log(1.5625) = .2231 (> .1: out,
    # moved with its advantage); p = .6 -> .0204 and .45 -> .0050 (in); p = .1 against its advantage: in
    old, log_prob, adv, mask = _dppo_case()
    loss, m = compute_policy_loss_dppo_kl(old, log_prob, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.1,
                                          clip_ratio_c=20.0)  # fmt: skip
    expected = (-1.2 * math.log(0.6) + 0.9 * math.log(0.45) - 0.2 * math.log(0.1)) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(2 / 5) and m["pg_clipfrac_lower"] == 0.0
    _, m = compute_policy_loss_dppo_kl(old, log_prob, adv, mask, clip_ratio_low=0.3, clip_ratio_high=0.3,
                                       clip_ratio_c=20.0)  # fmt: skip
    assert m["pg_clipfrac"] == 0.0  # .2231 is inside a .3 region


# ------------------------------------------------------------------------------------ Clip-Cov, KL-Cov


def _cov_case(old_first: float):
    # log-probs [-1, -2, -3, -2] (mean -2), A [3, -1, -1, -1] (mean 0):
    # cov = (A - 0) * (lp + 2) = [3, 0, 1, 0]
    log_prob = _leaf([[-1.0, -2.0, -3.0, -2.0]])
    old = torch.tensor([[old_first, -2.0, -3.0, -2.0]])
    return old, log_prob, torch.tensor([[3.0, -1.0, -1.0, -1.0]]), torch.ones(1, 4)


def test_clip_cov_cuts_the_gradient_of_the_high_covariance_token():
    # window (1, 5): only token 0 (cov 3; token 2's cov 1 is not > 1); max(1, int(2e-4 * 4)) = 1 cut.
    # ratio 1 everywhere: PPO's loss -A = [-3, 1, 1, 1] with token 0 cut -> (0 + 1 + 1 + 1) / 4
    old, log_prob, adv, mask = _cov_case(-1.0)
    loss, m = compute_policy_loss_clip_cov(old, log_prob, adv, mask)
    assert loss.item() == pytest.approx(0.75, abs=1e-6)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[0.0, 0.25, 0.25, 0.25]]), atol=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.25)


def test_kl_cov_penalises_the_highest_covariance_token():
    # old log-prob of token 0 is -1.5: log r = [.5, 0, 0, 0]; token 0 (cov 3) gets + coef * |log r|
    #   loss = (-3 e^.5 + .1 * .5 + 1 + 1 + 1) / 4;  ppo_kl (verl's for kl_cov) = mean |log r| = .125
    old, log_prob, adv, mask = _cov_case(-1.5)
    loss, m = compute_policy_loss_kl_cov(old, log_prob, adv, mask, ppo_kl_coef=0.1)
    assert loss.item() == pytest.approx((-3 * math.exp(0.5) + 0.05 + 3) / 4, abs=1e-6)
    loss.backward()
    assert log_prob.grad[0, 0].item() == pytest.approx((-3 * math.exp(0.5) + 0.1) / 4, abs=1e-6)
    assert m["ppo_kl"] == pytest.approx(0.125) and m["pg_clipfrac"] == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------- DRO


def test_dro_is_policy_gradient_with_quadratic_log_ratio_penalty():
    # beta .4: token 0 (A 1, log r .5): -(-1 - .2 * .25) = 1.05; token 1 (A -1, log r 0): -2
    #   gradient -(A - beta log r): [-(1 - .2), -(-1)] = [-.8, 1], / 2 tokens
    log_prob = _leaf([[-1.0, -2.0]])
    loss, m = compute_policy_loss_dro(torch.tensor([[-1.5, -2.0]]), log_prob, torch.tensor([[1.0, -1.0]]),
                                      torch.ones(1, 2), dro_beta=0.4)  # fmt: skip
    assert loss.item() == pytest.approx(-0.475, abs=1e-6)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-0.4, 0.5]]), atol=1e-6)
    assert m["ppo_kl"] == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="dro_beta"):
        compute_policy_loss_dro(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))


def test_gpg_loss_is_the_reinforce_loss():
    assert get_policy_loss("gpg") is compute_policy_loss_reinforce


# ------------------------------------------------------------------------------- importance weights


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "reinforce", "dppo_tv", "dro", "kl_cov"])
def test_every_loss_multiplies_its_per_token_loss_by_the_importance_weights(name):
    # ratio 1, A = [1, 2]: weights [2, 0] leave token 0's term doubled and drop token 1's
    fn = get_policy_loss(name)
    kw = {"dro_beta": 0.1} if name == "dro" else {}
    log_prob = torch.tensor([[-1.0, -2.0]])
    args = (log_prob, log_prob, torch.tensor([[1.0, 2.0]]), torch.ones(1, 2))
    loss_w, _ = fn(*args, rollout_is_weights=torch.tensor([[2.0, 0.0]]), **kw)
    single, _ = fn(log_prob[:, :1], log_prob[:, :1], torch.tensor([[1.0]]), torch.ones(1, 1), **kw)
    # token-mean over 2 tokens of [2 * term_0, 0] = term_0; seq-mean-token-mean (gspo) the same
    assert loss_w.item() == pytest.approx(single.item(), abs=1e-6)


# ------------------------------------------------------------------------------------------ KL kinds


@pytest.mark.parametrize(
    ("kind", "d", "value"),
    [
        ("k3+", 0.5, math.exp(-0.5) + 0.5 - 1),
        ("low_var_kl+", -0.3, math.exp(0.3) - 0.3 - 1),
        ("k1+", 0.5, 0.5),
        ("kl+", -0.2, -0.2),
        ("abs+", -0.3, 0.3),
        ("k2+", 0.4, 0.08),
        ("mse+", 0.4, 0.08),
    ],
)
def test_plus_kl_kinds_have_the_base_value_and_k2s_gradient(kind, d, value):
    # value of the base kind, gradient d (that of d^2 / 2)
    log_prob = _leaf([[d]])
    kl = kl_penalty(log_prob, torch.zeros(1, 1), kind)
    assert kl.item() == pytest.approx(value, abs=1e-6)
    assert torch.equal(kl.detach(), kl_penalty(log_prob.detach(), torch.zeros(1, 1), kind[:-1]))
    kl.sum().backward()
    assert log_prob.grad.item() == pytest.approx(d, abs=1e-6)


def test_k3_without_plus_keeps_its_own_gradient():
    log_prob = _leaf([[0.5]])
    kl_penalty(log_prob, torch.zeros(1, 1), "k3").sum().backward()
    assert log_prob.grad.item() == pytest.approx(1 - math.exp(-0.5), abs=1e-6)  # d(e^-d + d - 1)/dd
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(log_prob, log_prob, "k4+")


# ------------------------------------------------------------------------------------- aggregation


def test_token_sum_sums_every_unmasked_token():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert agg_loss(loss, mask, "token-sum").item() == 7.0


def test_loss_scale_factor_is_the_seq_mean_token_sum_norm_divisor():
    # token sums [3, 4] / 10 -> mean .35 (the width 3 is not used); without the factor / 3
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.35)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(3.5 / 3)
    # with a factor the loss inputs need no padding to a constant width
    assert norm_width("seq-mean-token-sum-norm", 256, None) == 256
    assert norm_width("seq-mean-token-sum-norm", 256, 512) is None
    with pytest.raises(ValueError, match="loss_scale_factor must be > 0"):
        agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=0)


@pytest.mark.parametrize("mode", ["token-sum", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_weights_reassemble_the_mini_batch_loss(mode):
    # the weighted sum of the micro-batches' losses is the mini-batch's loss, token-sum included
    torch.manual_seed(3)
    loss = torch.randn(6, 5)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 1, 3, 4, 2, 5])[:, None]).long()
    mb = Batch(tensors={"response_mask": mask, "loss": loss})
    ubs = [mb.slice(0, 2), mb.slice(2, 5), mb.slice(5, 6)]
    weights = loss_weights(mb, ubs, mode)
    parts = sum(
        w * agg_loss(ub["loss"], ub["response_mask"], mode) for w, ub in zip(weights, ubs, strict=True)
    )
    assert parts.item() == pytest.approx(agg_loss(loss, mask, mode).item(), abs=1e-5)


def test_vanilla_token_sum_gradient_is_minus_advantage_per_token():
    log_prob = _leaf([[-1.0, -2.0, -3.0]])
    loss, _ = compute_policy_loss_vanilla(log_prob.detach(), log_prob, torch.tensor([[1.0, -2.0, 5.0]]),
                                          torch.tensor([[1, 1, 0]]), loss_agg_mode="token-sum")  # fmt: skip
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-1.0, 2.0, 0.0]]))
