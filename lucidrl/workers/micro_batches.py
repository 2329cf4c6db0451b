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
"""

from __future__ import annotations

import torch

from lucidrl.batch import Batch

PROMPT_SIDE = {"prompts", "prompt_mask"}


def trim_response_padding(batch: Batch) -> Batch:
    """The same samples with the response columns past the longest response cut off."""
    width = batch["responses"].shape[1]
    longest = max(1, int(batch["response_mask"].sum(-1).max().item())) if len(batch) else width
    if longest >= width:
        return batch
    tensors = {
        k: (v[:, :longest] if k not in PROMPT_SIDE and v.dim() >= 2 and v.shape[1] == width else v)
        for k, v in batch.tensors.items()
    }
    return Batch(tensors=tensors, non_tensors=batch.non_tensors, meta=batch.meta)


def length_sorted_micro_batches(batch: Batch, size: int) -> list[tuple[torch.Tensor, Batch]]:
    """(indices into `batch`, trimmed micro-batch) pairs covering every sample once.

    Groups (consecutive equal `uid`s; each sample is its own group without uids) are ordered by their
    longest response, shortest first; ties keep their order, so the result is deterministic.
    """
    lengths = batch["response_mask"].sum(-1).tolist()
    uids = batch["uid"] if "uid" in batch else list(range(len(batch)))
    groups: list[list[int]] = []
    for i, uid in enumerate(uids):
        if groups and uids[groups[-1][0]] == uid:
            groups[-1].append(i)
        else:
            groups.append([i])
    groups.sort(key=lambda g: max(lengths[i] for i in g))
    order = torch.tensor([i for g in groups for i in g], dtype=torch.long)
    return [(idx, trim_response_padding(batch.select(idx))) for idx in order.split(size)]


def micro_batches(batch: Batch, size: int, length_sorted: bool) -> list[tuple[torch.Tensor, Batch]]:
    """(indices, micro-batch) pairs: length-sorted and trimmed, or plain consecutive chunks."""
    if length_sorted:
        return length_sorted_micro_batches(batch, size)
    return [(torch.arange(start, min(start + size, len(batch))), batch.slice(start, start + size))
            for start in range(0, len(batch), size)]  # fmt: skip


def scatter_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], n_rows: int, width: int) -> torch.Tensor:
    """(n_rows, width) tensor with each part's (len(idx), w <= width) rows at its indices, zeros after w."""
    first = parts[0][1]
    out = torch.zeros(n_rows, width, dtype=first.dtype, device=first.device)
    for idx, values in parts:
        out[idx.to(out.device), : values.shape[1]] = values
    return out
