"""A step's rewards: the rule functions by data_source, a reward model (reward_model.enable), or both.

Both kinds answer `score(batch) -> (Batch with token_level_scores (bs, R), per-sample extras)`, so the
collector, ReMax's baselines and validation do not care which scored them. Under reward.on_error=mask
the samples whose reward failed are then left out of the update here (leave_out_failed).
"""

from __future__ import annotations

import torch

from lucidrl.batch import Batch
from lucidrl.rewards.manager import RuleRewardManager


class ModelRewardScorer:
    """The reward-model group's score, alone (`combine=replace`, verl's) or added to the rule score.

    Its scores are not accuracies: validation reports `acc` only from the rule (combine=add).
    """

    score_is_accuracy = False

    def __init__(self, group, rule: RuleRewardManager, combine: str):
        self.group = group  # a worker group hosting the reward_model role
        self.rule = rule
        self.combine = combine

    def close(self) -> None:
        self.rule.close()

    def score(self, batch: Batch) -> tuple[Batch, dict[str, list[float]]]:
        out = self.group.compute_rm_score(batch)
        rm = out["rm_scores"]
        extras: dict[str, list[float]] = {}
        failures = {}
        if self.combine == "add":
            scored, extras = self.rule.score(batch)
            extras["rule_score"] = scored["token_level_scores"].sum(-1).tolist()
            extras.setdefault("acc", extras["rule_score"])  # what the rule alone calls accuracy
            scores = scored["token_level_scores"] + rm
            failures = {k: scored[k] for k in FAILURE_KEYS if k in scored}  # reward.on_error's marks
        else:
            scores = rm
        extras["rm_score"] = rm.sum(-1).tolist()
        extras["rm_truncated"] = out["rm_truncated"].tolist()
        return Batch(tensors={"token_level_scores": scores, **failures}), extras


FAILURE_KEYS = ("reward_failed", "reward_timed_out")  # (bs,) bool, from a rule reward under on_error


def leave_out_failed(batch: Batch) -> Batch:
    """reward.on_error=mask: the samples whose reward failed take no part in the update.

    Their `response_mask (bs, R)` rows are zeroed, so none of their tokens enters the policy loss, the
    KL or entropy terms, the critic's loss or the advantage whitening; the mask they were generated
    with is kept as `generated_mask` for the length metrics. `compute_advantage` then gives each
    its own group (`advantage_index`), so a GRPO or RLOO group's baseline is its other samples'.
    """
    failed = batch["reward_failed"]
    if not failed.any():
        return batch
    batch.set("generated_mask", batch["response_mask"])
    batch.set("response_mask", batch["response_mask"].masked_fill(failed.unsqueeze(-1), 0))
    return batch


def advantage_index(batch: Batch) -> list:
    """The group of each sample for the advantage estimators: its prompt's uid, or a group of its own
    for a sample left out by leave_out_failed (its score must not move its group's mean and std)."""
    if "generated_mask" not in batch:
        return list(batch["uid"])
    failed = batch["reward_failed"].tolist()
    return [
        f"{uid}/failed/{i}" if bad else uid
        for i, (uid, bad) in enumerate(zip(batch["uid"], failed, strict=True))
    ]


def lone_survivors(batch: Batch) -> torch.Tensor:
    """(bs,) bool: the samples that leave_out_failed left alone in their prompt's group (every other sample
    of it failed). A group estimator has nothing to compare them with; they get advantage 0, as a group
    whose samples all tied does (a lone sample's score would otherwise be its advantage, unscaled)."""
    lone = torch.zeros(len(batch), dtype=torch.bool)
    if "generated_mask" not in batch:
        return lone
    failed = batch["reward_failed"].tolist()
    members: dict = {}
    for i, uid in enumerate(batch["uid"]):
        members.setdefault(uid, []).append(i)
    for idx in members.values():
        alive = [i for i in idx if not failed[i]]
        if len(idx) > 1 and len(alive) == 1:
            lone[alive[0]] = True
    return lone
