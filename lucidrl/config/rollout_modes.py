"""`rollout.mode` and `rollout.max_staleness` resolved and checked once, at validation: what overlaps
with what, how stale a sample may be, and the correction stale samples train with by default."""

from __future__ import annotations

import logging
from typing import Any

from lucidrl.config.errors import ConfigError

log = logging.getLogger(__name__)


def resolve_rollout_mode(cfg: Any) -> None:
    """Set rollout.max_staleness from rollout.mode, refuse what the modes do not run, and turn on the
    default correction for stale samples (rollout.staleness_correction)."""
    r = cfg.rollout
    default = 0 if r.mode == "sync" else 1
    if r.max_staleness is None:
        r.max_staleness = default
    if r.mode == "sync" and r.max_staleness != 0:
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness} with rollout.mode=sync: sync trains every batch with the "
            "policy that generated it (staleness 0); set rollout.mode=async to let samples lag by "
            f"{r.max_staleness} version(s), or leave rollout.max_staleness unset"
        )
    if r.mode == "one_step_off" and r.max_staleness != 1:
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness} with rollout.mode=one_step_off, which is staleness 1 by "
            "definition (the next batch generates while this one trains); use rollout.mode=async for "
            f"max_staleness={r.max_staleness}"
        )
    if r.mode == "sync":
        return
    where = f"rollout.mode={r.mode}"
    if cfg.trainer.backend != "local":
        raise ConfigError(
            f"{where} with trainer.backend={cfg.trainer.backend}: the overlapped modes generate in a thread of "
            "the trainer's process, so they run on trainer.backend=local; use rollout.mode=sync on Ray"
        )
    if r.name != "hf":
        raise ConfigError(
            f"{where} with rollout.name={r.name}: the overlapped modes generate with the hf engine (a copy of "
            "the actor's weights, refreshed after each update); use rollout.name=hf, or rollout.mode=sync"
        )
    if cfg.rollout.multi_turn.enable:
        raise ConfigError(
            f"{where} with rollout.multi_turn.enable=true: multi-turn rollouts run in sync mode only; "
            "set rollout.mode=sync"
        )
    rc = cfg.algorithm.rollout_correction
    if r.max_staleness > 0 and rc.bypass_mode:
        raise ConfigError(
            f"{where} (max_staleness {r.max_staleness}) with algorithm.rollout_correction.bypass_mode=true: "
            "bypass takes the engine's log-probs as the old ones, so a stale sample's ratio would be to the "
            "policy that generated it, not to the one being trained; leave bypass_mode false (the actor "
            "recomputes them)"
        )
    if r.max_staleness > 0 and cfg.trainer.collapse.keep_last_healthy:
        raise ConfigError(
            f"{where} (max_staleness {r.max_staleness}) with trainer.collapse.keep_last_healthy=true: the guard "
            "keeps the weights a step starts from as healthy once its rollouts look healthy, but a stale "
            "batch was made by older weights, so it would vouch for weights it never measured; set "
            "trainer.collapse.keep_last_healthy=false, or rollout.mode=sync"
        )
    chosen = rc.rollout_is is not None or rc.rollout_rs is not None
    if r.max_staleness > 0 and r.staleness_correction and not chosen:
        rc.rollout_is = "token"
        log.info(
            "%s: samples up to %d update(s) old train with token importance weights between the engine's "
            "and the recomputed old log-probs, truncated at %s (algorithm.rollout_correction.rollout_is=token; "
            "rollout.staleness_correction=false turns this off)",
            where,
            r.max_staleness,
            rc.rollout_is_threshold,
        )
    elif r.max_staleness > 0 and not chosen:
        log.warning(
            "%s with rollout.staleness_correction=false and no algorithm.rollout_correction: samples up to %d "
            "update(s) old train against the recomputed old policy only; nothing corrects for the gap to the "
            "policy that generated them (docs/async.md)",
            where,
            r.max_staleness,
        )
