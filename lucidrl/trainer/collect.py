"""Generate and score a training batch: reward, DAPO overlong shaping, ReMax baselines, dynamic sampling."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

from lucidrl.algos import dynamic_sampling_keep_mask, overlong_reward_penalty
from lucidrl.batch import Batch, align_widths, last_loss_index, response_lengths
from lucidrl.config import LucidConfig
from lucidrl.diagnostics.errors import UserError
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.trainer import setup
from lucidrl.trainer.metrics import groups_tied_at_best, score_groups, timer
from lucidrl.workers.rollout.engine import SamplingParams

log = logging.getLogger(__name__)

EXTRA_PREFIX = "reward_extra:"  # per-sample metrics a reward function returned, kept as (bs,) tensors


def score(batch: Batch, reward: RuleRewardManager, cfg: LucidConfig) -> Batch:
    """Add token_level_scores (with the overlong penalty folded in, if on) and reward_extra:<key> tensors."""
    scores, extras = reward.score(batch)
    batch.update(scores)
    for key, values in extras.items():
        batch.set(EXTRA_PREFIX + key, torch.tensor(values, dtype=torch.float32))
    ob = cfg.reward.overlong_buffer
    if ob.enable:
        lengths = response_lengths(batch)  # a multi-turn response's tool tokens count against the limit too
        penalty = overlong_reward_penalty(lengths, cfg.data.max_response_length, ob.len, ob.penalty_factor)
        last = last_loss_index(batch["response_mask"])
        scores = batch["token_level_scores"].clone()
        scores[torch.arange(len(batch)), last] += penalty
        batch.set("token_level_scores", scores)
        batch.set(EXTRA_PREFIX + "overlong_penalty", penalty.float())
    return batch


def remax_baselines(
    batch: Batch, rollout, reward: RuleRewardManager, cfg: LucidConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ReMax's baseline: the score of one greedy response per prompt, (prompts,); and which of those
    scorings failed, (prompts,) bool, under reward.on_error mask or zero (else None)."""
    greedy = rollout.generate(
        batch, SamplingParams(n=1, do_sample=False, max_new_tokens=cfg.data.max_response_length)
    )
    scored = score(greedy, reward, cfg)
    return scored["token_level_scores"].sum(-1), scored[
        "reward_failed"
    ] if "reward_failed" in scored else None


class FilterMetricError(UserError, ValueError):
    """algorithm.filter_groups.metric names a value the batch does not hold for every sample."""


def filter_values(batch: Batch, metric: str) -> torch.Tensor:
    """(bs,) the values whose ties drop a group under algorithm.filter_groups.metric."""
    if metric in ("score", "seq_reward"):
        return batch["token_level_scores"].sum(-1)
    key = EXTRA_PREFIX + metric
    extras = sorted(k.removeprefix(EXTRA_PREFIX) for k in batch.keys() if k.startswith(EXTRA_PREFIX))
    if key not in batch:
        raise FilterMetricError(
            f"algorithm.filter_groups.metric={metric!r}: the reward function returned no {metric!r} for this "
            f"batch (its extra metrics: {', '.join(extras) or 'none'}); name one of those, or score"
        )
    values = batch[key]
    if torch.isnan(values).any():
        raise FilterMetricError(
            f"algorithm.filter_groups.metric={metric!r}: {int(torch.isnan(values).sum())} of {len(values)} "
            f"samples have no {metric!r} (a data source whose reward does not return it); filter on score, "
            "or return it for every source"
        )
    return values


def fill_missing_extras(batches: list[Batch]) -> list[Batch]:
    """Give every batch the reward_extra:<key> tensors any of them has, NaN where a round's reward never
    returned the key (a data source without it, or an extra a function returns only sometimes), so the
    rounds concatenate; the metrics average extras with nanmean."""
    keys = sorted({k for b in batches for k in b.keys() if k.startswith(EXTRA_PREFIX)})
    for b in batches:
        for k in keys:
            if k not in b:
                b.set(k, torch.full((len(b),), float("nan")))
    return batches


class BatchCollector:
    """Turns prompt batches into scored rollouts of exactly data.train_batch_size groups."""

    def __init__(
        self,
        cfg: LucidConfig,
        rollout,
        reward: RuleRewardManager,
        prompts: Iterator[Batch],
        *,
        pad_token_id: int,
    ):
        self.cfg = cfg
        self.rollout = rollout  # anything with generate(prompts, SamplingParams): an engine or a worker group
        self.reward = reward
        self.prompts = prompts
        self.pad_token_id = pad_token_id
        self.rounds = 0  # generation rounds so far: seeds deterministic sampling

    def _one_round(self, prompts: Batch, timings: dict[str, float]) -> Batch:
        cfg = self.cfg
        with timer("gen", timings):
            self.rounds += 1
            batch = self.rollout.generate(prompts, setup.train_sampling(cfg, self.rounds))
            baseline_failed = None
            if cfg.algorithm.adv_estimator == "remax":
                baselines, baseline_failed = remax_baselines(prompts, self.rollout, self.reward, cfg)
                batch.set("reward_baselines", baselines.repeat_interleave(cfg.rollout.n))
        with timer("reward", timings):
            batch = score(batch, self.reward, cfg)
        if baseline_failed is not None and cfg.reward.on_error == "mask":
            # without its baseline no sample of the prompt has an advantage: all of them are left out
            batch.set(
                "reward_failed", batch["reward_failed"] | baseline_failed.repeat_interleave(cfg.rollout.n)
            )
        return batch

    def collect(self, timings: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        cfg = self.cfg
        batch = self._one_round(next(self.prompts), timings)
        if not cfg.algorithm.filter_groups.enable:
            return batch, {}
        n, wanted = cfg.rollout.n, cfg.data.train_batch_size
        kept: list[Batch] = []
        tied: list[Batch] = []
        dropped = rounds = n_kept = 0
        while True:
            rounds += 1
            values = filter_values(batch, cfg.algorithm.filter_groups.metric)
            keep, m = dynamic_sampling_keep_mask(values, batch["uid"])
            dropped += m["dapo/groups_dropped_all_same"]
            n_kept += m["dapo/groups_kept"]
            kept.append(batch.select(keep.nonzero().flatten()))
            tied.append(batch.select((~keep).nonzero().flatten()))
            if n_kept >= wanted or rounds >= cfg.algorithm.filter_groups.max_num_gen_batches:
                break
            batch = self._one_round(next(self.prompts), timings)
        filled = max(0, wanted - n_kept)
        if filled:
            log.warning(
                "dynamic sampling: %d of %d groups had mixed scores after %d rounds "
                "(algorithm.filter_groups.max_num_gen_batches); filling with %d tied groups (zero advantage)",
                n_kept,
                wanted,
                rounds,
                filled,
            )
        parts = fill_missing_extras([b for b in kept + tied if len(b)])
        pool = Batch.concat(align_widths(parts, self.pad_token_id))
        out = pool.slice(0, wanted * n)  # kept groups come first; each group is n consecutive samples
        generated = torch.cat([b["token_level_scores"].sum(-1) for b in kept + tied])
        generated_uids = [u for b in kept + tied for u in b["uid"]]
        metrics = {
            # what the policy produced, before the filter: the batch trained on holds mixed groups by
            # construction, so its critic/groups_with_mixed_scores and critic/score say little of the
            # policy; the collapse monitor reads these instead
            "dapo/generated/groups_with_mixed_scores": n_kept / (n_kept + dropped),
            "dapo/generated/score/mean": generated.mean().item(),
            "dapo/generated/score/max": generated.max().item(),
            "dapo/generated/groups_tied_at_best": groups_tied_at_best(
                score_groups(generated, generated_uids)
            ),
            "dapo/gen_rounds": float(rounds),
            "dapo/groups_dropped_all_same": float(dropped),
            "dapo/filled_with_tied_groups": float(filled),
            # mixed groups of the last round beyond the batch: generated and scored, not trained on
            "dapo/groups_surplus_unused": float(max(0, n_kept - wanted)),
        }
        return out, metrics
