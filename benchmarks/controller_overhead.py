"""Step time of the same GRPO training on three placements, side by side from one run:

  local        the trainer's own process (the default)
  ray x1       one Ray actor rank (1 CPU, 1 torch thread)
  ray x1 2cpu  one Ray actor rank with 2 CPUs and 2 threads, like local: the cost of the Ray hop alone
  ray x2       two Ray actor ranks of 1 CPU each, FSDP2 over gloo (data parallel)

Prints the median step time (steps after the first), its ratio to local, the per-stage medians,
and the wall time of the whole command (Ray start-up included). Runs are interleaved (A B C A B C)
so a noisy neighbour hits all three alike.

    .venv/bin/python benchmarks/controller_overhead.py [--steps 6] [--repeats 2] [--hidden 128 --layers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str[len("<think>"):]
    return {"score": text.count("e") / max(len(text), 1)}
"""

PLACEMENTS = {
    "local": [],
    "ray x1": ["trainer.backend=ray"],
    "ray x1 2cpu": ["trainer.backend=ray", "trainer.cpus_per_rank=2"],
    "ray x2": ["trainer.backend=ray", "placement.pools={global: {nodes: 1, devices_per_node: 2}}"],
}
STAGES = ["gen", "reward", "old_log_prob", "ref", "update_actor", "sync_weights"]


def prepare(work: Path, hidden: int, layers: int) -> tuple[Path, Path, Path]:
    from lucidrl.data.kk import write_kk_parquet
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model

    data = write_kk_parquet(work / "data", people=(2, 3), n_train=256, n_val=8, seed=0)
    model = build_tiny_model(work / "model", kk_tokenizer_corpus(0), hidden_size=hidden, num_layers=layers)
    reward = work / "reward.py"
    reward.write_text(REWARD)
    return Path(data["train"]), Path(model["path"]), reward


def run(name: str, work: Path, train: Path, model: Path, reward: Path, steps: int, tag: str) -> dict:
    run_dir = work / f"{name.replace(' ', '_')}_{tag}"
    args = [
        f"model.path={model}",
        f"data.train_files=[{train}]",
        "data.val_files=[]",
        "data.max_response_length=32",
        "data.train_batch_size=8",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=8",
        "actor.ppo_micro_batch_size=16",
        "actor.use_kl_loss=true",
        "actor.optim.lr=1e-4",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.save_final_model=false",
        f"trainer.run_dir={run_dir}",
        "trainer.logger=[jsonl]",
        f"reward.custom_function.path={reward}",
        *PLACEMENTS[name],
    ]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "lucidrl", "train", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]  # skip step 1
    out = {"step": [r["timing_s/step"] for r in records], "wall": wall}
    for s in STAGES:
        out[s] = [r.get(f"timing_s/{s}", 0.0) for r in records]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train, model, reward = prepare(work, args.hidden, args.layers)
        results: dict[str, dict[str, list[float]]] = {n: {"step": [], "wall": []} for n in PLACEMENTS}
        for rep in range(args.repeats):
            for name in PLACEMENTS:
                r = run(name, work, train, model, reward, args.steps, str(rep))
                results[name]["step"] += r["step"]
                results[name]["wall"].append(r["wall"])
                for s in STAGES:
                    results[name].setdefault(s, []).extend(r[s])
                print(
                    f"  {name:11s} repeat {rep}: median step {statistics.median(r['step']):.3f}s, "
                    f"command {r['wall']:.1f}s",
                    flush=True,
                )
    base = statistics.median(results["local"]["step"])
    print(
        f"\nGRPO step, tiny model (hidden {args.hidden}, {args.layers} layers), 8 prompts x 4 samples, "
        f"32 new tokens, KL loss; {args.steps - 1} timed steps x {args.repeats} repeats each\n"
    )
    head = (
        f"{'placement':11s} {'step s':>7s} {'x local':>8s} "
        + " ".join(f"{s:>12s}" for s in STAGES)
        + f" {'command s':>10s}"
    )
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        med = statistics.median(r["step"])
        stages = " ".join(f"{statistics.median(r[s]):12.3f}" for s in STAGES)
        print(f"{name:11s} {med:7.3f} {med / base:8.2f} {stages} {statistics.median(r['wall']):10.1f}")


if __name__ == "__main__":
    main()
