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


def _check_clip_range(clip_ratio_low: float, clip_ratio_high: float, *, low_below_one: bool = True) -> None:
    if not (0.0 <= clip_ratio_low < 1.0 if low_below_one else clip_ratio_low >= 0.0):
        bound = "[0, 1)" if low_below_one else ">= 0"
        raise ValueError(
            f"clip_ratio_low must be {bound} (ratio clipped at 1 - it; actor.clip_ratio_low), got {clip_ratio_low}"
        )
    if not clip_ratio_high >= 0.0:
        raise ValueError(
            f"clip_ratio_high must be >= 0 (ratio clipped at 1 + it; actor.clip_ratio_high), got {clip_ratio_high}"
        )


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "seq-mean-token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: PPO clipping applied to one sequence-level importance ratio per response.

    With d_t = log_prob_t - old_log_prob_t over the response's unmasked tokens (|y| of them):
        s       = exp(mean_t d_t)                              (geometric mean of the token ratios)
        s_t     = sg[s] * pi(y_t) / sg[pi(y_t)]                 (value s, gradient s * grad log pi(y_t))
        loss_t  = max(-A_t * s_t, -A_t * clip(s_t, 1 - clip_ratio_low, 1 + clip_ratio_high))
    so every token of a response shares the same ratio and the same clip decision, and the gradient
    is s * A * mean_t grad log pi(y_t) with "seq-mean-token-mean" aggregation. The log of s_t is
    clamped at 10 before exp (verl). No dual clip: `clip_ratio_c` is accepted and unused.

    The paper's clip range is tiny (3e-4 / 4e-4, the defaults here) because s is a per-token
    geometric mean; whatever the caller passes is used. verl always aggregates GSPO with
    "seq-mean-token-mean"; here the passed `loss_agg_mode` is honoured — set
    actor.loss_agg_mode=seq-mean-token-mean for the paper's objective.

    GSPO: https://arxiv.org/abs/2507.18071.

    Args:
        old_log_prob: (bs, response_len) rollout-policy log-probs of the sampled tokens.
        log_prob: (bs, response_len) current-policy log-probs (carries the gradient).
        advantages: (bs, response_len), normally constant over a response (outcome advantages).
        response_mask: (bs, response_len) 0/1.
        clip_ratio_low, clip_ratio_high: s is clipped to [1 - low, 1 + high].
        clip_ratio_c: unused (accepted so every loss takes the same arguments).
        loss_agg_mode: see `agg_loss`.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (fraction of unmasked tokens on the clipped branch), pg_clipfrac_lower
            (always 0.0: no dual clip), ppo_kl (token mean of old_log_prob - log_prob).
    """
    del clip_ratio_c
    _check_clip_range(clip_ratio_low, clip_ratio_high)
    _check_same_shape(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask
    )
    valid = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    lengths = valid.sum(dim=-1).clamp(min=1)
    seq_log_ratio = torch.where(valid, log_ratio, 0.0).sum(dim=-1) / lengths
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))

    loss_unclipped = -advantages * seq_ratio
    loss_clipped = -advantages * torch.clamp(seq_ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)

    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
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
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance weight; no token loses its gradient.

    With r_t = exp(log_prob_t - old_log_prob_t) (log-ratio clamped to [-20, 20]):
        w_t    = sg[clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)]
        loss_t = -w_t * A_t * log_prob_t                 gradient: -w_t * A_t * grad log pi(y_t)
    PPO zeroes the gradient of a clipped token; CISPO keeps it and only bounds its weight, which
    matters for rare "fork" tokens (e.g. "Wait", "However") that PPO clips after one update.
    MiniMax-M1 sets no lower bound (a large epsilon_low) and tunes only the upper one: pass
    clip_ratio_low >= 1 (actor.clip_ratio_low=1.0) for that. No dual clip: `clip_ratio_c` is unused.

    CISPO (MiniMax-M1, section 3.1): https://arxiv.org/abs/2506.13585.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len), as for PPO.
        clip_ratio_low: weight clipped below at 1 - it; >= 0, and >= 1 means no lower bound.
        clip_ratio_high: weight clipped above at 1 + it; >= 0.
        clip_ratio_c: unused.
        loss_agg_mode: see `agg_loss`.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (fraction of unmasked tokens whose weight was clipped, either side, as
            in verl), pg_clipfrac_lower (always 0.0), ppo_kl (token mean of old_log_prob - log_prob).
    """
    del clip_ratio_c
    _check_clip_range(clip_ratio_low, clip_ratio_high, low_below_one=False)
    _check_same_shape(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask
    )
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio.detach())
    weight = torch.clamp(ratio, min=1.0 - clip_ratio_low, max=1.0 + clip_ratio_high)
    pg_losses = -weight * advantages * log_prob
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)

    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((weight != ratio).float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("reinforce")
def compute_policy_loss_reinforce(
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
    """Plain on-policy policy gradient (REINFORCE): loss_t = -A_t * log_prob_t, no ratio, no clip.

    The gradient is -A_t * grad log pi(y_t), which is unbiased only for samples from the current
    policy: use it with one update per rollout (actor.ppo_epochs=1 and one mini-batch), otherwise
    prefer a ratio-based loss. `old_log_prob` only feeds the ppo_kl metric (how off-policy the
    update has become); the clip arguments are accepted and unused.

    REINFORCE: Williams 1992, https://doi.org/10.1007/BF00992696. With an RLOO or GRPO
    baseline this is the objective of https://arxiv.org/abs/2402.14740.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len).
        clip_ratio_low, clip_ratio_high, clip_ratio_c: unused.
        loss_agg_mode: see `agg_loss`.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac 0.0, pg_clipfrac_lower 0.0, ppo_kl (token mean of old_log_prob - log_prob).
    """
    del clip_ratio_low, clip_ratio_high, clip_ratio_c
    _check_same_shape(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask
    )
    pg_loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": 0.0,
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask).item(),
        }
    return pg_loss, metrics
