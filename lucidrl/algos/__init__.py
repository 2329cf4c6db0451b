"""RL algorithm math: advantage estimators, policy losses, KL estimators, loss aggregation, log-probs.

Pure tensor functions — no models, no processes — each testable on its own. Estimators and losses
are looked up by their config name through the registries.
"""

from lucidrl.algos.advantage import compute_grpo_outcome_advantage
from lucidrl.algos.aggregation import LOSS_AGG_MODES, agg_loss, masked_mean, masked_var, masked_whiten
from lucidrl.algos.kl import KL_PENALTY_KINDS, kl_penalty
from lucidrl.algos.logprob import entropy_from_logits, logprobs_from_logits
from lucidrl.algos.policy_loss import compute_policy_loss_vanilla
from lucidrl.algos.registry import (
    get_advantage_estimator,
    get_policy_loss,
    list_advantage_estimators,
    list_policy_losses,
    register_advantage_estimator,
    register_policy_loss,
)

__all__ = [
    "KL_PENALTY_KINDS",
    "LOSS_AGG_MODES",
    "agg_loss",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss_vanilla",
    "entropy_from_logits",
    "get_advantage_estimator",
    "get_policy_loss",
    "kl_penalty",
    "list_advantage_estimators",
    "list_policy_losses",
    "logprobs_from_logits",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "register_advantage_estimator",
    "register_policy_loss",
]
