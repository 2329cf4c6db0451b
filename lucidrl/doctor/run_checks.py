"""Checks of one run's config: placement, tokenizer, model folders, rollout server, run directory, data, rewards."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from lucidrl.doctor.checks import Check, Needs
from lucidrl.doctor.machine import usable_cpus


def needs_of(cfg: Any) -> tuple[Needs, str]:
    """What the config asks of the machine, and its placement in words."""
    from lucidrl.config.placement import plan_groups
    from lucidrl.controller.worker_group import ray_target

    plans = plan_groups(cfg)
    # GPUs this host must have: every cuda rank, unless the ranks go to a Ray cluster of other hosts
    gpus = sum(p.world_size for p in plans if p.device.startswith("cuda") and p.nodes == 1)
    # as the run decides: RAY_ADDRESS (which `ray job submit` sets) joins a cluster as the key does
    joins = cfg.trainer.backend == "ray" and ray_target(cfg.trainer.ray_address)[0] != "local"
    needs = Needs(
        gpu=any(p.device.startswith("cuda") for p in plans),
        compile=cfg.actor.use_torch_compile,
        vllm=cfg.rollout.name == "vllm",
        ray=cfg.trainer.backend == "ray",
        ray_address=cfg.trainer.ray_address,
        joins_cluster=joins,
        ranks=sum(p.world_size for p in plans),
        cpus_per_rank=cfg.trainer.cpus_per_rank,
        gpus=0 if joins else gpus,  # a cluster's GPUs are not this host's
        logits_dtype=cfg.model.compute_dtype or cfg.model.dtype,
    )
    words = "; ".join(f"{'+'.join(sorted(p.roles))} x{p.world_size} on {p.where} ({p.device})" for p in plans)
    return needs, f"{cfg.trainer.backend} backend: {words}"


def check_placement(needs: Needs, words: str, cpus: int | None = None) -> Check:
    cpus = cpus or usable_cpus()
    if needs.ray and not needs.joins_cluster and not needs.gpu and needs.ranks * needs.cpus_per_rank > cpus:
        return Check(
            "placement",
            "fail",
            f"{words}: {needs.ranks} ranks x trainer.cpus_per_rank={needs.cpus_per_rank} CPUs, but this "
            f"machine has {cpus} usable CPUs, so Ray cannot place them (a run waits 120 s for them, then fails)",
            "lower the pools' nodes/devices_per_node or trainer.cpus_per_rank, or join a cluster (trainer.ray_address)",
        )
    return Check("placement", "ok", words)


def check_memory_plan(cfg: Any) -> Check:
    """The memory plan the config was loaded with (lucidrl.config.memory_plan): each phase's estimated
    peak, the memory found and what the auto keys became. A plan that does not fit failed at loading."""
    plan = getattr(cfg, "_memory_plan", None)
    if plan is None:
        return Check(
            "memory plan", "skip", f"model.path={cfg.model.path!r} has no readable config.json to plan from"
        )
    lines = plan.lines()
    status = "ok" if plan.available is not None else "warn"
    fix = "" if status == "ok" else "set trainer.memory_budget_gib to the memory the run may use"
    return Check("memory plan", status, "\n       ".join(lines), fix)  # indented under the check's name


def check_tokenizer(cfg: Any) -> tuple[Check, Any]:
    from lucidrl.models import load_run_tokenizer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok = load_run_tokenizer(cfg.model)
    detail = f"{type(tok).__name__}, {len(tok)} tokens, pad {tok.pad_token!r} (id {tok.pad_token_id})"
    if any("no pad token" in str(w.message) for w in caught):
        return Check(
            "tokenizer",
            "warn",
            detail + ": the tokenizer has no pad token, so runs pad with eos",
            "fine for training (lucidrl masks padding itself); set model.pad_token to silence the warning",
        ), tok
    return Check("tokenizer", "ok", detail), tok


def check_model(cfg: Any, tokenizer: Any, path: str, key: str) -> Check:
    from lucidrl.models.inspection import inspect_model_folder

    info = inspect_model_folder(path, config_key=key, trust_remote_code=cfg.model.trust_remote_code)
    name = f"model ({key})"
    gib = info.size_gib(cfg.model.dtype)
    size = f"{gib:.1f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB"
    detail = (
        f"{info.architecture}, {info.num_parameters / 1e6:.1f}M parameters ({size} in {cfg.model.dtype}), "
        f"{len(info.weight_files)} weight file(s)"
    )
    problems = []
    if info.missing:
        problems.append(
            f"{len(info.missing)} tensors missing from the weight files (first: {info.missing[:3]})"
        )
    if info.mismatched:
        problems.append(
            f"{len(info.mismatched)} shapes differ from config.json (first: {info.mismatched[:2]})"
        )
    if problems:
        return Check(
            name,
            "fail",
            detail + ": " + "; ".join(problems),
            "the weights belong to another model or config.json was edited; save the model again with "
            "save_pretrained, or fix config.json to the shapes the weights have",
        )
    if info.embedding_rows < len(tokenizer):
        return Check(
            name,
            "fail",
            detail + f": {info.embedding_rows} embedding rows but the tokenizer has {len(tokenizer)} tokens",
            "use the tokenizer saved with this model (model.tokenizer_path) or resize the model's embeddings",
        )
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    if info.max_positions is not None and length > info.max_positions:
        return Check(
            name,
            "fail",
            detail + f": data.max_prompt_length + data.max_response_length = {length} is more than the "
            f"model's max_position_embeddings={info.max_positions} (`lucidrl train` refuses it)",
            "lower the lengths; positions past the model's range were never trained",
        )
    if info.converted:
        return Check(
            name,
            "ok",
            detail + " (tensor names not compared: transformers converts this architecture's on load)",
        )
    if info.checked_tensors == 0:
        return Check(name, "ok", detail + " (.bin weights: names and shapes not checked; safetensors are)")
    if info.unexpected:
        return Check(
            name,
            "warn",
            detail
            + f"; {len(info.unexpected)} tensors in the files that the architecture does not use (first: "
            f"{info.unexpected[:3]}); from_pretrained drops them",
            "check config.json (fewer layers than the weights have?) or that the folder holds the model you mean",
        )
    return Check(name, "ok", detail + f"; all {info.checked_tensors} tensors match the architecture")


def check_rollout_server(cfg: Any, tokenizer: Any) -> Check:
    """rollout.name=server: the server answers its health check and takes the actor's weights."""
    from lucidrl.workers.rollout.server_engine import ServerRollout

    sv = cfg.rollout.server
    engine = ServerRollout(
        sv.base_url, tokenizer, host=sv.host, port=sv.port, timeout_s=min(sv.timeout_s, 30.0)
    )
    version = engine.check_accepts_weights()
    return Check(
        "rollout server",
        "ok",
        f"{engine.base_url} serves {engine.model_name!r} and takes weight updates ({version} taken so far)",
    )


def check_run_dir(cfg: Any) -> Check:
    """Where the run goes, and whether it resumes: the refusals `lucidrl train` would give, given now."""
    from lucidrl.config import to_dict
    from lucidrl.trainer import checkpoint
    from lucidrl.trainer.setup import refuse_concurrent, refuse_occupied, refuse_unwritable, run_dir_of

    run_dir = run_dir_of(cfg)
    refuse_unwritable(cfg, run_dir)  # a file, or a folder the run cannot write in
    refuse_concurrent(run_dir)  # a run training there now
    resume = checkpoint.resume_point(cfg, run_dir)  # CheckpointError for a broken `latest`
    if resume is not None:
        state, changes = checkpoint.resumable(resume, to_dict(cfg))
        more = f"; changed since: {', '.join(changes)}" if changes else ""
        return Check(
            "run dir", "ok", f"{run_dir}: resumes from {resume} after step {state['global_step']}{more}"
        )
    refuse_occupied(cfg, run_dir)  # RunDirError, as `lucidrl train` would raise it
    if run_dir.is_dir() and any(run_dir.iterdir()):
        return Check("run dir", "warn", f"{run_dir} holds a run that trainer.overwrite=true will delete")
    return Check("run dir", "ok", f"{run_dir}: a new run")


def check_data(cfg: Any, tokenizer: Any) -> tuple[Check, list]:
    from lucidrl.trainer.setup import load_data

    # what `lucidrl train` loads, and its errors; the rewards check below finds the data_sources without one
    train, val, report = load_data(cfg, tokenizer, check_rewards=False)
    dropped = f", {report.overlong_filtered} overlong dropped" if report.overlong_filtered else ""
    detail = (
        f"data.train_files: {len(train)} of {report.total_rows} rows{dropped}, longest prompt "
        f"{report.longest_prompt} tokens (max {cfg.data.max_prompt_length}); "
        + (f"data.val_files: {len(val)} rows" if val else "no data.val_files (no validation)")
    )
    return Check("data", "ok", detail), train + val


def check_reward_model(cfg: Any, policy_tokenizer: Any) -> Check:
    """reward_model.model.path: a one-output classifier with a score head in its weights (headers only)."""

    from transformers import AutoConfig

    from lucidrl.models.loading import load_tokenizer, read_weight_shapes
    from lucidrl.workers.training.reward_model import same_tokenizer

    m = cfg.reward_model.model
    config = AutoConfig.from_pretrained(m.path, local_files_only=True, trust_remote_code=m.trust_remote_code)
    arch = ", ".join(getattr(config, "architectures", None) or ["(no architectures in config.json)"])
    found = read_weight_shapes(Path(m.path), "reward_model.model.path")
    fix = "point reward_model.model.path at a *ForSequenceClassification checkpoint with num_labels=1"
    if found is None:
        return Check(
            "reward model",
            "warn",
            f"{m.path}: {arch}, weights not in safetensors: its score head is checked only when training loads it",
            "save it with save_pretrained (safetensors) to have it checked here",
        )
    heads = {k: v for k, v in found[1].items() if k.endswith("score.weight")}
    if not heads:
        return Check(
            "reward model", "fail", f"{m.path}: {arch} with no score.weight in its safetensors weights", fix
        )
    shape = next(iter(heads.values()))
    if shape[0] != 1:
        return Check("reward model", "fail", f"{m.path}: {arch} whose score head has {shape[0]} outputs", fix)
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, config_key="reward_model.model.tokenizer_path")
    if same_tokenizer(tokenizer, policy_tokenizer):
        how = "the policy's tokenizer: the rollout's token ids are scored as they are"
    elif getattr(tokenizer, "chat_template", None):
        how = "another tokenizer: each conversation is rendered again with its chat template"
    else:
        return Check(
            "reward model",
            "fail",
            f"{m.path}: its tokenizer differs from the policy's and has no chat template",
            "give reward_model.model.tokenizer_path a tokenizer with a chat template (or the policy's)",
        )
    return Check(
        "reward model",
        "ok",
        f"{arch}, score head {shape[0]} x {shape[1]}, combine={cfg.reward_model.combine}; {how}",
    )


def check_rewards(cfg: Any, samples: list) -> Check:
    from lucidrl.rewards.custom import load_custom_function, normalize_reward_output
    from lucidrl.rewards.manager import RewardFunctionError
    from lucidrl.rewards.registry import (
        _qualname,
        check_ground_truths,
        default_compute_score,
        get_reward_function,
    )

    fn_cfg = cfg.reward.custom_function
    if fn_cfg.reward_kwargs and not fn_cfg.path:
        from lucidrl.rewards.manager import RuleRewardManager

        RuleRewardManager.from_config(None, None, fn_cfg.name, fn_cfg.reward_kwargs)  # refuses, saying why
    custom = load_custom_function(fn_cfg.path, fn_cfg.name, fn_cfg.reward_kwargs) if fn_cfg.path else None
    compute = custom or default_compute_score
    first: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for s in samples:
        first.setdefault(s.data_source, s)
        counts[s.data_source] = counts.get(s.data_source, 0) + 1
    if not custom:  # every row's ground truth, as `lucidrl train` checks it at load
        check_ground_truths(((s.data_source, s.ground_truth, s.source) for s in samples), "data")
    parts = []
    for ds, s in first.items():
        # UnknownDataSourceError names the known data sources and the fix
        name = f"{fn_cfg.path}:{fn_cfg.name}" if custom else _qualname(get_reward_function(ds))
        try:
            raw = compute(
                data_source=ds, solution_str="", ground_truth=s.ground_truth, extra_info=s.extra_info
            )
        except Exception as exc:
            raise RewardFunctionError(
                f"reward function {name} raised {type(exc).__name__}: {exc} on an empty response to "
                f"{s.source} (data_source {ds!r}); a reward function has to score any text, malformed "
                "responses included: return 0 or a penalty for them"
            ) from exc
        text: set[str] = set()
        value, _ = normalize_reward_output(raw, data_source=ds, index=0, text_extras=text)
        parts.append(
            f"{ds} ({counts[ds]} rows): {name}, an empty response scores {value:g}"
            + (f" (text extras, not metrics: {', '.join(sorted(text))})" if text else "")
        )
    return Check("rewards", "ok", "; ".join(parts))


def check_config_warnings(cfg: Any) -> Check:
    """What the trainer would warn about at start (trainer/config_warnings.py), before anything runs."""
    from lucidrl.trainer.config_warnings import config_warnings

    lines = config_warnings(cfg)
    if not lines:
        return Check("", "ok", "nothing to warn about")
    return Check("", "warn", " | ".join(lines), "each warning names the keys to change")
