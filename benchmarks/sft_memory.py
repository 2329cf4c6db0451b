"""SFT's memory step by step with a real vocabulary: the whole logits against the chunked LM head.

The scarce-label experiment's SFT phase from a pretrained model (`lucidrl experiment scarce-labels
--model`): its labelled 2-person Knights & Knaves traces (100 puzzles x 8 renderings), 32 rows a step
in length-sorted micro-batches of 8, lr 2e-5, bf16 compute where the CPU has it. Each variant runs as
a `lucidrl sft` command (so with the allocator settings every `lucidrl` command starts with,
lucidrl/launch.py), one after the other; the process's resident memory is read every second and its
steps from metrics.jsonl. Printed: RSS after chosen steps and each variant's median step time.

    .venv/bin/python benchmarks/sft_memory.py --model outputs/demo/model [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

VARIANTS = {"whole logits": 0, "1024-token chunks": 1024}  # name: head_chunk_tokens


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(config: dict, work: Path, name: str) -> dict:
    """One `lucidrl sft` run; RSS at the end of each step (the most seen while it ran) and step times."""
    path = work / f"{name.replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(config))
    metrics = Path(config["trainer"]["run_dir"]) / "metrics.jsonl"
    lucidrl = Path(sys.executable).parent / "lucidrl"
    proc = subprocess.Popen(
        [str(lucidrl), "sft", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    peak_by_step: dict[int, float] = {}
    while proc.poll() is None:
        steps = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        rss = rss_mb(proc.pid)
        if rss is not None:
            peak_by_step[steps] = max(peak_by_step.get(steps, 0.0), rss)
        time.sleep(1.0)
    if proc.returncode:
        sys.exit(f"{name}: lucidrl sft failed:\n{proc.stderr.read().decode()[-3000:]}")
    step_s = [json.loads(line)["timing_s/step"] for line in metrics.read_text().splitlines()]
    return {"peak_during_step": {s + 1: v for s, v in peak_by_step.items()}, "step_s": step_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", required=True, help="a model folder, e.g. outputs/demo/model (SmolLM2-135M-Instruct)"
    )
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--only", default=",".join(VARIANTS))
    args = p.parse_args()
    from lucidrl.experiments.scarce_labels import ScarceLabelsPlan, sft_config, write_data

    names = args.only.split(",")
    if any(n not in VARIANTS for n in names):
        sys.exit(f"--only {args.only}: variants are {list(VARIANTS)}")
    plan = ScarceLabelsPlan(model=args.model)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = write_data(work / "data", plan, seed=0)
        for name in names:
            config = sft_config(args.model, files, work / name.replace(" ", "_"), plan, seed=0, seconds=None)
            config["head_chunk_tokens"] = VARIANTS[name]
            config["trainer"].update(total_training_steps=args.steps, save_freq=0, save_final_model=False)
            rows[name] = run(config, work, name)
            print(f"  {name}: done, median step {statistics.median(rows[name]['step_s']):.1f} s", flush=True)
    shown = sorted({1, 2, 4, args.steps // 2, args.steps} & set(range(1, args.steps + 1)))
    print(
        f"\nSFT of {args.model} on K&K traces: 32 rows a step, micro-batches of 8, "
        f"{plan.compute_dtype or 'float32'} compute; the most RSS seen during each step, MB\n"
    )
    print(
        f"{'LM head':18s} " + " ".join(f"{'step ' + str(s):>9s}" for s in shown) + f" {'median s/step':>14s}"
    )
    for name, r in rows.items():
        peaks = " ".join(f"{r['peak_during_step'].get(s, float('nan')):9.0f}" for s in shown)
        print(f"{name:18s} {peaks} {statistics.median(r['step_s']):14.2f}")


if __name__ == "__main__":
    main()
