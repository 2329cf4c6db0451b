"""Metrics of rollout correction: how far the rollout engine's log-probs are from the actor's, and what
the importance weights and rejection did about it. verl 0.9.1's metric names and formulas (logged under
"rollout_corr/" by rollout_correction.rollout_correction); every value a float.

Where verl averages with masked_mean it divides by the count plus 1e-8, lucidrl's masked_mean by the
count itself (0 where nothing is unmasked): the two agree to about 1e-8 relative.
"""

from __future__ import annotations

import math

import torch

from lucidrl.algos.aggregation import masked_mean

SAFETY_BOUND = 20.0  # as rollout_correction.SAFETY_BOUND


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    return torch.where(mask.bool(), x, float("-inf")).max().item()


def _masked_min(x: torch.Tensor, mask: torch.Tensor) -> float:
    return torch.where(mask.bool(), x, float("inf")).min().item()


def _clamped_std(x: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """Std over unmasked positions of x clamped to [low, high] (E[x^2] - E[x]^2, floored at 0); 0 with
    fewer than two unmasked positions."""
    if mask.sum() <= 1:
        return 0.0
    c = x.clamp(min=low, max=high)
    mean = masked_mean(c, mask)
    return math.sqrt(max(0.0, (masked_mean(c.square(), mask) - mean.square()).item()))


def importance_metrics(
    weights: torch.Tensor,
    raw_weights: torch.Tensor,
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    upper: float,
    lower: float | None,
) -> dict[str, float]:
    """rollout_is_*: the applied weights' mean, max, min, std, effective sample size, the share of raw
    ratios past the bounds, and per-sequence summaries.

    Args:
        weights: (bs, R) the applied (truncated or IcePop-masked) weights, 0 on masked tokens.
        raw_weights: (bs, R) the weights before truncation, 0 on masked tokens.
        log_ratio: (bs, R) token log-ratios ("token") or (bs, 1) sequence sums ("sequence"), unclamped.
        response_mask: (bs, R) 0/1.
        level: "token" or "sequence".
        upper, lower: the bounds (lower None: TIS, whose lower bound for the "low" share is 1 / upper).
    """
    lower_for_share = 1.0 / upper if lower is None else lower
    m: dict[str, float] = {"rollout_is_mean": masked_mean(weights, response_mask).item()}
    if level == "sequence":
        # from the log-ratios, whose exp the stored weights may have truncated
        m["rollout_is_max"] = math.exp(min(log_ratio.max().item(), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(log_ratio.min().item())
        m["rollout_is_ratio_fraction_high"] = (log_ratio > math.log(upper)).float().mean().item()
        m["rollout_is_ratio_fraction_low"] = (log_ratio < math.log(lower_for_share)).float().mean().item()
    else:
        m["rollout_is_ratio_fraction_high"] = masked_mean((raw_weights > upper).float(), response_mask).item()
        m["rollout_is_ratio_fraction_low"] = masked_mean(
            (raw_weights < lower_for_share).float(), response_mask
        ).item()
        m["rollout_is_max"] = _masked_max(weights, response_mask)
        m["rollout_is_min"] = _masked_min(weights, response_mask)
    m["rollout_is_std"] = _clamped_std(weights, response_mask, 0.0, upper)
    clamped = weights.clamp(min=0.0, max=upper)
    normalised = clamped / (masked_mean(clamped, response_mask) + 1e-8)
    second_moment = masked_mean(normalised.square(), response_mask).item()
    # every weight 0 (IcePop with every ratio out of bounds): no effective sample. verl divides by the
    # 0 and raises ZeroDivisionError there
    m["rollout_is_eff_sample_size"] = 1.0 / second_moment if second_moment > 0 else 0.0
    seq_mean = masked_mean(weights, response_mask, dim=-1)
    m["rollout_is_seq_mean"] = seq_mean.mean().item()
    m["rollout_is_seq_std"] = seq_mean.std().item() if seq_mean.numel() > 1 else 0.0
    m["rollout_is_seq_max"] = seq_mean.max().item()
    m["rollout_is_seq_min"] = seq_mean.min().item()
    m["rollout_is_seq_max_deviation"] = (seq_mean - 1.0).abs().max().item()
    # from the raw per-sequence means: a mean of truncated weights never exceeds the bound
    raw_seq_mean = masked_mean(raw_weights, response_mask, dim=-1)
    m["rollout_is_seq_fraction_high"] = (raw_seq_mean > upper).float().mean().item()
    m["rollout_is_seq_fraction_low"] = (raw_seq_mean < lower_for_share).float().mean().item()
    if lower is not None:
        out = (raw_weights < lower) | (raw_weights > upper)
        m["rollout_is_oob_ratio"] = masked_mean(out.float(), response_mask).item()
    return m


def rejection_metrics(
    option: str,
    values: torch.Tensor,
    seq_values: torch.Tensor | None,
    keep: torch.Tensor,
    response_mask: torch.Tensor,
    upper: float,
    lower: float,
    lower_applies: bool,
) -> dict[str, float]:
    """rollout_rs_<option>_*: the statistic's mean, max, min, std, the share past the bounds, per-sequence
    summaries, and the share of tokens and sequences the option masked.

    Args:
        option: e.g. "token_k1", "seq_mean_k3".
        values: (bs, R) the statistic per token (a sequence option's value repeated on its tokens).
        seq_values: (bs,) a sequence option's value per sequence, None for token options.
        keep: (bs, R) bool, the option's verdict.
        response_mask: (bs, R) 0/1.
        upper, lower: the bounds in the statistic's units (log-ratios for k1; lower 0 for k2/k3).
        lower_applies: k1 options have a lower bound.
    """
    p = f"rollout_rs_{option}"
    valid = response_mask.bool()
    seq_valid = valid.any(dim=-1)
    per_seq = masked_mean(values, response_mask, dim=-1) if seq_values is None else seq_values
    per_seq = per_seq[seq_valid]
    m: dict[str, float] = {f"{p}_mean": masked_mean(values, response_mask).item()}
    if seq_values is not None and per_seq.numel():
        m[f"{p}_max"], m[f"{p}_min"] = per_seq.max().item(), per_seq.min().item()
        m[f"{p}_fraction_high"] = (per_seq > upper).float().mean().item()
        m[f"{p}_fraction_low"] = (per_seq < lower).float().mean().item() if lower_applies else 0.0
    else:
        m[f"{p}_max"], m[f"{p}_min"] = _masked_max(values, response_mask), _masked_min(values, response_mask)
        m[f"{p}_fraction_high"] = masked_mean((values > upper).float(), response_mask).item()
        m[f"{p}_fraction_low"] = (
            masked_mean((values < lower).float(), response_mask).item() if lower_applies else 0.0
        )
    m[f"{p}_std"] = _clamped_std(values, response_mask, lower if lower_applies else 0.0, upper)
    if per_seq.numel():
        m[f"{p}_seq_mean"] = per_seq.mean().item()
        m[f"{p}_seq_std"] = per_seq.std().item() if per_seq.numel() > 1 else 0.0
        m[f"{p}_seq_max"], m[f"{p}_seq_min"] = per_seq.max().item(), per_seq.min().item()
        m[f"{p}_seq_max_deviation"] = per_seq.abs().max().item()
        m[f"{p}_seq_fraction_high"] = (per_seq > upper).float().mean().item()
        if lower_applies:
            m[f"{p}_seq_fraction_low"] = (per_seq < lower).float().mean().item()
    else:
        for k in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high",
                  "seq_fraction_low"):  # fmt: skip
            m[f"{p}_{k}"] = 0.0
    m[f"{p}_masked_fraction"] = masked_mean((~keep).float(), response_mask).item()
    dropped = (valid & ~keep).any(dim=-1)
    n_seq = int(seq_valid.sum())
    m[f"{p}_seq_masked_fraction"] = (dropped & seq_valid).float().sum().item() / n_seq if n_seq else 0.0
    return m


def off_policy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """The gap between the actor's and the rollout engine's log-probs of the sampled tokens.

        kl:               token mean of rollout_log_prob - old_log_prob   (k1 of KL(rollout || actor))
        k3_kl:            token mean of rho - 1 - log rho, rho = exp(old - rollout)
        training_ppl, rollout_ppl: mean over sequences of exp(-mean token log-prob); *_log_ppl without exp
        log_ppl_diff:     mean over sequences of (rollout - actor) mean token log-prob; also |.|, max, min
        ppl_ratio:        mean over sequences of exp(log_ppl_diff)
        chi2_token:       token mean of rho^2, minus 1;  chi2_seq: sequence mean of prod_t rho_t^2, minus 1

    Args:
        old_log_prob, rollout_log_prob, response_mask: (bs, response_len).
    """
    mask = response_mask
    train_mean = masked_mean(old_log_prob, mask, dim=-1)
    rollout_mean = masked_mean(rollout_log_prob, mask, dim=-1)
    log_ratio = old_log_prob - rollout_log_prob
    diff = rollout_mean - train_mean
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    seq_log_ratio = torch.where(mask.bool(), log_ratio, 0.0).sum(dim=-1)
    return {
        "training_ppl": torch.exp(-train_mean).mean().item(),
        "training_log_ppl": (-train_mean).mean().item(),
        "kl": masked_mean(rollout_log_prob - old_log_prob, mask).item(),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1.0, mask).item(),
        "rollout_ppl": torch.exp(-rollout_mean).mean().item(),
        "rollout_log_ppl": (-rollout_mean).mean().item(),
        "log_ppl_diff": diff.mean().item(),
        "log_ppl_abs_diff": diff.abs().mean().item(),
        "log_ppl_diff_max": diff.max().item(),
        "log_ppl_diff_min": diff.min().item(),
        "ppl_ratio": torch.exp(diff).mean().item(),
        "chi2_token": (masked_mean(rho.square(), mask) - 1.0).item(),
        "chi2_seq": (
            torch.exp(2.0 * torch.clamp(seq_log_ratio, -SAFETY_BOUND, SAFETY_BOUND)).mean() - 1.0
        ).item(),
    }
