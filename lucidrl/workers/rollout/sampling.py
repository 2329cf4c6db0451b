"""Drawing tokens from logits: top-k / top-p filtering, one uniform draw per row, and the draws
themselves, fixed per row and step (RowDraws)."""

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


# RowDraws draws every row's uniforms for this many decoding steps at a time
DRAW_BLOCK = 64


class RowDraws:
    """The uniform each row of a decoding call draws at each step, fixed by the row and the step.

    Drawn in blocks of (rows, DRAW_BLOCK) from a generator of the call's own, seeded once from the
    process RNG (so `torch.manual_seed` still makes a call reproducible, and the process RNG advances
    by one draw per call whatever the responses' lengths). A row's tokens then do not depend on which
    other rows are still decoding: one token drawn differently (another thread count, CPU or a float
    rounding) changes that row's response only, not every later row's draws. Drawing from the process
    RNG for the active rows instead shifts all later rows' draws whenever a row ends at another step.
    """

    def __init__(self, rows: int, device: torch.device) -> None:
        self.rows = rows
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(torch.randint(0, 2**62, (1,))))
        self.block: torch.Tensor | None = None
        self.start = 0

    def at(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        """(len(rows), 1) uniforms in [0, 1): each listed row's draw for `step` (steps in order from 0)."""
        if self.block is None or step >= self.start + DRAW_BLOCK:
            self.start = step - step % DRAW_BLOCK
            self.block = torch.rand(
                (self.rows, DRAW_BLOCK), generator=self.generator, device=self.generator.device
            )
        return self.block[rows, step - self.start, None]


def sample_tokens(probs: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of (rows, V) probabilities, by inverse CDF: one uniform draw per row.

    `u` is each row's uniform in [0, 1), shape (rows, 1) (RowDraws); by default drawn here from the
    process RNG.

    `torch.multinomial` draws an exponential per vocabulary entry, many times the work
    (benchmarks/decode_cpu.py's "+inverse CDF" variant). A token of probability 0 (filtered by top-k / top-p) is never drawn: its
    interval of the CDF is empty. Each token's interval is exact up to float32 rounding of the
    running sum (~1e-7 in probability).
    """
    cdf = probs.cumsum(-1)
    if u is None:
        u = torch.rand((probs.shape[0], 1), dtype=cdf.dtype, device=probs.device)
    u = u.to(cdf.dtype) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    # rounding can put u at the very top of the CDF (odds ~2^-24): the likeliest token then
    empty = probs.gather(-1, tokens[:, None]).squeeze(-1) == 0
    return torch.where(empty, probs.argmax(-1), tokens) if bool(empty.any()) else tokens
