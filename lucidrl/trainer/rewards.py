"""A step's rewards: the rule functions by data_source, a reward model (reward_model.enable), or both.

Both kinds answer `score(batch) -> (Batch with token_level_scores (bs, R), per-sample extras)`, so the
collector, ReMax's baselines and validation do not care which scored them.
"""

from __future__ import annotations

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

    def score(self, batch: Batch) -> tuple[Batch, dict[str, list[float]]]:
        out = self.group.compute_rm_score(batch)
        rm = out["rm_scores"]
        extras: dict[str, list[float]] = {}
        if self.combine == "add":
            scored, extras = self.rule.score(batch)
            extras["rule_score"] = scored["token_level_scores"].sum(-1).tolist()
            extras.setdefault("acc", extras["rule_score"])  # what the rule alone calls accuracy
            scores = scored["token_level_scores"] + rm
        else:
            scores = rm
        extras["rm_score"] = rm.sum(-1).tolist()
        extras["rm_truncated"] = out["rm_truncated"].tolist()
        return Batch(tensors={"token_level_scores": scores}), extras
