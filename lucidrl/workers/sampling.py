"""Drawing tokens from logits: top-k / top-p filtering and one uniform draw per row."""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the smallest set with probability >= top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already cover top_p (the first token always stays)
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of (rows, V) probabilities, by inverse CDF: one uniform draw per row.

    `torch.multinomial` draws an exponential per vocabulary entry, many times the work
    (benchmarks/decode_cpu.py's "+inverse CDF" variant). A token of probability 0 (filtered by top-k / top-p) is never drawn: its
    interval of the CDF is empty. Each token's interval is exact up to float32 rounding of the
    running sum (~1e-7 in probability).
    """
    cdf = probs.cumsum(-1)
    u = torch.rand((probs.shape[0], 1), dtype=cdf.dtype, device=probs.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    # rounding can put u at the very top of the CDF (odds ~2^-24): the likeliest token then
    empty = probs.gather(-1, tokens[:, None]).squeeze(-1) == 0
    return torch.where(empty, probs.argmax(-1), tokens) if bool(empty.any()) else tokens
