"""Validation: generate on held-out prompts, score, and report reward and accuracy per data source.

Accuracy is the reward function's "acc" metric when it returns one (K&K does), else a built-in rule's
score itself (GSM8K-style 0/1 rewards); a custom function's or a reward model's score is never called
accuracy. K&K samples also report accuracy per number of people, the table Logic-RL publishes.
"""

from __future__ import annotations

from collections import defaultdict

from lucidrl.batch import Batch, align_widths, response_lengths
from lucidrl.data.dataset import PromptSample, collate
from lucidrl.rewards.kk import people_count
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.trainer.metrics import nanmean
from lucidrl.workers.rollout.agent.trajectory import multi_turn_metrics
from lucidrl.workers.rollout.engine import SamplingParams


def validate(
    rollout,
    reward: RuleRewardManager,
    samples: list[PromptSample],
    params: SamplingParams,
    *,
    pad_token_id: int,
    batch_size: int | None,
) -> dict[str, float]:
    """val/<data_source>/score, val/<data_source>/acc, val/<data_source>/acc/<n>_people and extras, and
    verl's names for the same means over the N = params.n samples of every prompt:
    val-core/<data_source>/acc/mean@N (reward/mean@N where there is no accuracy) and
    val-aux/<data_source>/reward/mean@N. verl's best@N, worst@N and maj@N are not computed."""
    bs = batch_size or len(samples)
    scored: list[Batch] = []
    extras: dict[str, list[float]] = defaultdict(list)
    for start in range(0, len(samples), bs):
        batch = rollout.generate(collate(samples[start : start + bs], pad_token_id), params)
        scores, extra = reward.score(batch)
        batch.update(scores)
        n, before = len(batch), sum(len(b) for b in scored)
        for k in set(extras) | set(extra):
            if k not in extras:  # a key first returned in this batch: NaN for the samples before it
                extras[k] = [float("nan")] * before
            extras[k].extend(extra.get(k, [float("nan")] * n))
        scored.append(batch)
    # each batch's responses are as wide as its longest one: pad them to one width to join them
    batch = Batch.concat(align_widths(scored, pad_token_id))
    seq_scores = batch["token_level_scores"].sum(-1).tolist()
    failed = batch["reward_failed"].tolist() if "reward_failed" in batch else [False] * len(batch)
    # a sample whose reward failed (reward.on_error mask or zero) has no score to average: NaN, counted
    seq_scores = [float("nan") if bad else v for v, bad in zip(seq_scores, failed, strict=True)]
    # row by row: in a set mixing sources, the rows of one whose reward returns no "acc" (GSM8K's 0/1
    # score is its accuracy) are NaN in the "acc" that another source's rows fill
    fallback = seq_scores if reward.score_is_accuracy else [float("nan")] * len(seq_scores)
    acc = [f if a != a else a for a, f in zip(extras.get("acc", fallback), fallback, strict=True)]
    lengths = response_lengths(batch).tolist()
    groups: dict[str, list[int]] = defaultdict(list)
    for i, ds in enumerate(batch["data_source"]):
        groups[ds].append(i)
        n_people = people_count(ds, batch["ground_truth"][i], batch["extra_info"][i])
        if n_people is not None:
            groups[f"{ds}/acc/{n_people}_people"].append(i)
    out: dict[str, float] = {}
    at_n = f"mean@{params.n}"
    for key, idx in groups.items():
        if "/acc/" in key:
            out[f"val/{key}"] = nanmean([acc[i] for i in idx])
            continue
        out[f"val/{key}/score"] = nanmean([seq_scores[i] for i in idx])
        out[f"val/{key}/acc"] = nanmean([acc[i] for i in idx])
        if all(a != a for a in (acc[i] for i in idx)):  # no accuracy: verl's core metric is the reward
            out[f"val-core/{key}/reward/{at_n}"] = out[f"val/{key}/score"]
        else:
            out[f"val-core/{key}/acc/{at_n}"] = out[f"val/{key}/acc"]
            out[f"val-aux/{key}/reward/{at_n}"] = out[f"val/{key}/score"]
        out[f"val/{key}/response_length"] = nanmean([lengths[i] for i in idx])
        for k, values in extras.items():
            if k != "acc" and any(values[i] == values[i] for i in idx):  # not an extra only others return
                out[f"val/{key}/{k}"] = nanmean([values[i] for i in idx])
    out["val/acc"] = nanmean(acc)
    out.update(multi_turn_metrics(batch, prefix="val/multi_turn"))
    if "reward_failed" in batch:
        out["val/reward_failed"] = float(sum(failed))  # left out of the means above
    return out
