"""The demo's first GRPO step, seed by seed: held-out greedy accuracy after it, by decode loop.

One step of the demo's config (`learning_vs_trl.lucidrl_config`, the smollm2 setting: 16 problems x 8
samples, T=0.7, lr 5e-5, one AdamW step) from SmolLM2-135M-Instruct, then the trained weights are saved
and scored greedily on the demo's 150 held-out problems by the same evaluator as `learning_vs_trl.py`.
Each `--loops` entry sets `rollout.decode_loop`: lucidrl's own loop ("lucidrl") or transformers'
`generate` ("transformers"); everything else is the same. Per seed and loop: the accuracy after the
step, the step's training reward, the share of groups with mixed scores (the only ones with a gradient),
and the update's gradient norm; then each loop's mean and standard deviation over the seeds.

Held-out accuracy after one step moves a long way from seed to seed (an AdamW first step moves
every weight by about the learning rate, in the direction its gradient's sign gives, and which samples
a seed draws decides that), so a difference between two ways of sampling shows only over many seeds.

    .venv/bin/lucidrl demo                                  # writes outputs/demo/model
    .venv/bin/python benchmarks/first_step.py [--model outputs/demo/model] [--seeds 3 4 5] \\
        [--loops lucidrl transformers]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from learning_vs_trl import (
    DEFAULT_MODEL,
    DemoPlan,
    check_seeds,
    greedy_accuracy,
    lucidrl_config,
    smollm2_setting,
    write_word_problems,
)

LOOPS = ("lucidrl", "transformers")


def first_step(setting, loop: str, seed: int, work: Path, threads: int) -> dict[str, float]:
    """One step with `rollout.decode_loop=loop` from setting.model; the held-out accuracy after it and the
    step's metrics."""
    from lucidrl.config import config_from_dict
    from lucidrl.trainer.ppo import PPOTrainer

    cfg = lucidrl_config(setting, 1, work / f"{loop}-{seed}", threads, seed)
    cfg["rollout"]["decode_loop"] = loop
    trainer = PPOTrainer(config_from_dict(cfg, source="first_step"))
    trainer.global_step = 1
    metrics = trainer.step()
    saved = work / f"{loop}-{seed}-model"
    trainer.save_model(saved)
    acc = greedy_accuracy(str(saved), setting, None, trainer.cfg.rollout.stop_regex)[0]
    shutil.rmtree(saved)
    return {
        "acc": acc,
        "reward": metrics["critic/score/mean"],
        "mixed": metrics["critic/groups_with_mixed_scores"],
        "grad_norm": metrics["actor/grad_norm"],
        "gen_s": metrics["timing_s/gen"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"the model folder (default {DEFAULT_MODEL})")
    p.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5], help="training seeds (default 3 4 5)")
    p.add_argument(
        "--loops", nargs="+", choices=LOOPS, default=list(LOOPS), help="decode loops (default both)"
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = p.parse_args()
    check_seeds(args.seeds)
    torch.set_num_threads(args.threads)
    rows: dict[str, dict[int, dict[str, float]]] = {loop: {} for loop in args.loops}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setting = smollm2_setting(Path(args.model), work / "data")
        write_word_problems(work / "data")
        base = greedy_accuracy(setting.model, setting, None, DemoPlan.stop_regex)[0]
        for loop in args.loops:
            for seed in args.seeds:
                rows[loop][seed] = first_step(setting, loop, seed, work, args.threads)
                r = rows[loop][seed]
                print(f"  {loop}, seed {seed}: {r['acc']:.3f} after the step", file=sys.stderr, flush=True)
    print(f"\none GRPO step of the demo's config from {args.model} (held-out greedy {base:.3f} before it)\n")
    print(
        f"{'decode loop':<13s} {'seed':>5s} {'acc after':>10s} {'reward':>7s} {'mixed':>6s} {'grad':>6s} {'gen s':>6s}"
    )
    for loop, by_seed in rows.items():
        for seed, r in by_seed.items():
            print(
                f"{loop:<13s} {seed:5d} {r['acc']:10.3f} {r['reward']:7.3f} {r['mixed']:6.3f} "
                f"{r['grad_norm']:6.3f} {r['gen_s']:6.1f}"
            )
    print(f"\n{'decode loop':<13s} {'seeds':>5s} {'mean acc':>9s} {'sd':>6s} {'se':>6s}")
    for loop, by_seed in rows.items():
        accs = [r["acc"] for r in by_seed.values()]
        spread = "     -      -"  # one seed has no spread
        if len(accs) > 1:
            sd = statistics.stdev(accs)
            spread = f"{sd:6.3f} {sd / len(accs) ** 0.5:6.3f}"
        print(f"{loop:<13s} {len(accs):5d} {statistics.mean(accs):9.3f} {spread}")


if __name__ == "__main__":
    main()
