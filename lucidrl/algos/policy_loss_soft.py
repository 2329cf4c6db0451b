"""Policy losses that never cut a token's gradient off at a clip boundary: CISPO bounds a stop-gradient
importance weight, REINFORCE / GPG use no ratio at all, SAPO replaces the clip by a smooth gate.

Same interface as policy_loss.py: registered by name, `(loss, metrics)`, the keyword arguments the
signature names.
"""

from __future__ import annotations

import torch

from lucidrl.algos.aggregation import agg_loss, masked_mean
from lucidrl.algos.policy_loss import check_clip_range, check_same_shape, weighted
from lucidrl.algos.registry import register_policy_loss


@register_policy_loss("cispo", zero_advantage_inert=True)
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance weight; no token loses its gradient.

    With r_t = exp(log_prob_t - old_log_prob_t) (log-ratio clamped to [-20, 20]):
        w_t    = sg[clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)]
        loss_t = -w_t * A_t * log_prob_t                 gradient: -w_t * A_t * grad log pi(y_t)
    PPO zeroes the gradient of a clipped token; CISPO keeps it and only bounds its weight, which
    matters for rare "fork" tokens (e.g. "Wait", "However") that PPO clips after one update.
    MiniMax-M1 sets no lower bound (a large epsilon_low) and tunes only the upper one: pass
    clip_ratio_low >= 1 (actor.clip_ratio_low=1.0) for that. No dual clip: `clip_ratio_c` is unused.

    CISPO (MiniMax-M1, section 3.1): https://arxiv.org/abs/2506.13585.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len), as for PPO.
        clip_ratio_low: weight clipped below at 1 - it; >= 0, and >= 1 means no lower bound.
        clip_ratio_high: weight clipped above at 1 + it; >= 0.
        clip_ratio_c: unused.
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) rollout-correction weights multiplying the per-token loss,
            or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (fraction of unmasked tokens whose weight was clipped, either side, as
            in verl), pg_clipfrac_lower (always 0.0), ppo_kl (token mean of old_log_prob - log_prob).
    """
    del clip_ratio_c
    check_clip_range(clip_ratio_low, clip_ratio_high, low_below_one=False)
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
    )
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio.detach())
    weight = torch.clamp(ratio, min=1.0 - clip_ratio_low, max=1.0 + clip_ratio_high)
    pg_losses = -weight * advantages * log_prob
    pg_loss = agg_loss(
        weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, loss_scale_factor
    )

    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((weight != ratio).float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("reinforce", zero_advantage_inert=True)
@register_policy_loss("gpg", zero_advantage_inert=True)
def compute_policy_loss_reinforce(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain on-policy policy gradient (REINFORCE): loss_t = -A_t * log_prob_t, no ratio, no clip.

    The gradient is -A_t * grad log pi(y_t), which is unbiased only for samples from the current
    policy: use it with one update per rollout (actor.ppo_epochs=1 and one mini-batch), otherwise
    prefer a ratio-based loss. `old_log_prob` only feeds the ppo_kl metric (how off-policy the
    update has become); the clip arguments are accepted and unused.

    Also registered as `gpg`, verl's name for the same loss in GPG (https://arxiv.org/abs/2504.02546),
    paired there with `adv_estimator=gpg`.

    REINFORCE: Williams 1992, https://doi.org/10.1007/BF00992696. With an RLOO or GRPO
    baseline this is the objective of https://arxiv.org/abs/2402.14740.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len).
        clip_ratio_low, clip_ratio_high, clip_ratio_c: unused.
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) rollout-correction weights multiplying the per-token loss,
            or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac 0.0, pg_clipfrac_lower 0.0, ppo_kl (token mean of old_log_prob - log_prob).
    """
    del clip_ratio_low, clip_ratio_high, clip_ratio_c
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
    )
    pg_loss = agg_loss(
        weighted(-advantages * log_prob, rollout_is_weights), response_mask, loss_agg_mode, loss_scale_factor
    )
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": 0.0,
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("sapo", loss_agg_mode="seq-mean-token-mean", zero_advantage_inert=True)
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: str = "seq-mean-token-mean",
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: a smooth, temperature-controlled gate on the ratio instead of PPO's hard clip.

    With r_t = exp(log_prob_t - old_log_prob_t) (log-ratio clamped to [-20, 20]) and
    tau_t = tau_pos where A_t > 0, tau_neg otherwise:
        f(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau
        loss_t    = -f(r_t, tau_t) * A_t,  aggregated per sequence (seq-mean-token-mean)
    At r = 1 the gradient is the policy gradient (f'(1) = 1); away from 1 it fades smoothly
    (f'(r) = 4 sigmoid'(tau (r - 1))), faster for larger tau, instead of dropping to 0 at a clip
    boundary. tau_neg > tau_pos damps negative-advantage updates more, which the paper finds steadier.

    The loss always aggregates seq-mean-token-mean, as verl 0.9.1's; the config loader asks for
    actor.loss_agg_mode=seq-mean-token-mean with it so the entropy and KL terms aggregate alike.

    SAPO: https://arxiv.org/abs/2511.20347.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len), as for PPO.
        tau_pos, tau_neg: > 0, the gate temperatures for positive and other advantages (actor.tau_pos,
            actor.tau_neg, verl's keys and defaults).
        loss_agg_mode: must be seq-mean-token-mean.
        loss_scale_factor: unused (only seq-mean-token-sum-norm reads it).
        rollout_is_weights: (bs, response_len) or None, multiplying the per-token loss.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac and pg_clipfrac_lower 0.0 (nothing is clipped), ppo_kl.
    """
    if loss_agg_mode != "seq-mean-token-mean":
        raise ValueError(
            f"the sapo policy loss aggregates seq-mean-token-mean, got loss_agg_mode={loss_agg_mode!r}; set "
            "actor.loss_agg_mode=seq-mean-token-mean"
        )
    for name, tau in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
        if not tau > 0:
            raise ValueError(f"{name} must be > 0 (the sapo gate's temperature, actor.{name}), got {tau}")
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
    )
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    taus = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = weighted(-gates * advantages, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": 0.0,
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics
