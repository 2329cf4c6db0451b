"""Which task, answer format and GRPO settings turn a pretrained model's partial ability into accuracy fastest.

For every (task, config, seed): lucidrl's demo GRPO run (lucidrl/demo.py: the verifier's score the only
reward, held-out greedy accuracy before training and every --eval-every steps) for --steps steps from
the model in --model. Prints one row per run: the base and final held-out greedy accuracy, the best
point of the curve, the gain in points and the seconds per step; and writes every curve as JSON.

Tasks are one-step word problems (lucidrl/data/word_problems.py, train and val never sharing numbers)
asked in an answer format the reward checks exactly: gsm8k ("#### N"), answer_is ("The answer is N.")
or boxed (\\boxed{N}). The reward is a custom function written next to the data (1 for the right
number in the asked format, else 0), so the sweep does not depend on how a built-in rule reads.

    python benchmarks/demo_sweep.py --model outputs/smollm2 --device cuda --steps 40
    python benchmarks/demo_sweep.py --model outputs/smollm2 --tasks word_gsm8k --configs full_lr2e-5 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

INSTRUCTIONS = {
    "gsm8k": "\nWrite the final answer as a number after ####, for example: #### 3",
    "answer_is": '\nEnd your reply with "The answer is N." where N is the number.',
    "boxed": "\nPut the final answer in \\boxed{}.",
}

REWARD = r"""
import re

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
PATTERNS = {
    "gsm8k": r"####\s*\$?\s*(" + _NUMBER + r")",
    "answer_is": r"answer is:?\s*\**\s*\$?\s*(" + _NUMBER + r")",
    "boxed": r"\\boxed\{\s*\$?(" + _NUMBER + r")\s*\$?\}",
}


def compute_score(data_source, solution_str, ground_truth, extra_info):
    found = re.findall(PATTERNS[extra_info["format"]], solution_str, flags=re.IGNORECASE)
    if not found:
        return {"score": 0.0, "acc": 0.0, "format_ok": 0.0}
    right = float(found[-1].replace(",", "").rstrip(".") == str(ground_truth))
    return {"score": right, "acc": right, "format_ok": 1.0}
"""

TASKS = {f"word_{fmt}": fmt for fmt in INSTRUCTIONS}


def write_task(out: Path, fmt: str, n_train: int, n_val: int, seed: int = 0) -> dict[str, str]:
    """train.parquet, val.parquet (verl's schema) and reward.py for word problems asked in `fmt`."""
    from lucidrl.data.word_problems import generate_problems

    out.mkdir(parents=True, exist_ok=True)
    val = generate_problems(n_val, seed=seed + 1000, distinct_cores=True)
    train = generate_problems(n_train, seed=seed, exclude={p.core for p in val})

    def rows(problems, split):
        return [
            {
                "data_source": "demo_sweep",
                "prompt": [{"role": "user", "content": p.question + INSTRUCTIONS[fmt]}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
                "extra_info": {"split": split, "index": i, "format": fmt},
            }
            for i, p in enumerate(problems)
        ]

    files = {"train": str(out / "train.parquet"), "val": str(out / "val.parquet")}
    pq.write_table(pa.Table.from_pylist(rows(train, "train")), files["train"])
    pq.write_table(pa.Table.from_pylist(rows(val, "val")), files["val"])
    (out / "reward.py").write_text(REWARD)
    files["reward"] = str(out / "reward.py")
    return files


def configs(base):
    """Named settings to compare, each a DemoPlan."""
    return {
        "full_lr1e-5": replace(base, lr=1e-5),
        "full_lr2e-5": replace(base, lr=2e-5),
        "full_lr5e-5": replace(base, lr=5e-5),
        "full_lr2e-5_kl": replace(base, lr=2e-5, kl_coef=0.01),
        "lora16_lr2e-4": replace(base, lora_rank=16, lr=2e-4),
        "lora16_lr5e-4": replace(base, lora_rank=16, lr=5e-4),
    }


def main() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from lucidrl.demo import DemoPlan, points, run_seed

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a HuggingFace model folder (lucidrl model get ...)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {', '.join(TASKS)}")
    p.add_argument("--configs", default=None, help="comma list of the configs (default: all)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--n-val", type=int, default=200)
    p.add_argument("--json", default=None, help="write every run's curves here")
    p.add_argument("--deadline", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--every-task", action="store_true", help="run every config on every task")
    args = p.parse_args()
    base = DemoPlan(
        steps=args.steps, eval_every=args.eval_every, prompts=args.prompts, n=args.n,
        max_new_tokens=args.max_new_tokens, n_val=args.n_val, device=args.device,
    )  # fmt: skip
    grid = configs(base)
    chosen = args.configs.split(",") if args.configs else list(grid)
    rows, started = [], time.perf_counter()
    tasks = args.tasks.split(",")
    # the first config on every task; the others on the task where it gained most (or every task with
    # --every-task): the sweep spends its time where learning shows
    order = [(task, chosen[0]) for task in tasks]
    with tempfile.TemporaryDirectory() as tmp:
        files = {task: write_task(Path(tmp) / task, TASKS[task], base.n_train, base.n_val) for task in tasks}
        i = 0
        while i < len(order):
            task, name = order[i]
            i += 1
            for seed in args.seeds:
                began = time.perf_counter()
                if args.deadline is not None and began - started > args.deadline:
                    print(
                        f"{task} {name} seed {seed}: not run (--deadline {args.deadline:.0f} s)", flush=True
                    )
                    continue
                plan = grid[name]
                try:
                    r = run_seed(
                        args.model,
                        files[task],
                        Path(tmp) / f"{task}-{name}-{seed}",
                        plan,
                        seed,
                        lambda *a: None,
                    )
                except Exception as e:  # one failing setting must not lose the others' rows
                    print(f"{task} {name} seed {seed}: FAILED {type(e).__name__}: {e}", flush=True)
                    continue
                s = time.perf_counter() - began
                best = max(pt["acc"] for pt in r.curve)
                row = {
                    "task": task, "config": name, "seed": seed, "base": r.base_acc, "final": r.final_acc,
                    "best": best, "gain": points(r.final_acc) - points(r.base_acc), "s_per_step": s / max(r.steps, 1),
                    "curve": r.curve, "reward": r.reward, "plan": asdict(plan),
                }  # fmt: skip
                rows.append(row)
                print(
                    f"{task:16} {name:16} seed {seed}: base {r.base_acc:.2f} final {r.final_acc:.2f} best "
                    f"{best:.2f} gain {row['gain']:+d} ({s / max(r.steps, 1):.1f} s/step) curve "
                    + " ".join(f"{pt['step']}:{pt['acc']:.2f}" for pt in r.curve),
                    flush=True,
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
            if i == len(tasks) and len(chosen) > 1:
                firsts = [r for r in rows if r["config"] == chosen[0]]
                targets = (
                    tasks if args.every_task or not firsts else [max(firsts, key=lambda r: r["gain"])["task"]]
                )
                order += [(t, name) for name in chosen[1:] for t in targets]
    print(f"\n{'task':16} {'config':16} seed  base  final  best  gain  s/step")
    for r in rows:
        print(
            f"{r['task']:16} {r['config']:16} {r['seed']:>4}  {r['base']:.2f}  {r['final']:.2f}  {r['best']:.2f}  "
            f"{r['gain']:+4d}  {r['s_per_step']:.1f}"
        )


if __name__ == "__main__":
    main()
