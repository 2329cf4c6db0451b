"""Policy losses that keep an update close to the sampling policy by masking or penalising tokens instead
of clipping the ratio: DPPO (a trust region on the token's probability, by total variation or binary
KL), Clip-Cov and KL-Cov (the few tokens whose advantage and log-prob covary most, which drive entropy
collapse, are cut off or penalised), and DRO (a quadratic penalty on the log-ratio).

Same interface as policy_loss.py: registered by name, `(loss, metrics)`, the keyword arguments the
signature names.
"""

from __future__ import annotations

import torch

from lucidrl.algos.aggregation import agg_loss, masked_mean
from lucidrl.algos.policy_loss import check_same_shape, weighted
from lucidrl.algos.registry import register_policy_loss


def _dppo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    inside: torch.Tensor,
    clip_ratio_c: float,
    loss_agg_mode: str,
    loss_scale_factor: float | None,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO's loss given the trust-region mask `inside` (bs, R): -A * sg[min(r, c)] * log_prob on the
    tokens inside, 0 outside."""
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    # truncated importance sampling instead of a dual clip (the paper's section 5.4)
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    keep = inside.detach().to(log_prob.dtype)
    pg_losses = weighted(-advantages * truncated * log_prob * keep, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(1.0 - keep, response_mask).item(),
            "pg_clipfrac_lower": masked_mean(
                (ratio > clip_ratio_c).to(keep.dtype) * keep, response_mask
            ).item(),
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics


def _check_dppo(clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float, name: str) -> None:
    for key, value in (("clip_ratio_low", clip_ratio_low), ("clip_ratio_high", clip_ratio_high)):
        if not value >= 0:
            raise ValueError(f"{key} must be >= 0 ({name}'s divergence threshold, actor.{key}), got {value}")
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"clip_ratio_c must be > 1 ({name} truncates the importance ratio at it, actor.clip_ratio_c), "
            f"got {clip_ratio_c}"
        )


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
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
    """DPPO-Binary-TV: a token leaves the update when its probability moved too far, in the direction
    its advantage pushes it (total variation of the token's binary distribution).

    With p = exp(log_prob), p_old = exp(old_log_prob), r = p / p_old (log-ratio clamped to ±20):
        inside_t = p - p_old <= clip_ratio_high   where A_t > 0
                   p - p_old >= -clip_ratio_low   otherwise
        loss_t   = -A_t * sg[min(r_t, clip_ratio_c)] * log_prob_t   on inside tokens, 0 outside
    The gradient is the importance-weighted policy gradient, truncated at clip_ratio_c instead of a
    dual clip; the paper recommends a large truncation (e.g. actor.clip_ratio_c=20). verl reads the
    truncation from actor.clip_ratio_c as well (default 3.0), and the thresholds from the clip ratios:
    here they are probability differences, not ratio offsets.

    DPPO: https://arxiv.org/abs/2602.04879.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len), as for PPO.
        clip_ratio_low, clip_ratio_high: >= 0, how far p may fall / rise (actor.clip_ratio_low/high).
        clip_ratio_c: > 1, the importance ratio's truncation.
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (share of unmasked tokens outside the trust region), pg_clipfrac_lower
            (share inside it whose ratio was truncated), ppo_kl.
    """
    _check_dppo(clip_ratio_low, clip_ratio_high, clip_ratio_c, "dppo_tv")
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask, rollout_is_weights=rollout_is_weights)  # fmt: skip
    moved = torch.exp(log_prob) - torch.exp(old_log_prob)
    inside = torch.where(advantages > 0, moved <= clip_ratio_high, moved >= -clip_ratio_low)
    return _dppo(old_log_prob, log_prob, advantages, response_mask, inside, clip_ratio_c, loss_agg_mode,
                 loss_scale_factor, rollout_is_weights)  # fmt: skip


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
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
    """DPPO-Binary-KL: as `dppo_tv`, with the trust region measured by the KL of the token's binary
    distribution (the token, or anything else):

        KL_t     = p_old * (log p_old - log p) + (1 - p_old) * log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        inside_t = KL_t <= clip_ratio_high or p <= p_old    where A_t > 0
                   KL_t <= clip_ratio_low  or p >= p_old    otherwise
        loss_t   = -A_t * sg[min(r_t, clip_ratio_c)] * log_prob_t   on inside tokens, 0 outside
    A token moved against its advantage's push is always inside (the update will pull it back).

    DPPO: https://arxiv.org/abs/2602.04879.

    Args and returns: as `compute_policy_loss_dppo_tv`; the clip ratios are KL thresholds here.
    """
    _check_dppo(clip_ratio_low, clip_ratio_high, clip_ratio_c, "dppo_kl")
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask, rollout_is_weights=rollout_is_weights)  # fmt: skip
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log(
        (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
    )
    inside = torch.where(
        advantages > 0,
        (binary_kl <= clip_ratio_high) | (p <= p_old),
        (binary_kl <= clip_ratio_low) | (p >= p_old),
    )
    return _dppo(old_log_prob, log_prob, advantages, response_mask, inside, clip_ratio_c, loss_agg_mode,
                 loss_scale_factor, rollout_is_weights)  # fmt: skip


def _centred_product(advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(bs, R) (A - mean A) * (log_prob - mean log_prob), means over the unmasked tokens, no grad."""
    a, lp = advantages.detach(), log_prob.detach()
    return (a - masked_mean(a, valid)) * (lp - masked_mean(lp, valid))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: PPO's clipped loss, with the gradient of a few high-covariance tokens cut off.

    Entropy collapses through tokens whose log-prob and advantage covary strongly (a confident token
    with a high advantage gets more confident). Per token, over the unmasked tokens of the micro-batch:
        cov_t = (A_t - mean A) * (log_prob_t - mean log_prob)
    Among the unmasked tokens PPO did not clip already with clip_cov_lb < cov_t < clip_cov_ub,
    max(1, int(clip_cov_ratio * unmasked tokens)) are drawn at random (torch's RNG) and their loss is
    set to 0 (no gradient); every other token gets PPO's max(-A r, -A clip(r, 1 - low, 1 + high)). The
    ratio is not clamped (as in verl).

    The Entropy Mechanism of RL for Reasoning LMs: https://arxiv.org/abs/2505.22617.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len), as for PPO.
        clip_ratio_low, clip_ratio_high: PPO's clip range.
        clip_cov_ratio: > 0, the share of unmasked tokens cut off at most (actor.clip_cov_ratio).
        clip_cov_lb, clip_cov_ub: the covariance window candidates are drawn from (actor.clip_cov_lb/ub).
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (share of unmasked tokens cut off by the covariance rule), pg_clipfrac_lower
            0.0, ppo_kl.
    """
    if not clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_ratio must be > 0 (actor.clip_cov_ratio), got {clip_cov_ratio}")
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask, rollout_is_weights=rollout_is_weights)  # fmt: skip
    valid = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    with torch.no_grad():
        cov = _centred_product(advantages, log_prob, valid)
        clipped_by_ppo = (loss_clipped > loss_unclipped) & valid
        candidates = valid & ~clipped_by_ppo & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        where = torch.nonzero(candidates)
        n_cut = max(int(clip_cov_ratio * int(valid.sum())), 1)
        chosen = where[torch.randperm(len(where), device=where.device)[:n_cut]]
        keep = torch.ones_like(ratio)
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    pg_losses = weighted(torch.maximum(loss_unclipped, loss_clipped) * keep, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((keep == 0).float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: the unclipped policy-gradient surrogate, with a KL penalty on the highest-covariance tokens.

        loss_t = -A_t * r_t                                   on most tokens (no clip)
        loss_t = -A_t * r_t + ppo_kl_coef * |log r_t|         on the max(1, int(kl_cov_ratio * unmasked))
                                                              unmasked tokens with the largest
                                                              cov_t = (A_t - mean A)(log_prob_t - mean log_prob)
    Penalising instead of cutting keeps those tokens learning, but pulls them back towards the
    sampling policy. The ratio is not clamped (as in verl).

    The Entropy Mechanism of RL for Reasoning LMs: https://arxiv.org/abs/2505.22617.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len), as for PPO.
        kl_cov_ratio: > 0, the share of unmasked tokens penalised (actor.kl_cov_ratio).
        ppo_kl_coef: >= 0, the penalty's coefficient (actor.ppo_kl_coef).
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (share of unmasked tokens penalised), pg_clipfrac_lower 0.0, and ppo_kl as verl
            reports it for this loss: the token mean of |log_prob - old_log_prob| (not of the signed difference).
    """
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0 (actor.kl_cov_ratio), got {kl_cov_ratio}")
    if not ppo_kl_coef >= 0:
        raise ValueError(f"ppo_kl_coef must be >= 0 (actor.ppo_kl_coef), got {ppo_kl_coef}")
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask, rollout_is_weights=rollout_is_weights)  # fmt: skip
    valid = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        penalised = torch.zeros_like(valid)
        n_valid = int(valid.sum())
        if n_valid:
            # covariance over the unmasked tokens, centred by their own means (verl's flattening)
            a, lp = advantages.detach()[valid], log_prob.detach()[valid]
            cov = (a - a.mean()) * (lp - lp.mean())
            top = torch.topk(cov, max(1, int(n_valid * kl_cov_ratio))).indices
            flat = torch.zeros(n_valid, dtype=torch.bool, device=valid.device)
            flat[top] = True
            penalised[valid] = flat
    pg_losses = -advantages * ratio + torch.where(penalised, ppo_kl_coef * log_ratio.abs(), 0.0)
    pg_loss = agg_loss(
        weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, loss_scale_factor
    )
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(penalised.float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(log_ratio.abs(), response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    dro_beta: float | None = None,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO: the policy gradient plus a quadratic penalty on the log-ratio to the sampling policy.

        loss_t = -(A_t * log_prob_t - beta / 2 * (log_prob_t - old_log_prob_t)^2)
    gradient -(A_t - beta * log r_t) * grad log_prob_t: the penalty pulls a token back in proportion to
    how far its log-prob has moved, with no clip boundary. verl 0.9.1's `dro` (its ppo_kl metric only).

    Direct Reward Optimisation (the quadratic log-ratio regulariser):
    https://arxiv.org/abs/2405.19107.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len).
        dro_beta: > 0, the penalty's strength beta (actor.dro_beta; required, verl has no default).
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac and pg_clipfrac_lower 0.0, ppo_kl.
    """
    if dro_beta is None or not dro_beta > 0:
        raise ValueError(
            f"the dro policy loss needs a positive actor.dro_beta (its quadratic penalty's strength), got {dro_beta}"
        )
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                     response_mask=response_mask, rollout_is_weights=rollout_is_weights)  # fmt: skip
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * dro_beta * log_ratio.square())
    pg_loss = agg_loss(
        weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, loss_scale_factor
    )
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": 0.0,
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics
