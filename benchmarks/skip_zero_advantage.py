"""actor.skip_zero_advantage side by side: the demo's GRPO steps with it off and on, from one model.

In a GRPO step every sample of a group whose samples all scored alike has advantage 0, so it adds
nothing to the gradient; with actor.skip_zero_advantage the update runs no forward or backward for it
(it stays in the token mean's count, so the gradient is the same). How much that saves depends on how
many groups tie, which changes as the model learns: many at the start of the demo (the base model
gets few problems right), fewer later.

This runs the demo's own config (`lucidrl.demo.run.grpo_config` with a default `DemoPlan`: 16 prompts x
8 samples, <= 64 new tokens, float32 or bf16 by the CPU) for `--steps` steps from `--model`, once with
the option off and once on, each in its own process with the same seed, one after the other, and
prints per step: whether both sides drew the same samples, the groups with mixed scores, the share
of samples the update left out, the update's seconds on each side and their ratio, and each side's
training reward. Both start from the same weights and draw the same samples in step 1, so the last
line compares the two updates of step 1. After it the weights differ by float rounding, and that can
be enough for later samples to part: one token drawn differently changes that response from there on
(each row's random draws are its own, so the other rows' draws stay the same).

    .venv/bin/python benchmarks/skip_zero_advantage.py --model outputs/demo/model [--steps 3] [--seed 0]
    .venv/bin/python benchmarks/skip_zero_advantage.py --model outputs/demo/seed0/final --steps 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def worker(model: str, skip: bool, steps: int, seed: int, work: Path) -> None:
    import hashlib

    from lucidrl.config import config_from_dict
    from lucidrl.data.word_problems import write_word_problems_parquet
    from lucidrl.demo.plan import DemoPlan
    from lucidrl.demo.run import grpo_config
    from lucidrl.trainer.ppo import PPOTrainer

    plan = DemoPlan(steps=steps)
    data = work / "data"
    if not (data / "train.parquet").exists():
        write_word_problems_parquet(
            data, n_train=plan.n_train, n_val=plan.n_val, seed=0, fmt="answer_is", shots=0
        )
    files = {"train": str(data / "train.parquet"), "val": str(data / "val.parquet")}
    run_dir = work / ("on" if skip else "off")
    cfg = grpo_config(model, files, run_dir, plan, seed)
    cfg["actor"]["skip_zero_advantage"] = skip
    cfg["data"]["val_files"] = []
    cfg["trainer"]["collapse"] = {"enable": False}  # the same steps on both sides, whatever happens
    trainer = PPOTrainer(config_from_dict(cfg, source="skip_zero_advantage"))
    samples: list[str] = []  # a digest of each step's sampled tokens: where the two runs' samples part
    collect = trainer.collector.collect

    def digest(t):
        batch, metrics = collect(t)
        samples.append(hashlib.sha256(batch["responses"].numpy().tobytes()).hexdigest())
        return batch, metrics

    trainer.collector.collect = digest
    with trainer.tracker:
        for step in range(1, steps + 1):
            trainer.global_step = step
            trainer.tracker.log(trainer.step(), step=step)
            if step == 1:  # the one update both runs make from the same samples
                trainer.save_model(run_dir / "step1")
    (run_dir / "samples.json").write_text(json.dumps(samples))


def read_steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "timing_s/step" in r]


def weight_gap(start: Path, a: Path, b: Path) -> tuple[float, float]:
    """The largest |a - b| over the weights, and |a - b| against how far `a` moved from `start` (L2 norms
    over all weights): rounding makes the first up to a step's size where Adam normalises a near-zero
    gradient; the second says how much of the update differs."""
    from safetensors.torch import load_file

    w0, wa, wb = (load_file(str(d / "model.safetensors")) for d in (start, a, b))
    keys = sorted(set(w0) & set(wa) & set(wb))
    diff = sum(float((wa[k].double() - wb[k].double()).pow(2).sum()) for k in keys) ** 0.5
    moved = sum(float((wa[k].double() - w0[k].double()).pow(2).sum()) for k in keys) ** 0.5
    largest = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in keys)
    return largest, diff / max(moved, 1e-30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder (the demo's base, or a trained checkpoint)")
    p.add_argument("--steps", type=int, default=3, help="GRPO steps on each side (default 3)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed on both sides (default 0)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--worker", choices=("off", "on"), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 1:
        sys.exit(f"--steps {args.steps}: must be >= 1")
    if args.worker:
        torch.set_num_threads(args.threads)
        worker(args.model, args.worker == "on", args.steps, args.seed, Path(args.work))
        return
    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"--model {args.model}: not a HuggingFace model folder (no config.json)")
    from lucidrl.launch import tuned_env

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs, samples = {}, {}
        for side in ("off", "on"):
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                side,
                "--model",
                args.model,
                "--steps",
                str(args.steps),
            ]
            cmd += ["--seed", str(args.seed), "--threads", str(args.threads), "--work", str(work)]
            proc = subprocess.run(cmd, env=tuned_env(), capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"the run with the option {side} failed:\n{proc.stderr[-3000:]}")
            runs[side] = read_steps(work / side)
            samples[side] = json.loads((work / side / "samples.json").read_text())
            print(f"  option {side}: {sum(s['timing_s/step'] for s in runs[side]):.0f} s", file=sys.stderr)
        largest, relative = weight_gap(Path(args.model), work / "off" / "step1", work / "on" / "step1")
    off, on = runs["off"], runs["on"]
    print(
        f"\nthe demo's GRPO from {args.model}, {args.steps} steps, seed {args.seed}, {args.threads} threads: "
        "actor.skip_zero_advantage off and on\n"
    )
    print("| step | same samples | groups mixed | samples left out | update s, off | update s, on | update off/on | step off/on | reward off | reward on |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(off, on, strict=True), 1):
        same = "yes" if samples["off"][i - 1] == samples["on"][i - 1] else "no"
        print(
            f"| {i} | {same} | {b['critic/groups_with_mixed_scores']:.3f} | {b['actor/zero_advantage_skipped']:.3f} | "
            f"{a['timing_s/update_actor']:.1f} | {b['timing_s/update_actor']:.1f} | "
            f"{a['timing_s/update_actor'] / b['timing_s/update_actor']:.2f}x | "
            f"{a['timing_s/step'] / b['timing_s/step']:.2f}x | {a['critic/score/mean']:.3f} | {b['critic/score/mean']:.3f} |"
        )
    total = [
        sum(s[k] for s in side) for side in (off, on) for k in ("timing_s/update_actor", "timing_s/step")
    ]
    print(
        f"\nin all: update {total[0]:.0f} s against {total[2]:.0f} s ({total[0] / total[2]:.2f}x), steps {total[1]:.0f} s "
        f"against {total[3]:.0f} s ({total[1] / total[3]:.2f}x)\nafter step 1 (the same samples on both sides) the "
        f"weights differ by at most {largest:.2e}, and the two updates by {relative:.2e} of their size"
    )


if __name__ == "__main__":
    main()
