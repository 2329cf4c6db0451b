"""From the placement config to worker groups: which roles share processes, how many ranks, where.

Roles listed together in `placement.colocate` run in the same processes (one PolicyWorker per rank
hosting all of them); every other active role gets its own group. Two groups may never use the same
device: that is how roles end up fighting over one GPU's memory.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from lucidrl.config.errors import ConfigError
from lucidrl.config.schema import LucidConfig, PoolConfig

ROLES = ("actor", "rollout", "reference", "critic", "reward_model")


@dataclass(frozen=True)
class GroupPlan:
    """One worker group: the roles its ranks host and where the ranks go."""

    name: str
    roles: frozenset[str]
    world_size: int
    nodes: int
    devices_per_node: int
    where: str  # "pool 'global'" or "devices cuda:0, cuda:1", for messages
    device: str  # the torch device of each rank ("cpu", "cuda", or an explicit one on the local backend)


def active_roles(cfg: LucidConfig) -> list[str]:
    roles = ["actor", "rollout"]
    if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        roles.append("reference")
    if cfg.algorithm.adv_estimator == "gae":
        roles.append("critic")
    if cfg.reward_model.enable:
        roles.append("reward_model")
    return roles


def _devices_of(cfg: LucidConfig, role: str) -> tuple[str, ...]:
    """The device names a role occupies: explicit devices, or the pool's slots."""
    p = getattr(cfg.placement, role)
    if p.devices:
        return tuple(p.devices)
    if p.pool not in cfg.placement.pools:
        raise ConfigError(
            f"placement.{role}.pool={p.pool!r} is not a pool; defined pools: {', '.join(cfg.placement.pools)}"
        )
    pool = cfg.placement.pools[p.pool]
    return tuple(
        f"{p.pool}:node{n}:device{d}" for n in range(pool.nodes) for d in range(pool.devices_per_node)
    )


def _local_gpus(cfg: LucidConfig, role: str) -> tuple[str, ...]:
    """On the local backend, the GPUs a role's rank uses: its explicit devices, or trainer.device for
    a pool, with `cuda` read as `cuda:0` (the current device of a fresh process). The CPU is shared
    by design and not listed."""
    p = getattr(cfg.placement, role)
    names = p.devices or [cfg.trainer.device]
    return tuple("cuda:0" if name == "cuda" else name for name in names if name.startswith("cuda"))


def plan_groups(cfg: LucidConfig) -> list[GroupPlan]:
    """The worker groups of this run; a config error for overlapping devices or unsupported splits."""
    pl = cfg.placement
    active = active_roles(cfg)
    for name, pool in pl.pools.items():
        if pool.nodes < 1 or pool.devices_per_node < 1:
            raise ConfigError(
                f"placement.pools.{name} needs nodes >= 1 and devices_per_node >= 1, got {pool}"
            )
    named = {getattr(pl, r).pool for r in ROLES}  # by any role, active in this run or not
    for name, pool in pl.pools.items():
        if name not in named and not (name == "global" and pool == PoolConfig()):
            close = difflib.get_close_matches(name, sorted(named), n=1)
            raise ConfigError(
                f"placement.pools.{name} is defined but no role's pool names it (roles use: "
                f"{', '.join(sorted(named))})"
                + (
                    f"; did you mean placement.pools.{close[0]}?"
                    if close
                    else "; remove it or give a role pool=" + name
                )
            )
    seen: set[str] = set()
    for i, group in enumerate(pl.colocate):
        for role in group:
            if role not in ROLES:
                raise ConfigError(
                    f"placement.colocate[{i}] names unknown role {role!r}; roles: {', '.join(ROLES)}"
                )
            if role in seen:
                raise ConfigError(f"role {role!r} appears in two placement.colocate lists")
            seen.add(role)
    groups = [[r for r in g if r in active] for g in pl.colocate]
    groups = [g for g in groups if g] + [[r] for r in active if r not in seen]
    plans = []
    for roles in groups:
        devices = {r: _devices_of(cfg, r) for r in roles}
        first = roles[0]
        for r in roles[1:]:
            if devices[r] != devices[first]:
                raise ConfigError(
                    f"roles {first!r} and {r!r} are colocated (placement.colocate) but placed differently "
                    f"({_describe(cfg, first)} vs {_describe(cfg, r)}); give them the same pool or devices"
                )
        p = getattr(pl, first)
        if p.devices:
            nodes, per_node = 1, len(p.devices)
        else:
            pool = pl.pools[p.pool]
            nodes, per_node = pool.nodes, pool.devices_per_node
        device = p.devices[0] if p.devices and len(p.devices) == 1 else cfg.trainer.device
        plans.append(
            GroupPlan(
                "+".join(roles),
                frozenset(roles),
                nodes * per_node,
                nodes,
                per_node,
                _describe(cfg, first),
                device,
            )
        )
    for a in range(len(plans)):
        for b in range(a + 1, len(plans)):
            ra, rb = sorted(plans[a].roles)[0], sorted(plans[b].roles)[0]
            shared = sorted(set(_devices_of(cfg, ra)) & set(_devices_of(cfg, rb)))
            if not shared and cfg.trainer.backend == "local":  # pool slots are GPUs of this process too
                shared = sorted(set(_local_gpus(cfg, ra)) & set(_local_gpus(cfg, rb)))
            if shared:
                raise ConfigError(
                    f"roles {ra!r} and {rb!r} are both placed on {shared[0]} but not colocated: they would compete "
                    f"for its memory. Put them in one placement.colocate list, or give one of them another pool "
                    f"(placement.pools) or other devices"
                )
    if "rollout" in active and not any({"actor", "rollout"} <= p.roles for p in plans):
        raise ConfigError(
            "the rollout must be colocated with the actor (placement.colocate): its weights are synced in memory "
            "after each update; a separately placed rollout engine is not supported yet"
        )
    if cfg.trainer.backend == "local":
        wide = [p for p in plans if p.world_size > 1]
        if wide:
            raise ConfigError(
                f"trainer.backend=local runs one rank per role in this process, but {wide[0].name} is placed on "
                f"{wide[0].world_size} devices ({wide[0].where}); set trainer.backend=ray for data parallelism"
            )
    for p in plans:
        for role, prompts, samples in (
            ("actor", cfg.actor.ppo_mini_batch_size, cfg.actor_mini_batch_samples),
            ("critic", cfg.critic_mini_batch_prompts, cfg.critic_mini_batch_samples),
        ):
            if role in p.roles and p.world_size > 1 and samples % p.world_size:
                raise ConfigError(
                    f"{role}.ppo_mini_batch_size: a mini-batch of {prompts} prompts x rollout.n={cfg.rollout.n} = {samples} samples does "
                    f"not split evenly over the {p.world_size} ranks of {p.name} ({p.where}): each rank would take "
                    f"{samples // p.world_size} and the update would run more optimizer steps than "
                    f"{role}.ppo_mini_batch_size says; pick a mini-batch whose samples the rank count divides"
                )
        if "actor" in p.roles and p.world_size > 1 and cfg.actor.head_chunk_tokens not in (0, "auto"):
            raise ConfigError(
                f"actor.head_chunk_tokens={cfg.actor.head_chunk_tokens}: the chunked LM head runs with one rank "
                f"only for now, but the actor is placed on {p.world_size} ({p.where}); set "
                "actor.head_chunk_tokens=0 or place the actor on one device"
            )
        explicit = getattr(pl, sorted(p.roles)[0]).devices
        if cfg.trainer.backend == "ray" and explicit and any(d.startswith("cuda") for d in explicit):
            raise ConfigError(
                f"{p.name}: explicit GPU ids ({', '.join(explicit)}) are honoured by trainer.backend=local only; "
                f"on Ray give the role a pool (placement.pools) and Ray assigns the GPUs"
            )
    return plans


def _describe(cfg: LucidConfig, role: str) -> str:
    p = getattr(cfg.placement, role)
    return f"devices {', '.join(p.devices)}" if p.devices else f"pool {p.pool!r}"
