"""Step metrics under the names verl users grep for (critic/score/mean, response_length/mean, ...)."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lucidrl.algos import explained_variance
from lucidrl.batch import Batch, response_attention, response_lengths
from lucidrl.workers.rollout.agent.trajectory import multi_turn_metrics
from lucidrl.workers.rollout.stop_rule import STOPPED_FIELD


@contextmanager
def timer(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to timings[name] (seconds)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else float("nan")


def score_groups(seq_scores: torch.Tensor, uids: list) -> dict[Any, list[float]]:
    """Each group's (the samples of one uid's) sequence scores."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for uid, s in zip(uids, seq_scores.tolist(), strict=True):
        groups[uid].append(s)
    return groups


def groups_tied_at_best(groups: dict[Any, list[float]]) -> float:
    """The share of groups whose samples all scored the batch's best score: prompts solved in every
    sample. No signal for GRPO either, but success: the collapse monitor tells this saturation from a
    collapse by it (with the run's best score so far, trainer/collapse.py)."""
    best = max(s for scores in groups.values() for s in scores)
    return sum(set(v) == {best} for v in groups.values()) / len(groups)


def step_metrics(batch: Batch, max_response_length: int, compare_rollout: bool = True) -> dict[str, float]:
    """Scores, rewards, advantages, values, lengths and reward-function extras of one training batch;
    with `compare_rollout`, the gap between the engine's and the actor's old log-probs.

    Samples left out of the update because their reward failed (reward.on_error=mask: a zeroed
    response_mask, the generated one kept as `generated_mask`) count in the lengths, and not in the
    scores and score groups: theirs is no score. reward/failed and reward/timed_out count them."""
    mask = batch["response_mask"].bool()
    resp_len = response_lengths(batch)  # a multi-turn response's tool tokens and a left-out sample's included
    prompt_len = batch["prompt_mask"].sum(-1)
    seq_scores = batch["token_level_scores"].sum(-1)
    seq_rewards = batch["token_level_rewards"].sum(-1)
    out: dict[str, float] = {}
    uids = batch["uid"]
    if "reward_failed" in batch:
        out["reward/failed"] = float(batch["reward_failed"].sum())
        out["reward/timed_out"] = float(batch["reward_timed_out"].sum())
        if "generated_mask" in batch:
            kept = (~batch["reward_failed"]).nonzero().flatten()
            seq_scores, seq_rewards = seq_scores[kept], seq_rewards[kept]
            uids = [uids[i] for i in kept.tolist()]
    if not len(seq_scores):  # every sample's reward failed: no score to report
        seq_scores = seq_rewards = torch.tensor([float("nan")])
        uids = ["none"]
    out.update(_stats("critic/score", seq_scores))
    out.update(_stats("critic/rewards", seq_rewards))
    adv = batch["advantages"][mask]
    out.update(_stats("critic/advantages", adv if adv.numel() else torch.zeros(1)))
    out.update(_stats("response_length", resp_len))
    out["response_length/clip_ratio"] = (resp_len >= max_response_length).float().mean().item()
    if STOPPED_FIELD in batch:  # rollout.stop_regex: the share of responses the rule ended
        out["response_length/stop_rule_ratio"] = batch[STOPPED_FIELD].float().mean().item()
    out.update(_stats("prompt_length", prompt_len))
    # GRPO learns nothing from a group whose samples all scored the same: watch this fraction
    groups = score_groups(seq_scores, uids)
    mixed = [len(set(v)) > 1 for v in groups.values()]
    out["critic/groups_with_mixed_scores"] = sum(mixed) / len(mixed)
    out["critic/groups_tied_at_best"] = groups_tied_at_best(groups)
    if "values" in batch:
        out.update(_stats("critic/values", batch["values"][mask]))
        out.update(_stats("critic/returns", batch["returns"][mask]))
        out["critic/vf_explained_var"] = explained_variance(
            batch["values"], batch["returns"], batch["response_mask"]
        )
    for key in batch.keys():
        if key.startswith("reward_extra:"):
            out[f"reward/{key.split(':', 1)[1]}/mean"] = nanmean(batch[key].tolist())
    out.update(multi_turn_metrics(batch))
    if compare_rollout and "rollout_log_probs" in batch and "old_log_probs" in batch:
        # sampling vs training log-probs of the same weights: ~1e-6 in float32; growth means a mismatch
        diff = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs()[mask]
        out["rollout/logprob_diff_max"] = diff.max().item() if diff.numel() else 0.0
        out["rollout/logprob_diff_mean"] = diff.mean().item() if diff.numel() else 0.0
    return out


def timing_metrics(timings: dict[str, float], batch: Batch) -> dict[str, float]:
    """timing_s/<stage> and perf/throughput (prompt + response tokens per second of the step)."""
    out = {f"timing_s/{k}": v for k, v in timings.items()}
    tokens = response_attention(batch).sum().item() + batch["prompt_mask"].sum().item()
    out["perf/total_num_tokens"] = float(tokens)
    if timings.get("step"):
        out["perf/throughput"] = tokens / timings["step"]
    return out
