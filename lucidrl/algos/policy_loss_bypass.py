"""verl's `bypass_mode` policy loss: rollout correction inside the loss, when the rollout engine's
log-probs stand in for the old ones (algorithm.rollout_correction.bypass_mode=true, no old-log-prob pass).

Two policies instead of three: the update compares the current policy directly with the rollout
engine's. The importance weights and rejection mask are computed per micro-batch from the current
forward (pi_theta / pi_rollout), and the loss is PPO-clip against the rollout policy (`loss_type=ppo_clip`,
where the ratio already is the importance weight, so no weight is applied) or REINFORCE with the
importance weights (`loss_type=reinforce`).
"""

from __future__ import annotations

import torch

from lucidrl.algos.aggregation import agg_loss, masked_mean
from lucidrl.algos.policy_loss import check_same_shape, compute_policy_loss_vanilla
from lucidrl.algos.registry import register_policy_loss
from lucidrl.algos.rollout_correction import rollout_correction

BYPASS_LOSS_TYPES: tuple[str, ...] = ("ppo_clip", "reinforce")


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_type: str = "ppo_clip",
    rollout_is: str | None = None,
    rollout_is_threshold: float | str | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss against the rollout engine's log-probs, with verl's rollout correction inside.

    `old_log_prob` is the rollout engine's (bypass mode). With w the importance weights of the current
    log-probs against it (`rollout_is`, detached) and keep the rejection mask (`rollout_rs`):
        ppo_clip:  PPO's clipped loss with ratio pi_theta / pi_rollout (w is not applied: the ratio is
                   the importance weight, and its clip bounds it)
        reinforce: loss_t = -w_t * A_t * log_prob_t (no ratio, no clip; w = 1 without rollout_is)
    Rejected tokens contribute 0 to the loss; the aggregation's denominators still count them (as
    verl's global token and sequence counts do; under seq-mean-token-mean verl averages a sequence
    over its kept tokens only). The weights are formed per micro-batch, and with
    `rollout_is_batch_normalize` normalised over the micro-batch on this rank.

    Rollout correction: https://richardli.xyz/rl-collapse.

    Args:
        old_log_prob: (bs, response_len) the rollout engine's log-probs.
        log_prob: (bs, response_len) current policy (carries the gradient).
        advantages, response_mask: (bs, response_len).
        loss_type: "ppo_clip" or "reinforce" (algorithm.rollout_correction.loss_type).
        rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold:
            algorithm.rollout_correction.*, see rollout_correction.rollout_correction.
        clip_ratio_low, clip_ratio_high, clip_ratio_c: PPO's, for ppo_clip.
        loss_agg_mode, loss_scale_factor: see `agg_loss`.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac, pg_clipfrac_lower (0.0 for reinforce), ppo_kl (token mean of
            rollout - current log-prob), each over the kept tokens (rejected ones left out, as verl's
            are: its loss gets the rejection mask as its response mask), and the rollout_corr/* metrics
            of the micro-batch.
    """
    if loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(
            f"algorithm.rollout_correction.loss_type must be one of {BYPASS_LOSS_TYPES}, got {loss_type!r}"
        )
    check_same_shape(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask
    )
    weights, keep, corr_metrics = rollout_correction(
        log_prob.detach(), old_log_prob, response_mask,
        rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold,
        rollout_is_batch_normalize=rollout_is_batch_normalize, rollout_rs=rollout_rs,
        rollout_rs_threshold=rollout_rs_threshold,
    )  # fmt: skip
    kept = keep.to(log_prob.dtype)
    if loss_type == "ppo_clip":
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, response_mask,
            clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
            loss_agg_mode=loss_agg_mode, loss_scale_factor=loss_scale_factor, rollout_is_weights=kept,
            metrics_mask=keep,
        )  # fmt: skip
    else:
        w = kept if weights is None else weights * kept
        pg_loss = agg_loss(-w * advantages * log_prob, response_mask, loss_agg_mode, loss_scale_factor)
        with torch.no_grad():
            metrics = {
                "pg_clipfrac": 0.0,
                "pg_clipfrac_lower": 0.0,
                "ppo_kl": masked_mean(old_log_prob - log_prob, keep).item(),
            }
    return pg_loss, {**metrics, **corr_metrics}
