"""Per-token KL estimators between the policy and the reference model.

Used either as a reward penalty (`-beta * kl` added to token rewards, see `apply_kl_penalty`, with
beta from a fixed or adaptive controller) or as a loss term (`kl_loss`).
Estimators from J. Schulman, "Approximating KL Divergence": http://joschu.net/blog/kl-approx.html
"""

from __future__ import annotations

import math

import torch

from lucidrl.algos.aggregation import masked_mean

_BASE_KL_KINDS: tuple[str, ...] = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
# "<kind>+": the value of <kind>, the gradient of k2 (verl 0.9.1's straight-through kinds)
KL_PENALTY_KINDS: tuple[str, ...] = _BASE_KL_KINDS + tuple(f"{k}+" for k in _BASE_KL_KINDS)


def _kl_value(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("k1", "kl"):
        return log_prob - ref_log_prob
    if kind == "abs":
        return (log_prob - ref_log_prob).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind in ("k3", "low_var_kl"):
        log_ratio = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"Unknown KL penalty kind {kind!r}; valid kinds: {list(KL_PENALTY_KINDS)}")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens' log-probs.

    With d = log_prob - ref_log_prob:
        "k1" / "kl":         d                          unbiased, high variance, can be negative.
        "abs":               |d|
        "k2" / "mse":        0.5 * d**2                 biased, low variance.
        "k3" / "low_var_kl": exp(-d) + d - 1            unbiased, low variance, >= 0; clamped to
                             [-10, 10] (and -d to [-20, 20] before exp) so one outlier token
                             cannot dominate the loss or overflow.
        "<kind>+" (k1+, abs+, k3+, low_var_kl+, ...): the value of <kind> with the gradient of k2,
                             0.5 * d**2 (straight through: k2 - sg[k2] + sg[<kind>]). As a loss term, k1's
                             and k3's expected gradients are not KL's gradient; k2's is, so "+" keeps the
                             reported value of the estimator and descends on the right gradient.
                             "k2+" / "mse+" are k2 itself.

    http://joschu.net/blog/kl-approx.html; the "+" kinds are verl 0.9.1's.

    Args:
        log_prob: (bs, response_len) log-probs of the sampled tokens under the policy.
        ref_log_prob: (bs, response_len) same tokens under the reference model.
        kind: one of KL_PENALTY_KINDS.

    Returns:
        (bs, response_len) per-token KL estimate; aggregate with agg_loss / masked_mean.
    """
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"kl_penalty: log_prob shape {tuple(log_prob.shape)} != ref_log_prob shape "
            f"{tuple(ref_log_prob.shape)}"
        )
    if kind not in KL_PENALTY_KINDS:
        raise ValueError(f"Unknown KL penalty kind {kind!r}; valid kinds: {list(KL_PENALTY_KINDS)}")
    if not kind.endswith("+"):
        return _kl_value(log_prob, ref_log_prob, kind)
    value = _kl_value(log_prob, ref_log_prob, kind[:-1])
    k2 = 0.5 * (log_prob - ref_log_prob).square()
    # value exactly: k2 - k2 is 0 in floating point, so the sum is `value` to the last bit
    return k2 - k2.detach() + value.detach()


KL_CONTROLLER_KINDS: tuple[str, ...] = ("fixed", "adaptive")


class FixedKLController:
    """A constant KL-penalty coefficient; `update` does nothing (the "fixed" kind)."""

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0.0:
            raise ValueError(f"kl_coef must be >= 0 (algorithm.kl_ctrl.kl_coef), got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op; the signature matches AdaptiveKLController.update."""


class AdaptiveKLController:
    """KL-penalty coefficient steered towards a target KL (Ziegler et al. 2019, section 2.2).

    After each batch: e = clip(current_kl / target_kl - 1, -0.2, 0.2) and
    value <- value * (1 + e * n_steps / horizon), so the coefficient grows while the measured KL is
    above target and shrinks below it, by at most 20% per `horizon` samples.

    https://arxiv.org/abs/1909.08593
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if not init_kl_coef >= 0.0:
            raise ValueError(f"init_kl_coef must be >= 0 (algorithm.kl_ctrl.kl_coef), got {init_kl_coef}")
        if not target_kl > 0.0:
            raise ValueError(f"target_kl must be > 0 (algorithm.kl_ctrl.target_kl), got {target_kl}")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0 (algorithm.kl_ctrl.horizon, in samples), got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move `value` towards the target after a batch of `n_steps` samples with mean KL `current_kl`."""
        if not math.isfinite(current_kl):
            # One NaN would make the coefficient NaN for the rest of the run.
            raise ValueError(f"AdaptiveKLController.update: current_kl must be finite, got {current_kl}")
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def make_kl_controller(
    kind: str,
    kl_coef: float,
    target_kl: float | None = None,
    horizon: int | None = None,
) -> FixedKLController | AdaptiveKLController:
    """The KL-in-reward coefficient controller named by `kind` ("fixed" or "adaptive").

    Args:
        kind: one of KL_CONTROLLER_KINDS.
        kl_coef: the (initial) coefficient.
        target_kl, horizon: required for "adaptive", ignored for "fixed".
    """
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError(
                f"the adaptive KL controller needs target_kl and horizon, got target_kl={target_kl}, "
                f"horizon={horizon}; set algorithm.kl_ctrl.target_kl and algorithm.kl_ctrl.horizon"
            )
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"Unknown KL controller kind {kind!r}; valid kinds: {list(KL_CONTROLLER_KINDS)}")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Fold a KL penalty into the token rewards: rewards = scores - kl_coef * kl, on unmasked tokens.

    kl = kl_penalty(log_prob, ref_log_prob, kind) * response_mask. The reported KL is verl's: the mean
    over sequences of each sequence's masked token mean (an empty sequence counts as 0). Feed it to a
    controller afterwards: `ctrl.update(metrics["actor/reward_kl_penalty"], n_steps=bs)` and pass
    `ctrl.value` as kl_coef next step (verl does both inside its apply_kl_penalty).

    Args:
        token_level_scores: (bs, response_len) rewards from the reward function.
        log_prob: (bs, response_len) rollout policy log-probs (old_log_probs).
        ref_log_prob: (bs, response_len) reference model log-probs.
        response_mask: (bs, response_len) 0/1.
        kl_coef: penalty coefficient (a controller's .value).
        kind: one of KL_PENALTY_KINDS (verl's default for the reward penalty is "kl", i.e. k1; a "+"
            kind's value is its base kind's, no gradient flows here).

    Returns:
        token_level_rewards: (bs, response_len), computed without grad.
        metrics: actor/reward_kl_penalty (the KL above), actor/reward_kl_penalty_coeff (kl_coef).
    """
    if token_level_scores.shape != response_mask.shape:
        raise ValueError(
            f"apply_kl_penalty: token_level_scores {tuple(token_level_scores.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (bs, response_len)"
        )
    with torch.no_grad():
        valid = response_mask.bool()
        kld = torch.where(valid, kl_penalty(log_prob, ref_log_prob, kind), 0.0)
        token_level_rewards = token_level_scores - kl_coef * kld
        current_kl = masked_mean(kld, response_mask, dim=-1).mean().item()
    return token_level_rewards, {
        "actor/reward_kl_penalty": current_kl,
        "actor/reward_kl_penalty_coeff": float(kl_coef),
    }
