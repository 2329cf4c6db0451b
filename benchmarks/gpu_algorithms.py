"""Every docs/algorithms "Try it" command for a few steps on a GPU in bfloat16, and the rollout gap
that rollout correction sees there.

    python benchmarks/gpu_algorithms.py --device cuda --out /tmp/gpu_alg      # on the GPU machine
    python benchmarks/gpu_algorithms.py --device cpu --only rollout_correction  # a smoke test here

The tests train the same commands on the CPU in float32, where the rollout engine and the actor compute
the same log-probs and the importance weights are 1. In bfloat16 on a GPU the hf engine's decode and the
actor's forward round differently, so the weights move off 1: the script prints, per command, the step
time, the policy loss, `rollout/logprob_diff_max` and the `rollout_corr/*` figures it logged, and fails
on a command that raises or logs a non-finite loss (device placement of every new path: the importance
weights, the rejection mask, sum pi^2 for the optimal token baselines, the covariance-selected tokens).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str[len("<think>"):]
    return {"score": text.count("e") / max(len(text), 1), "acc": float("e" in text)}
"""
SHOWN = ("rollout/logprob_diff_max", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_max",
         "rollout_corr/rollout_is_min", "rollout_corr/rollout_is_ratio_fraction_high",
         "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl", "rollout_corr/chi2_token")  # fmt: skip


def doc_commands(only: str | None) -> dict[str, list[str]]:
    cases = {}
    for page in sorted((ROOT / "docs" / "algorithms").glob("*.md")):
        for k, command in enumerate(re.findall(r"`lucidrl train CONFIG\.yaml([^`]*)`", page.read_text())):
            name = page.stem if k == 0 else f"{page.stem}-{k + 1}"
            if only is None or name.startswith(only):
                cases[name] = command.split()
    return cases


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="/tmp/gpu_algorithms")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", default=None, help="run the commands whose name starts with this")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from lucidrl.cli import main as lucidrl

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward.py").write_text(REWARD)
    if not (out / "model").exists():
        assert (
            lucidrl(["model", "tiny", "--out", str(out / "model"), "--hidden", "256", "--layers", "4"]) == 0
        )
        assert (
            lucidrl(
                ["data", "kk", "--out", str(out / "data"), "--people", "2-3", "--train", "256", "--val", "8"]
            )
            == 0
        )
    base = [
        f"model.path={out / 'model'}", f"data.train_files=[{out / 'data' / 'train.parquet'}]", "data.val_files=[]",
        f"reward.custom_function.path={out / 'reward.py'}", f"trainer.device={args.device}",
        "model.compute_dtype=bfloat16", "data.train_batch_size=16", "rollout.n=4", "data.max_response_length=48",
        "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=16", "actor.optim.lr=1e-4",
        f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=false",
        "trainer.save_final_model=false", "trainer.logger=[jsonl]", "trainer.overwrite=true",
        "trainer.collapse.enable=false",
    ]  # fmt: skip
    failed = []
    for name, overrides in doc_commands(args.only).items():
        run = out / "runs" / name
        began = time.perf_counter()
        try:
            rc = lucidrl(["train", *base, f"trainer.run_dir={run}", *overrides])
        except Exception as e:  # a failure is the finding: say which command, go on with the others
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
            failed.append(name)
            continue
        seconds = time.perf_counter() - began
        if rc != 0:
            print(
                f"{name}: rc={rc} (refused or failed, see the log above)  [{' '.join(overrides)}]", flush=True
            )
            failed.append(name)
            continue
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        last = records[-1]
        finite = all(math.isfinite(r.get("actor/pg_loss", 0.0)) for r in records)
        if rc != 0 or not finite:
            failed.append(name)
        shown = "  ".join(f"{k.split('/')[-1]}={last[k]:.4g}" for k in SHOWN if k in last)
        print(f"{name}: rc={rc} {seconds:.1f}s for {args.steps} steps, pg_loss={last.get('actor/pg_loss', float('nan')):.4g}"
              f"{'' if finite else ' NON-FINITE'}  {shown}  [{' '.join(overrides)}]", flush=True)  # fmt: skip
    print(f"\n{len(failed)} failed: {failed}" if failed else "\nall commands ran")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
