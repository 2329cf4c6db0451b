"""Per-token KL estimators between the policy and the reference model.

Used either as a reward penalty (`-beta * kl` added to token rewards) or as a loss term (`kl_loss`).
Estimators from J. Schulman, "Approximating KL Divergence": http://joschu.net/blog/kl-approx.html
"""

from __future__ import annotations

import torch

KL_PENALTY_KINDS: tuple[str, ...] = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens' log-probs.

    With d = log_prob - ref_log_prob:
        "k1" / "kl":         d                          unbiased, high variance, can be negative.
        "abs":               |d|
        "k2" / "mse":        0.5 * d**2                 biased, low variance.
        "k3" / "low_var_kl": exp(-d) + d - 1            unbiased, low variance, >= 0; clamped to
                             [-10, 10] (and -d to [-20, 20] before exp) so one outlier token
                             cannot dominate the loss or overflow.

    http://joschu.net/blog/kl-approx.html

    Args:
        log_prob: (bs, response_len) log-probs of the sampled tokens under the policy.
        ref_log_prob: (bs, response_len) same tokens under the reference model.
        kind: one of KL_PENALTY_KINDS.

    Returns:
        (bs, response_len) per-token KL estimate; aggregate with agg_loss / masked_mean.
    """
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"kl_penalty: log_prob shape {tuple(log_prob.shape)} != ref_log_prob shape "
            f"{tuple(ref_log_prob.shape)}"
        )
    if kind in ("k1", "kl"):
        return log_prob - ref_log_prob
    if kind == "abs":
        return (log_prob - ref_log_prob).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind in ("k3", "low_var_kl"):
        log_ratio = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"Unknown KL penalty kind {kind!r}; valid kinds: {list(KL_PENALTY_KINDS)}")
