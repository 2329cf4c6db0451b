"""The loop every trained role's update shares: epochs of mini-batches, one finite optimizer step each.

The actor and the critic differ in what a mini-batch's forward and loss are (`step_mini_batch`); the
rest is the same: `epochs` passes over mini-batches of `mini_rows` samples, the gradients of each
accumulated over its micro-batches and stepped once, a step whose gradient norm is not finite skipped
and counted (never trained on), and the learning-rate schedule advanced once per update (one RL step,
as verl's: optim.warmup_steps counts RL steps, however many mini-batches an update takes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lucidrl.batch import Batch
from lucidrl.workers.training.optim import NonFiniteLossError, step_if_finite
from lucidrl.workers.training.rank_metrics import Combine, RankMetrics

# One mini-batch's forwards and backwards; it adds its metrics, each weighted so that they sum to the
# mini-batch's value, into the dict it is given. The optimizer step is the loop's.
StepMiniBatch = Callable[[Batch, dict[str, float]], None]


@dataclass
class UpdateOutcome:
    metrics: dict[str, list[float]]  # one value per mini-batch step (grad_norm: per step taken)
    skipped: int  # optimizer steps skipped for a non-finite gradient norm


def run_update(
    batch: Batch,
    step_mini_batch: StepMiniBatch,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    epochs: int,
    mini_rows: int,
    grad_clip: float,
    role: str,
    lr_hint: str,
) -> UpdateOutcome:
    """`epochs` passes over `batch` in mini-batches of `mini_rows` rows, one optimizer step each.

    Raises NonFiniteLossError when every step of the update had a non-finite gradient norm; `lr_hint`
    ends its message (what to lower or check for this role).
    """
    model.train()
    metrics: dict[str, list[float]] = defaultdict(list)
    steps = skipped = 0
    for _ in range(epochs):
        for mb in batch.split(mini_rows):
            optimizer.zero_grad(set_to_none=True)
            mb_metrics: dict[str, float] = defaultdict(float)
            step_mini_batch(mb, mb_metrics)
            for k, v in mb_metrics.items():
                metrics[k].append(v)
            grad_norm = step_if_finite(model, optimizer, grad_clip)
            steps += 1
            if grad_norm is None:
                skipped += 1  # counted, and said so in metrics
            else:
                metrics[f"{role}/grad_norm"].append(grad_norm)
    scheduler.step()
    if skipped == steps:
        raise NonFiniteLossError(
            f"all {steps} {role} optimizer steps of this update had a non-finite gradient norm (NaN/inf "
            f"loss); {lr_hint}"
        )
    return UpdateOutcome(dict(metrics), skipped)


def update_metrics(outcome: UpdateOutcome, role: str, lr: float) -> RankMetrics:
    """The mean over the mini-batches of each metric. Across ranks the pre-weighted parts average to the
    batch's, and what the all-reduced gradient or the settings decide is the same on every rank (checked)."""
    out = RankMetrics()
    for k, v in outcome.metrics.items():
        out.put(k, sum(v) / len(v), Combine.SAME if k == f"{role}/grad_norm" else Combine.MEAN)
    out.same(f"{role}/lr", lr)
    out.same(f"{role}/nonfinite_skipped", outcome.skipped)  # the ranks skip together: one reduced gradient
    return out
