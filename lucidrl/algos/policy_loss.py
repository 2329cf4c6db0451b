"""Policy-gradient losses: per-token objective from log-probs and advantages, aggregated to a scalar.

Each loss is one top-level function registered by name (the `policy_loss` config value) and returns
`(loss, metrics)`; metric names are the ones users grep for under `actor/` (pg_clipfrac, ppo_kl, ...).
"""

from __future__ import annotations

import torch

from lucidrl.algos.aggregation import agg_loss, masked_mean
from lucidrl.algos.registry import register_policy_loss


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"policy loss inputs must all be (bs, response_len); got shapes {shapes}")


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate loss with asymmetric clip range and dual clip.

    With r = exp(log_prob - old_log_prob) (the log-ratio clamped to [-20, 20] first) and A the advantage:
        clipped  = max(-A * r, -A * clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        per-token loss = clipped                          if A >= 0
                         min(clipped, -A * clip_ratio_c)  if A < 0   (dual clip)
    then aggregated over `response_mask` with `loss_agg_mode`. A token on a clipped branch contributes
    no gradient. The dual clip bounds the loss of a negative-advantage token whose ratio has grown
    large, which otherwise is unbounded.

    PPO: https://arxiv.org/abs/1707.06347. Dual-clip PPO: https://arxiv.org/abs/1912.09729.
    Separate low/high ratios ("clip-higher"): DAPO, https://arxiv.org/abs/2503.14476 (it uses 0.2/0.28).

    Args:
        old_log_prob: (bs, response_len) log-probs of the sampled tokens under the rollout policy.
        log_prob: (bs, response_len) same tokens under the current policy (carries the gradient).
        advantages: (bs, response_len).
        response_mask: (bs, response_len) 0/1, 1 on tokens that count.
        clip_ratio_low: r is clipped below at 1 - clip_ratio_low; in [0, 1).
        clip_ratio_high: r is clipped above at 1 + clip_ratio_high; >= 0.
        clip_ratio_c: dual-clip bound for negative advantages; must be > 1.
        loss_agg_mode: see `agg_loss`.

    Returns:
        pg_loss: scalar tensor to back-propagate.
        metrics: floats over unmasked tokens —
            pg_clipfrac: fraction where the clipped branch is active (-A*clip(r) > -A*r);
            pg_clipfrac_lower: fraction where the dual clip is active (A < 0 and -A*c < clipped);
            ppo_kl: mean of old_log_prob - log_prob (k1 estimate of KL(old || new)).
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"clip_ratio_c must be > 1 (the dual-clip bound on the ratio for negative advantages; "
            f"3.0 is the usual value), got {clip_ratio_c}"
        )
    if not 0.0 <= clip_ratio_low < 1.0:
        raise ValueError(f"clip_ratio_low must be in [0, 1) (ratio clipped at 1 - it), got {clip_ratio_low}")
    if not clip_ratio_high >= 0.0:
        raise ValueError(f"clip_ratio_high must be >= 0 (ratio clipped at 1 + it), got {clip_ratio_high}")
    _check_same_shape(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask
    )

    # Clamped so a stale or corrupted old_log_prob cannot overflow exp into inf/NaN.
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)

    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item(),
            "pg_clipfrac_lower": masked_mean(
                ((loss_ppo > loss_dual) & negative).float(), response_mask
            ).item(),
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics
