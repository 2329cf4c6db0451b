"""float32, bfloat16 compute over float32 weights (`model.compute_dtype=bfloat16`), and bfloat16 weights.

step_vs_trl's model and prompts (4.1M Qwen2, hidden 256, 4 layers). Per variant, in a fresh process:
one rollout of `--prompts` x 8 samples (lucidrl's decode loop, all in one call), the old-log-prob
pass, one GRPO update of all samples (one mini-batch), `--repeats` times; median seconds of each.
Consistency columns:

- rollout vs update: max and mean |rollout log-prob - the actor's own log-prob| of the same tokens
  (what `rollout/logprob_diff_max` reports in training; the trainer never uses the rollout's
  log-probs as the old ones, so this is a measure of rounding, not of a bias);
- vs float32: max and mean |log-prob - the float32 model's| on the float32 variant's samples (the
  precision's error in the quantity the loss is made of).

On CPUs without native bfloat16 (AVX-512 BF16 / AMX) its matmuls are emulated and slow; the speed
columns mean something on GPUs (`--device cuda`), the consistency columns everywhere.

    .venv/bin/python benchmarks/mixed_precision.py [--prompts 8] [--repeats 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from processes import peak_rss_mb, rss_mb, run_variant

N_SAMPLES, MAX_NEW = 8, 64
VARIANTS = {  # name: (model.dtype, model.compute_dtype)
    "float32": ("float32", None),
    "bf16 compute, fp32 weights": ("float32", "bfloat16"),
    "bf16 weights": ("bfloat16", None),
}


def _abs_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    d = (a - b).abs()[mask.bool()]
    return d.max().item(), d.mean().item()


def worker(work: Path, name: str, device: str, repeats: int) -> dict:
    from lucidrl.batch import Batch
    from lucidrl.config.schema import ActorConfig, OptimConfig
    from lucidrl.data.dataset import collate, load_prompts
    from lucidrl.models import load_model, load_tokenizer
    from lucidrl.models.loading import DTYPES
    from lucidrl.models.precision import autocast_dtype
    from lucidrl.workers.rollout.engine import SamplingParams
    from lucidrl.workers.rollout.hf_engine import HFRollout
    from lucidrl.workers.training.actor import ActorWorker

    prep = json.loads((work / "prep.json").read_text())
    dtype, compute = VARIANTS[name]
    autocast = autocast_dtype(dtype, compute)
    tok = load_tokenizer(prep["model"])
    model = load_model(prep["model"], dtype=DTYPES[dtype]).to(device)
    samples, _ = load_prompts([prep["train"]], tok, max_prompt_length=4096)
    prompts = collate(samples[: prep["prompts"]], tok.pad_token_id).to(device)
    rows = prep["prompts"] * N_SAMPLES
    rollout = HFRollout(model, tok, micro_batch_size=rows, compute_dtype=autocast)
    cfg = ActorConfig(
        optim=OptimConfig(lr=1e-5), ppo_mini_batch_size=prep["prompts"], ppo_micro_batch_size=64,
        log_prob_micro_batch_size=64,
    )  # fmt: skip
    actor = ActorWorker(model, cfg, temperature=1.0, samples_per_prompt=N_SAMPLES, compute_dtype=autocast)
    params = SamplingParams(n=N_SAMPLES, temperature=1.0, max_new_tokens=MAX_NEW)
    rollout.generate(prompts.slice(0, 1), SamplingParams(n=2, max_new_tokens=4))  # warm-up
    before = rss_mb()
    cuda = device.startswith("cuda")

    def now() -> float:  # CUDA runs asynchronously: wait for the queued work before reading the clock
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    decode_s, log_prob_s, update_s, tokens = [], [], [], 0
    for i in range(repeats):
        torch.manual_seed(i)
        t = now()
        out = rollout.generate(prompts, params)
        decode_s.append(now() - t)
        tokens = int(out["response_mask"].sum())
        t = now()
        old = actor.compute_log_prob(out)
        log_prob_s.append(now() - t)
        if i == 0:
            consistency = _abs_diff(out["rollout_log_probs"], old["old_log_probs"], out["response_mask"])
            first = out
        out.update(old)
        adv = torch.randn(rows, 1, device=device).expand_as(out["response_mask"]) * out["response_mask"]
        out.set("advantages", adv)
        t = now()
        actor.update(out)
        update_s.append(now() - t)
    # the float32 variant's samples, scored by this variant's first weights (reloaded: the update moved them)
    shared = work / "fp32_samples.pt"
    if name == "float32":
        torch.save(
            {"tensors": {k: v.cpu() for k, v in first.tensors.items()}, "non_tensors": first.non_tensors},
            shared,
        )
    saved = torch.load(shared, weights_only=False)
    ref_batch = Batch(tensors=saved["tensors"], non_tensors=saved["non_tensors"]).to(device)
    fresh = ActorWorker(
        load_model(prep["model"], dtype=DTYPES[dtype]).to(device), cfg, temperature=1.0,
        samples_per_prompt=N_SAMPLES, compute_dtype=autocast,
    )  # fmt: skip
    scored = fresh.compute_log_prob(ref_batch)["old_log_probs"].cpu()
    if name == "float32":
        torch.save(scored, work / "fp32_log_probs.pt")
    exact = torch.load(work / "fp32_log_probs.pt")
    return {
        "decode_s": statistics.median(decode_s),
        "tokens": tokens,
        "log_prob_s": statistics.median(log_prob_s),
        "update_s": statistics.median(update_s),
        "rollout_vs_update": consistency,
        "vs_fp32": _abs_diff(scored, exact, saved["tensors"]["response_mask"]),
        # on a GPU the memory that matters is the device's, not the host's RSS
        "peak_growth_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb() - before,
        "param_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(Path(args.work), args.worker, args.device, args.repeats)))
        return
    import step_vs_trl

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        step_vs_trl.N_PROMPTS = args.prompts
        prep = step_vs_trl.prepare(Path(tmp))
        (Path(tmp) / "prep.json").write_text(json.dumps({**prep, "prompts": args.prompts}))
        for name in VARIANTS:  # float32 first: the others are compared with its samples and log-probs
            rows[name] = r = run_variant(
                __file__, name, tmp, "--device", args.device, "--repeats", str(args.repeats)
            )
            print(f"  {name}: decode {r['decode_s']:.1f} s, update {r['update_s']:.1f} s", flush=True)
    print(
        f"\n{args.prompts} prompts x {N_SAMPLES} samples, <= {MAX_NEW} new tokens, Qwen2 "
        f"{prep['params'] / 1e6:.1f}M on {args.device}; median of {args.repeats}\n"
    )
    base = rows["float32"]
    print(
        f"{'variant':27s} {'weights':>8s} {'decode tok/s':>12s} {'log-prob s':>10s} {'update s':>8s} "
        f"{'update vs fp32':>14s} {'rollout-update max/mean':>24s} {'vs fp32 max/mean':>18s} "
        f"{'GPU peak MB' if args.device.startswith('cuda') else 'peak MB':>11s}"
    )
    for name, r in rows.items():
        ru, vf = r["rollout_vs_update"], r["vs_fp32"]
        print(
            f"{name:27s} {r['param_dtype']:>8s} {r['tokens'] / r['decode_s']:12.0f} {r['log_prob_s']:10.2f} "
            f"{r['update_s']:8.2f} {r['update_s'] / base['update_s']:14.2f} "
            f"{ru[0]:11.1e} / {ru[1]:8.1e} {vf[0]:8.1e} / {vf[1]:7.1e} {r['peak_growth_mb']:11.0f}"
        )


if __name__ == "__main__":
    main()
