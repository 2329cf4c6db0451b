"""The demo's GRPO step with SDPA attention against eager, alternating runs of the same seed.

Each run is `lucidrl demo`'s config for seed 0 (lucidrl.demo.run, DemoPlan with `--steps` steps) with
`model.attn_implementation` left to transformers (sdpa) or set to eager, in a fresh process with
lucidrl's allocator settings; sdpa and eager alternate `--rounds` times, so a host that slows down
costs both alike. Printed: per run, the median over its steps from the third on (the first two
allocate and warm up) of the step, update and generation seconds, then each kind's median and the
ratio eager / sdpa.

    .venv/bin/python benchmarks/demo_attention.py --model outputs/demo/model [--rounds 2] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("sdpa", "eager")
TIMINGS = {"step": "timing_s/step", "update": "timing_s/update_actor", "generation": "timing_s/gen"}


def worker(kind: str, out: Path, model: str, steps: int) -> dict:
    from lucidrl.demo.plan import DemoPlan
    from lucidrl.demo.run import run_demo

    plan = DemoPlan(steps=steps, eval_every=steps, attn_implementation=None if kind == "sdpa" else kind)
    run_demo(out, [0], plan, model=model)
    rows = [json.loads(line) for line in (out / "seed0" / "metrics.jsonl").read_text().splitlines()]
    return {name: statistics.median([r[key] for r in rows if key in r][2:]) for name, key in TIMINGS.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", required=True, help="a model folder, e.g. outputs/demo/model (SmolLM2-135M-Instruct)"
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 3:
        sys.exit("--steps must be at least 3: the first two steps are not counted")
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.out), args.model, args.steps)))
        return
    from lucidrl.launch import tuned_env
    from lucidrl.models.precision import cpu_has_amx, cpu_has_native_bf16

    env = tuned_env()
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for kind in KINDS:
                cmd = [
                    sys.executable,
                    __file__,
                    "--worker",
                    kind,
                    "--out",
                    f"{tmp}/{kind}{i}",
                    "--model",
                    args.model,
                ]
                cmd += ["--steps", str(args.steps)]
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
                if done.returncode:
                    sys.exit(f"{kind} run {i} failed:\n{done.stderr[-3000:]}")
                runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(
                    f"  round {i + 1} {kind}: "
                    + ", ".join(f"{k} {v:.1f} s" for k, v in runs[kind][-1].items())
                )
    print(
        f"\n{args.model}: the demo's config, seed 0, {args.steps} steps per run, {args.rounds} rounds; "
        f"native bf16: {cpu_has_native_bf16()}, AMX: {cpu_has_amx()}; medians of steps 3-{args.steps}, s\n"
    )
    print(f"{'attention':10s} " + " ".join(f"{name:>11s}" for name in TIMINGS))
    median = {kind: {n: statistics.median(r[n] for r in runs[kind]) for n in TIMINGS} for kind in KINDS}
    for kind in KINDS:
        print(f"{kind:10s} " + " ".join(f"{median[kind][n]:11.2f}" for n in TIMINGS))
    print(
        f"{'eager/sdpa':10s} " + " ".join(f"{median['eager'][n] / median['sdpa'][n]:11.2f}" for n in TIMINGS)
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
