"""`lucidrl demo`: zero-RL on a real pretrained model, on the CPU: GRPO with only a verifier.

Per seed: GRPO from SmolLM2-135M-Instruct (installed from the package index by `lucidrl model get`)
on generated problems whose answers a rule checks exactly; no labelled answer reaches training, only
the verifier's score. Held-out greedy accuracy is measured before training (the base model) and every
`eval_every` steps, on problems the run never sees. Budgets are steps, never seconds, so the result
does not depend on how busy the machine is; the wall time is measured and printed.

Writes, under the output folder: the model (once), the data, a run folder per seed (metrics.jsonl,
the final model), `demo_results.json` (the plan, per-seed accuracies and curves, the verdict) and
`demo_curves.png` (training reward and held-out accuracy against steps, one line per seed).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from lucidrl.config import config_from_dict
from lucidrl.demo.plan import DemoPlan, SeedResult
from lucidrl.demo.report import GOAL_POINTS, MIN_SEEDS, draw_curves, results_table, verdict
from lucidrl.diagnostics.errors import UsageError


def grpo_config(model: str, files: dict[str, str], run_dir: Path, plan: DemoPlan, seed: int) -> dict:
    """The run's config: GRPO from the pretrained model, the verifier's score as the only reward."""
    kl = plan.kl_coef > 0
    return {
        "model": {
            "path": model,
            "compute_dtype": plan.resolved_compute_dtype(),
            "attn_implementation": plan.resolved_attn_implementation(),
            "lora_rank": plan.lora_rank,
        },
        "data": {
            "train_files": [files["train"]],
            "val_files": [files["val"]],
            "max_prompt_length": 128,  # the word problems' chat prompts take 66-81 tokens
            "max_response_length": plan.max_new_tokens,
            "train_batch_size": plan.prompts,
            "seed": seed,
        },
        "rollout": {"n": plan.n, "temperature": plan.temperature, "stop_regex": plan.stop_regex},
        "actor": {
            "optim": {"lr": plan.lr, "warmup_steps": plan.warmup_steps},
            "ppo_mini_batch_size": plan.prompts,  # one update per step: on-policy
            # micro-batches, the LM head's chunks and checkpointing: the memory plan's (docs/memory.md)
            "use_kl_loss": kl,
            "kl_loss_coef": plan.kl_coef if kl else 0.001,
            "kl_loss_type": "low_var_kl",
            # groups whose samples all scored alike have no gradient: no forward for them (exact)
            "skip_zero_advantage": not kl,
        },
        "algorithm": {"adv_estimator": "grpo"},
        **({"reward": {"custom_function": {"path": files["reward"]}}} if "reward" in files else {}),
        "trainer": {
            "device": plan.device,
            "experiment_name": f"demo-seed{seed}",
            "run_dir": str(run_dir),
            "overwrite": True,
            "total_training_steps": plan.steps,
            "val_before_train": True,
            "test_freq": plan.eval_every,
            "logger": ["jsonl"],
            "seed": seed,
            "save_freq": 0,
        },
    }


def float32_note(plan: DemoPlan) -> str | None:
    """What a user should know before the run when "auto" fell back to float32 on this CPU."""
    if plan.compute_dtype != "auto" or plan.device != "cpu" or plan.resolved_compute_dtype() is not None:
        return None
    return (
        "this CPU has no native bfloat16 (AVX-512 BF16 or AMX), so the demo computes in float32: each step "
        "takes several times as long as on a CPU that has it (docs/demo.md has the figures measured on "
        "such a CPU; the bar's ETA follows the first step)"
    )


def _val_acc(metrics: dict[str, float]) -> float | None:
    return metrics.get("val/acc")


def run_seed(
    model: str,
    files: dict[str, str],
    out: Path,
    plan: DemoPlan,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None],
) -> SeedResult:
    """One GRPO run; its held-out curve from the trainer's validations (step 0 is the base model)."""
    from lucidrl.trainer.ppo import PPOTrainer

    res, began = SeedResult(seed=seed), time.perf_counter()
    trainer = PPOTrainer(config_from_dict(grpo_config(model, files, out, plan, seed), source="lucidrl demo"))
    trainer.on_step = on_step
    trainer.fit()
    res.seconds = time.perf_counter() - began
    res.steps = trainer.global_step
    res.collapse = trainer.collapse.message() if trainer.collapse else None
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("val/acc") is not None:
            res.curve.append({"step": record["step"], "acc": record["val/acc"]})
        if record.get("critic/score/mean") is not None:
            res.reward.append({"step": record["step"], "score": record["critic/score/mean"]})
    res.base_acc = res.curve[0]["acc"] if res.curve and res.curve[0]["step"] == 0 else None
    res.final_acc = res.curve[-1]["acc"] if res.curve else None
    return res


def run_demo(
    out: Path, seeds: list[int], plan: DemoPlan | None = None, model: str | None = None
) -> list[SeedResult]:
    """Set up the model and data once, then one GRPO run per seed; print the table and the verdict."""
    from lucidrl.demo.setup import ensure_data, ensure_model

    plan = plan or DemoPlan()
    if len(set(seeds)) != len(seeds):
        raise UsageError(
            f"lucidrl demo: --seeds {' '.join(map(str, seeds))} repeats a seed; give distinct seeds"
        )
    console = Console(highlight=False)
    out.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]lucidrl demo[/bold]: GRPO with only a verifier, on a real pretrained model (CPU)")
    started = time.perf_counter()
    model_dir = ensure_model(out, plan, model, console)
    files = ensure_data(out / "data", plan, console)
    precision = f"{plan.resolved_compute_dtype() or 'float32'} compute"
    if attention := plan.resolved_attn_implementation():
        precision += f", {attention} attention"
    console.print(
        f"{plan.steps} GRPO steps of {plan.prompts} problems x {plan.n} samples at temperature {plan.temperature:g} "
        f"per seed ({precision}), "
        f"held-out greedy accuracy on {plan.n_val} problems every {plan.eval_every} steps"
    )
    if note := float32_note(plan):
        console.print(f"[yellow]{escape(note)}[/yellow]")
    results: list[SeedResult] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    )
    with Progress(*columns, console=console) as progress:
        for seed in seeds:
            task = progress.add_task(f"seed {seed}: GRPO", total=plan.steps, note="")

            def on_step(step: int, metrics: dict[str, float], task=task) -> None:
                note = f"reward {metrics.get('critic/score/mean', float('nan')):.2f}"
                if metrics.get("val/acc") is not None:
                    note += f"  held-out {metrics['val/acc']:.2f}"
                progress.update(task, completed=step, note=note)

            results.append(run_seed(str(model_dir), files, out / f"seed{seed}", plan, seed, on_step))
            _write(out, plan, results, started)
    console.rule("[bold]results[/bold]")
    console.print(results_table(results))
    v = verdict(results)
    why_not = draw_curves(results, out / "demo_curves.png")
    console.print(escape(f"curves: {out / 'demo_curves.png'}") if why_not is None else f"no plot: {why_not}")
    gains = [s["gain_points"] for s in v["per_seed"]]
    if gains:
        console.print(
            f"GRPO gained {statistics.mean(gains):+.1f} points of held-out greedy accuracy on average "
            f"({', '.join(f'{g:+d}' for g in gains)})"
        )
    if v["seeds"] >= MIN_SEEDS:
        console.print(
            f"goal ({v['goal']}): {'MET' if v['met'] else 'NOT MET'} ({v['wins']} of {v['seeds']} seeds)"
        )
    else:
        console.print(
            f"{v['wins']} of {v['seeds']} seed(s) {GOAL_POINTS} or more points above the base model; the "
            f"goal asks it of {MIN_SEEDS} of {MIN_SEEDS} seeds: `lucidrl demo --seeds 0 1 2` runs them"
        )
    console.print(
        f"wall time {time.perf_counter() - started:.0f} s; results: {escape(str(out / 'demo_results.json'))}"
    )
    return results


def _write(out: Path, plan: DemoPlan, results: list[SeedResult], started: float) -> None:
    summary = {
        "plan": asdict(plan),
        "seeds": [asdict(r) for r in results],
        "verdict": verdict(results),
        "wall_s": time.perf_counter() - started,
    }
    (out / "demo_results.json").write_text(json.dumps(summary, indent=2) + "\n")
