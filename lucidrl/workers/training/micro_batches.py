"""Micro-batches that spend no compute on response padding.

A rollout batch pads every response to the longest one in the batch; with K&K traces of 60-150
tokens about half of a padded forward is padding. `length_sorted_micro_batches` orders the prompt
groups by their longest response (samples of one prompt stay together, so the shared-prompt forward
still runs each prompt once), cuts micro-batches of `size` samples from that order, and trims each
micro-batch's response columns to its own longest response. `scatter_rows` puts per-token results
back in the original order and width. Per-sample log-probs are unchanged (only padding is dropped).
The update's micro-batches group different samples than plain chunks do; the actor weights each
micro-batch's token-mean by its share of the mini-batch's tokens (ActorWorker._loss_weights), so the
gradient does not depend on how samples are grouped into micro-batches.

`token_budget_micro_batches` (actor.use_dynamic_bsz, verl's name) cuts the same order by a token budget
instead of a sample count: many short samples per micro-batch, few long ones.
"""

from __future__ import annotations

import torch

from lucidrl.batch import Batch, loss_mask, response_lengths

PROMPT_SIDE = {"prompts", "prompt_mask"}


def trim_response_padding(batch: Batch) -> Batch:
    """The same samples with the response columns past the longest response cut off."""
    width = batch["responses"].shape[1]
    longest = max(1, int(response_lengths(batch).max().item())) if len(batch) else width
    if longest >= width:
        return batch
    tensors = {
        k: (v[:, :longest] if k not in PROMPT_SIDE and v.dim() >= 2 and v.shape[1] == width else v)
        for k, v in batch.tensors.items()
    }
    return Batch(tensors=tensors, non_tensors=batch.non_tensors, meta=batch.meta)


def _groups(batch: Batch) -> list[list[int]]:
    """Runs of consecutive equal `uid`s (the samples of one prompt); each sample alone without uids."""
    uids = batch["uid"] if "uid" in batch else list(range(len(batch)))
    groups: list[list[int]] = []
    for i, uid in enumerate(uids):
        if groups and uids[groups[-1][0]] == uid:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _by_longest_response(groups: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Groups ordered by their longest response, shortest first; ties keep their order (deterministic)."""
    return sorted(groups, key=lambda g: max(lengths[i] for i in g))


def length_sorted_micro_batches(batch: Batch, size: int) -> list[tuple[torch.Tensor, Batch]]:
    """(indices into `batch`, trimmed micro-batch) pairs covering every sample once.

    Groups (consecutive equal `uid`s; each sample is its own group without uids) are ordered by their
    longest response, shortest first; ties keep their order, so the result is deterministic.
    """
    lengths = response_lengths(batch).tolist()
    groups = _by_longest_response(_groups(batch), lengths)
    order = torch.tensor([i for g in groups for i in g], dtype=torch.long)
    return [(idx, trim_response_padding(batch.select(idx))) for idx in order.split(size)]


def token_budget_micro_batches(
    batch: Batch, max_tokens: int, length_sorted: bool
) -> list[tuple[torch.Tensor, Batch]]:
    """(indices, micro-batch) pairs, each micro-batch holding at most `max_tokens` padded tokens.

    verl's dynamic batch size: a micro-batch's tokens are its rows times its padded width, prompt
    (the batch's prompt width) plus response (its own longest response when `length_sorted`, which
    also orders the groups shortest first; the batch's response width otherwise). Short responses
    thus travel in large micro-batches and long ones in small, so every forward holds about the same
    number of tokens and peak activation memory is bounded by the budget, not by the longest sample.
    A prompt group is kept whole when it fits an empty micro-batch; a larger one is split between
    samples. Raises ValueError when a single sample is longer than the budget.
    """
    lengths = [int(x) for x in response_lengths(batch).tolist()]
    prompt_width, full_width = batch["prompts"].shape[1], batch["responses"].shape[1]
    groups = _groups(batch)
    if length_sorted:
        groups = _by_longest_response(groups, lengths)

    def tokens(rows: list[int]) -> int:
        width = max(1, max(lengths[i] for i in rows)) if length_sorted else full_width
        return len(rows) * (prompt_width + width)

    cuts: list[list[int]] = []
    current: list[int] = []
    for group in groups:
        if tokens(current + group) <= max_tokens:
            current = current + group
            continue
        if current and tokens(group) <= max_tokens:
            cuts.append(current)
            current = list(group)
            continue
        for i in group:  # the group is over the budget on its own: split it between samples
            if tokens([i]) > max_tokens:
                raise ValueError(
                    f"one sample is {tokens([i])} tokens (prompt width {prompt_width} + response "
                    f"{lengths[i] if length_sorted else full_width}), more than the micro-batch token budget "
                    f"of {max_tokens}; raise the budget to at least max_prompt_length + max_response_length"
                )
            if current and tokens(current + [i]) > max_tokens:
                cuts.append(current)
                current = []
            current.append(i)
    if current:
        cuts.append(current)
    out = []
    for rows in cuts:
        idx = torch.tensor(rows, dtype=torch.long)
        mb = batch.select(idx)
        out.append((idx, trim_response_padding(mb) if length_sorted else mb))
    return out


def micro_batches(
    batch: Batch, size: int, length_sorted: bool, max_tokens: int | None = None, world_size: int = 1
) -> list[tuple[torch.Tensor, Batch]]:
    """(indices, micro-batch) pairs: cut by a token budget when `max_tokens` is set, else `size`
    samples each; length-sorted and trimmed, or in batch order.

    `world_size` > 1 (the caller's model is data-parallel): a token-budget cut gives every rank as
    many micro-batches as the rank that needs the most (`match_count`; one all-reduce per cut), since each
    FSDP2 / DDP forward and backward is a collective all ranks must join. Cuts by sample count
    already agree: the ranks hold equal shares.
    """
    if max_tokens is not None:
        chunks = token_budget_micro_batches(batch, max_tokens, length_sorted)
        if world_size > 1:
            import torch.distributed as dist

            count = torch.tensor([len(chunks)], device=batch["responses"].device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            chunks = match_count(batch, chunks, int(count), length_sorted)
        return chunks
    if length_sorted:
        return length_sorted_micro_batches(batch, size)
    return [(torch.arange(start, min(start + size, len(batch))), batch.slice(start, start + size))
            for start in range(0, len(batch), size)]  # fmt: skip


def match_count(
    batch: Batch, chunks: list[tuple[torch.Tensor, Batch]], count: int, trim: bool
) -> list[tuple[torch.Tensor, Batch]]:
    """`chunks` split until there are `count` of them: the one with the most rows (the first of
    equals) is halved, in order, each half trimmed again when `trim`. Fewer rows per forward keep
    within the token budget. Possible whenever `count` <= the rows (ranks hold equal shares, and each
    rank's own cut has at most one micro-batch per row)."""
    chunks = list(chunks)
    if count > len(batch):
        raise ValueError(f"cannot cut {len(batch)} samples into {count} micro-batches")
    while len(chunks) < count:
        i = max(range(len(chunks)), key=lambda j: len(chunks[j][0]))
        idx = chunks[i][0]
        halves = []
        for part in (idx[: len(idx) // 2], idx[len(idx) // 2 :]):
            mb = batch.select(part)
            halves.append((part, trim_response_padding(mb) if trim else mb))
        chunks[i : i + 1] = halves
    return chunks


def inert_pads(mb: Batch, ubs: list[Batch]) -> list[Batch]:
    """Micro-batches that keep a data-parallel rank in step when the ranks left out different numbers of
    samples (actor.skip_zero_advantage): as many as the rank with the most micro-batches has beyond
    this rank's `ubs` (one all-reduce), each the first sample of `mb` with its advantages set to zero.
    Under the policy losses that allow the skip such a sample adds exactly nothing to the gradient; the
    caller also gives it a loss weight of zero. Its forward and backward are the collectives (FSDP2's
    all-gathers and reduce-scatters, DDP's gradient all-reduce) every rank must join."""
    import torch.distributed as dist

    count = torch.tensor([len(ubs)], device=mb["responses"].device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    missing = int(count) - len(ubs)
    if missing == 0:
        return []
    pad = trim_response_padding(mb.select(torch.tensor([0])))
    pad.set("advantages", torch.zeros_like(pad["advantages"]))
    return [pad] * missing


def loss_weights(mb: Batch, ubs: list[Batch], loss_agg_mode: str, world_size: int = 1) -> list[float]:
    """Each micro-batch's share of the mini-batch loss.

    token-mean: its loss tokens over the mini-batch's tokens on all ranks (times the rank count,
    since data-parallel gradients are averaged), so the loss is one mean over every token of the
    mini-batch whatever the micro-batching or the number of ranks. The seq-mean modes average
    sequences, and agg_loss leaves empty responses out of the mean: the share is the micro-batch's
    non-empty sequences over the mini-batch's on all ranks (counting every row, a micro-batch holding
    an empty response weighed more than its sequences: the loss changed with the micro-batching).
    token-sum: every micro-batch's sum counts whole (times the rank count), so the loss is the sum
    over the mini-batch's tokens on all ranks. Tokens and sequences are those of `loss_mask`.
    """
    if loss_agg_mode == "token-sum":
        return [float(world_size)] * len(ubs)
    if loss_agg_mode == "token-mean":

        def count(b: Batch) -> torch.Tensor:
            return loss_mask(b).sum()
    else:

        def count(b: Batch) -> torch.Tensor:
            return (loss_mask(b).sum(-1) > 0).sum()

    total = count(mb).to(torch.float64)
    if world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(total)  # one scalar per mini-batch
    total = max(float(total), 1.0)
    return [world_size * float(count(ub)) / total for ub in ubs]


def token_shares(
    mb: Batch, ubs: list[Batch], loss_agg_mode: str, weights: list[float], world_size: int = 1
) -> list[float]:
    """Each micro-batch's share of the mini-batch's tokens on all ranks (times the rank count): the
    weights of metrics that are token means whatever the loss mode (clip fractions, ppo_kl). Under
    token-mean these are the loss `weights` themselves; otherwise one more scalar all-reduce."""
    if loss_agg_mode == "token-mean":
        return weights
    return loss_weights(mb, ubs, "token-mean", world_size)


def scatter_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], n_rows: int, width: int) -> torch.Tensor:
    """(n_rows, width) tensor with each part's (len(idx), w <= width) rows at its indices, zeros after w."""
    first = parts[0][1]
    out = torch.zeros(n_rows, width, dtype=first.dtype, device=first.device)
    for idx, values in parts:
        out[idx.to(out.device), : values.shape[1]] = values
    return out
