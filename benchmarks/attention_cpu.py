"""Attention code on the CPU (model.attn_implementation): transformers' sdpa against eager, per precision.

On the demo's micro-batch of a real model (head_chunks.py's `--model` batch: 4 prompts x 8 samples,
70-token prompts, responses of 5 to 64 tokens; the LM head on 1,024-token chunks, as the demo runs it),
in a fresh process per variant, with lucidrl's allocator settings: the old-log-prob pass and one GRPO
update with its AdamW step, `--repeats` times. Printed: median seconds of each pass, peak RSS growth,
the ratios to sdpa in the same precision, and how far each variant's log-probs of the batch's response
tokens lie from float32 sdpa's (the most exact of the four).

sdpa runs PyTorch's CPU flash-attention kernel (forward and backward); eager runs the attention as
two matrix products and a softmax, keeping the (heads x length x length) probabilities for the
backward. Under bf16 compute on an AMX CPU lucidrl keeps sdpa's attention in bfloat16; without AMX it
runs it in float32 (lucidrl.models.precision.float32_attention_wanted).

    .venv/bin/python benchmarks/attention_cpu.py --model outputs/demo/model [--repeats 3] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from head_chunks import prepare, worker
from processes import run_variant

VARIANTS = {  # name: (model.attn_implementation, bf16 compute)
    "sdpa float32": ("sdpa", False),
    "eager float32": ("eager", False),
    "sdpa bf16": ("sdpa", True),
    "eager bf16": ("eager", True),
}
CHUNK = "1024 tokens"  # head_chunks.py's variant for the demo's actor.head_chunk_tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", required=True, help="a model folder, e.g. outputs/demo/model (SmolLM2-135M-Instruct)"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=",".join(VARIANTS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        attn, bf16 = VARIANTS[args.worker]
        work = Path(args.work)
        saved = work / f"{args.worker.replace(' ', '_')}.pt"
        print(json.dumps(worker(work, CHUNK, args.repeats, args.model, bf16, attn, save_log_probs=saved)))
        return
    from lucidrl.launch import tuned_env
    from lucidrl.models.precision import cpu_has_amx, cpu_has_native_bf16

    os.environ.update(tuned_env())  # the variants' processes allocate as `lucidrl` commands do
    names = args.only.split(",")
    if any(n not in VARIANTS for n in names):
        sys.exit(f"--only {args.only}: variants are {list(VARIANTS)}")
    rows, log_probs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        prepare(Path(tmp), args.model)
        mask = torch.load(Path(tmp) / "batch.pt", weights_only=False)["tensors"]["response_mask"].bool()
        for name in names:
            rows[name] = run_variant(
                __file__, name, tmp, "--repeats", str(args.repeats), "--model", args.model
            )
            log_probs[name] = torch.load(Path(tmp) / f"{name.replace(' ', '_')}.pt")[mask]
            r = rows[name]
            print(f"  {name}: {r['log_prob_s']:.2f} s log-prob, {r['update_s']:.2f} s update", flush=True)
    print(
        f"\n{args.model}; the demo's micro-batch, LM head on {CHUNK} chunks; median of {args.repeats}; "
        f"native bf16: {cpu_has_native_bf16()}, AMX: {cpu_has_amx()}\n"
    )
    print(
        f"{'variant':15s} {'log-prob s':>11s} {'update s':>9s} {'peak RSS growth MB':>19s} "
        f"{'log-prob vs sdpa':>17s} {'update vs sdpa':>15s} {'|dlogp| vs sdpa float32: mean':>30s} {'max':>8s}"
    )
    exact = log_probs.get("sdpa float32")
    for name, r in rows.items():
        ref = rows.get(f"sdpa {name.split()[1]}", r)
        gap = (log_probs[name] - exact).abs() if exact is not None else torch.full((1,), float("nan"))
        print(
            f"{name:15s} {r['log_prob_s']:11.2f} {r['update_s']:9.2f} {r['peak_growth_mb']:19.0f} "
            f"{r['log_prob_s'] / ref['log_prob_s']:17.2f} {r['update_s'] / ref['update_s']:15.2f} "
            f"{gap.mean().item():30.1e} {gap.max().item():8.1e}"
        )


if __name__ == "__main__":
    main()
