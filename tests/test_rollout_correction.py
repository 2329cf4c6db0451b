"""Rollout correction: importance weights and rejection between the rollout engine's log-probs and the
actor's, checked on hand-computed log-ratios, in the bypass_mode loss, in the config loader, and in a
training step whose rollout engine reports log-probs perturbed by a known amount."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import write_train_config

from lucidrl.algos import compute_policy_loss_bypass_mode, rollout_correction
from lucidrl.config import load_config
from lucidrl.config.errors import ConfigError

# log rho = old - rollout: row 0 [log 3, log .5, (masked)], row 1 [log 1.5, log .25, log 1]
RHO = torch.tensor([[3.0, 0.5, 7.0], [1.5, 0.25, 1.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
OLD = ROLLOUT + torch.log(RHO)


def test_token_tis_truncates_at_the_threshold():
    # raw [3, .5 | 1.5, .25, 1] -> TIS at 2: [2, .5 | 1.5, .25, 1]; masked token 0
    w, keep, m = rollout_correction(OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.25, 1.0]]), atol=1e-6)
    assert torch.equal(keep, MASK)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(5.25 / 5, abs=1e-6)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # the 3 was truncated
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)  # .25 < 1/2 (.5 is not)
    # the gap: kl = mean(rollout - old) = -mean(log rho); chi2_token = mean(rho^2) - 1
    log_rho = [math.log(x) for x in (3, 0.5, 1.5, 0.25, 1)]
    assert m["rollout_corr/kl"] == pytest.approx(-sum(log_rho) / 5, abs=1e-6)
    assert m["rollout_corr/chi2_token"] == pytest.approx((9 + 0.25 + 2.25 + 0.0625 + 1) / 5 - 1, abs=1e-5)
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in log_rho) / 5, abs=1e-6)


def test_sequence_is_weights_are_the_product_over_the_response():
    # row 0: 3 * .5 = 1.5 on its 2 tokens; row 1: 1.5 * .25 * 1 = .375 on its 3
    w, _, m = rollout_correction(OLD, ROLLOUT, MASK, rollout_is="sequence", rollout_is_threshold=2.0)
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 0.0], [0.375, 0.375, 0.375]]), atol=1e-6)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((2 * 1.5 + 3 * 0.375) / 5, abs=1e-6)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(1.5, abs=1e-6)  # from the sequences
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 2)  # .375 < 1/2, per sequence


def test_icepop_zeroes_weights_outside_the_bounds_and_batch_normalise_rescales():
    # "0.5_2": 3 and .25 fall outside -> 0; .5, 1.5, 1 kept
    w, _, m = rollout_correction(OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold="0.5_2")
    assert torch.allclose(w, torch.tensor([[0.0, 0.5, 0.0], [1.5, 0.0, 1.0]]), atol=1e-6)
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 5)
    # normalised to mean 1 over the unmasked tokens: TIS weights / 1.05
    w, _, m = rollout_correction(OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_batch_normalize=True)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.25, 1.0]]) / 1.05, atol=1e-6)
    assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.05, abs=1e-6)


def test_token_k1_rejection_keeps_ratios_inside_the_bounds():
    # a single upper bound 2 means [1/2, 2]: rho 3 and .25 are dropped, .5 (the bound) is kept
    w, keep, m = rollout_correction(OLD, ROLLOUT, MASK, rollout_rs="token_k1", rollout_rs_threshold=2.0)
    assert w is None
    assert torch.equal(keep, torch.tensor([[0, 1, 0], [1, 0, 1]]))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0  # each response lost a token
    assert m["rollout_corr/rollout_rs_token_k1_fraction_high"] == pytest.approx(1 / 5)  # -log .25 > log 2
    assert m["rollout_corr/rollout_rs_token_k1_fraction_low"] == pytest.approx(1 / 5)  # -log 3 < -log 2


def test_seq_mean_k3_rejection_drops_whole_responses():
    # k3 = rho - 1 - log rho: row 0 mean (.9014 + .1931) / 2 = .5473; row 1 (.0945 + .6363 + 0) / 3 = .2436
    k3 = [[x - 1 - math.log(x) for x in row] for row in ([3, 0.5], [1.5, 0.25, 1])]
    means = [sum(r) / len(r) for r in k3]
    _, keep, m = rollout_correction(OLD, ROLLOUT, MASK, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.3)
    assert torch.equal(keep, torch.tensor([[0, 0, 0], [1, 1, 1]]))
    assert m["rollout_corr/rollout_rs_seq_mean_k3_max"] == pytest.approx(means[0], abs=1e-6)
    assert m["rollout_corr/rollout_rs_seq_mean_k3_min"] == pytest.approx(means[1], abs=1e-6)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    # two options: a token stays only if both pass (token_k1 at 2 also drops row 1's .25)
    _, keep, _ = rollout_correction(OLD, ROLLOUT, MASK, rollout_rs="seq_mean_k3,token_k1",
                                    rollout_rs_threshold="0.3,2")  # fmt: skip
    assert torch.equal(keep, torch.tensor([[0, 0, 0], [1, 0, 1]]))


def test_unperturbed_log_probs_give_weights_of_one():
    w, keep, m = rollout_correction(ROLLOUT, ROLLOUT, MASK, rollout_is="sequence", rollout_rs="token_k1",
                                    rollout_rs_threshold=1.01)  # fmt: skip
    assert torch.equal(w, MASK.float()) and torch.equal(keep, MASK)
    assert m["rollout_corr/kl"] == 0.0 and m["rollout_corr/chi2_token"] == 0.0
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollout_is": "token", "rollout_is_threshold": "2_1"}, "lower <= upper"),
        ({"rollout_is": "token", "rollout_is_threshold": "two"}, "not a number"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "unknown option.*token_k4"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_0.2"}, "one upper bound"),
        ({"rollout_rs": "token_k2,seq_sum_k3", "rollout_rs_threshold": "1,2,3"}, "3 thresholds for 2"),
        ({"rollout_rs": "token_k1"}, "must be set"),
    ],
)
def test_bad_thresholds_and_options_are_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rollout_correction(OLD, ROLLOUT, MASK, **kwargs)


# ------------------------------------------------------------------------------------- bypass_mode


def test_bypass_reinforce_weights_the_policy_gradient_and_drops_rejected_tokens():
    # current / rollout = [3, .5]; TIS at 2 -> w [2, .5]; loss -(2 lp0 + .5 lp1) / 2, gradient [-1, -.25]
    rollout = torch.tensor([[-1.0, -2.0]])
    log_prob = (rollout + torch.log(torch.tensor([[3.0, 0.5]]))).requires_grad_(True)
    args = (rollout, log_prob, torch.ones(1, 2), torch.ones(1, 2))
    loss, m = compute_policy_loss_bypass_mode(*args, loss_type="reinforce", rollout_is="token")
    assert loss.item() == pytest.approx(
        -(2 * log_prob[0, 0].item() + 0.5 * log_prob[0, 1].item()) / 2, abs=1e-6
    )
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-1.0, -0.25]]), atol=1e-6)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.25, abs=1e-6)
    # with token_k1 rejection at 2 (ratios in [1/2, 2]) the 3 drops out: gradient [0, -.25]
    log_prob.grad = None
    loss, m = compute_policy_loss_bypass_mode(*args, loss_type="reinforce", rollout_is="token",
                                              rollout_rs="token_k1", rollout_rs_threshold=2.0)  # fmt: skip
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[0.0, -0.25]]), atol=1e-6)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)


def test_bypass_ppo_clip_is_ppo_against_the_rollout_policy_without_weights():
    # ratio [3, .5], clip [.8, 1.2], A = 1: token 0 on the clipped branch (-1.2, no gradient), token 1
    # unclipped (-.5, gradient -.5); the importance weights are not applied on top of the ratio
    rollout = torch.tensor([[-1.0, -2.0]])
    log_prob = (rollout + torch.log(torch.tensor([[3.0, 0.5]]))).requires_grad_(True)
    loss, m = compute_policy_loss_bypass_mode(rollout, log_prob, torch.ones(1, 2), torch.ones(1, 2),
                                              rollout_is="token")  # fmt: skip
    assert loss.item() == pytest.approx(-0.85, abs=1e-6)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[0.0, -0.25]]), atol=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------- config


BASE = ["model.path=unused", "data.train_files=[unused.parquet]", "rollout.n=4"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=3_1"],
         "rollout_is_threshold='3_1'.*lower <= upper"),
        (["algorithm.rollout_correction.rollout_rs=seq_mean_k4", "algorithm.rollout_correction.rollout_rs_threshold=1"],
         "rollout_rs='seq_mean_k4'.*unknown option"),
        (["algorithm.rollout_correction.rollout_rs=token_k1"], "rollout_rs_threshold must be set"),
        (["algorithm.rollout_correction.rollout_rs_threshold=2"], "read only with algorithm.rollout_correction.rollout_rs"),
        (["algorithm.rollout_correction.rollout_is_batch_normalize=true"], "rollout_is=null"),
        (["actor.policy_loss=bypass_mode"], "bypass_mode=true"),
        (["algorithm.rollout_correction.loss_type=reinforce"], "read only by actor.policy_loss=bypass_mode"),
        (["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"],
         "set actor.policy_loss=bypass_mode"),
        (["algorithm.rollout_correction.bypass_mode=true", "algorithm.adv_estimator=optimal_token_baseline"],
         "needs the actor's old-log-prob pass"),
        (["algorithm.rollout_correction.rollout_is=tokens"], "must be 'token' | 'sequence' | null, got 'tokens'"),
    ],
)  # fmt: skip
def test_config_refuses_what_rollout_correction_cannot_mean(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, *overrides])


def test_config_accepts_verl_style_thresholds():
    cfg = load_config(None, [*BASE, "algorithm.rollout_correction.rollout_is=sequence",
                             "algorithm.rollout_correction.rollout_is_threshold=0.5_5.0",
                             "algorithm.rollout_correction.rollout_rs=token_k1,seq_max_k2",
                             "algorithm.rollout_correction.rollout_rs_threshold=0.9_1.1,0.05"])  # fmt: skip
    rc = cfg.algorithm.rollout_correction
    assert rc.rollout_is_threshold == "0.5_5.0" and rc.rollout_rs_threshold == "0.9_1.1,0.05"
    assert (
        load_config(
            None, [*BASE, "algorithm.rollout_correction.rollout_is_threshold=3"]
        ).algorithm.rollout_correction.rollout_is_threshold
        == 3.0
    )


# -------------------------------------------------------------------- a training step, engine perturbed

# the double's perturbation: rollout log-probs + delta, delta = -log 3 on even positions (rho ~ 3) and
# -log .8 on odd ones (rho ~ .8); the engine and the actor otherwise agree to ~1e-6 (float32)
RHO_EVEN, RHO_ODD = 3.0, 0.8


def _perturbing_engine(monkeypatch, scale: float, masks: list[torch.Tensor]) -> None:
    """Wrap the hf engine: its rollout_log_probs come back shifted by scale * delta, and the response
    masks it produced are recorded."""
    from lucidrl.workers.rollout.hf_engine import HFRollout

    generate = HFRollout.generate

    def perturbed(self, batch, params):
        out = generate(self, batch, params)
        mask = out["response_mask"]
        even = (torch.arange(mask.shape[1]) % 2 == 0).to(mask.device)
        delta = torch.where(even, -math.log(RHO_EVEN), -math.log(RHO_ODD)) * scale
        out.set("rollout_log_probs", out["rollout_log_probs"] + delta * mask)
        masks.append(mask.clone())
        return out

    monkeypatch.setattr(HFRollout, "generate", perturbed)


def _trainer(tmp_path, kk_data, tiny_model, overrides: list[str]):
    from lucidrl.trainer.ppo import PPOTrainer

    tmp_path.mkdir(parents=True, exist_ok=True)
    config = write_train_config(
        tmp_path, kk_data, tiny_model,
        data={"val_files": [], "max_response_length": 10},
        actor={"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 8, "use_kl_loss": False},
    )  # fmt: skip
    trainer = PPOTrainer(load_config(str(config), overrides))
    trainer.global_step = 1  # as fit() counts it before its first step (step 0 would not update the actor)
    return trainer


@pytest.mark.slow
def test_a_step_with_a_perturbed_engine_weights_and_rejects_by_the_known_gap(
    tmp_path, kk_data, tiny_model, monkeypatch
):
    """Decoupled mode: token TIS at 2 and token_k1 rejection at 2.5 ([.4, 2.5]) against an engine whose
    log-probs are off by a known amount; the step's weights, mask and metrics are the hand-computed ones,
    and the estimator sees only the kept tokens."""
    import lucidrl.trainer.ppo as ppo

    masks: list[torch.Tensor] = []
    _perturbing_engine(monkeypatch, 1.0, masks)
    seen = []
    compute = ppo.compute_advantage
    monkeypatch.setattr(ppo, "compute_advantage", lambda b, c: seen.append((b, out := compute(b, c))) or out)
    trainer = _trainer(tmp_path, kk_data, tiny_model, [
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=2.5",
    ])  # fmt: skip
    assert not trainer.on_policy  # the correction needs the actor's old log-probs: the pass runs
    metrics = trainer.step()
    (mask,) = masks
    even = (torch.arange(mask.shape[1]) % 2 == 0) & mask.bool()
    odd = ~even & mask.bool()
    n_even, n_odd, n = int(even.sum()), int(odd.sum()), int(mask.sum())
    assert n_even and n_odd
    # weights: rho 3 truncated to 2 on even tokens, .8 on odd ones
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
        (2 * n_even + RHO_ODD * n_odd) / n, abs=1e-4
    )
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0, abs=1e-4)
    assert metrics["rollout_corr/rollout_is_min"] == pytest.approx(RHO_ODD, abs=1e-4)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(n_even / n)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0
    # rejection: every even token (rho 3 > 2.5); every response has one at position 0
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(n_even / n)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0
    # the gap itself: kl = mean(rollout - actor) = mean(delta)
    kl = (n_even * -math.log(RHO_EVEN) + n_odd * -math.log(RHO_ODD)) / n
    assert metrics["rollout_corr/kl"] == pytest.approx(kl, abs=1e-4)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(math.log(RHO_EVEN), abs=1e-4)
    # what the estimator and the update got: the weights, and advantages only on kept tokens
    ((batch, adv),) = seen
    expected_w = torch.where(even, 2.0, torch.where(odd, RHO_ODD, 0.0))
    assert torch.allclose(batch["rollout_is_weights"], expected_w, atol=1e-4)
    assert torch.equal(batch["loss_mask"], (odd).to(batch["loss_mask"].dtype))
    assert torch.equal(batch["response_mask"], mask)  # the forwards still attend to every token
    assert torch.equal(adv["advantages"][even], torch.zeros(n_even))
    assert math.isfinite(metrics["actor/pg_loss"])


@pytest.mark.slow
def test_weights_reach_the_loss_and_an_unperturbed_engine_gives_weights_of_one(
    tmp_path, kk_data, tiny_model, monkeypatch
):
    """The perturbation tripled (rho ~ 27 on even tokens, ~ .512 on odd ones) against IcePop bounds
    [.6, 2]: every weight is 0, so the policy loss is exactly 0. Then the same run unperturbed: weights
    1, nothing rejected."""
    masks: list[torch.Tensor] = []
    _perturbing_engine(monkeypatch, 3.0, masks)
    overrides = [
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=0.6_2",
        "algorithm.rollout_correction.rollout_rs=seq_max_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=100",
    ]
    metrics = _trainer(tmp_path / "a", kk_data, tiny_model, overrides).step()
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(1.0)
    assert metrics["rollout_corr/rollout_is_mean"] == 0.0
    assert metrics["actor/pg_loss"] == 0.0  # every token's loss times a weight of 0
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0  # k3 of rho 27 is 22.7 < 100

    monkeypatch.undo()
    metrics = _trainer(tmp_path / "b", kk_data, tiny_model, overrides).step()
    for key in ("rollout_is_mean", "rollout_is_max", "rollout_is_min"):
        assert metrics[f"rollout_corr/{key}"] == pytest.approx(1.0, abs=1e-4), key
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == 0.0
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["actor/pg_loss"] != 0.0


@pytest.mark.slow
def test_bypass_mode_step_compares_the_update_with_the_perturbed_engine(
    tmp_path, kk_data, tiny_model, monkeypatch
):
    """Bypass mode: no old-log-prob pass; the bypass_mode loss computes the weights from the update's
    own forwards against the engine's log-probs (one mini-batch: every forward before the optimizer step)."""
    masks: list[torch.Tensor] = []
    _perturbing_engine(monkeypatch, 1.0, masks)
    trainer = _trainer(tmp_path, kk_data, tiny_model, [
        "algorithm.rollout_correction.bypass_mode=true",
        "actor.policy_loss=bypass_mode",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=token",
    ])  # fmt: skip
    metrics = trainer.step()
    assert "timing_s/old_log_prob" not in metrics and "rollout/logprob_diff_mean" not in metrics
    (mask,) = masks
    even = (torch.arange(mask.shape[1]) % 2 == 0) & mask.bool()
    n_even, n = int(even.sum()), int(mask.sum())
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
        (2 * n_even + RHO_ODD * (n - n_even)) / n, abs=1e-4
    )
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0, abs=1e-4)
    assert metrics["rollout_corr/rollout_is_min"] == pytest.approx(RHO_ODD, abs=1e-4)


def test_bypass_ppo_clip_metrics_count_the_kept_tokens_only():
    """verl passes the rejection mask to the PPO loss as its response mask, so pg_clipfrac, ppo_kl and
    pg_clipfrac_lower are means over the kept tokens; they were over every response token."""
    # ratios [3, 1.1, 5, 1], advantages [1, 1, -1, 1]: token 0 on PPO's clipped branch (A > 0, r > 1.2),
    # token 2 dual-clipped (A < 0, r > clip_ratio_c = 3), tokens 1 and 3 inside the clip range
    rollout = torch.tensor([[-1.0, -2.0, -1.5, -0.5]])
    ratios = torch.tensor([[3.0, 1.1, 5.0, 1.0]])
    log_prob = rollout + torch.log(ratios)
    advantages = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    mask = torch.ones(1, 4)
    # token_k1 keeps |log r| <= log 2: tokens 1 and 3 (r 1.1 and 1); tokens 0 and 2 (r 3 and 5) are rejected
    _, m = compute_policy_loss_bypass_mode(rollout, log_prob, advantages, mask, rollout_rs="token_k1",
                                           rollout_rs_threshold=2.0)  # fmt: skip
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    # over the kept tokens nothing is clipped, and ppo_kl is the mean of -log r over r = 1.1 and 1
    assert m["pg_clipfrac"] == 0.0 and m["pg_clipfrac_lower"] == 0.0
    assert m["ppo_kl"] == pytest.approx(-math.log(1.1) / 2, abs=1e-6)
    # the same batch without rejection counts all four (what the rejected run reported before)
    _, every = compute_policy_loss_bypass_mode(rollout, log_prob, advantages, mask)
    assert every["pg_clipfrac"] == pytest.approx(0.25) and every["pg_clipfrac_lower"] == pytest.approx(0.25)
    assert every["ppo_kl"] == pytest.approx(-math.log(3.0 * 1.1 * 5.0) / 4, abs=1e-6)
