"""The advantage step of a training batch: the KL penalty in the reward, rollout correction, and the
configured estimator called with the inputs its signature asks for."""

from __future__ import annotations

import inspect

import torch

from lucidrl.algos import apply_kl_penalty, get_advantage_estimator, rollout_correction
from lucidrl.batch import Batch, loss_mask
from lucidrl.config import LucidConfig
from lucidrl.diagnostics.errors import UserError
from lucidrl.trainer.collect import EXTRA_PREFIX
from lucidrl.trainer.rewards import advantage_index, lone_survivors


class RewardComponentError(UserError, ValueError):
    """algorithm.gdpo_reward_keys names a value the reward function did not return for every sample."""


class RolloutLogProbsMissing(UserError, ValueError):
    """Rollout correction is on, but the rollout engine gave no log-probs for the sampled tokens."""


def reward_components(batch: Batch, keys: list[str]) -> torch.Tensor:
    """(bs, K) GDPO's components: `score` is each sample's score (the token scores' sum), any other key a
    value the reward function returned in its dict (reward_extra:<key>)."""
    columns = []
    extras = sorted(k.removeprefix(EXTRA_PREFIX) for k in batch.keys() if k.startswith(EXTRA_PREFIX))
    for key in keys:
        if key == "score":
            columns.append(batch["token_level_scores"].sum(-1).float())
            continue
        if EXTRA_PREFIX + key not in batch:
            raise RewardComponentError(
                f"algorithm.gdpo_reward_keys has {key!r}, which the reward function did not return for this batch "
                f"(its dict held: {', '.join(['score', *extras])}); return {key!r} from compute_score, or name "
                "one of those"
            )
        values = batch[EXTRA_PREFIX + key].float()
        if torch.isnan(values).any():
            raise RewardComponentError(
                f"algorithm.gdpo_reward_keys has {key!r}, but {int(torch.isnan(values).sum())} of {len(values)} "
                f"samples have none (a data source whose reward does not return it); return it for every source"
            )
        columns.append(values)
    return torch.stack(columns, dim=-1)


def compute_advantage(batch: Batch, cfg: LucidConfig) -> Batch:
    """Call the configured estimator with the inputs its signature asks for."""
    estimator = get_advantage_estimator(cfg.algorithm.adv_estimator)
    alg = cfg.algorithm
    available = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": loss_mask(batch),
        "index": advantage_index(batch),  # a sample whose reward failed (reward.on_error=mask) alone
        "norm_adv_by_std_in_grpo": alg.norm_adv_by_std_in_grpo,
        "gamma": alg.gamma,
        "lam": alg.lam,
    }
    for key in ("values", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights"):
        if key in batch:
            available[key] = batch[key]
    wanted = inspect.signature(estimator).parameters
    if "reward_components" in wanted and alg.gdpo_reward_keys:
        available["reward_components"] = reward_components(batch, alg.gdpo_reward_keys)
        available["reward_weights"] = alg.gdpo_reward_weights
    elif "reward_weights" in wanted and alg.gdpo_reward_weights is not None:
        available["reward_weights"] = alg.gdpo_reward_weights
    missing = [k for k, p in wanted.items() if p.default is p.empty and k not in available]
    if missing:
        raise ValueError(
            f"advantage estimator '{alg.adv_estimator}' needs {missing}, which this run does not compute"
        )
    advantages, returns = estimator(**{k: v for k, v in available.items() if k in wanted})
    if "index" in wanted:  # a group estimator: a sample whose group's others all failed has no baseline
        lone = lone_survivors(batch).unsqueeze(-1)
        advantages, returns = advantages.masked_fill(lone, 0.0), returns.masked_fill(lone, 0.0)
    return Batch(tensors={"advantages": advantages, "returns": returns})


def estimator_needs(cfg: LucidConfig, name: str) -> bool:
    """Whether the configured estimator takes the input `name` (e.g. sum_pi_squared, old_log_probs)."""
    return name in inspect.signature(get_advantage_estimator(cfg.algorithm.adv_estimator)).parameters


def apply_reward_kl(batch: Batch, controller, kind: str) -> tuple[Batch, dict[str, float]]:
    """token_level_rewards = scores − β·KL(actor ‖ reference) per token; the controller adapts β."""
    rewards, metrics = apply_kl_penalty(
        batch["token_level_scores"],
        batch["old_log_probs"],
        batch["ref_log_probs"],
        batch["response_mask"],
        controller.value,
        kind,
    )
    controller.update(metrics["actor/reward_kl_penalty"], n_steps=len(batch))
    return Batch(tensors={"token_level_rewards": rewards}), metrics


def rollout_log_probs(batch: Batch, why: str) -> torch.Tensor:
    """The engine's log-probs of the sampled tokens; RolloutLogProbsMissing (saying `why`) without them."""
    if "rollout_log_probs" not in batch:
        raise RolloutLogProbsMissing(
            f"{why} needs the rollout engine's log-probs of the sampled tokens, and this batch has none (every "
            "engine returns them when sampling: check rollout.name and that the run samples, rollout.n)"
        )
    return batch["rollout_log_probs"]


def correct_rollout(batch: Batch, cfg: LucidConfig) -> tuple[Batch, dict[str, float]]:
    """Decoupled rollout correction (algorithm.rollout_correction, bypass_mode=false): importance weights
    `rollout_is_weights` and a rejection `loss_mask` from the actor's old log-probs against the engine's,
    and the rollout_corr/* metrics. The response mask is left as it is; the estimator and the losses read
    `loss_mask` (batch.loss_mask), and the forwards attend to every real token (batch.response_attention)."""
    rc = cfg.algorithm.rollout_correction
    rollout = rollout_log_probs(batch, "algorithm.rollout_correction (rollout_is / rollout_rs)")
    weights, keep, metrics = rollout_correction(
        batch["old_log_probs"], rollout, batch["response_mask"],
        rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize, rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold,
    )  # fmt: skip
    out = Batch(tensors={"rollout_is_weights": weights} if weights is not None else {})
    if rc.rollout_rs is not None:
        out.set("loss_mask", keep)
    return out, metrics
