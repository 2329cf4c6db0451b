"""Cross-field checks of the algorithm keys: what a policy loss, an advantage estimator and rollout
correction need from each other, and keys set where nothing reads them.

Called by validation._validate_rl after the names have been checked against the registries.
"""

from __future__ import annotations

import dataclasses

from lucidrl.config.errors import ConfigError
from lucidrl.config.schema import ActorConfig, AlgorithmConfig, LucidConfig, RolloutCorrectionConfig

# actor keys read by one policy loss only (a changed value elsewhere would silently mean nothing)
LOSS_KEYS: dict[str, tuple[str, ...]] = {
    "tau_pos": ("sapo",),
    "tau_neg": ("sapo",),
    "clip_cov_ratio": ("clip_cov",),
    "clip_cov_lb": ("clip_cov",),
    "clip_cov_ub": ("clip_cov",),
    "kl_cov_ratio": ("kl_cov",),
    "ppo_kl_coef": ("kl_cov",),
    "dro_beta": ("dro",),
}

# estimators that take old_log_probs and sum_pi_squared from the actor's old-log-prob pass
TOKEN_BASELINE_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def _defaults(cls: type) -> dict[str, object]:
    return {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}


def _check_loss_keys(a: ActorConfig) -> None:
    defaults = _defaults(ActorConfig)
    for key, readers in LOSS_KEYS.items():
        if getattr(a, key) != defaults[key] and a.policy_loss not in readers:
            raise ConfigError(
                f"actor.{key}={getattr(a, key)!r} is read only by actor.policy_loss={' or '.join(readers)}, "
                f"and this run's is {a.policy_loss}; set the policy loss, or drop actor.{key}"
            )
    if a.policy_loss == "dro" and a.dro_beta is None:
        raise ConfigError(
            "actor.policy_loss=dro needs actor.dro_beta, the strength of its quadratic log-ratio penalty "
            "(> 0; verl has no default either), e.g. actor.dro_beta=0.1"
        )


def _check_aggregation(a: ActorConfig) -> None:
    from lucidrl import algos

    forced = algos.policy_loss_agg_mode(a.policy_loss)
    if forced is not None and a.loss_agg_mode != forced:
        raise ConfigError(
            f"actor.policy_loss={a.policy_loss} aggregates its loss {forced} whatever actor.loss_agg_mode says "
            f"(it is {a.loss_agg_mode}); set actor.loss_agg_mode={forced} so the entropy and KL terms and the "
            "micro-batch weights aggregate the same way"
        )
    if a.loss_scale_factor is not None and a.loss_agg_mode != "seq-mean-token-sum-norm":
        raise ConfigError(
            f"actor.loss_scale_factor={a.loss_scale_factor} divides the token sums of "
            f"loss_agg_mode=seq-mean-token-sum-norm only (this run's is {a.loss_agg_mode}); set that mode, or "
            "drop actor.loss_scale_factor"
        )


def _check_skip_zero_advantage(a: ActorConfig) -> None:
    """actor.skip_zero_advantage leaves samples out of the update: only where they add nothing to it."""
    from lucidrl import algos

    if not a.skip_zero_advantage:
        return
    inert = [n for n in algos.list_policy_losses() if algos.policy_loss_zero_advantage_inert(n)]
    other_terms = {
        f"actor.use_kl_loss=true (kl_loss_coef={a.kl_loss_coef})": a.use_kl_loss,
        f"actor.entropy_coeff={a.entropy_coeff}": a.entropy_coeff != 0,
        f"actor.policy_loss={a.policy_loss} (one without a batch statistic, zero where the advantage is: "
        f"{', '.join(inert)})": not algos.policy_loss_zero_advantage_inert(a.policy_loss),
    }
    found = [what for what, on in other_terms.items() if on]
    if found:
        raise ConfigError(
            f"actor.skip_zero_advantage=true leaves samples whose advantages are all 0 out of the update, "
            f"which is exact only when nothing else in the loss reads them, but this run has {'; '.join(found)}; "
            "drop those settings, or set actor.skip_zero_advantage=false"
        )


def _check_gdpo(alg: AlgorithmConfig) -> None:
    keys, weights = alg.gdpo_reward_keys, alg.gdpo_reward_weights
    if alg.adv_estimator != "gdpo":
        for name, value in (("gdpo_reward_keys", keys), ("gdpo_reward_weights", weights)):
            if value:
                raise ConfigError(
                    f"algorithm.{name}={value!r} is read only with algorithm.adv_estimator=gdpo (this run's is "
                    f"{alg.adv_estimator}); set it, or drop algorithm.{name}"
                )
        return
    if len(set(keys)) != len(keys):
        raise ConfigError(f"algorithm.gdpo_reward_keys={keys!r} names a component twice")
    if weights is not None and len(weights) != max(1, len(keys)):
        raise ConfigError(
            f"algorithm.gdpo_reward_weights={weights!r} has {len(weights)} weight(s) for "
            f"{max(1, len(keys))} reward component(s) (algorithm.gdpo_reward_keys={keys!r}; none: the score "
            "alone); give one weight per key"
        )


def _check_rollout_correction(cfg: LucidConfig) -> None:
    from lucidrl.algos.rollout_correction import parse_is_threshold, parse_rs_options, parse_rs_thresholds

    rc: RolloutCorrectionConfig = cfg.algorithm.rollout_correction
    p = "algorithm.rollout_correction"
    loss = cfg.actor.policy_loss
    try:
        parse_is_threshold(rc.rollout_is_threshold, f"{p}.rollout_is_threshold")
        if rc.rollout_rs is not None:
            options = parse_rs_options(rc.rollout_rs, f"{p}.rollout_rs")
            parse_rs_thresholds(options, rc.rollout_rs_threshold, f"{p}.rollout_rs_threshold")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if rc.rollout_rs is None and rc.rollout_rs_threshold is not None:
        raise ConfigError(
            f"{p}.rollout_rs_threshold={rc.rollout_rs_threshold!r} is read only with {p}.rollout_rs set (e.g. "
            f"token_k1); set it, or drop the threshold"
        )
    if rc.rollout_is is None and rc.rollout_is_batch_normalize:
        raise ConfigError(f"{p}.rollout_is_batch_normalize=true normalises weights that {p}.rollout_is=null "
                          "does not make; set rollout_is=token or sequence")  # fmt: skip
    if loss == "bypass_mode" and not rc.bypass_mode:
        raise ConfigError(
            f"actor.policy_loss=bypass_mode compares the current policy with the rollout engine's log-probs, which "
            f"stand in for the old ones only with {p}.bypass_mode=true; set it (or use {p}.rollout_is / "
            "rollout_rs with another policy loss, where the actor recomputes the old log-probs)"
        )
    if rc.loss_type != "ppo_clip" and loss != "bypass_mode":
        raise ConfigError(
            f"{p}.loss_type={rc.loss_type} is read only by actor.policy_loss=bypass_mode (this run's is {loss}); "
            "set both, or drop loss_type"
        )
    if rc.bypass_mode and loss != "bypass_mode" and (rc.rollout_is or rc.rollout_rs):
        raise ConfigError(
            f"{p}.bypass_mode=true with rollout_is / rollout_rs: in bypass mode the importance weights and "
            f"rejection are applied inside actor.policy_loss=bypass_mode only (this run's is {loss}, whose ratio "
            "to the rollout policy is then the correction); set actor.policy_loss=bypass_mode, or drop them"
        )
    if rc.bypass_mode and cfg.algorithm.adv_estimator in TOKEN_BASELINE_ESTIMATORS:
        raise ConfigError(
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs the actor's old-log-prob pass (its "
            f"log-probs and sum of squared probabilities), which {p}.bypass_mode=true skips; set bypass_mode=false"
        )


def validate_algorithm(cfg: LucidConfig) -> None:
    """The algorithm keys of a config tree, together (names are checked before this)."""
    _check_loss_keys(cfg.actor)
    _check_aggregation(cfg.actor)
    _check_skip_zero_advantage(cfg.actor)
    _check_gdpo(cfg.algorithm)
    _check_rollout_correction(cfg)


def rollout_correction_active(cfg: LucidConfig) -> bool:
    """Whether a step computes importance weights or a rejection mask from the engine's log-probs before the
    update (decoupled mode: the actor's old-log-prob pass must run)."""
    rc = cfg.algorithm.rollout_correction
    return not rc.bypass_mode and (rc.rollout_is is not None or rc.rollout_rs is not None)
