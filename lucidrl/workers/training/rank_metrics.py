"""Metrics a worker method returns from each of its ranks, each saying how the ranks' values combine.

A training update returns one dict of scalars per rank. What the whole batch's value is depends on
the metric: a loss each rank pre-weights by its share is the ranks' mean, a count is their sum, a
maximum their maximum, and a gradient norm taken after the all-reduce is the same on every rank.
A plain mean of every key (what the worker groups did before) is right for the first kind only, and
a new maximum or count would have been averaged without anyone noticing. So a worker method that
returns metrics from several ranks returns `RankMetrics`, and `combine_ranks` refuses a key that
does not say how it combines.

RankMetrics is a dict (a trainer, a test or one local rank reads it as one), plus `how`: key → Combine.
"""

from __future__ import annotations

import enum
import logging
import math
from typing import Any

from lucidrl.batch import BatchError

log = logging.getLogger(__name__)


class Combine(enum.Enum):
    MEAN = "mean"  # the rank's part, weighted so that the ranks' mean is the batch's (losses, token means)
    SAME = "same"  # every rank computes the same value (after an all-reduce, or a setting): checked
    SUM = "sum"  # counts over the rank's own samples or steps
    MAX = "max"
    MIN = "min"


# two ranks' SAME values further apart than this (relative) mean that the ranks have diverged
SAME_RTOL = 1e-5


class RankMetrics(dict):
    """`{name: float}` from one rank, and how each name combines with the other ranks' (`how`)."""

    def __init__(self) -> None:
        super().__init__()
        self.how: dict[str, Combine] = {}

    def put(self, key: str, value: float, how: Combine) -> None:
        self[key] = float(value)
        self.how[key] = how

    def mean(self, key: str, value: float) -> None:
        self.put(key, value, Combine.MEAN)

    def same(self, key: str, value: float) -> None:
        self.put(key, value, Combine.SAME)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled to and from Ray workers with `how`
        return (_rebuild, (dict(self), {k: v.value for k, v in self.how.items()}))


def _rebuild(values: dict[str, float], how: dict[str, str]) -> RankMetrics:
    out = RankMetrics()
    for k, v in values.items():
        out.put(k, v, Combine(how[k]))
    return out


_warned: set[str] = set()


def _same(key: str, values: list[float]) -> float:
    first = values[0]
    spread = max(abs(v - first) for v in values)
    if spread > SAME_RTOL * max(abs(first), 1e-12) and not all(math.isnan(v) for v in values):
        if key not in _warned:  # once per metric: a diverged run would otherwise say it every step
            _warned.add(key)
            log.warning(
                "%s should be the same on every rank but is %s by rank: the ranks' models or settings "
                "have diverged (reporting rank 0's; this is a bug, please report it with LUCIDRL_DEBUG=1)",
                key,
                ", ".join(f"{v:.6g}" for v in values),
            )
    return first


_REDUCE = {
    Combine.MEAN: lambda key, vs: sum(vs) / len(vs),
    Combine.SAME: _same,
    Combine.SUM: lambda key, vs: sum(vs),
    Combine.MAX: lambda key, vs: max(vs),
    Combine.MIN: lambda key, vs: min(vs),
}


def combine_ranks(results: list[dict[str, float]], method: str = "a worker method") -> dict[str, float]:
    """One dict of the whole batch's metrics from each rank's, combined as each key says.

    One rank's metrics are its own, whatever they are. From several ranks every key must be a
    RankMetrics key with the same Combine on every rank, and present on every rank.
    """
    if len(results) == 1:
        return dict(results[0])
    undeclared = sorted({k for r in results for k in r if not isinstance(r, RankMetrics) or k not in r.how})
    if undeclared:
        raise BatchError(
            f"{method} returned metrics from {len(results)} ranks without saying how they combine: "
            f"{', '.join(undeclared)}; return a lucidrl.workers.training.rank_metrics.RankMetrics and put each "
            "with its Combine (MEAN of pre-weighted parts, SAME, SUM, MAX, MIN)"
        )
    keys = list(dict.fromkeys(k for r in results for k in r))
    out: dict[str, float] = {}
    for key in keys:
        missing = [rank for rank, r in enumerate(results) if key not in r]
        hows = {r.how[key] for r in results if key in r}
        if missing or len(hows) > 1:
            raise BatchError(
                f"{method}: metric {key} is missing on rank(s) {missing} or combines differently by rank "
                f"({sorted(h.value for h in hows)}); every rank must report every metric the same way"
            )
        (how,) = hows
        out[key] = _REDUCE[how](key, [r[key] for r in results])
    return out
