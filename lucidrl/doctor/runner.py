"""`lucidrl doctor`'s order: the machine checks, then (given a config) the run checks, each as it finishes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lucidrl.doctor.checks import Check, Needs, Report, run_check
from lucidrl.doctor.machine import (
    check_compile,
    check_cuda,
    check_distributed,
    check_ray,
    check_shm,
    check_torch,
    check_vllm,
)
from lucidrl.doctor.run_checks import (
    check_config_warnings,
    check_data,
    check_memory_plan,
    check_model,
    check_placement,
    check_reward_model,
    check_rewards,
    check_rollout_server,
    check_run_dir,
    check_tokenizer,
    needs_of,
)


def run_doctor(
    config_path: str | None = None,
    overrides: list[str] | None = None,
    *,
    skip: tuple[str, ...] = (),
    start_ray: bool = False,
    on_check: Callable[[Check], None] | None = None,
) -> Report:
    """Every check, in order; `on_check` sees each as it finishes (the CLI prints them as they come)."""
    report = Report()

    def add(name: str, fn: Callable[[], Any]) -> Any:
        check, value = (
            (Check(name, "skip", "skipped (--skip)"), None) if name in skip else run_check(name, fn)
        )
        report.checks.append(check)
        if on_check:
            on_check(check)
        return value if check.status != "fail" else None

    needs, cfg, words = Needs(), None, ""
    if config_path is not None or overrides:
        from lucidrl.config import load_config

        def load() -> tuple[Check, Any]:
            loaded = load_config(
                config_path, overrides or [], echo=None
            )  # a verl command line is translated quietly
            where = config_path or "command-line overrides"
            detail = f"{where}: {loaded.algorithm.adv_estimator}, rollout.name={loaded.rollout.name}"
            return Check("config", "ok", detail), (loaded, *needs_of(loaded))

        got = add("config", load)
        if got is not None:
            cfg, needs, words = got

    add("torch", check_torch)
    add("cuda", lambda: check_cuda(needs))
    add("shm", check_shm)
    add("compile", lambda: check_compile(needs, "cuda" if needs.gpu and torch.cuda.is_available() else "cpu"))
    add("distributed", check_distributed)
    if torch.cuda.is_available():
        add("distributed", lambda: check_distributed("nccl", min(2, torch.cuda.device_count())))
    add("ray", lambda: check_ray(needs, start_ray or needs.ray))
    add("vllm", lambda: check_vllm(needs))
    if cfg is not None:
        _config_checks(cfg, needs, words, add)
    return report


def _config_checks(cfg: Any, needs: Needs, words: str, add: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Placement, tokenizer, models, data, rewards: each later check needs what the earlier ones loaded."""
    add("placement", lambda: check_placement(needs, words))
    add("warnings", lambda: check_config_warnings(cfg))
    add("run dir", lambda: check_run_dir(cfg))
    add("memory plan", lambda: check_memory_plan(cfg))
    tokenizer = add("tokenizer", lambda: check_tokenizer(cfg))
    paths = [(cfg.model.path, "model.path")]
    if cfg.algorithm.adv_estimator == "gae" and cfg.critic.model_path not in (None, cfg.model.path):
        paths.append((cfg.critic.model_path, "critic.model_path"))
    if tokenizer is None:
        for name in [f"model ({key})" for _, key in paths] + ["data", "rewards"]:
            add(name, lambda: Check("", "skip", "needs the tokenizer, which failed"))
        return
    for path, key in paths:
        add(f"model ({key})", lambda path=path, key=key: check_model(cfg, tokenizer, path, key))
    if cfg.rollout.name == "server":
        add("rollout server", lambda: check_rollout_server(cfg, tokenizer))
    if cfg.reward_model.enable:
        add("reward model", lambda: check_reward_model(cfg, tokenizer))
    samples = add("data", lambda: check_data(cfg, tokenizer))
    if samples is None:
        add("rewards", lambda: Check("", "skip", "needs the data, which failed"))
        return
    if cfg.reward_model.enable and cfg.reward_model.combine == "replace":
        add("rewards", lambda: Check("", "skip", "reward_model.combine=replace: no rule function is called"))
        return
    add("rewards", lambda: check_rewards(cfg, samples))
