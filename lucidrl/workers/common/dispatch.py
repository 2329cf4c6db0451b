"""How a worker method declares its dispatch across the ranks of a group (`@dispatch(mode)`).

The worker group (lucidrl/controller/) reads the mode and sends the Batch accordingly:

- ``ALL``: every rank gets the same arguments; the result is rank 0's (collective calls: all ranks
  must take part, e.g. a weight sync).
- ``DP``: the Batch (first argument) is padded to a multiple of the world size, split into equal
  contiguous chunks, one per rank; the returned Batches are concatenated in rank order and the
  padding removed. For computations (log-probs, values, generation).
- ``DP_EXACT``: like DP, but the batch must divide evenly: padding would be trained on. For updates;
  the ranks' metrics are combined as each says (`rank_metrics.RankMetrics`).
- ``RANK0``: only rank 0 runs it (saving a replicated model, reporting).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Dispatch(enum.Enum):
    ALL = "all"
    DP = "dp"
    DP_EXACT = "dp_exact"
    RANK0 = "rank0"


DISPATCH_ATTR = "__lucidrl_dispatch__"


def dispatch(mode: Dispatch) -> Callable[[F], F]:
    """Declare how a worker method is dispatched across ranks."""

    def deco(fn: F) -> F:
        setattr(fn, DISPATCH_ATTR, mode)
        return fn

    return deco


def dispatch_mode(worker_cls: type, method: str) -> Dispatch:
    fn = getattr(worker_cls, method, None)
    if fn is None or not callable(fn):
        public = sorted(m for m in dir(worker_cls) if hasattr(getattr(worker_cls, m), DISPATCH_ATTR))
        raise AttributeError(
            f"{worker_cls.__name__} has no worker method '{method}'; it has: {', '.join(public)}"
        )
    mode = getattr(fn, DISPATCH_ATTR, None)
    if mode is None:
        raise AttributeError(f"{worker_cls.__name__}.{method} is not a worker method (no @dispatch mode)")
    return mode
