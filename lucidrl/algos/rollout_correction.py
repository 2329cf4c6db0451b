"""Rollout correction: importance weights and rejection masks between the rollout engine's log-probs and
the actor's, for when the two policies differ.

The engine that samples (vLLM, a bf16 decode, a server holding older weights) does not compute exactly
the actor's probabilities, so the samples are slightly off-policy. With rho_t = pi_actor(y_t) /
pi_rollout(y_t) = exp(old_log_prob_t - rollout_log_prob_t):

- importance sampling (`rollout_is`): weight each token's loss by rho_t ("token") or each sequence's by
  prod_t rho_t ("sequence"); the weights are truncated at an upper bound (TIS) or, with "lower_upper"
  bounds, set to 0 outside them (IcePop);
- rejection sampling (`rollout_rs`): drop tokens, or whole sequences, whose divergence estimate (k1, k2
  or k3 of log rho, per token or as the sequence's sum, mean or max) is past a threshold.

Both are verl 0.9.1's (verl/trainer/ppo/rollout_corr_helper.py, config algorithm.rollout_correction.*),
with its option names, threshold syntax and metric names (under "rollout_corr/", in
rollout_correction_metrics.py).

"When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch":
https://richardli.xyz/rl-collapse. Truncated importance sampling for this mismatch:
https://fengyao.notion.site/off-policy-rl. IcePop: https://ringtech.notion.site/icepop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lucidrl.algos.aggregation import masked_mean
from lucidrl.algos.rollout_correction_metrics import importance_metrics, off_policy_metrics, rejection_metrics

# exp(±20) bounds every exponentiated log-ratio: no overflow to inf, no underflow to 0 that a ratio divides
SAFETY_BOUND = 20.0

ROLLOUT_IS_LEVELS: tuple[str, ...] = ("token", "sequence")
ROLLOUT_RS_OPTIONS: tuple[str, ...] = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip


@dataclass(frozen=True)
class Bounds:
    """A threshold: an upper bound, and a lower one where the option has one (ratio bounds for k1 and
    IcePop, None otherwise)."""

    upper: float
    lower: float | None = None


def parse_is_threshold(
    spec: float | str, key: str = "algorithm.rollout_correction.rollout_is_threshold"
) -> Bounds:
    """`2.0` or `"2.0"`: truncate at 2 (TIS); `"0.5_5.0"`: keep weights in [0.5, 5], 0 outside (IcePop)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{key} must be a number or a 'lower_upper' string such as 0.5_5.0, got {spec!r}")
    text = str(spec).strip()
    try:
        lower, upper = (float(x) for x in text.split("_", 1)) if "_" in text else (None, float(text))
    except ValueError:
        raise ValueError(f"{key}={spec!r} is not a number or a 'lower_upper' pair such as 0.5_5.0") from None
    if not upper > 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{key}={spec!r}: the bounds must be positive, lower <= upper")
    return Bounds(upper, lower)


def parse_rs_options(spec: str, key: str = "algorithm.rollout_correction.rollout_rs") -> list[str]:
    """The comma-separated rejection options, duplicates dropped, in order; each must be known."""
    options = list(dict.fromkeys(o.strip() for o in str(spec).split(",") if o.strip()))
    if not options:
        raise ValueError(f"{key}={spec!r} names no option; use e.g. token_k1 or seq_mean_k3")
    bad = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if bad:
        raise ValueError(f"{key}={spec!r}: unknown option(s) {bad}; valid: {', '.join(ROLLOUT_RS_OPTIONS)}")
    return options


def parse_rs_thresholds(
    options: list[str],
    spec: float | str | None,
    key: str = "algorithm.rollout_correction.rollout_rs_threshold",
) -> dict[str, Bounds]:
    """One threshold per option (comma-separated), or one shared by all. k1 options bound the ratio:
    "lower_upper", or an upper bound u alone meaning [1/u, u]; k2/k3 options take an upper bound."""
    if spec is None:
        raise ValueError(f"{key} must be set when rollout_rs is (one threshold, or one per option)")
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{key} must be a number or a string, got {spec!r}")
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) == 1:
        parts = parts * len(options)
    if len(parts) != len(options):
        raise ValueError(
            f"{key}={spec!r} gives {len(parts)} thresholds for {len(options)} rollout_rs options "
            f"({', '.join(options)}): give one shared threshold or one per option"
        )
    out: dict[str, Bounds] = {}
    for option, part in zip(options, parts, strict=True):
        try:
            if option.endswith("k1"):
                lower, upper = part.split("_", 1) if "_" in part else (1.0 / float(part), part)
                bounds = Bounds(float(upper), float(lower))
            elif "_" in part:
                raise ValueError(f"{key}: option {option} takes one upper bound, got {part!r}")
            else:
                bounds = Bounds(float(part))
        except (ValueError, ZeroDivisionError) as e:
            if str(e).startswith(key):
                raise
            raise ValueError(
                f"{key}: {part!r} (for {option}) is not a number or a 'lower_upper' pair"
            ) from None
        if not bounds.upper > 0 or (bounds.lower is not None and not 0 < bounds.lower <= bounds.upper):
            raise ValueError(f"{key}: {part!r} (for {option}): the bounds must be positive, lower <= upper")
        out[option] = bounds
    return out


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, 0.0).sum(dim=-1)


def importance_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    threshold: Bounds,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated (TIS) or masked (IcePop) importance weights, detached, 0 on masked tokens.

        token:    w_t = exp(clamp(log rho_t, ±20))
        sequence: w_t = exp(clamp(sum_t log rho_t, ±20)) on every token of the sequence
        TIS:      w = min(w, upper);  IcePop: w = 0 where w < lower or w > upper
    With `batch_normalize` the weights are divided by their mean (over unmasked tokens for "token",
    over sequences for "sequence"), so they average 1 in the batch.

    Args:
        log_ratio: (bs, response_len) old_log_prob - rollout_log_prob.
        response_mask: (bs, response_len) 0/1.
        level: "token" or "sequence".
        threshold: from parse_is_threshold.
        batch_normalize: rescale to mean 1.

    Returns:
        weights: (bs, response_len); metrics: rollout_is_* (unprefixed; see importance_metrics).
    """
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is must be one of {ROLLOUT_IS_LEVELS} or null, got {level!r}")
    valid = response_mask.bool()
    if level == "token":
        log_for_metrics = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_for_metrics = _masked_sum(log_ratio, response_mask).unsqueeze(-1)  # (bs, 1)
        raw = torch.exp(torch.clamp(log_for_metrics, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = torch.where(valid, raw, 0.0)
    if threshold.lower is None:
        weights = raw.clamp(max=threshold.upper)
    else:
        weights = torch.where((raw >= threshold.lower) & (raw <= threshold.upper), raw, 0.0)
    weights = weights.detach()
    metrics = importance_metrics(
        weights, raw, log_for_metrics, response_mask, level, threshold.upper, threshold.lower
    )
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, response_mask)
        else:
            nonempty = valid.any(dim=-1).to(weights.dtype)
            mean = (masked_mean(weights, response_mask, dim=-1) * nonempty).sum() / nonempty.sum().clamp(
                min=1e-8
            )
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _token_divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """k1 = -log rho, k2 = (log rho)^2 / 2, k3 = rho - 1 - log rho, per token (log rho clamped to ±20)."""
    lr = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}


def rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, thresholds: dict[str, Bounds]
) -> tuple[torch.Tensor, dict[str, float]]:
    """Keep mask (bs, response_len): 1 where every rejection option passes, 0 where any fails.

    Per option the statistic is a token divergence (k1, k2, k3 of log rho), or the sequence's sum, mean
    or max of it over unmasked tokens; a sequence option keeps or drops the whole sequence. k1 options
    keep log(lower) <= statistic <= log(upper) (k1 = -log rho: with an upper bound u alone, rho within
    [1/u, u]); k2 and k3 options keep statistic <= upper.

    Args:
        log_ratio: (bs, response_len) old_log_prob - rollout_log_prob.
        response_mask: (bs, response_len) 0/1.
        thresholds: option name -> Bounds (parse_rs_options, parse_rs_thresholds).

    Returns:
        keep: (bs, response_len) in response_mask's dtype, response_mask times the options' verdict;
        metrics: rollout_rs_* (unprefixed; see rejection_metrics).
    """
    valid = response_mask.bool()
    per_token = _token_divergences(log_ratio)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for option, bounds in thresholds.items():
        kind = option[-2:]
        stat = per_token[kind]
        if option.startswith("token_"):
            seq_stat = None
        elif option.startswith("seq_sum_"):
            seq_stat = _masked_sum(stat, response_mask)
        elif option.startswith("seq_mean_"):
            seq_stat = masked_mean(stat, response_mask, dim=-1)
        else:  # seq_max_: an empty sequence's max is 0
            seq_stat = torch.where(valid, stat, float("-inf")).max(dim=-1).values
            seq_stat = torch.where(torch.isinf(seq_stat), 0.0, seq_stat)
        values = stat if seq_stat is None else seq_stat.unsqueeze(-1).expand_as(stat)
        if kind == "k1":
            low, high = math.log(bounds.lower), math.log(bounds.upper)
            keep = (values >= low) & (values <= high)
        else:
            low, high = 0.0, bounds.upper
            keep = values <= high
        keep_all &= keep
        metrics.update(
            rejection_metrics(
                option, values, seq_stat, keep, response_mask, high, low, lower_applies=kind == "k1"
            )
        )
    keep_float = keep_all.to(log_ratio.dtype)
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep_float, response_mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = (valid & ~keep_all).any(dim=-1).float().mean().item()
    return (response_mask * keep_all).to(response_mask.dtype), metrics


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Importance weights, rejection mask and the off-policy metrics of a batch, in one call (verl's
    compute_rollout_correction_and_rejection_mask).

    Args:
        old_log_prob: (bs, response_len) the training policy's log-probs (the actor's old-log-prob pass;
            in bypass mode the current forward's).
        rollout_log_prob: (bs, response_len) the rollout engine's log-probs of the same tokens.
        response_mask: (bs, response_len) 0/1, with at least one 1.
        rollout_is: None (no weights), "token" or "sequence".
        rollout_is_threshold: see parse_is_threshold; None: no weights either (as verl).
        rollout_is_batch_normalize: rescale the weights to mean 1.
        rollout_rs: None (no rejection) or comma-separated options of ROLLOUT_RS_OPTIONS.
        rollout_rs_threshold: see parse_rs_thresholds.

    Returns:
        weights: (bs, response_len) or None; keep: (bs, response_len) the response mask with rejected
        tokens set to 0 (the response mask itself without rejection); metrics: "rollout_corr/<name>".
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
            f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} must all be "
            "(bs, response_len)"
        )
    if not response_mask.bool().any():
        raise ValueError("rollout correction needs at least one response token; every response is empty")
    with torch.no_grad():
        old, rollout = old_log_prob.detach(), rollout_log_prob.detach()
        log_ratio = old - rollout
        metrics: dict[str, float] = {}
        weights = None
        if rollout_is is not None and rollout_is_threshold is not None:
            weights, is_metrics = importance_weights(
                log_ratio, response_mask, rollout_is, parse_is_threshold(rollout_is_threshold),
                rollout_is_batch_normalize,
            )  # fmt: skip
            metrics.update(is_metrics)
        keep = response_mask
        if rollout_rs is not None:
            options = parse_rs_options(rollout_rs)
            keep, rs_metrics = rejection_mask(
                log_ratio, response_mask, parse_rs_thresholds(options, rollout_rs_threshold)
            )
            metrics.update(rs_metrics)
        metrics.update(off_policy_metrics(old, rollout, response_mask))
    return weights, keep, {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}
