"""The log-prob passes over a whole batch (old log-probs, reference log-probs): the batch cut into
micro-batches, each through the shared forward, the results put back in the batch's order and width."""

from __future__ import annotations

import torch

from lucidrl.batch import Batch
from lucidrl.workers.training.forward import response_log_probs, response_log_probs_and_sum_pi_squared
from lucidrl.workers.training.micro_batches import micro_batches, scatter_rows


def per_token_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    micro_batch_size: int,
    temperature: float,
    with_entropy: bool,
    share_prompt: bool,
    length_sorted: bool,
    max_tokens: int | None = None,
    head_chunk_tokens: int = 0,
    compiled: bool = False,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(bs, R) log-probs (and entropy) of the responses, in micro-batches (length-sorted and trimmed;
    of `micro_batch_size` samples, or of at most `max_tokens` padded tokens when it is set).
    `world_size` > 1: `model` is data-parallel, and every rank runs as many micro-batches."""
    lp, ent, _ = _per_token(model, batch, micro_batch_size, temperature, with_entropy, share_prompt,
                            length_sorted, max_tokens, head_chunk_tokens, compiled, world_size, False)  # fmt: skip
    return lp, ent


def per_token_log_probs_and_sum_pi_squared(
    model: torch.nn.Module,
    batch: Batch,
    micro_batch_size: int,
    temperature: float,
    share_prompt: bool,
    length_sorted: bool,
    max_tokens: int | None = None,
    head_chunk_tokens: int = 0,
    compiled: bool = False,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As `per_token_log_probs` with the entropy, plus sum_v pi(v)^2 (bs, R) per position from the same
    forwards (the optimal token baselines' input)."""
    lp, ent, spsq = _per_token(model, batch, micro_batch_size, temperature, True, share_prompt, length_sorted,
                               max_tokens, head_chunk_tokens, compiled, world_size, True)  # fmt: skip
    assert ent is not None and spsq is not None
    return lp, ent, spsq


def _per_token(
    model: torch.nn.Module,
    batch: Batch,
    micro_batch_size: int,
    temperature: float,
    with_entropy: bool,
    share_prompt: bool,
    length_sorted: bool,
    max_tokens: int | None,
    head_chunk_tokens: int,
    compiled: bool,
    world_size: int,
    with_sum_pi_squared: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    chunks = micro_batches(batch, micro_batch_size, length_sorted, max_tokens, world_size)
    lps, ents, sq = [], [], []
    kw = dict(
        temperature=temperature, share_prompt=share_prompt, data_parallel=world_size > 1,
        head_chunk_tokens=head_chunk_tokens, compiled=compiled,
    )  # fmt: skip
    for idx, mb in chunks:
        if with_sum_pi_squared:
            lp, ent, spsq = response_log_probs_and_sum_pi_squared(model, mb, **kw)
            sq.append((idx, spsq))
        else:
            lp, ent = response_log_probs(model, mb, with_entropy=with_entropy, **kw)
        lps.append((idx, lp))
        ents.append((idx, ent))
    width = batch["responses"].shape[1]
    entropy = scatter_rows(ents, len(batch), width) if with_entropy else None
    spsq_all = scatter_rows(sq, len(batch), width) if with_sum_pi_squared else None
    return scatter_rows(lps, len(batch), width), entropy, spsq_all
