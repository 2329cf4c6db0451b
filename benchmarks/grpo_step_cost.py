"""What one GRPO step costs on a real pretrained model with lucidrl, in each precision and tuning mode.

Runs `python -m lucidrl train` for a few steps per configuration (each in its own process, one after
another) on word problems (`lucidrl data word-problems`) from a model folder such as the one
`lucidrl model get smollm2-135m-instruct --out outputs/smollm2` writes, and prints seconds per step
split into the stages the trainer times (metrics.jsonl's timing_s/*): gen (rollout), reward,
old_log_prob, ref (the reference model's pass, only with a KL term), update_actor, sync_weights.
The first step of each run is reported apart (warm-up: allocator, autocast caches); the others are
averaged.

Configurations (--configs, comma list): fp32 / bf16 (model.compute_dtype=bfloat16 over float32
weights), full fine-tuning / lora (model.lora_rank=16, all linear layers), and +kl (a low_var_kl loss
term against a reference model, actor.use_kl_loss=true).

    python benchmarks/grpo_step_cost.py --model outputs/smollm2 --steps 4
    python benchmarks/grpo_step_cost.py --configs bf16,bf16-lora --prompts 16 --n 4 --max-response 64

The numbers measured with it are in docs/tasks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "fp32": [],
    "bf16": ["model.compute_dtype=bfloat16"],
    "fp32+kl": ["actor.use_kl_loss=true"],
    "bf16+kl": ["model.compute_dtype=bfloat16", "actor.use_kl_loss=true"],
    "fp32-lora": ["model.lora_rank=16", "model.lora_alpha=32"],
    "bf16-lora": ["model.compute_dtype=bfloat16", "model.lora_rank=16", "model.lora_alpha=32"],
    "bf16-lora+kl": ["model.compute_dtype=bfloat16", "model.lora_rank=16", "model.lora_alpha=32", "actor.use_kl_loss=true"],
}  # fmt: skip
STAGES = ("gen", "reward", "old_log_prob", "ref", "update_actor", "sync_weights")


def run_config(name: str, args, data: Path, work: Path) -> dict:
    run_dir = work / name
    cmd = [
        sys.executable, "-m", "lucidrl", "train",
        f"model.path={args.model}",
        f"data.train_files=[{data / 'train.parquet'}]",
        "data.max_prompt_length=256",
        f"data.max_response_length={args.max_response}",
        f"data.train_batch_size={args.prompts}",
        f"rollout.n={args.n}",
        f"actor.ppo_mini_batch_size={args.prompts}",  # one optimizer step per generation batch
        f"actor.ppo_micro_batch_size={args.micro}",
        f"actor.log_prob_micro_batch_size={args.micro}",
        "actor.optim.lr=1e-6",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.save_final_model=false",
        "trainer.logger=[jsonl]",
        "trainer.collapse.enable=false",
        f"trainer.run_dir={run_dir}",
        *CONFIGS[name],
    ]  # fmt: skip
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r]
    return {"name": name, "steps": steps, "wall": wall, "load": (load + os.getloadavg()[0]) / 2}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="outputs/smollm2")
    p.add_argument("--configs", default="fp32,bf16,bf16+kl,fp32+kl,fp32-lora,bf16-lora")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--max-response", type=int, default=64)
    p.add_argument("--micro", type=int, default=16, help="sequences per forward/backward (default 16)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; choose among {', '.join(CONFIGS)}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "lucidrl", "data", "word-problems", "--train", "400", "--val", "10",
             "--out", str(work / "data")],
            check=True, capture_output=True,
        )  # fmt: skip
        print(
            f"# {args.model}: {args.prompts} prompts x {args.n} samples, <= {args.max_response} new tokens, "
            f"micro-batches of {args.micro}, {args.steps} steps per config; seconds per step after the first"
        )
        print("| config | step | " + " | ".join(STAGES) + " | first step | response length | load |")
        print("|---|" + "---|" * (len(STAGES) + 4))
        for name in names:
            r = run_config(name, args, work / "data", work)
            later = r["steps"][1:] or r["steps"]
            cells = [f"{_mean([s.get(f'timing_s/{k}', 0.0) for s in later]):.1f}" for k in STAGES]
            length = _mean([s["response_length/mean"] for s in r["steps"]])
            print(
                f"| {name} | {_mean([s['timing_s/step'] for s in later]):.1f} | " + " | ".join(cells)
                + f" | {r['steps'][0]['timing_s/step']:.1f} | {length:.0f} | {r['load']:.1f} |",
                flush=True,
            )  # fmt: skip
            results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
