"""How a worker method's Batch is sent to the ranks of a group and how their results come back.

Each worker method declares its mode with `@dispatch(...)` (lucidrl/workers/common/dispatch.py, where the
modes are described); these functions carry it out for the local and Ray worker groups.
"""

from __future__ import annotations

from typing import Any

from lucidrl.batch import Batch, BatchError, align_widths
from lucidrl.workers.common.dispatch import Dispatch
from lucidrl.workers.training.rank_metrics import combine_ranks


def split_for_ranks(batch: Batch, world_size: int, mode: Dispatch, method: str) -> tuple[list[Batch], int]:
    """Equal contiguous chunks, one per rank, and how many padding samples were appended."""
    if not isinstance(batch, Batch):
        raise TypeError(
            f"{mode.value} dispatch of '{method}' needs a Batch as first argument, got {type(batch).__name__}"
        )
    if mode is Dispatch.DP_EXACT and len(batch) % world_size:
        raise BatchError(
            f"'{method}' trains on its batch, so the {len(batch)} samples must divide evenly over {world_size} "
            f"data-parallel ranks (padding would be trained on); make data.train_batch_size x rollout.n a multiple"
        )
    padded, pad = batch.pad_to_divisor(world_size)
    return padded.chunk(world_size), pad


def mini_batch_order(batch: Batch, mini_rows: int, world_size: int) -> Batch:
    """`batch` reordered so that DP_EXACT's contiguous chunks give each rank its part of every global
    mini-batch, in order: rank r's k-th mini-batch is then rows r*p..(r+1)*p of mini-batch k (p =
    mini_rows / world_size), and the ranks' k-th mini-batches together are the rows one process's k-th
    mini-batch holds. Without it rank r held rows of other prompts (its chunk's own k-th slice), so a
    multi-rank update took its optimizer steps over other mini-batches than a one-process run; the
    same batch now trains the same way on any number of ranks. Unchanged on one rank, with one
    mini-batch, or when the sizes do not divide (the update then refuses them, saying why)."""
    n = len(batch)
    if world_size == 1 or mini_rows >= n or n % mini_rows or mini_rows % world_size:
        return batch
    part = mini_rows // world_size
    order = [
        k * mini_rows + r * part + i
        for r in range(world_size)
        for k in range(n // mini_rows)
        for i in range(part)
    ]
    return batch.reorder(order)


def merge_from_ranks(
    results: list[Any], pad: int, mode: Dispatch, sent: int | None = None, method: str = "a worker method"
) -> Any:
    """Concatenate Batch results (removing padding) or combine metric dicts (rank_metrics.combine_ranks).

    Each rank's rollout trims its responses to its own longest one: they are padded to one width here
    (token ids with the rollout's meta['pad_token_id']) before they are joined. `sent`: the rows the
    ranks were sent, padding included (default: as many as they returned). A rollout returns n rows
    per prompt, so `pad` padding prompts are `pad * n` rows of its output.
    """
    first = results[0]
    if isinstance(first, Batch):
        merged = Batch.concat(align_widths(results, first.meta.get("pad_token_id")))
        per, rest = divmod(len(merged), sent or len(merged))
        if rest:
            raise BatchError(
                f"the ranks returned {len(merged)} rows for the {sent} they were sent: not a whole number per "
                "row, so the padding rows cannot be told apart (a worker method must return the same number "
                "of rows for every input row)"
            )
        return merged.unpad(pad * per)
    if isinstance(first, dict):
        return combine_ranks(results, method)
    if mode is Dispatch.DP:
        return results
    return first
