"""Shared pieces of the advantage estimators: group ids to dense codes, per-group sums and means, input
checks. Tensors only; every estimator module builds on these."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch


def group_codes(index: Any, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
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


def group_tied(scores: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(n_groups,) bool: every sample of the group has the same score. Compared as max == min, not by
    std == 0: the std of equal floats can come out as a tiny non-zero number."""
    fill = torch.full((n_groups,), float("nan"), dtype=scores.dtype, device=scores.device)
    high = fill.scatter_reduce(0, group, scores, reduce="amax", include_self=False)
    low = fill.scatter_reduce(0, group, scores, reduce="amin", include_self=False)
    return high == low


def check_rewards_and_mask(
    fn_name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor
) -> None:
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.ndim != 2:
        raise ValueError(
            f"{fn_name}: token_level_rewards and response_mask must both be (bs, response_len), got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )


def check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1] (config key algorithm.{name}), got {value}")


def float_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def outcome_scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """(bs,) sum of each sample's token rewards, in float32 or wider."""
    return token_level_rewards.to(float_dtype(token_level_rewards)).sum(dim=-1)


def group_sums(values: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(n_groups,) sum of `values` (bs,) over the samples of each group."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, group, values)


def group_mean_and_count(
    scores: torch.Tensor, group: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_groups,) mean score and sample count per group (every code 0..n_groups-1 has >= 1 sample)."""
    counts = torch.bincount(group, minlength=n_groups).to(scores.dtype)
    return group_sums(scores, group, n_groups) / counts, counts


def broadcast_masked(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(bs,) -> (bs, response_len) on unmasked tokens, exactly +0.0 elsewhere."""
    return torch.where(response_mask.bool(), per_sample.unsqueeze(-1), 0.0)
