"""The memory plan's estimates against measured peaks, phase by phase (lucidrl.config.memory_plan).

Per case, a model of a real shape with random weights is built locally (no downloads) and each phase
runs in a fresh process with lucidrl's allocator settings, as the `lucidrl` command runs: the
old-log-prob pass and two GRPO updates of the plan's micro-batches (prompts and responses at their full
lengths, so the plan's worst case is what runs), and one generation of the plan's rollout rows with no
eos (every row runs to the length limit). Printed per phase: the plan's estimate, the process's peak
RSS (ru_maxrss), and their ratio; the plan's auto choices. The update's process runs the log-prob pass
first, as a step does; the log-prob pass and the rollout are measured before any update, so their
estimates here leave out the gradients and AdamW moments that a run holds from its first update on.

    .venv/bin/python benchmarks/memory_plan.py [--cases smollm2,qwen0.5b] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from processes import peak_rss_mb, run_variant

# name: (config.json fields, prompts, samples per prompt, prompt tokens, response tokens, overrides)
SHAPES = {
    "qwen2-40m": dict(
        model_type="qwen2", hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, vocab_size=32768, tie_word_embeddings=True,
    ),
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
}  # fmt: skip
CASES = {
    # name: (shape, prompts, n, prompt tokens, response tokens, config overrides)
    "ci": ("qwen2-40m", 4, 4, 64, 64, {}),  # tests/test_memory_plan.py
    "ci-ckpt": ("qwen2-40m", 4, 4, 64, 64, {"model.enable_gradient_checkpointing": True}),
    "smollm2": ("smollm2-135m", 16, 8, 96, 64, {}),
    "smollm2-ckpt": ("smollm2-135m", 16, 8, 96, 64, {"model.enable_gradient_checkpointing": True}),
    "smollm2-whole-head": ("smollm2-135m", 16, 8, 96, 64, {"actor.head_chunk_tokens": 0}),
    "qwen0.5b": ("qwen2.5-0.5b", 8, 4, 128, 256, {}),
    "qwen1.5b-lora": ("qwen2.5-1.5b", 8, 4, 128, 256, {"model.lora_rank": 16}),
}


def build_model(shape: str, folder: Path) -> Path:
    """A random-weight model of `shape` in `folder` (once), with the tiny model's tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = folder / shape
    if (path / "config.json").is_file():
        return path
    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), max_position_embeddings=4096, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)  # transformers' own init (norms at 1)
    model.save_pretrained(path)
    return path


def plan_config(path: Path, case: str, budget_gib: float | None) -> dict:
    _, prompts, n, prompt_len, response_len, overrides = CASES[case]
    cfg = {
        "model": {"path": str(path), "compute_dtype": "bfloat16"},
        "data": {
            "train_files": ["unused.parquet"], "max_prompt_length": prompt_len,
            "max_response_length": response_len, "train_batch_size": prompts,
        },
        "rollout": {"n": n},
        "actor": {"ppo_mini_batch_size": prompts},
        "trainer": {"memory_budget_gib": budget_gib},
    }  # fmt: skip
    for key, value in overrides.items():
        *parents, last = key.split(".")
        d = cfg
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value
    return cfg


def worker(work: Path, case: str, phase: str) -> dict:
    """One phase of `case` in this process: its peak RSS and seconds."""
    from lucidrl.batch import Batch
    from lucidrl.config import config_from_dict
    from lucidrl.models import load_model
    from lucidrl.models.precision import autocast_dtype
    from lucidrl.workers.common.model_support import enable_activation_checkpointing
    from lucidrl.workers.rollout.engine import SamplingParams
    from lucidrl.workers.rollout.hf_engine import HFRollout
    from lucidrl.workers.training.actor import ActorWorker

    shape, prompts, n, prompt_len, response_len, _ = CASES[case]
    cfg = config_from_dict(plan_config(work / shape, case, None), source=case)
    model = load_model(str(work / shape))
    if cfg.model.lora_rank:
        from lucidrl.models.lora import apply_lora

        model = apply_lora(model, cfg.model)
    if cfg.model.enable_gradient_checkpointing:
        enable_activation_checkpointing(model)
    compute = autocast_dtype(cfg.model.dtype, cfg.model.compute_dtype)
    vocab = min(model.config.vocab_size, 32000)
    torch.manual_seed(0)
    rows = prompts * n
    prompt_ids = torch.randint(10, vocab, (prompts, prompt_len))
    t = time.perf_counter()
    if phase == "rollout":

        class _Tok:  # the engine reads pad and eos ids only (no stop rule)
            pad_token_id = 0
            eos_token_id = vocab + 1  # never sampled below `vocab`... nor at all: a row runs to the limit

        model.generation_config.eos_token_id = vocab + 1
        engine = HFRollout(
            model, _Tok(), micro_batch_size=cfg.rollout.micro_batch_size, compute_dtype=compute
        )
        batch = Batch(tensors={"prompts": prompt_ids, "prompt_mask": torch.ones(prompts, prompt_len, dtype=torch.long)},
                      non_tensors={"uid": [f"p{i}" for i in range(prompts)]})  # fmt: skip
        params = SamplingParams(n=n, max_new_tokens=response_len, temperature=1.0, do_sample=True)
        out = engine.generate(batch, params)
        assert int(out["response_mask"].sum()) == rows * response_len, "a row ended early"
    else:
        tensors = {
            "prompts": prompt_ids.repeat_interleave(n, 0),
            "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.long),
            "responses": torch.randint(10, vocab, (rows, response_len)),
            "response_mask": torch.ones(rows, response_len, dtype=torch.long),
            "advantages": torch.randn(rows, 1).expand(rows, response_len).contiguous(),
        }
        batch = Batch(tensors=tensors, non_tensors={"uid": [f"p{i // n}" for i in range(rows)]})
        actor = ActorWorker(model, cfg.actor, temperature=1.0, samples_per_prompt=n, compute_dtype=compute)
        old = actor.compute_log_prob(batch)
        log_prob_peak = peak_rss_mb()
        batch.set("old_log_probs", old["old_log_probs"])
        for _ in range(2):
            actor.update(batch)
        return {
            "log_prob_peak_mb": log_prob_peak,
            "peak_mb": peak_rss_mb(),
            "seconds": time.perf_counter() - t,
        }
    return {"peak_mb": peak_rss_mb(), "seconds": time.perf_counter() - t}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="smollm2,smollm2-ckpt,smollm2-whole-head,qwen0.5b")
    p.add_argument(
        "--work", default=None, help="where the built models are kept (default: a temporary folder)"
    )
    p.add_argument("--json", default=None)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--phase", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(Path(args.work), args.worker, args.phase)))
        return
    from lucidrl.config import config_from_dict
    from lucidrl.config.memory_plan import ALLOCATOR_SLACK
    from lucidrl.launch import tuned_env

    os.environ.update(tuned_env())  # the allocator settings `lucidrl` runs with, for the workers
    work = Path(args.work or tempfile.mkdtemp(prefix="memory_plan_"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"host: {torch.get_num_threads()} threads; models in {work}", flush=True)
    for case in args.cases.split(","):
        shape = CASES[case][0]
        build_model(shape, work)
        cfg = config_from_dict(plan_config(work / shape, case, None), source=case)
        plan = cfg._memory_plan
        print(f"\n{case}: " + "\n  ".join(plan.lines()))
        measured = {
            "train": run_variant(__file__, case, str(work), "--phase", "train"),
            "rollout": run_variant(__file__, case, str(work), "--phase", "rollout"),
        }
        for phase in plan.phases:
            kind, key = {"update": ("train", "peak_mb"), "log-prob": ("train", "log_prob_peak_mb"),
                         "rollout": ("rollout", "peak_mb")}[phase.name.split(" ")[0]]  # fmt: skip
            got = measured[kind]
            est = phase.total
            if not phase.name.startswith("update"):  # measured before any update: no gradients nor moments
                state = phase.parts.get("gradients", 0) + phase.parts.get("optimizer", 0)
                est -= int(state * (1 + ALLOCATOR_SLACK))
            rows.append({"case": case, "phase": phase.name, "estimate_mb": est / 2**20,
                         "peak_mb": got[key], "seconds": got["seconds"]})  # fmt: skip
            r = rows[-1]
            print(
                f"  {r['phase']}: estimate {r['estimate_mb']:.0f} MiB, measured {r['peak_mb']:.0f} MiB, "
                f"ratio {r['estimate_mb'] / r['peak_mb']:.2f}",
                flush=True,
            )
    print("\n| case | phase | estimate MiB | measured peak MiB | estimate / measured |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['phase']} | {r['estimate_mb']:.0f} | {r['peak_mb']:.0f} | "
              f"{r['estimate_mb'] / r['peak_mb']:.2f} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
