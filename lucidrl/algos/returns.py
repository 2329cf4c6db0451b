"""Token-level estimators: discounted returns along each response, with a critic (GAE) or without
(REINFORCE++), skipping masked tokens the same way.

Each is registered by name (the `adv_estimator` config value) and returns `(advantages, returns)`, both
(bs, response_len), exactly 0 at masked positions, without grad.
"""

from __future__ import annotations

import torch

from lucidrl.algos.aggregation import masked_whiten
from lucidrl.algos.groups import check_rewards_and_mask, check_unit_interval, float_dtype
from lucidrl.algos.registry import register_advantage_estimator


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
    check_rewards_and_mask("compute_gae_advantage_return", token_level_rewards, response_mask)
    if values.shape != token_level_rewards.shape:
        raise ValueError(
            f"compute_gae_advantage_return: values {tuple(values.shape)} must match token_level_rewards "
            f"{tuple(token_level_rewards.shape)}"
        )
    check_unit_interval("gamma", gamma)
    check_unit_interval("lam", lam)
    with torch.no_grad():
        dtype = float_dtype(token_level_rewards)
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
    check_rewards_and_mask(
        "compute_reinforce_plus_plus_outcome_advantage", token_level_rewards, response_mask
    )
    check_unit_interval("gamma", gamma)
    with torch.no_grad():
        dtype = float_dtype(token_level_rewards)
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
