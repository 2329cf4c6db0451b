"""rollout.mode sync against one_step_off (and async) on the demo's task, on this machine, side by side.

Runs `lucidrl train` on the config a demo seed wrote (RUN/config.yaml: SmolLM2-135M-Instruct, word
problems, GRPO) once per mode, each in its own process, one after another, with the same seed and
steps, held-out accuracy before and after. Prints per mode: wall-clock of the run, seconds per step
after the first, the mean generation and update seconds (in the overlapped modes they run at the same
time, in two threads of one process), the trainer's idle seconds per step, the mean staleness, and the
held-out accuracy at the end.

    .venv/bin/lucidrl demo --steps 1 --n-val 16 --out outputs/demo_async     # writes the config
    .venv/bin/python benchmarks/async_vs_sync.py outputs/demo_async/seed0/config.yaml --steps 6
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {
    "sync": [],
    "one_step_off": ["rollout.mode=one_step_off"],
    "async k=2": ["rollout.mode=async", "rollout.max_staleness=2"],
}


def run(config: str, name: str, steps: int, n_val: int | None, work: Path) -> dict[str, float]:
    run_dir = work / name.replace(" ", "_").replace("=", "")
    cmd = [
        sys.executable, "-m", "lucidrl", "train", config, *MODES[name],
        f"trainer.run_dir={run_dir}", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=true", f"trainer.test_freq={steps}", "trainer.save_final_model=false",
    ]  # fmt: skip
    if n_val:
        cmd.append(f"data.val_batch_size={n_val}")
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if r["step"] >= 2]
    mean = lambda k: sum(r.get(k, 0.0) for r in steps_) / max(len(steps_), 1)  # noqa: E731
    return {
        "wall_s": wall,
        "step_s": mean("timing_s/step"),
        "gen_s": mean("timing_s/gen"),
        "update_s": mean("timing_s/update_actor"),
        "idle_s": mean("async/trainer_idle_s"),
        "staleness": mean("async/staleness_mean"),
        "acc_before": records[0].get("val/acc", float("nan")),
        "acc_after": records[-1].get("val/acc", float("nan")),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", help="a demo seed's RUN/config.yaml")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--modes", default="sync,one_step_off", help=f"comma list of {', '.join(MODES)}")
    a = p.parse_args()
    names = a.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="lucidrl-async-") as tmp:
        results = {n: run(a.config, n, a.steps, None, Path(tmp)) for n in names}
    base = results[names[0]]["wall_s"]
    print(
        f"{'mode':<14} {'wall s':>7} {'vs ' + names[0]:>8} {'s/step':>7} {'gen s':>6} {'update s':>9} "
        f"{'idle s':>7} {'staleness':>9} {'acc before':>11} {'acc after':>10}"
    )
    for n in names:
        r = results[n]
        print(
            f"{n:<14} {r['wall_s']:7.1f} {base / r['wall_s']:7.2f}x {r['step_s']:7.1f} {r['gen_s']:6.1f} "
            f"{r['update_s']:9.1f} {r['idle_s']:7.1f} {r['staleness']:9.2f} {r['acc_before']:11.3f} "
            f"{r['acc_after']:10.3f}"
        )


if __name__ == "__main__":
    main()
