"""Critic math for PPO with GAE: the clipped value loss and the explained-variance diagnostic."""

from __future__ import annotations

import torch

from lucidrl.algos.aggregation import agg_loss, masked_mean, masked_var


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss: the critic may not move its prediction more than cliprange_value per update.

        vpred_clipped = clip(vpred, values - cliprange_value, values + cliprange_value)
        per-token loss = max((vpred - R)^2, (vpred_clipped - R)^2)
        vf_loss = 0.5 * agg_loss(per-token loss, response_mask, loss_agg_mode)
    The max is pessimistic: where the clipped branch is larger, the gradient through vpred is 0.

    PPO: https://arxiv.org/abs/1707.06347 (value clipping as in OpenAI baselines' ppo2).

    Args:
        vpreds: (bs, response_len) current critic predictions (carry the gradient).
        returns: (bs, response_len) regression targets R (GAE returns).
        values: (bs, response_len) the critic's predictions at rollout time.
        response_mask: (bs, response_len) 0/1.
        cliprange_value: >= 0, in reward units (critic.cliprange_value).
        loss_agg_mode: see `agg_loss`.

    Returns:
        vf_loss: scalar tensor.
        metrics: vf_clipfrac, the fraction of unmasked tokens where the clipped branch is larger.
    """
    shapes = {
        "vpreds": tuple(vpreds.shape),
        "returns": tuple(returns.shape),
        "values": tuple(values.shape),
        "response_mask": tuple(response_mask.shape),
    }
    if len(set(shapes.values())) != 1:
        raise ValueError(f"compute_value_loss inputs must all be (bs, response_len); got shapes {shapes}")
    if not cliprange_value >= 0.0:
        raise ValueError(f"cliprange_value must be >= 0 (critic.cliprange_value), got {cliprange_value}")
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    with torch.no_grad():
        clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item()
    return vf_loss, {"vf_clipfrac": clipfrac}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """How much of the returns' variance the critic explains: 1 - Var[R - V] / Var[R] over unmasked tokens.

    1 is a perfect critic, 0 one no better than a constant, < 0 one worse than a constant. NaN when
    the returns have zero variance (nothing to explain) or there are fewer than 2 unmasked tokens (a
    metric: the step's other figures are still logged).

    Args:
        values: (bs, response_len) critic predictions V.
        returns: (bs, response_len) targets R.
        mask: (bs, response_len) 0/1.
    """
    if not values.shape == returns.shape == mask.shape:
        raise ValueError(
            f"explained_variance: values {tuple(values.shape)}, returns {tuple(returns.shape)} and mask "
            f"{tuple(mask.shape)} must have the same shape"
        )
    if mask.sum() < 2:
        return float("nan")
    with torch.no_grad():
        values, returns = values.double(), returns.double()
        var_returns = masked_var(returns, mask).item()
        if var_returns == 0.0:
            return float("nan")
        return 1.0 - masked_var(returns - values, mask).item() / var_returns
