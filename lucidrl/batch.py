"""The Batch container every worker method takes and returns.

A Batch holds tensors that share their first dimension (one row per sample), per-sample Python
objects (ground truths, data sources, group ids) in lists of the same length, and a meta dict for
batch-wide values (temperature, step, timing). It supports the operations the controller needs to
move samples between workers: split, concat, repeat (interleaved, so the n samples of a prompt sit
next to each other), select, reorder and padding to a divisor.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lucidrl.diagnostics.errors import UserError


class BatchError(UserError, ValueError):
    """A Batch was built or combined with inconsistent sizes or keys."""


@dataclass
class Batch:
    """Tensors with a shared first dimension, per-sample objects and a meta dict."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, list[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check()

    # -- size and access ------------------------------------------------------------------------

    def __len__(self) -> int:
        for t in self.tensors.values():
            return int(t.shape[0])
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def _check(self) -> None:
        sizes = {f"tensor '{k}'": int(v.shape[0]) for k, v in self.tensors.items() if v.dim() > 0}
        for k, v in self.tensors.items():
            if v.dim() == 0:
                raise BatchError(f"tensor '{k}' is a scalar; put batch-wide values in Batch.meta")
        sizes.update({f"non-tensor '{k}'": len(v) for k, v in self.non_tensors.items()})
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{k}: {n}" for k, n in sizes.items())
            raise BatchError(f"Batch fields disagree on the number of samples ({listing})")

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        known = sorted(self.tensors) + sorted(self.non_tensors)
        raise KeyError(f"Batch has no field '{key}'; it has: {', '.join(known) or 'nothing'}")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def keys(self) -> list[str]:
        return list(self.tensors) + list(self.non_tensors)

    def set(self, key: str, value: torch.Tensor | list[Any]) -> None:
        """Add or replace one field, checking its length against the batch."""
        n = len(value) if not isinstance(value, torch.Tensor) else int(value.shape[0])
        if self.keys() and n != len(self):
            raise BatchError(f"field '{key}' has {n} rows but the batch has {len(self)}")
        if isinstance(value, torch.Tensor):
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            self.tensors.pop(key, None)
            self.non_tensors[key] = list(value)

    def update(self, other: Batch) -> Batch:
        """Merge the fields and meta of `other` (same number of samples) into this batch."""
        if other.keys() and self.keys() and len(other) != len(self):
            raise BatchError(f"cannot merge a batch of {len(other)} samples into one of {len(self)}")
        self.tensors.update(other.tensors)
        self.non_tensors.update(other.non_tensors)
        self.meta.update(other.meta)
        return self

    # -- reshaping --------------------------------------------------------------------------------

    def select(self, indices: Sequence[int] | torch.Tensor) -> Batch:
        """A new batch holding the samples at `indices`, in that order."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        idx_list = idx.tolist()
        return Batch(
            tensors={k: v[idx] for k, v in self.tensors.items()},
            non_tensors={k: [v[i] for i in idx_list] for k, v in self.non_tensors.items()},
            meta=dict(self.meta),
        )

    def reorder(self, indices: Sequence[int] | torch.Tensor) -> Batch:
        """A permutation of this batch; `indices` must name every sample exactly once."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        if sorted(idx.tolist()) != list(range(len(self))):
            raise BatchError(f"reorder needs a permutation of 0..{len(self) - 1}, got {idx.tolist()[:10]}...")
        return self.select(idx)

    def slice(self, start: int, end: int) -> Batch:
        return self.select(list(range(start, min(end, len(self)))))

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each sample n times: [a, a, b, b] when interleaved, else [a, b, a, b]."""
        if n < 1:
            raise BatchError(f"repeat count must be >= 1, got {n}")
        size = len(self)
        if interleave:
            idx = [i for i in range(size) for _ in range(n)]
        else:
            idx = [i for _ in range(n) for i in range(size)]
        return self.select(idx)

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of `size` samples (the last may be smaller)."""
        if size < 1:
            raise BatchError(f"split size must be >= 1, got {size}")
        return [self.slice(i, i + size) for i in range(0, len(self), size)]

    def chunk(self, chunks: int) -> list[Batch]:
        """`chunks` equal parts; the batch size must be divisible (see pad_to_divisor)."""
        if chunks < 1 or len(self) % chunks:
            raise BatchError(f"cannot split {len(self)} samples into {chunks} equal chunks; pad first")
        return self.split(len(self) // chunks)

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """Append copies of the first samples until the size divides `divisor`; returns the pad count."""
        pad = (-len(self)) % divisor
        if pad == 0:
            return self, 0
        if len(self) == 0:
            raise BatchError("cannot pad an empty batch")
        idx = list(range(len(self))) + [i % len(self) for i in range(pad)]
        return self.select(idx), pad

    def unpad(self, pad: int) -> Batch:
        return self.slice(0, len(self) - pad) if pad else self

    @staticmethod
    def concat(batches: Iterable[Batch]) -> Batch:
        """Samples of all batches in order; every batch must have the same fields."""
        batches = list(batches)
        if not batches:
            raise BatchError("concat needs at least one batch")
        keys = set(batches[0].keys())
        for i, b in enumerate(batches[1:], start=1):
            if set(b.keys()) != keys:
                raise BatchError(
                    f"concat: batch {i} has fields {sorted(b.keys())}, batch 0 has {sorted(keys)}"
                )
        meta: dict[str, Any] = {}
        for b in batches:
            meta.update(b.meta)
        return Batch(
            tensors={k: torch.cat([b.tensors[k] for b in batches]) for k in batches[0].tensors},
            non_tensors={k: [x for b in batches for x in b.non_tensors[k]] for k in batches[0].non_tensors},
            meta=meta,
        )

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            {k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta)
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def describe(self) -> str:
        """One line per field with shape/dtype/device: what LUCIDRL_DEBUG prints at each hop."""
        parts = [f"Batch({len(self)} samples)"]
        for k, v in self.tensors.items():
            parts.append(f"  {k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')} {v.device}")
        for k, v in self.non_tensors.items():
            parts.append(f"  {k}: list[{type(v[0]).__name__ if v else '?'}]")
        return "\n".join(parts)


# prompts are left-padded; everything else per sample is right-padded
LEFT_PADDED = ("prompts", "prompt_mask")
TOKEN_FIELDS = ("prompts", "responses", "input_ids")  # padded with the pad token id, every other field with 0


def align_widths(batches: list[Batch], pad_token_id: int | None) -> list[Batch]:
    """Pad batches' 2-D fields to one width so they concatenate: prompts (and their mask) on the left,
    responses and every per-token field on the right; token ids with `pad_token_id`, the rest with 0.

    Rollouts of different calls end at different lengths (each trims to its longest response): DAPO's
    rounds, and the data-parallel ranks of one generate call.
    """
    widths = {
        k: max(b.tensors[k].shape[1] for b in batches) for k, v in batches[0].tensors.items() if v.dim() == 2
    }
    out = []
    for b in batches:
        tensors = {}
        for k, v in b.tensors.items():
            missing = widths.get(k, 0) - (v.shape[1] if v.dim() == 2 else 0)
            if v.dim() != 2 or missing <= 0:
                tensors[k] = v
                continue
            if k in TOKEN_FIELDS and pad_token_id is None:
                raise BatchError(
                    f"'{k}' is {v.shape[1]} wide in one batch and {widths[k]} in another, and no pad "
                    "token id was given to pad it with (a rollout's output carries meta['pad_token_id'])"
                )
            value = pad_token_id if k in TOKEN_FIELDS else 0
            pad = torch.full((v.shape[0], missing), value, dtype=v.dtype, device=v.device)
            tensors[k] = torch.cat([pad, v] if k in LEFT_PADDED else [v, pad], dim=1)
        out.append(Batch(tensors, dict(b.non_tensors), dict(b.meta)))
    return out


# The response masks, each (bs, R) 0/1, real tokens from column 0 and padding after:
#   response_mask            the tokens the model generated: what the estimators and losses are about.
#                            A multi-turn response has gaps in it: the tool results and environment
#                            replies inside the response are attended to, but were not generated.
#   response_attention_mask  every real response token, the model's and the tools' alike; only a
#                            multi-turn rollout writes it (elsewhere it equals the response mask).
#   loss_mask                the response mask less the tokens rollout correction's rejection dropped;
#                            only written when that rejection ran.
#   generated_mask           the response mask as generated, kept when reward.on_error=mask zeroed the
#                            rows of samples whose reward failed.
# Forwards attend to `response_attention`, micro-batches are trimmed, sorted and budgeted by its
# lengths, and the losses and estimators count `loss_mask`.
RESPONSE_ATTENTION = "response_attention_mask"


def response_attention(batch: Batch) -> torch.Tensor:
    """(bs, R) 1 for every real response token, the model's and the tools' alike, and those of a sample
    left out of the loss; 0 for padding. The attention mask of every forward."""
    for key in (RESPONSE_ATTENTION, "generated_mask"):
        if key in batch:
            return batch[key]
    return batch["response_mask"]


def response_lengths(batch: Batch) -> torch.Tensor:
    """(bs,) tokens of each response, gaps in the loss mask included (real tokens start at column 0)."""
    return response_attention(batch).sum(-1)


def loss_mask(batch: Batch) -> torch.Tensor:
    """(bs, R) the tokens that count in the advantages and losses: the response mask (with a multi-turn
    response's gaps), less the tokens rollout correction's rejection dropped when it ran."""
    return batch["loss_mask"] if "loss_mask" in batch else batch["response_mask"]


def last_loss_index(response_mask: torch.Tensor) -> torch.Tensor:
    """(bs,) the column of each row's last token in the loss mask (bs, R), where an outcome reward sits;
    0 for a row without any. With gaps in the mask this is not `mask.sum(-1) - 1`."""
    cols = torch.arange(response_mask.shape[1], device=response_mask.device)
    return (cols * (response_mask > 0)).max(dim=-1).values
