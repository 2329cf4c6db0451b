"""The trainer's supply of scored batches: made when a step asks (rollout.mode=sync), or made ahead in a
thread while the trainer trains (one_step_off, async), never more than rollout.max_staleness policy
versions behind the step that trains them.

Batch j (the one step j trains) may start generating once the engine holds the weights of step
j - 1 - max_staleness: with max_staleness 1 (one_step_off) batch j + 1 generates with step j - 1's
weights while step j trains, as verl's one-step-off does. The engine takes a weight sync only between
generations (PolicyWorker's lock; no partial rollouts), so every token of a sample comes from one
policy version, which the worker stamps on it (`policy_version`). What the thread drew from the data
is counted per batch: a checkpoint records the cursor of the last batch trained, not of the ones made
ahead, and a resume generates those again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lucidrl.batch import Batch


@dataclass
class Made:
    """A scored batch with what making it took and where the data cursor stood after it."""

    batch: Batch
    metrics: dict[str, float]
    timings: dict[str, float]
    cursor: dict[str, int]
    rollout_idle_s: float = 0.0  # the thread's wait for weights fresh enough to start this batch


@dataclass
class _Failure:
    error: BaseException


@dataclass
class Supply:
    """Batches for the trainer. `collect(timings)` makes one (generate + score); `cursor()` reads the data
    position after it; `synced` is the weights' step after each sync."""

    collect: Callable[[dict[str, float]], tuple[Batch, dict[str, float]]]
    cursor: Callable[[], dict[str, int]]
    max_staleness: int
    first_step: int = 1
    abort: Callable[[], None] | None = None  # cuts a generation under way short (the engine's abort)
    last_step: int | None = None  # no batch is made ahead for a step after it
    _thread: threading.Thread | None = None
    _queue: queue.Queue | None = None
    _synced: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stop: bool = False

    def start(self, synced_step: int) -> None:
        """Begin making batches ahead (nothing to do in sync mode)."""
        self._synced = synced_step
        if self.max_staleness == 0:
            return
        self._queue = queue.Queue(maxsize=self.max_staleness)
        self._thread = threading.Thread(target=self._make_ahead, name="lucidrl-rollout", daemon=True)
        self._thread.start()

    def synced(self, step: int) -> None:
        """The engine now holds step `step`'s weights: batches waiting for them may start."""
        with self._cond:
            self._synced = step
            self._cond.notify_all()

    def take(self, step: int) -> tuple[Made, float, int]:
        """The batch step `step` trains, the seconds the trainer waited for it, and how many more were
        ready behind it."""
        if self._queue is None:  # sync: made now, with the weights of the step before
            timings: dict[str, float] = {}
            batch, metrics = self.collect(timings)
            return Made(batch, metrics, timings, self.cursor()), 0.0, 0
        start = time.perf_counter()
        item = self._queue.get()
        waited = time.perf_counter() - start
        if isinstance(item, _Failure):
            raise item.error
        return item, waited, self._queue.qsize()

    def close(self) -> None:
        """Stop making batches: a generation under way is aborted where the engine can (hf), else it
        finishes first; what it made is not trained on."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread.is_alive() and self.abort is not None:
            self.abort()
        if self._thread is not None:
            while self._thread.is_alive():
                try:  # make room, so a thread blocked on a full queue sees the stop
                    self._queue.get_nowait()
                except queue.Empty:
                    pass
                self._thread.join(timeout=0.1)

    def _make_ahead(self) -> None:
        j = self.first_step
        while self.last_step is None or j <= self.last_step:
            waited = time.perf_counter()
            need = j - 1 - self.max_staleness  # batch j starts with the weights of this step or newer
            with self._cond:
                self._cond.wait_for(lambda need=need: self._stop or self._synced >= need)
                if self._stop:
                    return
            waited = time.perf_counter() - waited
            try:
                timings: dict[str, float] = {}
                batch, metrics = self.collect(timings)
                item: Any = Made(batch, metrics, timings, self.cursor(), rollout_idle_s=waited)
            except BaseException as e:  # the trainer re-raises it at its next take
                item = _Failure(e)
            while True:  # a full queue: wait for the trainer, or for the stop
                if self._stop:
                    return
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return
            j += 1


def staleness_metrics(
    batch: Batch, step: int, made: Made, trainer_wait_s: float, ready: int
) -> dict[str, float]:
    """How old the trained tokens' policies are (in updates before this step's), and who waited."""
    mask = batch["response_mask"].bool()
    lag = (step - 1) - batch["policy_version"][mask]
    metrics = {
        "async/staleness_mean": lag.float().mean().item() if lag.numel() else 0.0,
        "async/staleness_max": float(lag.max().item()) if lag.numel() else 0.0,
        "async/queue_depth": float(ready),
        "async/trainer_idle_s": trainer_wait_s,
        "async/rollout_idle_s": made.rollout_idle_s,
    }
    for k, count in zip(*torch.unique(lag, return_counts=True), strict=True):
        metrics[f"async/staleness_share/{int(k)}"] = count.item() / lag.numel()
    return metrics
