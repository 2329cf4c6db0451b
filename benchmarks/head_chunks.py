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
smaller batch before the measurement. A chunked head that is a plain nn.Linear runs as one autograd
function (lucidrl.algos.head_logprob); the whole-micro-batch path keeps the logits, their float32
copy and their gradient.

`--model DIR` measures a real model folder instead, on the demo's micro-batch: 4 prompts x 8 samples,
70-token prompts, 64-token responses of 5 to 64 tokens (seeded), bf16 compute where `--bf16` is given
(the demo's on a CPU with native bf16). Every variant runs with lucidrl's allocator settings
(lucidrl.launch), as the `lucidrl` command does.

    .venv/bin/python benchmarks/head_chunks.py [--repeats 2] [--only NAME,...]
    .venv/bin/python benchmarks/head_chunks.py --model outputs/demo/model --bf16 --repeats 3 \\
        --only "whole micro-batch,1024 tokens,256 tokens"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from processes import peak_rss_mb, rss_mb, run_variant

VOCAB, PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 151_936, 2, 4, 128, 512
REAL = {"prompts": 4, "n": 8, "prompt_len": 70, "response_len": 64}  # --model: the demo's micro-batch
VARIANTS = {  # name: (actor.head_chunk_tokens, actor.use_torch_compile)
    "whole micro-batch": (0, False),
    "4096 tokens": (4096, False),
    "1024 tokens": (1024, False),
    "256 tokens": (256, False),
    "whole + compile": (0, True),
    "256 tokens + compile": (256, True),
}


def shape(model: str | None) -> tuple[int, int, int, int]:
    """(prompts, samples per prompt, prompt tokens, response tokens) of the measured micro-batch."""
    if model:
        return REAL["prompts"], REAL["n"], REAL["prompt_len"], REAL["response_len"]
    return PROMPTS, N, PROMPT_LEN, RESPONSE_LEN


def prepare(work: Path, model: str | None) -> int:
    """The model folder (built, or --model's) and the batch, in `work`; returns the vocabulary size."""
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if model:
        vocab = AutoConfig.from_pretrained(model, local_files_only=True).vocab_size
    else:
        vocab = VOCAB
        config = Qwen2Config(
            vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=1024,
        )  # fmt: skip
        Qwen2ForCausalLM(config).save_pretrained(work / "model")
    prompts_n, n, prompt_len, response_len = shape(model)
    rows = prompts_n * n
    lengths = torch.randint(5, response_len + 1, (rows,)) if model else torch.full((rows,), response_len)
    tensors = {
        "prompts": torch.randint(0, vocab, (prompts_n, prompt_len)).repeat_interleave(n, 0),
        "prompt_mask": torch.ones(rows, prompt_len),
        "responses": torch.randint(0, vocab, (rows, response_len)),
        "response_mask": (torch.arange(response_len)[None, :] < lengths[:, None]).float(),
        "advantages": torch.randn(rows, 1).expand(rows, response_len).contiguous(),
    }
    uids = [f"p{i // n}" for i in range(rows)]
    torch.save({"tensors": tensors, "non_tensors": {"uid": uids}}, work / "batch.pt")
    return vocab


def worker(
    work: Path, name: str, repeats: int, model: str | None, bf16: bool, attn: str | None = None,
    save_log_probs: Path | None = None,
) -> dict:  # fmt: skip
    """One variant's passes, in this process; `attn`: model.attn_implementation, and the first pass's
    log-probs saved to `save_log_probs` (both for benchmarks/attention_cpu.py)."""
    from lucidrl.batch import Batch
    from lucidrl.config.schema import ActorConfig, OptimConfig
    from lucidrl.models import load_model
    from lucidrl.workers.training.actor import ActorWorker

    chunk, compiled = VARIANTS[name]
    torch.manual_seed(0)
    saved = torch.load(work / "batch.pt", weights_only=False)
    batch = Batch(tensors=saved["tensors"], non_tensors=saved["non_tensors"])
    prompts_n, n, _, _ = shape(model)
    rows = prompts_n * n
    cfg = ActorConfig(
        optim=OptimConfig(lr=1e-5), ppo_mini_batch_size=prompts_n, ppo_micro_batch_size=rows,
        log_prob_micro_batch_size=rows, head_chunk_tokens=chunk, use_torch_compile=compiled,
    )  # fmt: skip
    path = model or str(work / "model")
    kw = {"temperature": 1.0, "samples_per_prompt": n, "compute_dtype": torch.bfloat16 if bf16 else None}
    actor = ActorWorker(load_model(path, attn_implementation=attn), cfg, **kw)
    if compiled:  # compile outside the measurement: a small batch of the same shapes' ranks
        warm = batch.select(list(range(N)))
        warm.set("old_log_probs", actor.compute_log_prob(warm)["old_log_probs"])
        actor.update(warm)
        actor = ActorWorker(load_model(path, attn_implementation=attn), cfg, **kw)
    before = rss_mb()
    log_prob_s, update_s, first = [], [], None
    for _ in range(repeats):
        t = time.perf_counter()
        old = actor.compute_log_prob(batch)
        log_prob_s.append(time.perf_counter() - t)
        if first is None and save_log_probs is not None:
            torch.save(old["old_log_probs"], save_log_probs)
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
    p.add_argument("--model", help="a real model folder (default: a built Qwen2 with a 151,936 vocabulary)")
    p.add_argument(
        "--bf16", action="store_true", help="bf16 compute over float32 weights (model.compute_dtype)"
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(Path(args.work), args.worker, args.repeats, args.model, args.bf16)))
        return
    from lucidrl.launch import tuned_env

    os.environ.update(tuned_env())  # the variants' processes allocate as `lucidrl` commands do
    names = args.only.split(",")
    if any(n not in VARIANTS for n in names):
        sys.exit(f"--only {args.only}: variants are {list(VARIANTS)}")
    rows = {}
    extra = ["--repeats", str(args.repeats), *(["--model", args.model] if args.model else [])]
    extra += ["--bf16"] if args.bf16 else []
    with tempfile.TemporaryDirectory() as tmp:
        vocab = prepare(Path(tmp), args.model)
        for name in names:
            rows[name] = run_variant(__file__, name, tmp, *extra)
            print(f"  {name}: {rows[name]['log_prob_s']:.2f} s log-prob, {rows[name]['update_s']:.2f} s update, "
                  f"{rows[name]['peak_growth_mb']:.0f} MB", flush=True)  # fmt: skip
    base = rows[names[0]]
    ref = torch.tensor(base["first_log_probs"])
    prompts_n, n, prompt_len, response_len = shape(args.model)
    print(
        f"\nvocabulary {vocab}, {prompts_n * n} samples x ({prompt_len} prompt + {response_len} response) tokens "
        f"in one micro-batch; {args.model or 'Qwen2 256/2'}, {'bf16 compute' if args.bf16 else 'float32'}; "
        f"median of {args.repeats}\n"
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
