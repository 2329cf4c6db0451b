"""Reduce a per-token loss matrix to a scalar, and masked statistics over response tokens.

The aggregation mode decides how much each token and each sequence weighs in the gradient, which is
an algorithmic choice, not a detail: GRPO's paper uses seq-mean-token-mean, DAPO token-mean, and
Dr.GRPO (https://arxiv.org/abs/2503.20783) seq-mean-token-sum-norm to remove the length bias;
token-sum (verl 0.9.1) sums every token of the batch, so the loss scale grows with the batch.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, and 0 where den == 0 — without the NaN gradients a torch.where over num/den gives."""
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is non-zero; 0 (not NaN) where nothing is unmasked.

    Args:
        x: any shape.
        mask: same shape as `x`; 0/1 (bool, int or float).
        dim: reduce over this dimension only; None reduces over everything to a scalar.
    """
    mask = mask.to(x.dtype)
    if dim is None:
        return _safe_div((x * mask).sum(), mask.sum())
    return _safe_div((x * mask).sum(dim=dim), mask.sum(dim=dim))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over unmasked positions (scalar); `unbiased` applies Bessel's correction."""
    n = mask.to(x.dtype).sum()
    if n == 0 or (unbiased and n == 1):
        raise ValueError(
            f"masked_var needs at least {2 if unbiased else 1} unmasked element(s), got {int(n.item())}: "
            "whitening (reinforce_plus_plus, gae) runs over all of a step's response tokens, and this step's "
            "responses hold fewer; sample more per step (data.train_batch_size x rollout.n) or longer "
            "responses (a model that ends at once gives none)"
        )
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise `x` to zero mean and unit (unbiased) variance over the unmasked positions.

    Statistics come from unmasked positions only, but every position is transformed; multiply by the
    mask afterwards if masked positions must be zero. With `shift_mean=False` the mean is kept and only
    the scale changes.

    Args:
        x: any shape, e.g. advantages (bs, response_len).
        mask: same shape as `x`, 0/1.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss into the scalar that is back-propagated.

    Modes (`m` = mask, `T` = loss_mask.shape[-1], the padded response length):
        token-mean:              sum(loss * m) / sum(m) — every token in the batch weighs the same.
        token-sum:               sum(loss * m) — every token weighs 1, the loss grows with the batch.
        seq-mean-token-sum:      mean over sequences of sum_t(loss * m).
        seq-mean-token-mean:     mean over sequences of the per-sequence masked mean.
        seq-mean-token-sum-norm: mean over sequences of sum_t(loss * m) / D — Dr.GRPO's constant
                                 normaliser, no length bias, as the paper and TRL's "dr_grpo" define it.
                                 D is `loss_scale_factor` (actor.loss_scale_factor) when given, else T,
                                 which must then be the same every step: the workers pad the loss inputs
                                 to data.max_response_length (`pad_response_width`). verl 0.9.1 divides
                                 the token sums by the mini-batch's sample count (ppo_mini_batch_size x
                                 rollout.n, empty responses included) and then by loss_scale_factor,
                                 which defaults to the micro-batch's padded width: its divisor changes
                                 with how the batch is cut unless loss_scale_factor is set.

    Sequences whose mask is all zero are left out of the seq-mean modes' mean; when nothing is
    unmasked every mode returns 0, still attached to the graph, instead of NaN.

    Args:
        loss_mat: (bs, response_len) per-token loss.
        loss_mask: (bs, response_len) 0/1, 1 on tokens that count.
        loss_agg_mode: one of LOSS_AGG_MODES.
        loss_scale_factor: > 0, seq-mean-token-sum-norm's divisor D; None: the mask's width T.

    Returns:
        scalar tensor.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(LOSS_AGG_MODES)}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss: loss_mat shape {tuple(loss_mat.shape)} != loss_mask shape {tuple(loss_mask.shape)}"
        )
    if loss_scale_factor is not None and not loss_scale_factor > 0:
        raise ValueError(f"loss_scale_factor must be > 0 (actor.loss_scale_factor), got {loss_scale_factor}")
    mask = loss_mask.to(loss_mat.dtype)
    masked = loss_mat * mask

    if loss_agg_mode == "token-mean":
        return _safe_div(masked.sum(), mask.sum())
    if loss_agg_mode == "token-sum":
        return masked.sum()

    tokens_per_seq = mask.sum(dim=-1)
    seq_losses = masked.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = _safe_div(seq_losses, tokens_per_seq)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = seq_losses / (loss_scale_factor or loss_mask.shape[-1])
    nonempty = (tokens_per_seq > 0).to(loss_mat.dtype)
    return _safe_div((seq_losses * nonempty).sum(), nonempty.sum())


def norm_width(
    loss_agg_mode: str, response_length: int | None, loss_scale_factor: float | None = None
) -> int | None:
    """The width the loss inputs are padded to: data.max_response_length under
    seq-mean-token-sum-norm (its constant divisor) unless a loss_scale_factor gives the divisor, None
    (no padding) otherwise."""
    if loss_agg_mode != "seq-mean-token-sum-norm" or loss_scale_factor is not None:
        return None
    if response_length is None:
        raise ValueError(
            "loss_agg_mode=seq-mean-token-sum-norm needs response_length (data.max_response_length)"
        )
    return response_length


def pad_response_width(width: int, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Each (bs, R) tensor zero-padded on the right to (bs, width); None stays None.

    seq-mean-token-sum-norm divides by the loss matrix's width, which must be a constant (Dr.GRPO's
    max response length) while the rollout trims each batch to its longest response and the update
    trims each micro-batch: padding the loss inputs (never the forward) restores it. The mask pads
    with zeros, so the padded positions count for nothing else.
    """
    out: list[torch.Tensor | None] = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        if t.shape[-1] > width:
            raise ValueError(
                f"a response of {t.shape[-1]} tokens is wider than the normalising length {width} of "
                "loss_agg_mode=seq-mean-token-sum-norm (data.max_response_length); raise it"
            )
        out.append(torch.nn.functional.pad(t, (0, width - t.shape[-1])))
    return out
