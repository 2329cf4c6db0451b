"""Optimal token baselines: a baseline per token position, from the other samples of the prompt weighted
by how much gradient variance their path has accumulated so far.

For a softmax policy the squared norm of the score function at token j, with respect to the logits, is
||s_j||^2 = 1 - 2 pi(y_j) + sum_v pi(v)^2, so W_t = sum_{j <= t} ||s_j||^2 measures the variance a
trajectory's gradient has gathered up to t. The baseline that minimises the variance of the per-token
gradient estimate is then the W-weighted mean of the group's returns at t:

    B_t = sum_i G_i,t * W_i,t / (sum_i W_i,t + epsilon)

(with rollout importance weights rho, W is built from rho^2 * ||s||^2: the baseline that minimises the
mean squared error under truncated importance sampling). Both estimators are verl 0.9.1's
(`optimal_token_baseline`, `tir_optimal_token_baseline`).

Optimal Token Baseline: https://richardli.xyz/optimal-token-baseline (the "logit-gradient proxy" W).
Optimal baselines for policy gradients: Greensmith, Bartlett and Baxter, JMLR 5 (2004),
https://www.jmlr.org/papers/v5/greensmith04a.html.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from lucidrl.algos.groups import check_rewards_and_mask, float_dtype, group_codes
from lucidrl.algos.registry import register_advantage_estimator


def _check_inputs(
    fn_name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **others
) -> None:
    check_rewards_and_mask(fn_name, token_level_rewards, response_mask)
    for name, t in others.items():
        if t is not None and t.shape != response_mask.shape:
            raise ValueError(
                f"{fn_name}: {name} {tuple(t.shape)} must match response_mask {tuple(response_mask.shape)}"
            )


def _path_variance(
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """(bs, R) W_t = cumulative sum over unmasked tokens j <= t of (1 - 2 pi_j + sum pi^2) [* rho_j^2]."""
    valid = response_mask.bool()
    w = 1.0 - 2.0 * torch.exp(old_log_probs.to(dtype)) + sum_pi_squared.to(dtype)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.to(dtype).square()
    return torch.where(valid, w, 0.0).cumsum(dim=-1)


def _reward_to_go(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """(bs, R) undiscounted sum of the unmasked rewards from t to the end (at every position t)."""
    rewards = torch.where(response_mask.bool(), token_level_rewards.to(dtype), 0.0)
    return rewards.flip(-1).cumsum(-1).flip(-1)


def _zero_tail(baselines: torch.Tensor, rows: list[int], lengths: list[int]) -> None:
    """verl's handle_zero_tail, in place: where one response of the group is strictly the longest, its
    baseline past the second-longest length is 0 (no other sample is there to estimate it from)."""
    if len(rows) < 2:
        return
    ordered = sorted(lengths)
    longest, second = ordered[-1], ordered[-2]
    if longest > second and lengths.count(longest) == 1:
        baselines[rows[lengths.index(longest)], second:] = 0.0


@register_advantage_estimator("optimal_token_baseline")
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (OTB): reward-to-go minus a per-position baseline from the group.

        G_i,t = sum_{t' >= t} r_i,t'  over unmasked tokens            (returns)
        W_i,t = sum_{j <= t, unmasked} (1 - 2 pi_i,j + sum_v pi_i,j(v)^2) [* rho_i,j^2]
        B_t   = sum_{i in g, t unmasked} G_i,t W_i,t / (sum_{i in g, t unmasked} W_i,t + epsilon)
        A_i,t = G_i,t - B_t  on unmasked tokens, 0 elsewhere
    Positions are aligned by their index in the response (`tir_optimal_token_baseline` aligns by the
    count of unmasked tokens instead, for responses with gaps). A single-sample group has baseline 0;
    with `handle_zero_tail` a group's unique longest response gets baseline 0 past the second-longest
    length. pi_i,j = exp(old_log_probs) at the rollout temperature.

    verl 0.9.1's `optimal_token_baseline`; see the module docstring for the derivation.

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample.
        old_log_probs: (bs, response_len) the sampling policy's log-probs (the actor's old-log-prob pass).
        sum_pi_squared: (bs, response_len) sum over the vocabulary of pi^2 at each position, from the
            same pass (the trainer asks the actor for it when this estimator is configured).
        rollout_is_weights: (bs, response_len) rollout-correction importance weights, or None.
        handle_zero_tail: zero the unique longest response's baseline past the second-longest length.
        epsilon: added to the weight sum.

    Returns:
        advantages: (bs, response_len); returns: G, 0 at masked tokens.
    """
    fn = "compute_optimal_token_baseline_advantage"
    _check_inputs(fn, token_level_rewards, response_mask, old_log_probs=old_log_probs,
                  sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights)  # fmt: skip
    with torch.no_grad():
        dtype = float_dtype(token_level_rewards)
        valid = response_mask.bool()
        returns = _reward_to_go(token_level_rewards, response_mask, dtype)
        weights = _path_variance(response_mask, old_log_probs, sum_pi_squared, rollout_is_weights, dtype)
        weights = torch.where(valid, weights, 0.0)
        group, n_groups = group_codes(index, returns.shape[0], returns.device)
        lengths = response_mask.sum(-1).tolist()
        baselines = torch.zeros_like(returns)
        for g in range(n_groups):
            rows = torch.nonzero(group == g).flatten().tolist()
            if len(rows) < 2:
                continue  # no other sample to form a baseline from
            num = (torch.where(valid[rows], returns[rows], 0.0) * weights[rows]).sum(0)
            baselines[rows] = num / (weights[rows].sum(0) + epsilon)
            if handle_zero_tail:
                _zero_tail(baselines, rows, [int(lengths[r]) for r in rows])
        advantages = torch.where(valid, returns - baselines, 0.0)
    return advantages, torch.where(valid, returns, 0.0)


@register_advantage_estimator("tir_optimal_token_baseline")
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline for multi-turn (tool-integrated) responses: as `optimal_token_baseline`,
    but the samples of a group are aligned by their k-th unmasked token instead of by position.

    A multi-turn response has masked gaps (tool output) of different lengths in each sample, so the
    t-th position of two samples can be a model token in one and a tool token in the other. Here each
    response's unmasked tokens are taken in order (k = 0, 1, ...), the baseline is formed per k over
    the group, and the advantages go back to the positions they came from:

        B_k = sum_i G_i,(k) W_i,(k) / (sum_i W_i,(k) + epsilon)      (i over samples with a k-th token)
        A_i,(k) = G_i,(k) - B_k

    G, W, the single-sample and zero-tail rules are those of `optimal_token_baseline` (the zero tail
    counts unmasked tokens); a response with no unmasked token is left out of its group. For responses
    without gaps the two estimators are the same.

    verl 0.9.1's `tir_optimal_token_baseline`.

    Args and returns: as `compute_optimal_token_baseline_advantage`; returns are G, 0 at masked tokens.
    """
    fn = "compute_multi_turn_optimal_token_baseline_advantage"
    _check_inputs(fn, token_level_rewards, response_mask, old_log_probs=old_log_probs,
                  sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights)  # fmt: skip
    with torch.no_grad():
        dtype = float_dtype(token_level_rewards)
        valid = response_mask.bool()
        returns = _reward_to_go(token_level_rewards, response_mask, dtype)
        weights = _path_variance(response_mask, old_log_probs, sum_pi_squared, rollout_is_weights, dtype)
        # compact each row's unmasked tokens to the left: (bs, K), K the most unmasked tokens of a row
        lengths = valid.sum(-1)
        width = int(lengths.max().item()) if lengths.numel() else 0
        slot = valid.long().cumsum(-1) - 1  # k of each unmasked token
        rows_idx, cols_idx = torch.nonzero(valid, as_tuple=True)
        packed_w = returns.new_zeros(returns.shape[0], width)
        packed_g = returns.new_zeros(returns.shape[0], width)
        packed_w[rows_idx, slot[rows_idx, cols_idx]] = weights[rows_idx, cols_idx]
        packed_g[rows_idx, slot[rows_idx, cols_idx]] = returns[rows_idx, cols_idx]

        group, n_groups = group_codes(index, returns.shape[0], returns.device)
        baselines = torch.zeros_like(packed_g)
        for g in range(n_groups):
            rows = [r for r in torch.nonzero(group == g).flatten().tolist() if lengths[r] > 0]
            if len(rows) < 2:
                continue
            # the packed tensors are 0 past each row's length, so the sums run over present tokens only
            baselines[rows] = (packed_g[rows] * packed_w[rows]).sum(0) / (packed_w[rows].sum(0) + epsilon)
            if handle_zero_tail:
                _zero_tail(baselines, rows, [int(lengths[r]) for r in rows])
        advantages = torch.zeros_like(returns)
        advantages[rows_idx, cols_idx] = (packed_g - baselines)[rows_idx, slot[rows_idx, cols_idx]]
    return advantages, torch.where(valid, returns, 0.0)
