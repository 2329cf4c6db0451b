"""`lucidrl demo`: K&K data, a tiny model, and a short GRPO run on the CPU, with nothing downloaded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from lucidrl.config import config_from_dict


def kk_tokenizer_corpus(seed: int = 0, n_puzzles: int = 400) -> Iterator[str]:
    """Text to train the tiny model's tokenizer on: K&K prompts, direct answers and reasoning traces.

    The traces (`lucidrl data kk --trace`) are in so the tokenizer learns their pieces (" K", ":N",
    "=F", " ok", ...) as single tokens, which keeps traced responses short.
    """
    from lucidrl.data.kk import generate_dataset

    rows, _ = generate_dataset((2, 5), n_puzzles, 0, seed=seed + 10_000, trace=True)
    for row in rows:
        for m in row["prompt"]:
            yield m["content"]
        yield (
            "<think> </think> <answer> "
            + row["reward_model"]["ground_truth"]["solution_text_format"]
            + " </answer>"
        )
        yield "<think>" + row["response"]


def sft_config(out: Path, seed: int) -> dict:
    """A short supervised warm-up on the puzzles' answers, so sampling ever passes the format rule."""
    return {
        "model": {"path": str(out / "model")},
        "data": {
            "train_files": [str(out / "data" / "train.parquet")],
            "val_files": [str(out / "data" / "val.parquet")],
            "batch_size": 32,
            "seed": seed,
        },
        "optim": {"lr": 2e-3, "warmup_steps": 10},
        "trainer": {
            "experiment_name": "demo-sft",
            "run_dir": str(out / "sft"),
            "overwrite": True,
            "total_training_steps": 50,
            "test_freq": 25,
            "seed": seed,
        },
    }


def grpo_config(out: Path, steps: int, seed: int) -> dict:
    """The demo's RL run: GRPO from the warmed-up model, 8 prompts x 8 samples, greedy validation."""
    return {
        "model": {"path": str(out / "sft" / "final")},
        "data": {
            "train_files": [str(out / "data" / "train.parquet")],
            "val_files": [str(out / "data" / "val.parquet")],
            "max_prompt_length": 512,
            "max_response_length": 48,
            "train_batch_size": 8,
            "seed": seed,
        },
        "rollout": {"n": 8, "temperature": 1.0, "micro_batch_size": 64},
        "actor": {
            "optim": {"lr": 1e-4, "warmup_steps": 2},
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size": 32,
            "use_kl_loss": True,
            "kl_loss_coef": 0.01,
            "kl_loss_type": "low_var_kl",
        },
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "experiment_name": "demo",
            "run_dir": str(out / "run"),
            "overwrite": True,
            "total_training_steps": steps,
            "test_freq": max(1, steps // 2),
            "seed": seed,
        },
    }


def _val_line(v: dict[str, float]) -> str:
    return (
        f"format {v.get('val/kk_logic/format_ok', float('nan')):.2f}, "
        f"score {v.get('val/kk_logic/score', float('nan')):+.2f}, accuracy {v.get('val/acc', float('nan')):.3f}"
    )


def run_demo(out: Path, steps: int = 10, seed: int = 0) -> dict[str, float]:
    """Data, model, a supervised warm-up, then GRPO; print where everything went. Returns the last validation."""
    from lucidrl.config import SFTConfig
    from lucidrl.data.kk import write_kk_parquet
    from lucidrl.models import build_tiny_model
    from lucidrl.trainer.ppo import PPOTrainer
    from lucidrl.trainer.sft import SFTTrainer

    console = Console(highlight=False)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]lucidrl demo[/bold]: GRPO on Knights & Knaves, tiny model, CPU")
    info = write_kk_parquet(out / "data", people=(2, 3), n_train=600, n_val=64, seed=seed)
    console.print(
        f"1. data: {info['n_train']} train / {info['n_val']} val puzzles (2-3 people) -> {out / 'data'}"
    )
    model = build_tiny_model(
        out / "model", kk_tokenizer_corpus(seed), hidden_size=128, num_layers=2, seed=seed
    )
    console.print(f"2. model: tiny Qwen2, {model['num_parameters'] / 1e6:.2f}M parameters -> {model['path']}")
    console.print(
        "3. supervised warm-up: 50 steps on the puzzles' answers (teaches the <think>/<answer> format)"
    )
    sft = SFTTrainer(config_from_dict(sft_config(out, seed), source="lucidrl demo", schema=SFTConfig))
    sft.fit()
    cfg = config_from_dict(grpo_config(out, steps, seed), source="lucidrl demo")
    console.print(f"4. GRPO: {steps} steps of {cfg.data.train_batch_size} prompts x {cfg.rollout.n} samples")
    trainer = PPOTrainer(cfg)
    trainer.announce()
    run_dir = trainer.fit()
    first, last = trainer.first_val, trainer.last_val
    console.rule("[bold]done[/bold]")
    console.print(f"validation (greedy, {info['n_val']} puzzles) before GRPO: {_val_line(first)}")
    console.print(f"validation (greedy, {info['n_val']} puzzles) after GRPO:  {_val_line(last)}")
    console.print(f"metrics:     {run_dir / 'metrics.jsonl'} (SFT: {out / 'sft' / 'metrics.jsonl'})")
    console.print(f"config:      {run_dir / 'config.yaml'}")
    console.print(f"final model: {run_dir / 'final'} (HuggingFace format)")
    console.print(f"wall time:   {time.perf_counter() - start:.1f} s")
    return last
