"""Policy-gradient losses: per-token objective from log-probs and advantages, aggregated to a scalar.

Each loss is one top-level function registered by name (the `policy_loss` config value) and returns
`(loss, metrics)`; metric names are the ones users grep for under `actor/` (pg_clipfrac, ppo_kl, ...).
The actor passes each loss the keyword arguments its signature names (clip ratios, loss_agg_mode,
loss_scale_factor, rollout_is_weights, and a loss's own keys such as tau_pos). `rollout_is_weights`
(bs, response_len), from rollout correction (rollout_correction.py), multiplies the per-token loss
before aggregation, as in verl 0.9.1.

Here the losses that clip a ratio (PPO's per token, GSPO's per sequence, GMPO's geometric mean);
those that keep every token's gradient (CISPO, REINFORCE / GPG, SAPO) are in policy_loss_soft.py,
those that bound the update by masking or penalising tokens instead (DPPO, Clip-Cov, KL-Cov, DRO)
in policy_loss_trust.py.
"""

from __future__ import annotations

import torch

from lucidrl.algos.aggregation import agg_loss, masked_mean
from lucidrl.algos.registry import register_policy_loss


def check_same_shape(**tensors: torch.Tensor | None) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"policy loss inputs must all be (bs, response_len); got shapes {shapes}")


def weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """The per-token loss times the rollout-correction importance weights (detached), when there are any."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights.detach()


@register_policy_loss("vanilla", zero_advantage_inert=True)
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
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    metrics_mask: torch.Tensor | None = None,
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
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) rollout-correction weights multiplying the per-token loss,
            or None.
        metrics_mask: (bs, response_len) the tokens the metrics count, or None: response_mask's. Bypass
            mode gives its kept tokens, as verl's metrics count them.

    Returns:
        pg_loss: scalar tensor to back-propagate.
        metrics: floats over unmasked tokens (metrics_mask's) —
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
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
        metrics_mask=metrics_mask,
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
    pg_loss = agg_loss(
        weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, loss_scale_factor
    )

    counted = response_mask if metrics_mask is None else metrics_mask
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), counted).item(),
            "pg_clipfrac_lower": masked_mean(((loss_ppo > loss_dual) & negative).float(), counted).item(),
            "ppo_kl": masked_mean(-log_ratio, counted).item(),
        }
    return pg_loss, metrics


def check_clip_range(clip_ratio_low: float, clip_ratio_high: float, *, low_below_one: bool = True) -> None:
    if not (0.0 <= clip_ratio_low < 1.0 if low_below_one else clip_ratio_low >= 0.0):
        bound = "[0, 1)" if low_below_one else ">= 0"
        raise ValueError(
            f"clip_ratio_low must be {bound} (ratio clipped at 1 - it; actor.clip_ratio_low), got {clip_ratio_low}"
        )
    if not clip_ratio_high >= 0.0:
        raise ValueError(
            f"clip_ratio_high must be >= 0 (ratio clipped at 1 + it; actor.clip_ratio_high), got {clip_ratio_high}"
        )


@register_policy_loss("gspo", zero_advantage_inert=True)
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
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
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
    geometric mean; whatever the caller passes is used. The passed `loss_agg_mode` is used, as verl
    0.9.1 does (its GSPO takes actor.loss_agg_mode; only SAPO forces seq-mean-token-mean) — set
    actor.loss_agg_mode=seq-mean-token-mean for the paper's sequence-level objective.

    GSPO: https://arxiv.org/abs/2507.18071.

    Args:
        old_log_prob: (bs, response_len) rollout-policy log-probs of the sampled tokens.
        log_prob: (bs, response_len) current-policy log-probs (carries the gradient).
        advantages: (bs, response_len), normally constant over a response (outcome advantages).
        response_mask: (bs, response_len) 0/1.
        clip_ratio_low, clip_ratio_high: s is clipped to [1 - low, 1 + high].
        clip_ratio_c: unused (accepted so every loss takes the same arguments).
        loss_agg_mode, loss_scale_factor: see `agg_loss`.
        rollout_is_weights: (bs, response_len) rollout-correction weights multiplying the per-token loss,
            or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (fraction of unmasked tokens on the clipped branch), pg_clipfrac_lower
            (always 0.0: no dual clip), ppo_kl (token mean of old_log_prob - log_prob).
    """
    del clip_ratio_c
    check_clip_range(clip_ratio_low, clip_ratio_high)
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
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
    pg_loss = agg_loss(
        weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, loss_scale_factor
    )

    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("geo_mean", loss_agg_mode="seq-mean-token-mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    loss_agg_mode: str = "seq-mean-token-mean",
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (`geo_mean`): maximise the geometric mean of the token ratios, clipped per token in log space.

    With d_t = log_prob_t - old_log_prob_t and the sequence's mean advantage A (sign s = sign(A)):
        d'_t   = s * min(s * d_t, s * clip(d_t, -clip_ratio_low, clip_ratio_high))   (PPO's pessimism)
        ratio  = exp(mean over unmasked t of d'_t)                  (geometric mean of the ratios)
        loss_i = -A * ratio,   averaged over the sequences
    The geometric mean is less sensitive than the arithmetic one to a few tokens with extreme
    ratios, so a wider clip range (the paper's e^±0.4, in log space here) stays stable. Advantages
    are taken per sequence (their masked mean), as verl does. With rollout-correction weights w the
    loss is multiplied by their geometric mean over the sequence.

    Per sequence by construction: the config loader asks for actor.loss_agg_mode=seq-mean-token-mean
    with it. verl 0.9.1 averages over every row of the micro-batch, an empty response included; here
    the mean runs over the non-empty responses (as every seq-mean mode does), which is the same number
    whenever each response holds a token.

    GMPO: https://arxiv.org/abs/2507.20673.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (bs, response_len), as for PPO.
        clip_ratio_low, clip_ratio_high: >= 0, bounds of the log-ratio (not the ratio): d is clipped to
            [-clip_ratio_low, clip_ratio_high].
        loss_agg_mode: must be seq-mean-token-mean.
        loss_scale_factor: unused.
        rollout_is_weights: (bs, response_len) or None.

    Returns:
        pg_loss: scalar tensor.
        metrics: pg_clipfrac (share of unmasked tokens with A > 0 whose log-ratio left the range),
            pg_clipfrac_lower (the same for A < 0), ppo_kl.
    """
    if loss_agg_mode != "seq-mean-token-mean":
        raise ValueError(
            f"the geo_mean policy loss averages per sequence, got loss_agg_mode={loss_agg_mode!r}; set "
            "actor.loss_agg_mode=seq-mean-token-mean"
        )
    check_clip_range(clip_ratio_low, clip_ratio_high, low_below_one=False)
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
    )
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clipped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    lengths = mask.sum(dim=-1)
    ratio = torch.exp((pessimistic * mask).sum(dim=-1) / (lengths + 1e-8))
    seq_advantage = (advantages * mask).sum(dim=-1) / (lengths + 1e-8)
    seq_losses = -seq_advantage * ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.detach() + 1e-10)
        seq_losses = seq_losses * torch.exp((log_w * mask).sum(dim=-1) / (lengths + 1e-8))
    # each sequence's loss on its tokens, averaged per sequence: the mean over non-empty sequences
    pg_loss = agg_loss(seq_losses.unsqueeze(-1).expand_as(log_prob), response_mask, "seq-mean-token-mean")
    with torch.no_grad():
        out = log_ratio != clipped
        metrics = {
            "pg_clipfrac": masked_mean((out & (advantages > 0)).float(), response_mask).item(),
            "pg_clipfrac_lower": masked_mean((out & (advantages < 0)).float(), response_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_loss, metrics
