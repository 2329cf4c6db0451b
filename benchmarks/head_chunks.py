"""The LM head on chunks of response tokens (actor.head_chunk_tokens) against the whole micro-batch at once.

With a real vocabulary the logits dominate the actor's memory: Qwen2.5's 151,936 entries make one
micro-batch of 8 samples x 512 response tokens 2.5 GB of float32 logits, before the softmax of the
entropy and the gradient of either. Here: a Qwen2 with that vocabulary (hidden 256, 2 layers, tied
embeddings, random weights, built locally), 2 prompts of 128 tokens x 4 samples, responses of 512
tokens; one micro-batch of all 8. Per variant, in a fresh process each: the old-log-prob pass
(log-probs and entropy, no gradient) and one GRPO update (entropy as a metric), `--repeats` times.
Printed: median seconds of each pass and peak RSS growth over the process's RSS before the first
pass (the same weights and optimizer state in every variant), and the ratios to the whole-batch path.
"+ compile" variants add actor.use_torch_compile (fused log-prob and entropy kernels), compiled on a
smaller batch before the measurement.

    .venv/bin/python benchmarks/head_chunks.py [--repeats 2] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from processes import peak_rss_mb, rss_mb, run_variant

VOCAB, PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 151_936, 2, 4, 128, 512
VARIANTS = {  # name: (actor.head_chunk_tokens, actor.use_torch_compile)
    "whole micro-batch": (0, False),
    "4096 tokens": (4096, False),
    "1024 tokens": (1024, False),
    "256 tokens": (256, False),
    "whole + compile": (0, True),
    "256 tokens + compile": (256, True),
}


def prepare(work: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=1024,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(work / "model")
    rows = PROMPTS * N
    prompts = torch.randint(0, VOCAB, (PROMPTS, PROMPT_LEN)).repeat_interleave(N, 0)
    tensors = {
        "prompts": prompts,
        "prompt_mask": torch.ones(rows, PROMPT_LEN),
        "responses": torch.randint(0, VOCAB, (rows, RESPONSE_LEN)),
        "response_mask": torch.ones(rows, RESPONSE_LEN),
        "advantages": torch.randn(rows, 1).expand(rows, RESPONSE_LEN).contiguous(),
    }
    uids = [f"p{i // N}" for i in range(rows)]
    torch.save({"tensors": tensors, "non_tensors": {"uid": uids}}, work / "batch.pt")


def worker(work: Path, name: str, repeats: int) -> dict:
    from lucidrl.batch import Batch
    from lucidrl.config.schema import ActorConfig, OptimConfig
    from lucidrl.models import load_model
    from lucidrl.workers.actor import ActorWorker

    chunk, compiled = VARIANTS[name]
    torch.manual_seed(0)
    saved = torch.load(work / "batch.pt", weights_only=False)
    batch = Batch(tensors=saved["tensors"], non_tensors=saved["non_tensors"])
    rows = PROMPTS * N
    cfg = ActorConfig(
        optim=OptimConfig(lr=1e-5), ppo_mini_batch_size=PROMPTS, ppo_micro_batch_size=rows,
        log_prob_micro_batch_size=rows, head_chunk_tokens=chunk, use_torch_compile=compiled,
    )  # fmt: skip
    actor = ActorWorker(load_model(str(work / "model")), cfg, temperature=1.0, samples_per_prompt=N)
    if compiled:  # compile outside the measurement: a small batch of the same shapes' ranks
        warm = batch.select(list(range(N)))
        warm.set("old_log_probs", actor.compute_log_prob(warm)["old_log_probs"])
        actor.update(warm)
        actor = ActorWorker(load_model(str(work / "model")), cfg, temperature=1.0, samples_per_prompt=N)
    before = rss_mb()
    log_prob_s, update_s, first = [], [], None
    for _ in range(repeats):
        t = time.perf_counter()
        old = actor.compute_log_prob(batch)
        log_prob_s.append(time.perf_counter() - t)
        first = first if first is not None else old["old_log_probs"][:, :4].tolist()
        batch.set("old_log_probs", old["old_log_probs"])
        t = time.perf_counter()
        actor.update(batch)
        update_s.append(time.perf_counter() - t)
    return {
        "log_prob_s": statistics.median(log_prob_s),
        "update_s": statistics.median(update_s),
        "peak_growth_mb": peak_rss_mb() - before,
        "first_log_probs": first,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=",".join(VARIANTS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(Path(args.work), args.worker, args.repeats)))
        return
    names = args.only.split(",")
    if any(n not in VARIANTS for n in names):
        sys.exit(f"--only {args.only}: variants are {list(VARIANTS)}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        prepare(Path(tmp))
        for name in names:
            rows[name] = run_variant(__file__, name, tmp, "--repeats", str(args.repeats))
            print(f"  {name}: {rows[name]['log_prob_s']:.2f} s log-prob, {rows[name]['update_s']:.2f} s update, "
                  f"{rows[name]['peak_growth_mb']:.0f} MB", flush=True)  # fmt: skip
    base = rows[names[0]]
    ref = torch.tensor(base["first_log_probs"])
    print(
        f"\nvocabulary {VOCAB}, {PROMPTS * N} samples x ({PROMPT_LEN} prompt + {RESPONSE_LEN} response) tokens in "
        f"one micro-batch; Qwen2 256/2; median of {args.repeats}\n"
    )
    print(
        f"{'LM head on':18s} {'log-prob s':>11s} {'update s':>9s} {'peak RSS growth MB':>19s} "
        f"{'memory vs ' + names[0]:>28s} {'update time vs':>15s} {'max |dlogp|':>12s}"
    )
    for name, r in rows.items():
        dlogp = (torch.tensor(r["first_log_probs"]) - ref).abs().max().item()
        print(
            f"{name:18s} {r['log_prob_s']:11.2f} {r['update_s']:9.2f} {r['peak_growth_mb']:19.0f} "
            f"{r['peak_growth_mb'] / base['peak_growth_mb']:28.2f} {r['update_s'] / base['update_s']:15.2f} "
            f"{dlogp:12.1e}"
        )


if __name__ == "__main__":
    main()
