"""Advantage estimators: turn rewards into the per-token advantages the policy loss weighs.

Each estimator is one top-level function registered by name (the `adv_estimator` config value).
The trainer passes the inputs an estimator's signature names, chosen from: token_level_rewards,
response_mask, index, values, gamma, lam, norm_adv_by_std_in_grpo, reward_baselines. Every estimator
returns `(advantages, returns)`, both (bs, response_len), exactly 0 at masked positions, without grad.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from lucidrl.algos.aggregation import masked_whiten
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


def _group_tied(scores: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(n_groups,) bool: every sample of the group has the same score. Compared as max == min, not by
    std == 0: the std of equal floats can come out as a tiny non-zero number."""
    fill = torch.full((n_groups,), float("nan"), dtype=scores.dtype, device=scores.device)
    high = fill.scatter_reduce(0, group, scores, reduce="amax", include_self=False)
    low = fill.scatter_reduce(0, group, scores, reduce="amin", include_self=False)
    return high == low


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
    zeroed where `response_mask` is 0. A group where every sample scored the same gets exactly A = 0
    (decided by comparing the scores, not by the rounded std, which verl divides by: 16 samples all
    scoring 0.7 get |A| up to 0.06 there).

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
        # A tied group's mean is off by rounding (16 x 0.7 in float32: |score - mean| ~ 6e-8), and the
        # std it gives is as small, so the quotient would be up to ~0.1 with one sign for the whole
        # group. Compare the scores themselves instead: a group whose max equals its min gets exactly 0.
        tied = _group_tied(scores, group, n_groups) & ~single
        adv = torch.where(tied[group], torch.zeros_like(adv), adv)
        # where, not multiply: masked positions become exactly +0.0 (a product would give -0.0 or NaN).
        advantages = torch.where(response_mask.bool(), adv.unsqueeze(-1), 0.0)
    return advantages, advantages.clone()


# ------------------------------------------------------------------------------------------ helpers


def _check_rewards_and_mask(
    fn_name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor
) -> None:
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.ndim != 2:
        raise ValueError(
            f"{fn_name}: token_level_rewards and response_mask must both be (bs, response_len), got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1] (config key algorithm.{name}), got {value}")


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def _outcome_scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """(bs,) sum of each sample's token rewards, in float32 or wider."""
    return token_level_rewards.to(_float_dtype(token_level_rewards)).sum(dim=-1)


def _group_sums(values: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(n_groups,) sum of `values` (bs,) over the samples of each group."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, group, values)


def _group_mean_and_count(
    scores: torch.Tensor, group: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_groups,) mean score and sample count per group (every code 0..n_groups-1 has >= 1 sample)."""
    counts = torch.bincount(group, minlength=n_groups).to(scores.dtype)
    return _group_sums(scores, group, n_groups) / counts, counts


def _broadcast_masked(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(bs,) -> (bs, response_len) on unmasked tokens, exactly +0.0 elsewhere."""
    return torch.where(response_mask.bool(), per_sample.unsqueeze(-1), 0.0)


# -------------------------------------------------------------------------------- token-level (PPO)


@register_advantage_estimator("gae")
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over the response tokens, with a critic's values (PPO).

    Backwards over the unmasked tokens t of each row (t' = the next unmasked token, V(t') = 0 past
    the last one):
        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lam * A(t')
        returns = A + V                     (the critic's regression target, unwhitened)
        advantages = masked_whiten(A)       (zero mean, unit variance over all unmasked tokens)
    Masked tokens (padding, tool output) are skipped: they neither bootstrap nor accumulate, as in
    verl. With gamma = lam = 1, returns - values = (reward-to-go - V), the Monte-Carlo advantage.

    GAE: https://arxiv.org/abs/1506.02438. PPO: https://arxiv.org/abs/1707.06347.

    Args:
        token_level_rewards: (bs, response_len) per-token rewards (outcome score on the last token,
            minus a KL penalty if one is applied to the reward).
        values: (bs, response_len) critic values V(t) of the rollout.
        response_mask: (bs, response_len) 0/1, 1 on generated tokens.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1]; 1 is Monte-Carlo (high variance), 0 is one-step TD (high bias).

    Returns:
        advantages: (bs, response_len) whitened over the batch, 0 at masked positions.
        returns: (bs, response_len) unwhitened A + V, 0 at masked positions.
    """
    _check_rewards_and_mask("compute_gae_advantage_return", token_level_rewards, response_mask)
    if values.shape != token_level_rewards.shape:
        raise ValueError(
            f"compute_gae_advantage_return: values {tuple(values.shape)} must match token_level_rewards "
            f"{tuple(token_level_rewards.shape)}"
        )
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    with torch.no_grad():
        dtype = _float_dtype(token_level_rewards)
        rewards, v = token_level_rewards.to(dtype), values.to(dtype)
        valid = response_mask.bool()
        next_value = torch.zeros(rewards.shape[0], dtype=dtype, device=rewards.device)
        last_gae = torch.zeros_like(next_value)
        gae = torch.zeros_like(rewards)
        for t in reversed(range(rewards.shape[1])):
            delta = rewards[:, t] + gamma * next_value - v[:, t]
            # where, not arithmetic with the mask: a NaN value on a padded token must not leak in.
            next_value = torch.where(valid[:, t], v[:, t], next_value)
            last_gae = torch.where(valid[:, t], delta + gamma * lam * last_gae, last_gae)
            gae[:, t] = last_gae
        returns = torch.where(valid, gae + v, 0.0)
        advantages = torch.where(valid, masked_whiten(gae, response_mask), 0.0)
    return advantages, returns


@register_advantage_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go per token, whitened over the whole batch (no critic).

        G_t = r_t + gamma * G_t'      on unmasked tokens, t' the next unmasked token (G = 0 past the
                                      last); a masked token is skipped: its reward is ignored, the
                                      running return passes it unchanged and undiscounted, and G = 0 there
        advantages = masked_whiten(G) over every unmasked token of the batch, 0 at masked tokens.

    Masked tokens inside a response (a tool's output between two turns of a multi-turn rollout) are
    skipped, not a reset: a reward after them still reaches the earlier turns. That is verl 0.9.1's
    behaviour and the same skipping `compute_gae_advantage_return` does, so with gamma = lam = 1 and
    values 0 the two estimators' returns agree.

    Whitening across the batch (not per prompt) is what distinguishes it from GRPO; with the KL
    penalty usually folded into token_level_rewards it is the token-level KL variant of the paper.

    REINFORCE++: https://arxiv.org/abs/2501.03262.

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        gamma: discount in [0, 1].

    Returns:
        advantages: (bs, response_len) whitened G, 0 at masked positions.
        returns: (bs, response_len) G (unwhitened), 0 at masked positions.
    """
    _check_rewards_and_mask(
        "compute_reinforce_plus_plus_outcome_advantage", token_level_rewards, response_mask
    )
    _check_unit_interval("gamma", gamma)
    with torch.no_grad():
        dtype = _float_dtype(token_level_rewards)
        rewards = token_level_rewards.to(dtype)
        valid = response_mask.bool()
        running = torch.zeros(rewards.shape[0], dtype=dtype, device=rewards.device)
        returns = torch.zeros_like(rewards)
        for t in reversed(range(rewards.shape[1])):
            # where, not arithmetic with the mask: a masked token's reward (even NaN) never enters
            running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
            returns[:, t] = torch.where(valid[:, t], running, 0.0)
        advantages = torch.where(valid, masked_whiten(returns, response_mask), 0.0)
    return advantages, returns


# ------------------------------------------------------------------------- outcome, group baselines


@register_advantage_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: outcome score minus its group's mean, then whitened over the batch.

        A_i = score_i - mean_{j in group(i)} score_j      (score_i = sum_t token_level_rewards[i, t])
        advantages = masked_whiten(A_i broadcast to the tokens), 0 at masked tokens.

    The group mean removes the prompt's difficulty; the batch-wide whitening (instead of GRPO's
    per-group std) keeps prompts whose samples barely differ from getting inflated advantages.
    A group of a single sample gets baseline 0 (verl), so its advantage is its raw score before
    whitening — sample several responses per prompt.

    REINFORCE++: https://arxiv.org/abs/2501.03262.

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample (str or int; list, numpy array or tensor).

    Returns:
        advantages: (bs, response_len); returns: the same tensor (copy).
    """
    _check_rewards_and_mask(
        "compute_reinforce_plus_plus_baseline_outcome_advantage", token_level_rewards, response_mask
    )
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards)
        group, n_groups = _group_codes(index, scores.shape[0], scores.device)
        mean, counts = _group_mean_and_count(scores, group, n_groups)
        mean = torch.where(counts == 1, torch.zeros_like(mean), mean)
        centred = _broadcast_masked(scores - mean[group], response_mask)
        advantages = torch.where(response_mask.bool(), masked_whiten(centred, response_mask), 0.0)
    return advantages, advantages.clone()


@register_advantage_estimator("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: each sample's outcome score minus the mean score of the other samples of its prompt.

    For a group of n > 1 samples:
        A_i = score_i - (sum_{j != i} score_j) / (n - 1)  =  n / (n - 1) * (score_i - mean)
    (verl writes the right-hand form; the two are the same number). A is broadcast to the response
    tokens, 0 at masked tokens; it sums to zero within each group. No std normalisation.
    A group of a single sample has no "others": following verl its advantage is its raw score.

    RLOO: https://arxiv.org/abs/2402.14740 (Ahmadian et al., "Back to Basics").

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample.

    Returns:
        advantages: (bs, response_len); returns: the same tensor (copy).
    """
    _check_rewards_and_mask("compute_rloo_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards)
        group, n_groups = _group_codes(index, scores.shape[0], scores.device)
        mean, counts = _group_mean_and_count(scores, group, n_groups)
        n = counts[group]
        loo = (scores - mean[group]) * n / (n - 1).clamp(min=1)
        advantages = _broadcast_masked(torch.where(n > 1, loo, scores), response_mask)
    return advantages, advantages.clone()


@register_advantage_estimator("opo")
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: outcome score minus the length-weighted mean score of its group (the optimal baseline).

    With L_i = number of unmasked tokens of sample i:
        b_g = sum_{i in g} L_i * score_i / sum_{i in g} L_i
        A_i = score_i - b_g                broadcast to the tokens, 0 at masked tokens.
    With a token-sum loss the gradient variance is minimised by this baseline when every token's
    gradient has similar norm, so longer samples weigh more. Length-weighted sums of A are zero per
    group (plain sums only when the lengths are equal). A single-sample group gets baseline 0 (verl).

    OPO (On-Policy RL with Optimal reward baseline): https://arxiv.org/abs/2505.23585.

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample.

    Returns:
        advantages: (bs, response_len); returns: the same tensor (copy).
    """
    _check_rewards_and_mask("compute_opo_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        group, n_groups = _group_codes(index, scores.shape[0], scores.device)
        counts = torch.bincount(group, minlength=n_groups)
        weighted = _group_sums(lengths * scores, group, n_groups)
        total_len = _group_sums(lengths, group, n_groups)
        # A group whose responses are all empty has no unmasked token to carry an advantage anyway.
        baseline = torch.where(total_len > 0, weighted / total_len.clamp(min=1e-12), 0.0)
        baseline = torch.where(counts == 1, torch.zeros_like(baseline), baseline)
        advantages = _broadcast_masked(scores - baseline[group], response_mask)
    return advantages, advantages.clone()


@register_advantage_estimator("grpo_passk")
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO: only the best sample of each group is reinforced, by its margin over the runner-up.

    Per group: A_best = score_max - score_second_max, divided by (group std + epsilon) when
    `norm_adv_by_std_in_grpo` (torch.std's unbiased std, as in GRPO); every other sample gets 0.
    Ties for the best go to the earliest sample in the batch (and the margin is then 0). A is
    broadcast to the response tokens, 0 at masked tokens. It optimises pass@k, not mean reward.

    Pass@k training: https://arxiv.org/abs/2503.19595.

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample; every group needs >= 2 samples (ValueError otherwise, as
            in verl).
        norm_adv_by_std_in_grpo: divide the margin by the group std.
        epsilon: added to the std.

    Returns:
        advantages: (bs, response_len); returns: the same tensor (copy).
    """
    _check_rewards_and_mask("compute_grpo_passk_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards)
        group, n_groups = _group_codes(index, scores.shape[0], scores.device)
        mean, counts = _group_mean_and_count(scores, group, n_groups)
        if bool((counts < 2).any()):
            keys = index.tolist() if hasattr(index, "tolist") else list(index)
            lonely = sorted({str(keys[i]) for i in range(len(keys)) if counts[group[i]] < 2})
            raise ValueError(
                f"grpo_passk needs >= 2 samples per group (best minus second best); groups {lonely[:5]} "
                "have 1 — set rollout.n >= 2"
            )
        # Sort by score (descending, stable), then stably by group: each group's rows become
        # contiguous with its best first and ties resolved towards the earlier sample.
        by_score = torch.sort(scores, descending=True, stable=True).indices
        order = by_score[torch.sort(group[by_score], stable=True).indices]
        starts = torch.cumsum(counts, 0).long() - counts.long()
        best, runner_up = order[starts], order[starts + 1]
        margin = scores[best] - scores[runner_up]
        if norm_adv_by_std_in_grpo:
            std = torch.sqrt(_group_sums((scores - mean[group]) ** 2, group, n_groups) / (counts - 1))
            margin = margin / (std + epsilon)
        per_sample = torch.zeros_like(scores).index_copy_(0, best, margin)
        advantages = _broadcast_masked(per_sample, response_mask)
    return advantages, advantages.clone()


@register_advantage_estimator("remax")
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: reward-to-go minus the reward of the greedy response to the same prompt.

        returns_t    = sum_{t' >= t} r_t'   over unmasked tokens (undiscounted reverse cumsum)
        advantages_t = returns_t - b        b = reward_baselines[i], the greedy sample's score
    Both are 0 at masked tokens. The greedy baseline needs one extra greedy generation per prompt
    but no critic and no group of samples.

    ReMax: https://arxiv.org/abs/2310.10505.

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        reward_baselines: (bs,) the greedy response's score for each sample's prompt; required.

    Returns:
        advantages: (bs, response_len); returns: (bs, response_len).
    """
    _check_rewards_and_mask("compute_remax_outcome_advantage", token_level_rewards, response_mask)
    if reward_baselines is None:
        raise ValueError(
            "adv_estimator remax needs reward_baselines (bs,): the score of a greedy response per prompt, "
            "repeated for each sample; the trainer must generate and score greedy responses for it"
        )
    bs = token_level_rewards.shape[0]
    if tuple(reward_baselines.shape) != (bs,):
        raise ValueError(
            f"compute_remax_outcome_advantage: reward_baselines must be ({bs},), one per sample, "
            f"got {tuple(reward_baselines.shape)}"
        )
    with torch.no_grad():
        valid = response_mask.bool()
        rewards = torch.where(valid, token_level_rewards.to(_float_dtype(token_level_rewards)), 0.0)
        returns = torch.where(valid, rewards.flip(-1).cumsum(-1).flip(-1), 0.0)
        baseline = reward_baselines.to(device=returns.device, dtype=returns.dtype).unsqueeze(-1)
        advantages = torch.where(valid, returns - baseline, 0.0)
    return advantages, returns
