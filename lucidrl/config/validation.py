"""Cross-field checks of a config tree: batch arithmetic, ranges, names that must exist, what goes together.

A value of the right type can still mean nothing together with the others (a mini-batch larger than
the batch, a KL watch with no KL computed): each such case is refused with the numbers to change.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import types
from typing import Any, Union, get_args, get_origin

from lucidrl.config.algorithm_checks import validate_algorithm
from lucidrl.config.errors import ConfigError
from lucidrl.config.fields import field_hints, range_error, split_ranges
from lucidrl.config.placement import plan_groups
from lucidrl.config.rollout_checks import validate_multi_turn, validate_rollout_engine
from lucidrl.config.schema import LucidConfig, ModelConfig, SFTConfig


def _check_token_budgets(cfg: LucidConfig) -> None:
    """With use_dynamic_bsz (actor or critic) every single sample must fit a micro-batch's token budget."""
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    budgets = []
    if cfg.actor.use_dynamic_bsz:
        budgets += [("actor", k) for k in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu")]
    if cfg.critic.use_dynamic_bsz:
        budgets.append(("critic", "ppo_max_token_len_per_gpu"))
    for section, key in budgets:
        budget = getattr(getattr(cfg, section), key)
        if budget < longest:
            raise ConfigError(
                f"{section}.{key}={budget} is smaller than one sample can be: data.max_prompt_length + "
                f"data.max_response_length = {cfg.data.max_prompt_length} + {cfg.data.max_response_length} = "
                f"{longest} tokens; set {section}.{key} >= {longest} (or {section}.use_dynamic_bsz=false)"
            )


def check_ranges(obj: Any, prefix: str = "", source: str = "the config") -> None:
    """Every number in a config tree within its key's Range: the loader checks values as it reads them,
    this catches a tree built or changed in code."""
    hints = field_hints(type(obj))
    for f in dataclasses.fields(obj):
        _check_value(getattr(obj, f.name), hints[f.name], f"{prefix}{f.name}", source)


def _check_value(value: Any, hint: Any, key: str, source: str) -> None:
    if value is None:
        return
    if dataclasses.is_dataclass(value):
        check_ranges(value, key + ".", source)
        return
    base, ranges = split_ranges(hint)
    for rng in ranges:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not rng.holds(value):
            raise range_error(key, source, rng, value)
    if get_origin(base) in (Union, types.UnionType):
        for opt in get_args(base):
            if opt is not type(None) and split_ranges(opt)[1]:
                _check_value(value, opt, key, source)
    elif get_origin(base) is list and isinstance(value, list):
        (item,) = get_args(base) or (Any,)
        for i, v in enumerate(value):
            _check_value(v, item, f"{key}[{i}]", source)
    elif get_origin(base) is dict and isinstance(value, dict):
        for k, v in value.items():
            _check_value(v, get_args(base)[1], f"{key}.{k}", source)


def validate(cfg: Any) -> None:
    """Ranges, then cross-field checks of whichever config tree `cfg` is."""
    check_ranges(cfg)
    if isinstance(cfg, SFTConfig):
        _validate_sft(cfg)
    elif isinstance(cfg, LucidConfig):
        if cfg.rollout.name == "auto":
            from lucidrl.config.engines import choose_rollout_engine

            # resolved here, once: the run header, the saved config and a resume all see the engine. The
            # overlapped modes generate with the hf engine (config/rollout_modes.py)
            cfg.rollout.name = "hf" if cfg.rollout.mode != "sync" else choose_rollout_engine(cfg)
        from lucidrl.config.memory_choices import plan_memory
        from lucidrl.config.rollout_modes import resolve_rollout_mode

        resolve_rollout_mode(cfg)  # before the correction checks below read algorithm.rollout_correction

        # the auto keys resolved here, once, as the engine is: the header, the saved config and a resume
        # see the numbers; settings that cannot fit are refused before anything loads
        cfg.__dict__["_memory_plan"] = plan_memory(cfg)
        _validate_rl(cfg)


# trainer.logger backends: the module each needs and the extra that installs it (None: built in)
LOGGERS: dict[str, tuple[str, str] | None] = {
    "console": None,
    "jsonl": None,
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def missing_logger_packages(backends: list[str]) -> list[str]:
    """A line per chosen tracker whose package is not installed, saying what to install."""
    return [
        f"trainer.logger has {name!r} but {need[0]} is not installed: pip install 'lucidrl[{need[1]}]'"
        for name, need in LOGGERS.items()
        if need is not None and name in backends and importlib.util.find_spec(need[0]) is None
    ]


def _check_loggers(backends: list[str]) -> None:
    bad = [x for x in backends if x not in LOGGERS]
    if bad:
        raise ConfigError(f"trainer.logger has unknown backend(s) {bad}; available: {', '.join(LOGGERS)}")
    missing = missing_logger_packages(backends)
    if missing:
        raise ConfigError("; ".join(missing))


def _validate_precision(m: Any) -> None:
    """model.dtype and model.compute_dtype: float32 weights may compute in bfloat16, not the reverse."""
    if m.dtype == "bfloat16" and m.compute_dtype == "float32":
        raise ConfigError(
            "model.compute_dtype=float32 over model.dtype=bfloat16 weights: the weights' precision is gone "
            "before any float32 compute; set model.dtype=float32 (optionally with model.compute_dtype=bfloat16 "
            "for bf16 compute over float32 master weights)"
        )


def _validate_optim(optim: Any, prefix: str) -> None:
    """An optimizer section (actor.optim, critic.optim, SFT's optim): Adam's two betas (each one's range
    is the schema's)."""
    if len(optim.betas) != 2:
        raise ConfigError(f"{prefix}.betas must be two numbers in [0, 1) (Adam's), got {optim.betas}")


def _validate_run(t: Any) -> None:
    """Where a run goes and runs, for `lucidrl train` and `lucidrl sft` alike."""
    name = t.experiment_name
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ConfigError(
            f"trainer.experiment_name={name!r} must be one folder name (the run goes to runs/<name>; with "
            "trainer.overwrite=true that folder is deleted first): no '/', not empty, '.' or '..'; use "
            "trainer.run_dir for a path"
        )
    if not re.fullmatch(r"cpu|cuda(:\d+)?", t.device):
        raise ConfigError(f"trainer.device={t.device!r} must be cpu, cuda or cuda:N")


def check_devices_here(cfg: Any) -> None:
    """ConfigError when the config puts ranks on a CUDA device this machine does not have (a CPU build
    of torch, no GPU visible, or cuda:N past the GPUs): torch said only "Torch not compiled with CUDA
    enabled" when the model moved there. Checked where a run starts, not in validate(): a config read back
    from a checkpoint (lucidrl export) or checked for another machine may name a GPU this one lacks. With
    backend=ray joining a cluster (trainer.ray_address or RAY_ADDRESS), the ranks may be on other hosts."""
    import os

    t = cfg.trainer
    if getattr(t, "backend", "local") == "ray" and (t.ray_address or os.environ.get("RAY_ADDRESS")):
        return
    wanted = [("trainer.device", t.device)]
    placement = getattr(cfg, "placement", None)
    for role in ("actor", "rollout", "reference", "critic", "reward_model"):
        devices = getattr(getattr(placement, role, None), "devices", None) or []
        wanted += [(f"placement.{role}.devices", d) for d in devices]
    wanted = [(key, str(d)) for key, d in wanted if str(d).startswith("cuda")]
    if not wanted:
        return
    import torch

    key, device = wanted[0]
    fix = (
        "set trainer.device=cpu, or " if key == "trainer.device" else f"drop {key} (trainer.device=cpu), or "
    )
    if torch.version.cuda is None:
        raise ConfigError(
            f"{key}={device!r} but torch {torch.__version__} here is a CPU build, without CUDA: {fix}install a "
            "CUDA build of the same torch version (on Linux x86_64, PyPI's default torch wheel); `lucidrl "
            "doctor` checks the machine"
        )
    if not torch.cuda.is_available():
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = (
            f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
            if hidden is not None and hidden.strip() in ("", "-1")
            else "no GPU or no working NVIDIA driver"
        )
        raise ConfigError(
            f"{key}={device!r} but no CUDA GPU is visible to this process ({why}): {fix}run on a machine "
            "with a GPU; `lucidrl doctor` says why none is seen"
        )
    count = torch.cuda.device_count()
    for key, device in wanted:
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= count:
            raise ConfigError(
                f"{key}={device!r} but this machine has {count} CUDA GPU(s) (cuda:0 to cuda:{count - 1}): "
                f"name one of them in {key}"
            )


def _validate_sft(cfg: SFTConfig) -> None:
    _validate_precision(cfg.model)
    _validate_run(cfg.trainer)
    _validate_optim(cfg.optim, "optim")
    if cfg.model.lora_rank:
        raise ConfigError(
            f"model.lora_rank={cfg.model.lora_rank}: `lucidrl sft` trains every weight for now (LoRA is "
            "`lucidrl train`'s); drop model.lora_rank"
        )
    lora_defaults = ModelConfig()
    for name in ("lora_alpha", "lora_dropout", "target_modules"):  # read by LoRA only, which SFT has not
        if getattr(cfg.model, name) != getattr(lora_defaults, name):
            raise ConfigError(
                f"model.{name}={getattr(cfg.model, name)!r} configures LoRA, which `lucidrl sft` does not do "
                f"(it trains every weight); drop model.{name}"
            )
    if cfg.bf16_autocast and cfg.model.compute_dtype == "float32":
        raise ConfigError(
            "bf16_autocast=true asks for bfloat16 compute but model.compute_dtype=float32 says float32; "
            "drop one (model.compute_dtype=bfloat16 is the same as bf16_autocast=true)"
        )
    if cfg.data.use_dynamic_bsz and cfg.data.max_token_len_per_gpu < cfg.data.max_length:
        raise ConfigError(
            f"data.max_token_len_per_gpu={cfg.data.max_token_len_per_gpu} is below data.max_length="
            f"{cfg.data.max_length}, so a row the data allows would fit no micro-batch; raise "
            "data.max_token_len_per_gpu, lower data.max_length, or cut by rows instead "
            "(data.use_dynamic_bsz=false and micro_batch_size)"
        )
    if cfg.data.batch_size % cfg.micro_batch_size and not cfg.data.use_dynamic_bsz:
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size} is not divisible by micro_batch_size={cfg.micro_batch_size}; "
            f"use a micro_batch_size that divides it, or cut by tokens instead (data.use_dynamic_bsz=true "
            "with data.max_token_len_per_gpu)"
        )
    _validate_checkpointing(cfg.trainer)
    _check_loggers(cfg.trainer.logger)


def _validate_collapse(c: Any) -> None:
    """trainer.collapse: thresholds that can fire, and at least one sign when it is on."""
    p = "trainer.collapse"
    signs = (c.min_mixed_groups_ratio, c.min_entropy, c.max_score_drop, c.max_kl)
    if c.enable and all(v is None for v in signs):
        raise ConfigError(
            f"{p}.enable=true but every sign is off (min_mixed_groups_ratio, min_entropy, max_score_drop, "
            f"max_kl are all null): set one, or {p}.enable=false"
        )


def _validate_checkpointing(t: Any) -> None:
    """trainer.save_freq, resume_mode, resume_from_path and max_ckpt_to_keep say one thing together."""
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        raise ConfigError(
            "trainer.resume_mode=resume_path needs trainer.resume_from_path (a checkpoint folder or run directory)"
        )
    if t.resume_from_path and t.resume_mode != "resume_path":
        raise ConfigError(
            f"trainer.resume_from_path={t.resume_from_path!r} is only read with trainer.resume_mode=resume_path "
            f"(it is {t.resume_mode!r}); set both, or drop resume_from_path"
        )
    if t.overwrite and t.resume_mode == "resume_path":
        raise ConfigError(
            "trainer.overwrite=true empties the run directory, trainer.resume_mode=resume_path continues a run: "
            "choose one"
        )


def _validate_reward_model(rm: Any) -> None:
    """reward_model: a path when on, nothing read when off."""
    if rm.enable and not rm.model.path:
        raise ConfigError(
            "reward_model.enable=true needs reward_model.model.path (a sequence-classification checkpoint "
            "with num_labels=1)"
        )
    if not rm.enable and rm.model.path:
        raise ConfigError(
            f"reward_model.model.path={rm.model.path!r} is only read with reward_model.enable=true; set it, "
            "or drop the path"
        )


def _validate_lora(cfg: LucidConfig) -> None:
    """model.lora_*: what the LoRA actor supports so far, and peft installed."""
    m = cfg.model
    if not m.lora_rank:
        return
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(
            f"model.lora_rank={m.lora_rank} needs peft, which is not installed: pip install 'lucidrl[peft]'"
        )
    if not m.target_modules:
        raise ConfigError("model.target_modules is empty: name the modules to adapt, or [all-linear]")
    if "all-linear" in m.target_modules and len(m.target_modules) > 1:
        raise ConfigError(
            f"model.target_modules={list(m.target_modules)}: 'all-linear' stands alone (peft reads it only as "
            "the whole list; beside other names it matches nothing, and only those names would be adapted)"
        )
    if m.lora_dropout and cfg.actor.disable_dropout:
        raise ConfigError(
            f"model.lora_dropout={m.lora_dropout} with actor.disable_dropout=true: dropout makes the update's "
            "forward differ from the log-prob pass it is compared with (PPO ratios off 1 before any step), so "
            "the actor's dropout is turned off; set model.lora_dropout=0, or actor.disable_dropout=false to "
            "train with it anyway"
        )
    if cfg.trainer.backend == "ray" and cfg.trainer.strategy == "fsdp2":
        raise ConfigError(
            f"model.lora_rank={m.lora_rank} on Ray: the LoRA actor trains data-parallel with trainer.strategy=ddp "
            "(FSDP2 sharding of peft modules is not supported yet)"
        )


def _validate_restarts(t: Any) -> None:
    """trainer.max_restarts restarts Ray worker groups; the local backend has none to lose."""
    if t.max_restarts and t.backend != "ray":
        raise ConfigError(
            f"trainer.max_restarts={t.max_restarts} restarts the run when a Ray worker process dies; with "
            f"trainer.backend={t.backend} the workers run in the trainer's own process, which cannot outlive "
            "them: drop trainer.max_restarts, or set trainer.backend=ray"
        )


def _validate_rl(cfg: LucidConfig) -> None:
    """Batch arithmetic, ranges and names that must exist in a registry."""
    _validate_checkpointing(cfg.trainer)
    _validate_restarts(cfg.trainer)
    _validate_reward_model(cfg.reward_model)
    _validate_lora(cfg)
    _validate_collapse(cfg.trainer.collapse)
    _validate_precision(cfg.model)
    _validate_run(cfg.trainer)
    _validate_optim(cfg.actor.optim, "actor.optim")
    _validate_optim(cfg.critic.optim, "critic.optim")
    a, d, r = cfg.actor, cfg.data, cfg.rollout
    if a.ppo_mini_batch_size > d.train_batch_size:
        raise ConfigError(
            f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size} is larger than data.train_batch_size="
            f"{d.train_batch_size} (both count prompts); set actor.ppo_mini_batch_size <= {d.train_batch_size}"
        )
    if d.train_batch_size % a.ppo_mini_batch_size:
        raise ConfigError(
            f"data.train_batch_size={d.train_batch_size} is not divisible by actor.ppo_mini_batch_size="
            f"{a.ppo_mini_batch_size}; pick a mini-batch size that divides it"
        )
    samples = cfg.actor_mini_batch_samples
    _check_token_budgets(cfg)
    if samples % a.ppo_micro_batch_size and not a.use_dynamic_bsz:
        raise ConfigError(
            f"a mini-batch holds actor.ppo_mini_batch_size x rollout.n = {a.ppo_mini_batch_size} x {r.n} = "
            f"{samples} samples, not divisible by actor.ppo_micro_batch_size={a.ppo_micro_batch_size}"
        )
    if a.ppo_micro_batch_size > samples and not a.use_dynamic_bsz:
        raise ConfigError(
            f"actor.ppo_micro_batch_size={a.ppo_micro_batch_size} exceeds the {samples} samples of a mini-batch"
        )
    if r.val_kwargs.do_sample and not 0.0 < r.val_kwargs.temperature:
        raise ConfigError(
            f"rollout.val_kwargs.temperature must be > 0 when rollout.val_kwargs.do_sample=true (dividing by "
            f"{r.val_kwargs.temperature} gives NaN probabilities), got {r.val_kwargs.temperature}; for greedy "
            "validation set rollout.val_kwargs.do_sample=false"
        )
    if r.name == "vllm":
        # vLLM raises a temperature in (0, 0.01) to 0.01 with a warning (the actor would compute log-probs
        # at another temperature than the samples were drawn at) and refuses one above 2 at the first
        # generate, after the model has loaded
        temps = [("rollout.temperature", r.temperature)]
        if r.val_kwargs.do_sample:
            temps.append(("rollout.val_kwargs.temperature", r.val_kwargs.temperature))
        for key, t in temps:
            if not 0.01 <= t <= 2.0:
                raise ConfigError(
                    f"{key}={t}: rollout.name=vllm samples at temperatures in [0.01, 2] only (vLLM raises a "
                    "lower one to 0.01, and refuses a higher one); use a value in that range, or rollout.name=hf"
                )
    alg = cfg.algorithm
    if alg.adv_estimator in NEEDS_GROUPS and r.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={alg.adv_estimator} compares samples of one prompt, so rollout.n must be "
            f">= 2 (got {r.n})"
        )
    if alg.filter_groups.enable and r.n < 2:
        raise ConfigError(
            "algorithm.filter_groups.enable=true drops groups whose samples tie: needs rollout.n >= 2"
        )
    if alg.filter_groups.enable and alg.adv_estimator not in GROUP_ESTIMATORS:
        raise ConfigError(
            f"algorithm.filter_groups.enable=true drops groups whose samples tie, which carry no signal only "
            f"when the baseline is the group itself ({', '.join(GROUP_ESTIMATORS)}); with "
            f"algorithm.adv_estimator={alg.adv_estimator} a tied group still has advantages (a greedy or "
            "batch baseline, or a critic's values), and dropping it discards them; use a group estimator "
            "such as grpo, or filter_groups.enable=false"
        )
    if (
        cfg.trainer.collapse.enable
        and cfg.trainer.collapse.max_kl is not None
        and not (alg.use_kl_in_reward or cfg.actor.use_kl_loss)
    ):
        raise ConfigError(
            f"trainer.collapse.max_kl={cfg.trainer.collapse.max_kl} watches the KL to the reference, which this "
            "run does not compute (actor.use_kl_loss and algorithm.use_kl_in_reward are both false): the "
            "sign could never fire; turn one on, or drop max_kl"
        )
    if cfg.critic.warmup_steps and alg.adv_estimator != "gae":
        raise ConfigError(
            f"critic.warmup_steps={cfg.critic.warmup_steps} holds the actor back while the critic learns, but "
            f"algorithm.adv_estimator={alg.adv_estimator} has no critic: the actor would not update for "
            f"{cfg.critic.warmup_steps} steps while rollouts ran; drop critic.warmup_steps"
        )
    if alg.use_kl_in_reward and cfg.actor.use_kl_loss:
        raise ConfigError(
            "algorithm.use_kl_in_reward=true and actor.use_kl_loss=true both penalise KL to the reference; "
            "pick one (verl's GRPO recipes use the loss, PPO recipes the reward penalty)"
        )
    ob = cfg.reward.overlong_buffer
    if ob.enable and not 0 < ob.len < d.max_response_length:
        raise ConfigError(
            f"reward.overlong_buffer.len={ob.len} must be in (0, data.max_response_length={d.max_response_length})"
        )
    c = cfg.critic
    if alg.adv_estimator == "gae":
        mini = cfg.critic_mini_batch_samples
        if d.train_batch_size % cfg.critic_mini_batch_prompts or (
            mini % c.ppo_micro_batch_size and not c.use_dynamic_bsz
        ):
            raise ConfigError(
                f"critic mini-batches of {mini} samples must divide the batch and be divisible by "
                f"critic.ppo_micro_batch_size={c.ppo_micro_batch_size}"
            )
    validate_rollout_engine(cfg)
    validate_multi_turn(cfg)
    _check_loggers(cfg.trainer.logger)
    _validate_names(cfg)
    validate_algorithm(cfg)
    plan_groups(cfg)


GROUP_ESTIMATORS = (
    "grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "grpo_passk", "reinforce_plus_plus_baseline",
    "gpg",
)  # fmt: skip
# estimators that compare samples of a prompt, so rollout.n >= 2 (gdpo's components and the token
# baselines' per-position returns can still differ within a group whose scores tie)
NEEDS_GROUPS = GROUP_ESTIMATORS + ("gdpo", "optimal_token_baseline", "tir_optimal_token_baseline")


def _validate_names(cfg: LucidConfig) -> None:
    import torch

    from lucidrl import algos

    probe = torch.zeros(1, 1)
    checks = [
        ("algorithm.adv_estimator", lambda: algos.get_advantage_estimator(cfg.algorithm.adv_estimator)),
        ("actor.policy_loss", lambda: algos.get_policy_loss(cfg.actor.policy_loss)),
        ("actor.loss_agg_mode", lambda: algos.agg_loss(probe, torch.ones(1, 1), cfg.actor.loss_agg_mode)),
        ("actor.kl_loss_type", lambda: algos.kl_penalty(probe, probe, cfg.actor.kl_loss_type)),
        ("algorithm.kl_penalty", lambda: algos.kl_penalty(probe, probe, cfg.algorithm.kl_penalty)),
        ("critic.loss_agg_mode", lambda: algos.agg_loss(probe, torch.ones(1, 1), cfg.critic.loss_agg_mode)),
    ]
    for key, check in checks:
        try:
            check()
        except (KeyError, ValueError) as e:
            raise ConfigError(f"config key '{key}': {e}") from None
