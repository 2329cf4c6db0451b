"""The update's micro-batches: fixed sample counts against token budgets (actor.use_dynamic_bsz).

step_vs_trl.py's model and prompts (tiny Qwen2, hidden 256, 4 layers; 64 Knights & Knaves prompts of
about 240 tokens, 8 samples each), responses sampled from the model and cut to lengths drawn
uniformly from 8-128 tokens, as a rollout whose samples end at different times. Per variant, in a
fresh process each (so one variant's allocations do not hide another's peak): the old-log-prob pass
(ActorWorker.compute_log_prob) and one GRPO update of all 512 samples (one optimizer step, no KL),
`--repeats` times. Printed: micro-batches per update and the most padded tokens one held, median
seconds of each pass, and peak RSS growth over the process's RSS before the first pass (activations,
gradients and optimizer state; the same optimizer state in every variant).

    .venv/bin/python benchmarks/update_micro_batches.py [--repeats 2] [--only NAME,...]
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

N_PROMPTS, N_SAMPLES, MAX_NEW = 64, 8, 128
# name -> (actor overrides); log-prob micro-batches are twice the update's, as in verl's defaults
VARIANTS = {
    "8 samples": {"ppo_micro_batch_size": 8, "log_prob_micro_batch_size": 16},
    "64 samples": {"ppo_micro_batch_size": 64, "log_prob_micro_batch_size": 128},
    "8k tokens": {
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 8192,
        "log_prob_max_token_len_per_gpu": 16384,
    },
    "16k tokens": {
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 16384,
        "log_prob_max_token_len_per_gpu": 32768,
    },
    "32k tokens": {
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 32768,
        "log_prob_max_token_len_per_gpu": 65536,
    },
}


def make_batch(work: Path) -> None:
    """Sample 64 x 8 responses from the model, cut them to lengths in 8-128, save the batch."""
    import step_vs_trl
    from step_vs_trl import prepare

    from lucidrl.data.dataset import collate, load_prompts
    from lucidrl.models import load_model, load_tokenizer
    from lucidrl.workers.rollout.engine import SamplingParams
    from lucidrl.workers.rollout.hf_engine import HFRollout

    step_vs_trl.N_PROMPTS = N_PROMPTS
    prep = prepare(work)
    tok = load_tokenizer(prep["model"])
    model = load_model(prep["model"]).eval()
    samples, _ = load_prompts([prep["train"]], tok, max_prompt_length=4096)
    torch.manual_seed(0)
    out = HFRollout(model, tok, micro_batch_size=512).generate(
        collate(samples[:N_PROMPTS], tok.pad_token_id), SamplingParams(n=N_SAMPLES, max_new_tokens=MAX_NEW)
    )
    lengths = torch.randint(8, MAX_NEW + 1, (len(out),), generator=torch.Generator().manual_seed(0))
    lengths = torch.minimum(lengths, out["response_mask"].sum(-1).long())
    mask = (torch.arange(out["responses"].shape[1])[None, :] < lengths[:, None]).float()
    out.set("response_mask", mask)
    out.set("responses", torch.where(mask.bool(), out["responses"], tok.pad_token_id))
    out.set("advantages", torch.randn(len(out), 1).expand_as(mask) * mask)
    torch.save({"tensors": out.tensors, "non_tensors": out.non_tensors}, work / "batch.pt")
    (work / "prep.json").write_text(json.dumps(prep))


def worker(work: Path, name: str, repeats: int) -> dict:
    from lucidrl.batch import Batch
    from lucidrl.config.schema import ActorConfig, OptimConfig
    from lucidrl.models import load_model
    from lucidrl.workers.training.actor import ActorWorker

    torch.manual_seed(0)
    prep = json.loads((work / "prep.json").read_text())
    saved = torch.load(work / "batch.pt", weights_only=False)
    batch = Batch(tensors=saved["tensors"], non_tensors=saved["non_tensors"])
    cfg = ActorConfig(optim=OptimConfig(lr=1e-5), ppo_mini_batch_size=N_PROMPTS, **VARIANTS[name])
    actor = ActorWorker(load_model(prep["model"]), cfg, temperature=1.0, samples_per_prompt=N_SAMPLES)
    ubs = actor._micro_batches(batch)
    tokens = [len(ub) * (ub["prompts"].shape[1] + ub["responses"].shape[1]) for ub in ubs]
    before = rss_mb()
    log_prob_s, update_s = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        old = actor.compute_log_prob(batch)
        log_prob_s.append(time.perf_counter() - t)
        batch.set("old_log_probs", old["old_log_probs"])
        t = time.perf_counter()
        actor.update(batch)
        update_s.append(time.perf_counter() - t)
    peak = peak_rss_mb()
    return {
        "micro_batches": len(ubs),
        "max_tokens": max(tokens),
        "log_prob_s": statistics.median(log_prob_s),
        "update_s": statistics.median(update_s),
        "peak_growth_mb": peak - before,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=",".join(VARIANTS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(Path(args.work), args.worker, args.repeats)))
        return
    names = args.only.split(",")
    if any(n not in VARIANTS for n in names):
        sys.exit(f"--only {args.only}: variants are {list(VARIANTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_batch(work)
        saved = torch.load(work / "batch.pt", weights_only=False)
        prompt_width = saved["tensors"]["prompts"].shape[1]
        mean_len = saved["tensors"]["response_mask"].sum(-1).mean().item()
        rows = {}
        for name in names:
            rows[name] = run_variant(__file__, name, tmp, "--repeats", str(args.repeats))
            print(f"  {name}: {rows[name]}", flush=True)
    print(
        f"\nGRPO update of {N_PROMPTS} x {N_SAMPLES} samples (prompt width {prompt_width}, responses 8-{MAX_NEW} "
        f"tokens, mean {mean_len:.0f}), tiny Qwen2 256/4; median of {args.repeats}\n"
    )
    base = rows[names[0]]
    print(
        f"{'micro-batches':13s} {'count':>6s} {'max tokens':>11s} {'log-prob s':>11s} {'update s':>9s} "
        f"{'vs ' + names[0]:>14s} {'peak RSS growth MB':>19s}"
    )
    for name, r in rows.items():
        print(
            f"{name:13s} {r['micro_batches']:6d} {r['max_tokens']:11d} {r['log_prob_s']:11.2f} "
            f"{r['update_s']:9.2f} {base['update_s'] / r['update_s']:14.2f} {r['peak_growth_mb']:19.0f}"
        )


if __name__ == "__main__":
    main()
