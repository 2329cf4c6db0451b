"""The LM head, log-softmax and label pick as one autograd function over chunks of tokens.

`log_softmax(hidden @ weight.T / temperature)[label]` without ever keeping a (tokens, V) tensor: the
forward runs the head on `chunk_tokens` rows at a time and keeps only each row's logsumexp; the
backward runs the head on the same chunk again and forms the gradient of the logits in place,

    d lp / d x_v = (1[v = label] - softmax(x)_v) / temperature,

which it multiplies into the hidden states' and the weight's gradients at once. The eager path
(`head(hidden)` then `logprobs_from_logits`) keeps the logits, a float32 copy and a zero-filled
gradient of the same size, and its backward walks them several times more; at a 49k vocabulary those
walks cost more than the head's matrix products (benchmarks/head_chunks.py measures both).

Numbers are the eager ones up to float rounding: the products run in `compute_dtype` (bfloat16 under
autocast, as `head(hidden)` would) and everything over the vocabulary in float32, temperature after
the upcast (lucidrl.algos.logprob). The entropy, when asked, is a metric from the same logits with no
gradient of its own.
"""

from __future__ import annotations

import torch


class _ChunkLogits:
    """The head's logits for up to `rows` tokens at a time, written into buffers allocated once per
    pass: fresh (rows, V) tensors per chunk cost more in page faults than the arithmetic on them."""

    def __init__(self, weight, bias, temperature: float, rows: int, compute_dtype: torch.dtype):
        self.w = weight.to(compute_dtype)
        self.b = bias.to(compute_dtype) if bias is not None else None
        self.t = temperature
        acc = torch.promote_types(compute_dtype, torch.float32)  # float64 stays float64
        self.x = weight.new_empty(rows, weight.shape[0], dtype=acc)
        self.low = (
            self.x if acc == compute_dtype else weight.new_empty(rows, weight.shape[0], dtype=compute_dtype)
        )

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """(rows, V) logits / temperature of `h` (rows, H) in the compute dtype, in float32."""
        n = h.shape[0]
        low, x = self.low[:n], self.x[:n]
        if self.b is None:
            torch.mm(h, self.w.t(), out=low)
        else:
            torch.addmm(self.b, h, self.w.t(), out=low)
        if low is not x:
            x.copy_(low)
        return x.div_(self.t) if self.t != 1.0 else x


class _HeadLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_tokens, compute_dtype, with_entropy):
        n = hidden.shape[0]
        logits = _ChunkLogits(weight, bias, temperature, min(n, chunk_tokens), compute_dtype)
        acc = logits.x.dtype
        lp, lse = hidden.new_empty(n, dtype=acc), hidden.new_empty(n, dtype=acc)
        ent = hidden.new_empty(n, dtype=acc) if with_entropy else None
        e = torch.empty_like(logits.x) if with_entropy else None
        for s in range(0, n, chunk_tokens):
            x = logits(hidden[s : s + chunk_tokens].to(compute_dtype))
            picked = x.gather(-1, labels[s : s + chunk_tokens, None]).squeeze(-1)
            m = x.amax(dim=-1)
            x.sub_(m[:, None])  # x - max: exp of it cannot overflow
            if e is None:
                z = x.exp_().sum(dim=-1)
            else:  # H = lse - sum_v p_v x_v = log z - sum_v e_v (x_v - max) / z, with e = exp(x - max)
                ev = torch.exp(x, out=e[: x.shape[0]])
                z = ev.sum(dim=-1)
                ent[s : s + chunk_tokens] = z.log() - ev.mul_(x).sum(dim=-1) / z
            lse[s : s + chunk_tokens] = m + z.log()
            lp[s : s + chunk_tokens] = picked - lse[s : s + chunk_tokens]
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.temperature, ctx.chunk_tokens, ctx.compute_dtype = temperature, chunk_tokens, compute_dtype
        if ent is not None:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, _grad_ent):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        t, chunk, cd = ctx.temperature, ctx.chunk_tokens, ctx.compute_dtype
        logits = _ChunkLogits(weight, bias, t, min(hidden.shape[0], chunk), cd)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = lse.dtype
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None
        part_w = torch.empty_like(weight, dtype=cd) if need_w and cd != acc else None
        grad_b = torch.zeros_like(bias, dtype=acc) if need_b and bias is not None else None
        for s in range(0, hidden.shape[0], chunk):
            hc = hidden[s : s + chunk].to(cd)
            g = grad_lp[s : s + chunk, None].to(acc)
            # d lp / d logits = (onehot - p) / t, times the incoming gradient: -p * g, then + g at the label
            d = logits(hc).sub_(lse[s : s + chunk, None]).exp_().mul_(-g)
            d.scatter_add_(-1, labels[s : s + chunk, None], g)
            if t != 1.0:
                d.div_(t)
            if grad_b is not None:
                grad_b.add_(d.sum(0))
            low = logits.low[: d.shape[0]]
            if low is not d:
                low.copy_(d)
            if grad_h is not None:
                grad_h[s : s + chunk] = low @ logits.w
            if part_w is not None:  # each chunk's product in the compute dtype, summed in float32
                grad_w.add_(torch.mm(low.t(), hc, out=part_w))
            elif grad_w is not None:
                grad_w.addmm_(low.t(), hc)
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None, None, None, None, None,
        )  # fmt: skip


def head_log_probs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    labels: torch.Tensor,
    *,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) log-probs of `labels` (N,) under head(hidden (N, H)) / temperature, and the (N,) entropies
    if asked (no gradient), `chunk_tokens` rows of logits at a time; float32 (float64 for a float64
    head).

    The products run in the autocast dtype where autocast is on (as `head(hidden)` would), else in the
    weight's dtype.
    """
    device = hidden.device.type
    cd = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else head.weight.dtype
    with torch.autocast(device_type=device, enabled=False):
        lp, ent = _HeadLogProbs.apply(
            hidden, head.weight, head.bias, labels.long(), float(temperature), max(1, chunk_tokens), cd,
            with_entropy,
        )  # fmt: skip
    return lp, ent
