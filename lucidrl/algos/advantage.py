"""Outcome advantage estimators: one score per response, compared with a baseline from its group (the
other samples of its prompt), the batch, or a greedy sample.

Each estimator is one top-level function registered by name (the `adv_estimator` config value).
The trainer passes the inputs an estimator's signature names (see trainer/ppo.py: compute_advantage).
Every estimator returns `(advantages, returns)`, both (bs, response_len), exactly 0 at masked
positions, without grad. The token-level estimators (GAE, REINFORCE++) are in returns.py, the
optimal token baselines in token_baseline.py.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from lucidrl.algos.aggregation import masked_whiten
from lucidrl.algos.groups import (
    broadcast_masked,
    check_rewards_and_mask,
    float_dtype,
    group_codes,
    group_mean_and_count,
    group_sums,
    group_tied,
    outcome_scores,
)
from lucidrl.algos.registry import register_advantage_estimator


def grpo_scores(
    scores: torch.Tensor, index: Sequence[Hashable] | Any, norm_adv_by_std_in_grpo: bool, epsilon: float
) -> torch.Tensor:
    """(bs,) GRPO's per-sample advantage of `scores` (bs,): (score - group mean) / (group std + epsilon),
    or without the division; a single-sample group has mean 0 and std 1; a tied group gets exactly 0."""
    group, n_groups = group_codes(index, scores.shape[0], scores.device)
    counts = torch.bincount(group, minlength=n_groups).to(scores.dtype)
    mean = group_sums(scores, group, n_groups) / counts
    std = torch.sqrt(group_sums((scores - mean[group]) ** 2, group, n_groups) / (counts - 1).clamp(min=1))

    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)

    adv = scores - mean[group]
    if norm_adv_by_std_in_grpo:
        adv = adv / (std[group] + epsilon)
    # A tied group's mean is off by rounding (16 x 0.7 in float32: |score - mean| ~ 6e-8), and the
    # std it gives is as small, so the quotient would be up to ~0.1 with one sign for the whole
    # group. Compare the scores themselves instead: a group whose max equals its min gets exactly 0.
    tied = group_tied(scores, group, n_groups) & ~single
    return torch.where(tied[group], torch.zeros_like(adv), adv)


@register_advantage_estimator("grpo")
@register_advantage_estimator("grpo_vectorized")
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

    Also registered as `grpo_vectorized`, verl's name for the same formula computed without a Python
    loop (verl's variance there is sum-of-squares based, so its last digits differ; this one is
    already vectorized).

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
    check_rewards_and_mask("compute_grpo_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        adv = grpo_scores(outcome_scores(token_level_rewards), index, norm_adv_by_std_in_grpo, epsilon)
        # where, not multiply: masked positions become exactly +0.0 (a product would give -0.0 or NaN).
        advantages = broadcast_masked(adv, response_mask)
    return advantages, advantages.clone()


@register_advantage_estimator("gpg")
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: the group-centred score, scaled up by the batch's share of samples that scored non-zero.

        alpha = bs / max(1, number of samples whose score is non-zero)
        A_i   = alpha * (score_i - mean_{j in group(i)} score_j)       (no std division)
    broadcast to the response tokens, 0 at masked tokens. A single-sample group has baseline 0, a
    tied group gets exactly 0 (verl's loop gives float noise there).

    The paper's correction alpha = B / (B - M) rescales the gradient for the M samples that carry no
    signal; verl 0.9.1 (whose numbers this matches) counts the samples whose *score* is non-zero
    instead, which is the same count for 0/1 rewards only when every rewarded sample sits in a mixed
    group. Pair with `actor.policy_loss=gpg` (plain -A * log_prob, no ratio).

    GPG: https://arxiv.org/abs/2504.02546.

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample.

    Returns:
        advantages: (bs, response_len); returns: the same tensor (copy).
    """
    check_rewards_and_mask("compute_gpg_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards)
        alpha = scores.shape[0] / max(1, int(torch.count_nonzero(scores)))
        adv = alpha * grpo_scores(scores, index, norm_adv_by_std_in_grpo=False, epsilon=0.0)
        advantages = broadcast_masked(adv, response_mask)
    return advantages, advantages.clone()


@register_advantage_estimator("gdpo")
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | Any,
    *,
    reward_components: torch.Tensor | None = None,
    reward_weights: Sequence[float] | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO: each reward component normalised within its group on its own, then summed and whitened.

        A_k,i = GRPO(component k)_i       (group mean and std of that component alone)
        A_i   = sum_k w_k * A_k,i          broadcast to the response tokens
        advantages = masked_whiten(A) over every unmasked token of the batch, 0 at masked tokens.

    Summing the components first (GRPO on the total) lets the one with the widest spread drown the
    others; normalising each first gives every component the same say, scaled by its weight.
    Without components it is GRPO on the total score followed by the batch whitening.

    GDPO: https://arxiv.org/abs/2601.05242.

    Args:
        token_level_rewards: (bs, response_len); used only when `reward_components` is None.
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample.
        reward_components: (bs, K) one column per component (algorithm.gdpo_reward_keys), or None.
        reward_weights: K weights (algorithm.gdpo_reward_weights); None: all 1.
        norm_adv_by_std_in_grpo, epsilon: as for GRPO, per component.

    Returns:
        advantages: (bs, response_len); returns: the same tensor (copy).
    """
    check_rewards_and_mask("compute_gdpo_outcome_advantage", token_level_rewards, response_mask)
    bs = token_level_rewards.shape[0]
    if reward_components is None:
        components = outcome_scores(token_level_rewards).unsqueeze(-1)
    else:
        if reward_components.ndim != 2 or reward_components.shape[0] != bs:
            raise ValueError(
                f"compute_gdpo_outcome_advantage: reward_components must be ({bs}, K), one column per "
                f"component, got {tuple(reward_components.shape)}"
            )
        components = reward_components.to(torch.promote_types(reward_components.dtype, torch.float32))
    k = components.shape[1]
    weights = [1.0] * k if reward_weights is None else [float(w) for w in reward_weights]
    if len(weights) != k:
        raise ValueError(
            f"gdpo has {k} reward component(s) but {len(weights)} weight(s) (algorithm.gdpo_reward_keys and "
            "algorithm.gdpo_reward_weights must have the same length)"
        )
    with torch.no_grad():
        total = sum(
            w * grpo_scores(components[:, j], index, norm_adv_by_std_in_grpo, epsilon)
            for j, w in enumerate(weights)
        )
        summed = broadcast_masked(total, response_mask)
        advantages = torch.where(response_mask.bool(), masked_whiten(summed, response_mask), 0.0)
    return advantages, advantages.clone()


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
    check_rewards_and_mask(
        "compute_reinforce_plus_plus_baseline_outcome_advantage", token_level_rewards, response_mask
    )
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards)
        group, n_groups = group_codes(index, scores.shape[0], scores.device)
        mean, counts = group_mean_and_count(scores, group, n_groups)
        mean = torch.where(counts == 1, torch.zeros_like(mean), mean)
        centred = broadcast_masked(scores - mean[group], response_mask)
        advantages = torch.where(response_mask.bool(), masked_whiten(centred, response_mask), 0.0)
    return advantages, advantages.clone()


@register_advantage_estimator("rloo")
@register_advantage_estimator("rloo_vectorized")
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
    A group of a single sample has no "others": following verl's `rloo` its advantage is its raw score.

    Also registered as `rloo_vectorized`, verl's loop-free name for it. verl's `rloo_vectorized` gives
    a single-sample group 0 instead of its raw score; here both names give the raw score (the config
    loader asks for rollout.n >= 2 with either, so no group has a single sample in training).

    RLOO: https://arxiv.org/abs/2402.14740 (Ahmadian et al., "Back to Basics").

    Args:
        token_level_rewards: (bs, response_len).
        response_mask: (bs, response_len) 0/1.
        index: (bs,) group id per sample.

    Returns:
        advantages: (bs, response_len); returns: the same tensor (copy).
    """
    check_rewards_and_mask("compute_rloo_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards)
        group, n_groups = group_codes(index, scores.shape[0], scores.device)
        mean, counts = group_mean_and_count(scores, group, n_groups)
        n = counts[group]
        loo = (scores - mean[group]) * n / (n - 1).clamp(min=1)
        advantages = broadcast_masked(torch.where(n > 1, loo, scores), response_mask)
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
    check_rewards_and_mask("compute_opo_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        group, n_groups = group_codes(index, scores.shape[0], scores.device)
        counts = torch.bincount(group, minlength=n_groups)
        weighted = group_sums(lengths * scores, group, n_groups)
        total_len = group_sums(lengths, group, n_groups)
        # A group whose responses are all empty has no unmasked token to carry an advantage anyway.
        baseline = torch.where(total_len > 0, weighted / total_len.clamp(min=1e-12), 0.0)
        baseline = torch.where(counts == 1, torch.zeros_like(baseline), baseline)
        advantages = broadcast_masked(scores - baseline[group], response_mask)
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
    check_rewards_and_mask("compute_grpo_passk_outcome_advantage", token_level_rewards, response_mask)
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards)
        group, n_groups = group_codes(index, scores.shape[0], scores.device)
        mean, counts = group_mean_and_count(scores, group, n_groups)
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
            std = torch.sqrt(group_sums((scores - mean[group]) ** 2, group, n_groups) / (counts - 1))
            margin = margin / (std + epsilon)
        per_sample = torch.zeros_like(scores).index_copy_(0, best, margin)
        advantages = broadcast_masked(per_sample, response_mask)
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
    check_rewards_and_mask("compute_remax_outcome_advantage", token_level_rewards, response_mask)
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
        rewards = torch.where(valid, token_level_rewards.to(float_dtype(token_level_rewards)), 0.0)
        returns = torch.where(valid, rewards.flip(-1).cumsum(-1).flip(-1), 0.0)
        baseline = reward_baselines.to(device=returns.device, dtype=returns.dtype).unsqueeze(-1)
        advantages = torch.where(valid, returns - baseline, 0.0)
    return advantages, returns
