"""RL algorithm math: advantage estimators, policy and value losses, KL, loss aggregation, log-probs.

Pure tensor functions — no models, no processes — each testable on its own. Estimators and losses
are looked up by their config name through the registries.
"""

from lucidrl.algos.advantage import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from lucidrl.algos.aggregation import LOSS_AGG_MODES, agg_loss, masked_mean, masked_var, masked_whiten
from lucidrl.algos.kl import (
    KL_CONTROLLER_KINDS,
    KL_PENALTY_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)
from lucidrl.algos.logprob import entropy_from_logits, logprobs_from_logits
from lucidrl.algos.policy_loss import (
    compute_policy_loss_geo_mean,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
)
from lucidrl.algos.policy_loss_bypass import compute_policy_loss_bypass_mode
from lucidrl.algos.policy_loss_soft import (
    compute_policy_loss_cispo,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
)
from lucidrl.algos.policy_loss_trust import (
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_kl_cov,
)
from lucidrl.algos.registry import (
    get_advantage_estimator,
    get_policy_loss,
    list_advantage_estimators,
    list_policy_losses,
    policy_loss_agg_mode,
    policy_loss_zero_advantage_inert,
    register_advantage_estimator,
    register_policy_loss,
)
from lucidrl.algos.returns import compute_gae_advantage_return, compute_reinforce_plus_plus_outcome_advantage
from lucidrl.algos.reward_shaping import dynamic_sampling_keep_mask, overlong_reward_penalty
from lucidrl.algos.rollout_correction import rollout_correction
from lucidrl.algos.token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from lucidrl.algos.value_loss import compute_value_loss, explained_variance

__all__ = [
    "KL_CONTROLLER_KINDS",
    "KL_PENALTY_KINDS",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "dynamic_sampling_keep_mask",
    "entropy_from_logits",
    "explained_variance",
    "get_advantage_estimator",
    "get_policy_loss",
    "kl_penalty",
    "list_advantage_estimators",
    "list_policy_losses",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "overlong_reward_penalty",
    "policy_loss_agg_mode",
    "policy_loss_zero_advantage_inert",
    "register_advantage_estimator",
    "register_policy_loss",
    "rollout_correction",
]
