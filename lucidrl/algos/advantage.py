"""Advantage estimators: turn rewards into the per-token advantages the policy loss weighs.

Each estimator is one top-level function registered by name (the `adv_estimator` config value).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from lucidrl.algos.registry import register_advantage_estimator


def _group_codes(index: Any, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group ids (str, int, ...) to dense codes 0..n_groups-1, shape (bs,)."""
    if hasattr(index, "ndim") and index.ndim != 1:
        raise ValueError(f"index must be 1-D (one group id per sample), got shape {tuple(index.shape)}")
    keys: Sequence[Hashable] = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(keys) != batch_size:
        raise ValueError(
            f"index has {len(keys)} group ids but token_level_rewards has {batch_size} rows; "
            "pass one group id (e.g. the prompt uid) per sample"
        )
    code_of: dict[Hashable, int] = {}
    codes = [code_of.setdefault(k, len(code_of)) for k in keys]
    return torch.tensor(codes, dtype=torch.long, device=device), len(code_of)


@register_advantage_estimator("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO advantage: each sample's outcome score relative to the other samples of its prompt.

    score_i = sum_t token_level_rewards[i, t]; per group (samples sharing an `index` value)
    A_i = (score_i - mean) / (std + epsilon), with torch.std's unbiased std, or A_i = score_i - mean
    when `norm_adv_by_std_in_grpo` is False (Dr.GRPO). A_i is broadcast to every response token and
    zeroed where `response_mask` is 0. A group where every sample scored the same gets A = 0.

    A group of a single sample has no baseline: following verl it gets mean 0 and std 1, so its
    advantage is its raw score / (1 + epsilon) — sample several responses per prompt.

    GRPO: https://arxiv.org/abs/2402.03300 (DeepSeekMath, section 4.1).
    Dr.GRPO (no std normalisation): https://arxiv.org/abs/2503.20783.

    Args:
        token_level_rewards: (bs, response_len); outcome rewards usually sit on the last valid token.
        response_mask: (bs, response_len) 0/1, 1 on generated tokens.
        index: (bs,) group id per sample (str or int; list, numpy array or tensor), e.g. the prompt uid.
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr.GRPO).
        epsilon: added to the std so a zero-variance group does not divide by zero.

    Returns:
        advantages: (bs, response_len), float32 (float64 if the rewards are float64).
        returns: (bs, response_len), equal to advantages (GRPO has no value function).
    """
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.ndim != 2:
        raise ValueError(
            "compute_grpo_outcome_advantage: token_level_rewards and response_mask must both be "
            f"(bs, response_len), got {tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    with torch.no_grad():
        dtype = torch.promote_types(token_level_rewards.dtype, torch.float32)
        scores = token_level_rewards.to(dtype).sum(dim=-1)  # (bs,)
        group, n_groups = _group_codes(index, scores.shape[0], scores.device)

        counts = torch.bincount(group, minlength=n_groups).to(dtype)
        mean = torch.zeros(n_groups, dtype=dtype, device=scores.device).index_add_(0, group, scores) / counts
        sq_dev = torch.zeros_like(mean).index_add_(0, group, (scores - mean[group]) ** 2)
        std = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))

        single = counts == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)

        adv = scores - mean[group]
        if norm_adv_by_std_in_grpo:
            adv = adv / (std[group] + epsilon)
        # where, not multiply: masked positions become exactly +0.0 (a product would give -0.0 or NaN).
        advantages = torch.where(response_mask.bool(), adv.unsqueeze(-1), 0.0)
    return advantages, advantages.clone()
