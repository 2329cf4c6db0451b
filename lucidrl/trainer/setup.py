"""Build what a run needs from the config: run directory, tokenizer, models, data, workers."""

from __future__ import annotations

import json
import logging
import random
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from lucidrl.config import LucidConfig, to_dict
from lucidrl.config.engines import model_max_positions
from lucidrl.config.errors import ConfigError
from lucidrl.config.placement import plan_groups
from lucidrl.controller.worker_group import LocalWorkerGroup, RayWorkerGroup, WorkerGroup, ensure_ray
from lucidrl.data.dataset import FilterReport, PromptSample, load_prompts, row_of
from lucidrl.diagnostics.debug import debug_enabled
from lucidrl.diagnostics.errors import UserError
from lucidrl.models import load_run_tokenizer
from lucidrl.models.loading import check_model_folder
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.rewards.registry import check_data_sources, check_ground_truths
from lucidrl.trainer import run_status
from lucidrl.trainer.rewards import ModelRewardScorer
from lucidrl.workers.policy import PolicyWorker
from lucidrl.workers.rollout.engine import SamplingParams

log = logging.getLogger(__name__)


class RunDirError(UserError, ValueError):
    """The run directory holds an earlier run that this one would overwrite."""


@dataclass
class Workers:
    """The worker groups of one run (local or Ray) and the reward manager, which runs in the trainer."""

    tokenizer: Any
    actor: WorkerGroup  # hosts actor and rollout (and whatever else is colocated with them)
    reference: WorkerGroup | None
    critic: WorkerGroup | None
    reward: RuleRewardManager | ModelRewardScorer  # score(batch): the rule functions and/or the reward model
    groups: list[WorkerGroup]
    ray_cluster: str | None = None  # with trainer.backend=ray: the cluster started or joined, in words

    def shutdown(self) -> None:
        for g in self.groups:
            g.shutdown()
        self.reward.close()  # a reward function's worker process (reward.timeout_s)

    @contextmanager
    def shut_down_on_error(self) -> Iterator[Workers]:
        """Shut the groups down if the block raises: a trainer whose set-up failed leaves no Ray actors and
        placement groups behind in a process that goes on (a notebook, a sweep)."""
        try:
            yield self
        except BaseException:
            self.shutdown()
            raise

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        # also when a step raised: the other ranks may be blocked in a collective with the failed one,
        # and a process that trains again (lucidrl demo's seeds) must not find them holding the CPUs
        self.shutdown()


def run_dir_of(cfg: LucidConfig) -> Path:
    """runs/<experiment_name>, or trainer.run_dir (`~` expanded)."""
    return (
        Path(cfg.trainer.run_dir).expanduser()
        if cfg.trainer.run_dir
        else Path("runs") / cfg.trainer.experiment_name
    )


# what a lucidrl run writes into its folder: a folder without any of them is not a run's
RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "final", run_status.STATUS)


def _holds_progress(run_dir: Path) -> bool:
    """Whether the run there logged a step or saved anything (a start that failed left config.yaml only)."""
    metrics = run_dir / "metrics.jsonl"
    return (metrics.is_file() and metrics.stat().st_size > 0) or any(
        (run_dir / name).exists() for name in ("checkpoints", "final")
    )


def _logged(run_dir: Path) -> str:
    """'step N', the last step metrics.jsonl holds ('no step' when none)."""
    steps = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            steps.append(int(json.loads(line).get("step", 0)))
        except (ValueError, AttributeError):  # a line torn by the kill
            continue
    return f"step {max(steps)}" if steps else "no step"


def refuse_occupied(cfg: LucidConfig, run_dir: Path) -> None:
    """RunDirError if `run_dir` holds a run that this one would overwrite without trainer.overwrite=true,
    or files that are not a lucidrl run's at all (never deleted, with overwrite or without)."""
    if not (run_dir.exists() and any(run_dir.iterdir())):
        return
    if not any((run_dir / name).exists() for name in RUN_FILES):
        found = sorted(p.name for p in run_dir.iterdir())
        raise RunDirError(
            f"run directory '{run_dir}' is not empty and holds no lucidrl run (no {', '.join(RUN_FILES)}; it "
            f"holds {', '.join(found[:5])}{', ...' if len(found) > 5 else ''}), so it is not replaced, even with "
            "trainer.overwrite=true; set trainer.experiment_name or trainer.run_dir to a new or empty folder"
        )
    if cfg.trainer.overwrite or not _holds_progress(run_dir):  # a failed start is no run to protect
        return
    checkpointed = (run_dir / "checkpoints" / "latest").is_file()
    status = run_status.read(run_dir)
    if not checkpointed and run_status.crashed(status):
        # killed, failed or interrupted before its first checkpoint: nothing to resume, so running the
        # command again starts it again (what the docs tell a user to do after a crash)
        log.warning(
            "run directory %s holds a run that was %s after logging %s, with no checkpoint to resume from: "
            "starting it again from the beginning (its metrics and files are replaced)",
            run_dir,
            "killed" if status.get("state") == "running" else status.get("state"),
            _logged(run_dir),
        )
        return
    why = (
        f"and trainer.resume_mode={cfg.trainer.resume_mode} does not continue from its checkpoints"
        if checkpointed
        else "with no checkpoint to resume from"
    )
    raise RunDirError(
        f"run directory '{run_dir}' already holds a run ({why}); set trainer.experiment_name or trainer.run_dir "
        "to a new place, trainer.overwrite=true to replace it"
        + (", or trainer.resume_mode=auto to continue it" if checkpointed else "")
    )


def refuse_concurrent(run_dir: Path) -> None:
    """RunDirError if a run is training in `run_dir` now: another start there (to resume it or to
    replace it) would mix their files or delete them under it."""
    elsewhere = run_status.running_elsewhere(run_status.read(run_dir))
    if elsewhere:
        raise RunDirError(
            f"run directory '{run_dir}' is in use: a run is training there ({elsewhere}); wait for it to end "
            f"or stop it, or set trainer.experiment_name or trainer.run_dir to another place (if that process "
            f"is no lucidrl run, delete {run_dir / run_status.STATUS})"
        )


def _run_dir_named(cfg: LucidConfig, run_dir: Path) -> str:
    """The run directory and the key that put it there, for messages."""
    if cfg.trainer.run_dir:
        return f"trainer.run_dir={cfg.trainer.run_dir!r}"
    return f"run directory '{run_dir}' (trainer.experiment_name={cfg.trainer.experiment_name!r})"


def _cannot_write(folder: Path) -> OSError | None:
    """The error creating a file in `folder` gives (a read-only disk, no permission), None if it can.
    A file is made and removed rather than os.access asked: that says yes to root on a read-only mount's
    folders in some setups and knows nothing of quotas or network disks."""
    import os
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".lucidrl-write-check-", dir=folder)
    except OSError as exc:
        return exc
    os.close(fd)
    os.unlink(name)
    return None


def refuse_unwritable(cfg: LucidConfig, run_dir: Path) -> None:
    """RunDirError, before anything is read or loaded, when the run could not write its files: the run
    directory (or a folder on its path) is a file, or it or its checkpoints folder cannot be written (a
    read-only disk, a folder made read-only). Before, a file gave a raw NotADirectoryError and a
    read-only checkpoints folder failed the first save, after a step's work."""
    named = _run_dir_named(cfg, run_dir)
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        what = "is a file" if existing == run_dir else f"is under '{existing}', which is a file"
        raise RunDirError(
            f"{named} {what}, not a folder: the run writes its config, metrics, "
            "checkpoints and final model into a folder there; set trainer.run_dir to a new folder, or to a "
            "run's folder to resume it"
        )
    for folder, holds in ((existing, "its files"), (run_dir / "checkpoints", "the checkpoints")):
        if not folder.is_dir():
            continue
        exc = _cannot_write(folder)
        if exc is not None:
            why = f"{type(exc).__name__}: {exc.strerror or exc}"
            raise RunDirError(
                f"cannot write in '{folder}' ({why}), where the run of {named} writes {holds}: "
                + (
                    "make that folder writable again (chmod u+w, or remount its disk read-write) to continue "
                    "the run there, or copy the run to a writable disk and set trainer.run_dir to the copy"
                    if folder.name == "checkpoints" or folder == run_dir
                    else "set trainer.run_dir to a folder on a writable disk, or make that folder writable"
                )
            )


def prepare_run_dir(cfg: LucidConfig, keep: bool = False) -> Path:
    """The run directory, refusing to mix two runs' metrics in one folder; `keep`: the run resumes there."""
    run_dir = run_dir_of(cfg)
    refuse_unwritable(cfg, run_dir)
    refuse_concurrent(run_dir)
    if not keep:
        refuse_occupied(cfg, run_dir)
        if run_dir.exists():
            shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return run_dir


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def load_data(
    cfg: LucidConfig, tokenizer, *, check_rewards: bool = True
) -> tuple[list[PromptSample], list[PromptSample], FilterReport]:
    """The train and val prompts; with `check_rewards`, every row's data_source must have a built-in
    rule (when those score the run), and a ground truth that rule can score: `lucidrl doctor` checks
    that in a check of its own. Before any file is read, the lengths must fit the model (check_positions)."""
    check_positions(cfg)
    d = cfg.data
    train, report = load_prompts(
        d.train_files,
        tokenizer,
        max_prompt_length=d.max_prompt_length,
        prompt_key=d.prompt_key,
        filter_overlong=d.filter_overlong_prompts,
        truncation=d.truncation,
        prompt_format=d.prompt_format,
        template_kwargs=d.apply_chat_template_kwargs,
        what="data.train_files",
    )
    val: list[PromptSample] = []
    if d.val_files:
        val, _ = load_prompts(
            d.val_files,
            tokenizer,
            max_prompt_length=d.max_prompt_length,
            prompt_key=d.prompt_key,
            filter_overlong=d.filter_overlong_prompts,
            truncation=d.truncation,
            prompt_format=d.prompt_format,
            template_kwargs=d.apply_chat_template_kwargs,
            what="data.val_files",
        )
    if cfg.rollout.multi_turn.enable:  # rows' tools and environments, and prompt lengths with the tools
        from lucidrl.workers.rollout.agent.rows import check_rows

        check_rows(train + val, tokenizer, cfg.rollout.multi_turn, d.max_prompt_length)
    if check_rewards and uses_rule_rewards(cfg) and not cfg.reward.custom_function.path:
        # the built-in rules pick a function by data_source: every row needs one, found before the first step
        for samples, what in ((train, "data.train_files"), (val, "data.val_files")):
            check_data_sources(((s.data_source, row_of(s)) for s in samples), what)
            check_ground_truths(((s.data_source, s.ground_truth, row_of(s)) for s in samples), what)
    return train, val, report


def check_positions(cfg: LucidConfig) -> None:
    """ConfigError when a prompt and its response may together pass the policy model's positions
    (max_position_embeddings in model.path's config.json): the model would generate and be trained at
    positions it never learned, silently (vLLM refuses such a max_model_len, later)."""
    d = cfg.data
    positions = model_max_positions(cfg.model.path)
    length = d.max_prompt_length + d.max_response_length
    if not isinstance(positions, int) or length <= positions:
        return
    room = positions - d.max_response_length
    lower = (
        f"lower data.max_prompt_length to at most {room} (data.filter_overlong_prompts=true or data.truncation "
        "drop or cut longer prompts), or data.max_response_length"
        if room > 0
        else f"lower data.max_response_length below {positions} and data.max_prompt_length with it"
    )
    raise ConfigError(
        f"data.max_prompt_length + data.max_response_length = {d.max_prompt_length} + {d.max_response_length} = "
        f"{length} tokens is more than the {positions} positions of the model at model.path={cfg.model.path!r} "
        f"(max_position_embeddings in its config.json): a sample that long would be generated and trained at "
        f"positions the model never learned; {lower}, or use a model with more positions"
    )


def uses_rule_rewards(cfg: LucidConfig) -> bool:
    """Whether rule functions score this run's samples (not with a reward model that replaces them)."""
    return not (cfg.reward_model.enable and cfg.reward_model.combine == "replace")


def _distinct(groups: dict[str, WorkerGroup]) -> list[WorkerGroup]:
    """Each group once: colocated roles share one."""
    return list({id(g): g for g in groups.values()}.values())


def build_workers(cfg: LucidConfig) -> Workers:
    """One worker group per placement group plan; the reward manager in this process."""
    m = cfg.model
    tokenizer = load_run_tokenizer(m)
    fn = cfg.reward.custom_function
    r = cfg.reward
    # before any group starts: a bad reward file is refused without starting Ray actors
    rules = RuleRewardManager.from_config(
        tokenizer, fn.path, fn.name, fn.reward_kwargs, on_error=r.on_error, timeout_s=r.timeout_s
    )
    groups: dict[str, WorkerGroup] = {}
    plans = plan_groups(cfg)
    if cfg.critic.model_path and any("critic" in p.roles for p in plans):
        check_model_folder(cfg.critic.model_path, "critic.model_path")  # before the policy loads
    ray_cluster = ensure_ray(cfg.trainer.ray_address, num_cpus=None) if cfg.trainer.backend == "ray" else None
    try:
        for plan in plans:
            if cfg.trainer.backend == "local":
                group = LocalWorkerGroup(PolicyWorker, plan.name, cfg, plan.roles, device=plan.device)
            else:
                gpu = plan.device.startswith("cuda")
                group = RayWorkerGroup(
                    PolicyWorker,
                    plan.name,
                    cfg,
                    plan.roles,
                    device="cuda" if gpu else "cpu",
                    world_size=plan.world_size,
                    nodes=plan.nodes,
                    cpus_per_rank=cfg.trainer.cpus_per_rank,
                    gpus_per_rank=1 if gpu else 0,
                    master_port=cfg.trainer.master_port,
                    backend="nccl" if gpu else "gloo",
                )
            if debug_enabled():
                print(
                    f"[lucidrl debug] placement: {plan.name} x{plan.world_size} on {plan.where} ({cfg.trainer.backend})",
                    file=sys.stderr,
                    flush=True,
                )
            for role in plan.roles:
                groups[role] = group
    except BaseException:
        # a group that failed to start (a taken port, a bad model) stops the ones started before it
        for g in _distinct(groups):
            g.shutdown()
        raise
    reward: RuleRewardManager | ModelRewardScorer = rules
    if cfg.reward_model.enable:
        reward = ModelRewardScorer(groups["reward_model"], rules, cfg.reward_model.combine)
    return Workers(
        tokenizer,
        groups["actor"],
        groups.get("reference"),
        groups.get("critic"),
        reward,
        _distinct(groups),
        ray_cluster,
    )


def train_sampling(cfg: LucidConfig, step: int = 0) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        seed=cfg.trainer.seed * 1_000_003 + step if r.deterministic else None,
        n=r.n,
        do_sample=True,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=cfg.data.max_response_length,
        stop_regex=r.stop_regex,
    )


def val_sampling(cfg: LucidConfig) -> SamplingParams:
    v = cfg.rollout.val_kwargs
    return SamplingParams(
        n=v.n,
        do_sample=v.do_sample,
        temperature=v.temperature,
        top_p=v.top_p,
        top_k=v.top_k,
        max_new_tokens=cfg.data.max_response_length,
        stop_regex=cfg.rollout.stop_regex,
    )
