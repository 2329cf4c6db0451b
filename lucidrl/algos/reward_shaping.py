"""DAPO's reward shaping and batch filtering: the soft overlong penalty and dynamic sampling.

DAPO: https://arxiv.org/abs/2503.14476 (sections 3.2 and 3.4).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from lucidrl.algos.groups import group_codes, group_tied


def overlong_reward_penalty(
    response_lengths: torch.Tensor,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment, to be added to each response's score.

    With L = response length, L_max = max_response_length and B = buffer_length:
        0                                 if L <= L_max - B
        -(L - (L_max - B)) / B * factor   if L_max - B < L <= L_max   (reaches -factor at L_max)
    so responses approaching the truncation limit are discouraged gradually instead of truncated
    ones getting an arbitrary reward.

    DAPO: https://arxiv.org/abs/2503.14476 (section 3.4, "Overlong Reward Shaping").

    Args:
        response_lengths: (bs,) number of generated tokens per response (response_mask.sum(-1)).
        max_response_length: the generation limit L_max (data.max_response_length).
        buffer_length: B, with 0 < B < L_max.
        penalty_factor: >= 0, the penalty at L_max.

    Returns:
        (bs,) float32 penalties in [-penalty_factor, 0].
    """
    if not 0 < buffer_length < max_response_length:
        raise ValueError(
            f"overlong buffer_length must be in (0, max_response_length={max_response_length}), "
            f"got {buffer_length}"
        )
    if not penalty_factor >= 0.0:
        raise ValueError(f"overlong penalty_factor must be >= 0, got {penalty_factor}")
    if response_lengths.ndim != 1:
        raise ValueError(
            f"response_lengths must be (bs,), got shape {tuple(response_lengths.shape)}; "
            "pass response_mask.sum(-1)"
        )
    lengths = response_lengths.to(torch.promote_types(response_lengths.dtype, torch.float32))
    if bool((lengths > max_response_length).any()) or bool((lengths < 0).any()):
        bad = lengths[(lengths > max_response_length) | (lengths < 0)][0].item()
        raise ValueError(
            f"response length {bad:g} is outside [0, max_response_length={max_response_length}]; "
            "pass the same max_response_length the rollout used"
        )
    exceed = lengths - (max_response_length - buffer_length)
    return torch.where(exceed > 0, -exceed / buffer_length * penalty_factor, 0.0)


def dynamic_sampling_keep_mask(
    scores: torch.Tensor,
    index: Sequence[Hashable] | Any,
) -> tuple[torch.Tensor, dict[str, int]]:
    """DAPO's dynamic sampling filter: keep the samples of groups whose scores are not all equal.

    A group where every sample scored the same (all right or all wrong) has zero group-relative
    advantage and contributes no gradient, only noise in the batch size; DAPO drops such groups and
    samples more prompts until the batch is full. A single-sample group is kept, as verl's DAPO
    trainer keeps it (its filter is std > 0 or a group of one); the trainer refuses dynamic sampling
    with rollout.n < 2, where every group would be one.

    DAPO: https://arxiv.org/abs/2503.14476 (section 3.2, "Dynamic Sampling").

    Args:
        scores: (bs,) outcome score per sample (token_level_scores.sum(-1)).
        index: (bs,) group id per sample.

    Returns:
        keep: (bs,) bool, True for samples of groups with differing scores.
        metrics: dapo/groups_total, dapo/groups_kept, dapo/groups_dropped_all_same (counts).
    """
    if scores.ndim != 1:
        raise ValueError(
            f"dynamic_sampling_keep_mask: scores must be (bs,), got shape {tuple(scores.shape)}; "
            "pass token_level_scores.sum(-1)"
        )
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    group, n_groups = group_codes(index, scores.shape[0], scores.device)
    counts = torch.bincount(group, minlength=n_groups)
    kept_groups = ~group_tied(scores, group, n_groups) | (counts == 1)
    n_kept = int(kept_groups.sum().item())
    metrics = {
        "dapo/groups_total": n_groups,
        "dapo/groups_kept": n_kept,
        "dapo/groups_dropped_all_same": n_groups - n_kept,
    }
    return kept_groups[group], metrics
