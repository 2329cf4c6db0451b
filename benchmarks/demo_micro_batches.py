"""The demo's update at several micro-batch sizes: seconds and peak memory on the real model.

Runs `lucidrl train` on the config a demo seed wrote (RUN/config.yaml: SmolLM2-135M-Instruct, 16 word
problems x 8 samples, 128 + 64 tokens) for `--steps` steps per micro-batch size, each in its own
process, one after another, and prints the mean of the steps after the first (timing_s/update_actor,
timing_s/step) with the process's peak RSS (GNU time's). `auto` is what the memory plan chooses.

    .venv/bin/lucidrl demo --steps 1 --n-val 16 --out outputs/demo_mb     # writes the config
    .venv/bin/python benchmarks/demo_micro_batches.py outputs/demo_mb/seed0/config.yaml --sizes auto,16,8,4
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def run(config: str, size: str, steps: int, work: Path) -> dict[str, float]:
    run_dir = work / f"mb_{size}"
    cmd = [
        sys.executable, "-m", "lucidrl", "train", config,
        f"trainer.run_dir={run_dir}", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_final_model=false",
        f"actor.ppo_micro_batch_size={size}",
    ]  # fmt: skip
    # GNU time reads the peak of the process it runs (the re-exec of `lucidrl` included)
    timed = ["/usr/bin/time", "-v", *cmd] if Path("/usr/bin/time").exists() else cmd
    done = subprocess.run(timed, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in records if r["step"] >= 2] or records
    mean = lambda k: sum(r[k] for r in later) / len(later)  # noqa: E731
    return {
        "update_s": mean("timing_s/update_actor"),
        "step_s": mean("timing_s/step"),
        "peak_gb": int(peak.group(1)) / 2**20 if peak else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", help="a demo seed's RUN/config.yaml")
    p.add_argument("--sizes", default="auto,16,8,4", help="comma list of actor.ppo_micro_batch_size values")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    sizes = a.sizes.split(",")
    with tempfile.TemporaryDirectory(prefix="lucidrl-mb-") as tmp:
        results = {s: run(a.config, s, a.steps, Path(tmp)) for s in sizes}
    base = results[sizes[0]]["update_s"]
    print(f"{'micro-batch':>12} {'update s':>9} {'vs ' + sizes[0]:>9} {'step s':>8} {'peak RSS GB':>12}")
    for s in sizes:
        r = results[s]
        print(
            f"{s:>12} {r['update_s']:9.1f} {base / r['update_s']:8.2f}x {r['step_s']:8.1f} {r['peak_gb']:12.2f}"
        )


if __name__ == "__main__":
    main()
