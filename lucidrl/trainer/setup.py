"""Build what a run needs from the config: run directory, tokenizer, models, data, workers."""

from __future__ import annotations

import copy
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from lucidrl.config import LucidConfig, to_dict
from lucidrl.data.dataset import FilterReport, PromptSample, load_prompts
from lucidrl.models import check_tokenizer_matches_model, load_model, load_tokenizer
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.workers.actor import ActorWorker, ReferenceWorker
from lucidrl.workers.critic import CriticWorker, load_value_model
from lucidrl.workers.rollout_hf import HFRollout, SamplingParams

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class RunDirError(ValueError):
    """The run directory holds an earlier run that this one would overwrite."""


@dataclass
class Workers:
    """The in-process worker set of one run (the `local` placement)."""

    tokenizer: object
    actor: ActorWorker
    rollout: HFRollout
    reference: ReferenceWorker | None
    critic: CriticWorker | None
    reward: RuleRewardManager


def prepare_run_dir(cfg: LucidConfig) -> Path:
    """runs/<experiment_name> (or trainer.run_dir), refusing to mix two runs' metrics in one folder."""
    run_dir = Path(cfg.trainer.run_dir or Path("runs") / cfg.trainer.experiment_name)
    if run_dir.exists() and any(run_dir.iterdir()):
        if not cfg.trainer.overwrite:
            raise RunDirError(
                f"run directory '{run_dir}' already holds a run; set trainer.experiment_name or trainer.run_dir "
                f"to a new place, or trainer.overwrite=true to replace it"
            )
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return run_dir


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def load_data(cfg: LucidConfig, tokenizer) -> tuple[list[PromptSample], list[PromptSample], FilterReport]:
    d = cfg.data
    train, report = load_prompts(
        d.train_files,
        tokenizer,
        max_prompt_length=d.max_prompt_length,
        prompt_key=d.prompt_key,
        filter_overlong=d.filter_overlong_prompts,
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
            what="data.val_files",
        )
    return train, val, report


def build_workers(cfg: LucidConfig) -> Workers:
    """Tokenizer, actor (+ colocated rollout), reference (only with a KL term) and reward manager."""
    m = cfg.model
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, pad_token=m.pad_token)
    model = load_model(m.path, dtype=DTYPES[m.dtype], trust_remote_code=m.trust_remote_code)
    check_tokenizer_matches_model(model, tokenizer, m.path)
    model.to(cfg.trainer.device)
    reference = None
    if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        reference = ReferenceWorker(
            copy.deepcopy(model),
            micro_batch_size=cfg.actor.log_prob_micro_batch_size,
            temperature=cfg.rollout.temperature,
        )
    actor = ActorWorker(
        model, cfg.actor, temperature=cfg.rollout.temperature, samples_per_prompt=cfg.rollout.n
    )
    rollout = HFRollout(model, tokenizer, micro_batch_size=cfg.rollout.micro_batch_size)
    critic = None
    if cfg.algorithm.adv_estimator == "gae":
        c = cfg.critic
        value_model = load_value_model(c.model_path or m.path, dtype=DTYPES[m.dtype]).to(cfg.trainer.device)
        critic = CriticWorker(
            value_model,
            c,
            mini_batch_prompts=c.ppo_mini_batch_size or cfg.actor.ppo_mini_batch_size,
            samples_per_prompt=cfg.rollout.n,
        )
    fn = cfg.reward.custom_function
    reward = RuleRewardManager.from_config(tokenizer, fn.path, fn.name)
    return Workers(tokenizer, actor, rollout, reference, critic, reward)


def train_sampling(cfg: LucidConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        n=r.n,
        do_sample=True,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=cfg.data.max_response_length,
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
    )
