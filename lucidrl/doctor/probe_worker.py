"""A worker with no model, for checking a placement: where samples land, and how failures surface.

The tests of the controller use it, and so can a user (or `lucidrl doctor`) on a new cluster: it
starts in seconds and exercises dispatch, the process group and the error path.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import torch
import torch.distributed as dist

from lucidrl.batch import Batch
from lucidrl.diagnostics.errors import UserError
from lucidrl.workers.common.dispatch import Dispatch, dispatch
from lucidrl.workers.common.distributed import DistInfo, init_process_group
from lucidrl.workers.training.rank_metrics import Combine, RankMetrics


class TwoArgError(Exception):
    """An exception Ray cannot unpickle: its __init__ takes two required arguments."""

    def __init__(self, detail: str, code: int):
        super().__init__(f"{detail} (code {code})")
        self.detail, self.code = detail, code


class ProbeInputError(UserError, ValueError):
    """A user error (bad input), as a worker that loads a config, data or model would raise one."""


class ProbeWorker:
    def __init__(self, cfg=None, roles: frozenset[str] = frozenset(), dist_info: DistInfo | None = None):
        self.rank = dist_info.rank if dist_info else 0
        self.world_size = dist_info.world_size if dist_info else 1
        if dist_info is not None and dist_info.world_size > 1:
            init_process_group(dist_info)

    @dispatch(Dispatch.DP)
    def where(self, batch: Batch) -> Batch:
        """Which rank, process and host handled each sample."""
        n = len(batch)
        return Batch(
            tensors={"x": batch["x"] * 1},
            non_tensors={
                "rank": [self.rank] * n,
                "pid": [os.getpid()] * n,
                "host": [socket.gethostname()] * n,
            },
        )

    @dispatch(Dispatch.DP_EXACT)
    def train_like(self, batch: Batch) -> RankMetrics:
        """Metrics of each way of combining across ranks (checks they survive the trip through Ray)."""
        out = RankMetrics()
        out.put("samples", len(batch), Combine.SUM)
        out.mean("rank", self.rank)
        out.put("rank_max", self.rank, Combine.MAX)
        out.same("world_size", self.world_size)
        return out

    @dispatch(Dispatch.ALL)
    def all_reduce_sum(self, value: float) -> float:
        """Sum `value` over the ranks through the process group (checks gloo/NCCL really works)."""
        t = torch.tensor([value + self.rank], dtype=torch.float64)
        if self.world_size > 1:
            dist.all_reduce(t)
        return float(t.item())

    @dispatch(Dispatch.ALL)
    def pid(self) -> int:
        return os.getpid()

    @dispatch(Dispatch.RANK0)
    def fail(self, kind: str) -> Any:
        """Raise an unpicklable exception, a user error, exit the process, or return what cannot be
        pickled, on purpose."""
        if kind == "exit":
            os._exit(13)
        if kind == "unpicklable":
            return threading.Lock()
        if kind == "user":
            raise ProbeInputError("probe.value=-1 must be positive; set probe.value=1")
        raise TwoArgError("worker-side detail", 42)
