"""One GRPO step at real sizes with the default settings: SmolLM2-135M, and Qwen2.5-0.5B- and 1.5B-shaped
models with random weights (built locally, no downloads), side by side in one run.

Per rung, `lucidrl train` runs in a fresh process for `--steps` steps of 8 prompts x 4 samples x up to
256 new tokens (the demo's word problems as prompts, bf16 compute, no validation, no checkpoints),
with every memory key left `auto`: the memory plan picks micro-batches, the LM head's chunks and
checkpointing. Random-weight models almost never sample their eos, so their responses run to the
limit. Printed per rung: the plan's peak estimate, the process's peak RSS, seconds per step (the
last step's: the first includes start-up costs the later ones do not), generated tokens per second of
generation and trained tokens (prompt + response) per second of the update, or the error a rung
ended with ("out of memory" when the kernel killed it).

    .venv/bin/python benchmarks/scale_ladder.py [--rungs smollm2,qwen0.5b,qwen1.5b-lora] [--steps 2]

The SmolLM2 rung reads outputs/demo/model (`lucidrl model get smollm2-135m-instruct --out DIR` makes
it) and the word problems in outputs/demo/data (`make demo` makes both).
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

from memory_plan import SHAPES, build_model

RUNGS = {  # name: (model: a folder or a SHAPES name, overrides)
    "smollm2": ("outputs/demo/model", []),
    "smollm2-lora": ("outputs/demo/model", ["model.lora_rank=16"]),
    "qwen0.5b": ("qwen2.5-0.5b", []),
    "qwen0.5b-lora": ("qwen2.5-0.5b", ["model.lora_rank=16"]),
    "qwen1.5b-lora": ("qwen2.5-1.5b", ["model.lora_rank=16"]),
}


def rung_args(model: str, data: Path, run_dir: Path, steps: int, overrides: list[str]) -> list[str]:
    return [
        f"model.path={model}", "model.tokenizer_path=outputs/demo/model", "model.compute_dtype=bfloat16",
        f"data.train_files=[{data / 'train.parquet'}]", "data.max_prompt_length=128",
        "data.max_response_length=256", "data.train_batch_size=8", "rollout.n=4", "rollout.temperature=1.0",
        "actor.ppo_mini_batch_size=8", "algorithm.adv_estimator=grpo", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=0",
        "trainer.save_final_model=false", "trainer.logger=[jsonl]", f"trainer.run_dir={run_dir}",
        "trainer.overwrite=true", *overrides,
    ]  # fmt: skip


def run_rung(name: str, work: Path, data: Path, steps: int) -> dict:
    model, overrides = RUNGS[name]
    if model in SHAPES:
        model = str(build_model(model, work))
    run_dir = work / f"run-{name}"
    args = rung_args(model, data, run_dir, steps, overrides)
    from lucidrl.config import load_config

    cfg = load_config(None, args, echo=None)
    plan = cfg._memory_plan
    began = time.perf_counter()
    log = run_dir.parent / f"{run_dir.name}.log"
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, "-m", "lucidrl", "train", *args], stdout=out, stderr=out)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak (it re-executes itself in place)
    wall = time.perf_counter() - began
    peak = usage.ru_maxrss / 2**20  # GiB
    code = os.waitstatus_to_exitcode(status)
    row = {"rung": name, "estimate_gib": plan.peak.total / 2**30, "peak_gib": peak, "wall_s": wall,
           "choices": {k: v for k, (v, _) in plan.choices.items()}}  # fmt: skip
    if code:
        killed = code in (-9, 137)
        tail = log.read_text().strip().splitlines()[-1:] or ["?"]
        row["error"] = "out of memory (killed)" if killed else tail[0][:200]
        return row
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "timing_s/step" in r][-1]
    generated = last["response_length/mean"] * 32
    trained = last["perf/total_num_tokens"]
    row.update(
        step_s=last["timing_s/step"], gen_s=last["timing_s/gen"], update_s=last["timing_s/update_actor"],
        gen_tok_s=generated / last["timing_s/gen"], train_tok_s=trained / last["timing_s/update_actor"],
    )  # fmt: skip
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rungs", default="smollm2,qwen0.5b,qwen1.5b-lora")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--data", default="outputs/demo/data", help="a folder with train.parquet")
    p.add_argument(
        "--work", default=None, help="where built models and runs go (default: a temporary folder)"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="scale_ladder_"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.rungs.split(","):
        rows.append(run_rung(name, work, Path(args.data), args.steps))
        print(json.dumps(rows[-1]), flush=True)
    print(
        "\n| rung | plan's peak GiB | peak RSS GiB | s/step | generated tok/s | trained tok/s | auto choices |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        choices = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r["choices"].items())
        if "error" in r:
            print(
                f"| {r['rung']} | {r['estimate_gib']:.2f} | {r['peak_gib']:.2f} | {r['error']} | | | {choices} |"
            )
            continue
        print(f"| {r['rung']} | {r['estimate_gib']:.2f} | {r['peak_gib']:.2f} | {r['step_s']:.1f} | "
              f"{r['gen_tok_s']:.0f} | {r['train_tok_s']:.0f} | {choices} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
