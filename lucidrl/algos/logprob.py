"""Token log-probabilities and entropies from logits, in float32 whatever the logits' dtype.

Rollout and training must compute log-probs the same way: a bf16 log-softmax in one place and a
float32 one in the other is a known source of silent RL instability (the PPO ratio drifts from 1 on
tokens the policy never changed). Both functions therefore always work in float32, and divide by the
sampling temperature only after the upcast, as the rollout does: a bf16 quotient `logits / 0.7` is
rounded to 8 bits of mantissa, which moved log-probs by up to 0.13 nats against the rollout's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _rowwise_float32(fn: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    """Apply `fn` (vocab-dim reduction) in float32; for low-precision logits one batch row at a time,
    so the float32 working copies never all exist at once (peak memory ~ one row, not a full copy)."""
    if logits.dtype in (torch.float32, torch.float64):
        return fn(logits)
    if logits.ndim < 2:
        return fn(logits.float())
    return torch.stack([fn(row.float()) for row in logits])


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each label token: log_softmax(logits / temperature)[..., label], in float32.

    Uses gather(logits, label) - logsumexp(logits) rather than log_softmax + gather, so no
    (bs, T, V) log-softmax output is materialised or kept for backward.

    Args:
        logits: (bs, T, V) any float dtype (bf16/fp16 are upcast to float32).
        labels: (bs, T) int64 token ids in [0, V).
        temperature: applied after the upcast to float32.

    Returns:
        (bs, T) float32 (float64 for float64 logits) log-probs.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logprobs_from_logits: logits {tuple(logits.shape)} must be labels {tuple(labels.shape)} "
            "plus a vocab dimension"
        )
    # Gather in the input dtype then upcast: exact, since every bf16/fp16 value is a float32 value.
    picked = torch.gather(logits, -1, labels.unsqueeze(-1).long()).squeeze(-1)
    picked = picked.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature == 1.0:
        return picked - _rowwise_float32(lambda x: torch.logsumexp(x, dim=-1), logits)
    return picked / temperature - _rowwise_float32(lambda x: torch.logsumexp(x / temperature, dim=-1), logits)


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the categorical distribution softmax(logits / temperature) at each position, in
    float32 (the division after the upcast).

    H = logsumexp(logits) - sum(softmax(logits) * logits), which is -sum(p log p) without taking the
    log of probabilities that underflow to 0.

    Args:
        logits: (bs, T, V) any float dtype.

    Returns:
        (bs, T) float32 (float64 for float64 logits) entropies in nats.
    """
    if temperature == 1.0:
        return _rowwise_float32(_entropy, logits)
    return _rowwise_float32(lambda x: _entropy(x / temperature), logits)


def _sum_squares(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.logsumexp(2.0 * x, dim=-1) - 2.0 * torch.logsumexp(x, dim=-1))


def sum_pi_squared_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """sum_v pi(v)^2 of softmax(logits / temperature) at each position, in float32 (the division after
    the upcast), without forming the probabilities: exp(logsumexp(2x) - 2 logsumexp(x)).

    The optimal token baselines weight each token by 1 - 2 pi(y) + sum_v pi(v)^2, the squared norm of
    the score function with respect to the logits (lucidrl.algos.token_baseline).

    Args:
        logits: (bs, T, V) any float dtype.

    Returns:
        (bs, T) float32 (float64 for float64 logits), in (0, 1].
    """
    if temperature == 1.0:
        return _rowwise_float32(_sum_squares, logits)
    return _rowwise_float32(lambda x: _sum_squares(x / temperature), logits)
