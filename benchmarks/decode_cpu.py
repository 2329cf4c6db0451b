"""Generation on the CPU: each of lucidrl's decode-loop changes, measured in one run.

step_vs_trl.py's setting: the tiny Qwen2 (hidden 256, 4 layers, GQA 4/2 heads, built locally), 64
Knights & Knaves prompts with Logic-RL's system prompt (about 240 tokens), 8 samples each at T=1, up
to 128 new tokens. The variants are cumulative, each adds one change to the one above:

    transformers/64    transformers' generate, 64 samples per call (8 prompts x 8)
    lucidrl/64         lucidrl's loop as of the previous release: prompts prefilled once, reserved
                       KV cache, finished rows dropped, torch.multinomial, prompt cache copied per sample
    +one call          all 512 samples in one call (rollout.micro_batch_size=512, now the default)
    +inverse CDF       sampling by one uniform draw per row (decode.sample_tokens)
    +shared prefix     the prompt's cache held and attended to once per prompt = lucidrl now

Printed: seconds for the 512 samples, generated tokens/s, the speed-up over lucidrl/64 and the share
of the decode roofline (step_vs_trl's measured fp32 matmul rate over 2 x parameters FLOPs per token, attention
ignored). Each variant first decodes a short warm-up batch; then `--repeats` timed runs (median).

    .venv/bin/python benchmarks/decode_cpu.py [--prompts 64] [--repeats 1] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

N_SAMPLES, MAX_NEW = 8, 128
VARIANTS = ["transformers/64", "lucidrl/64", "+one call", "+inverse CDF", "+shared prefix"]


def multinomial(probs: torch.Tensor) -> torch.Tensor:
    return torch.multinomial(probs, 1).squeeze(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--only", default=",".join(VARIANTS))
    args = p.parse_args()

    import step_vs_trl
    from step_vs_trl import matmul_gflops, prepare  # the same model, prompts and matmul rate

    from lucidrl.data.dataset import collate, load_prompts
    from lucidrl.models import load_model, load_tokenizer
    from lucidrl.workers import decode
    from lucidrl.workers.rollout_hf import HFRollout, SamplingParams

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        step_vs_trl.N_PROMPTS = args.prompts
        prep = prepare(Path(tmp))
        tok = load_tokenizer(prep["model"])
        model = load_model(prep["model"]).eval()
        samples, _ = load_prompts([prep["train"]], tok, max_prompt_length=4096)
    batch = collate(samples, tok.pad_token_id)
    warm = collate(samples[:2], tok.pad_token_id)
    params = SamplingParams(n=N_SAMPLES, temperature=1.0, max_new_tokens=MAX_NEW)
    rows = args.prompts * N_SAMPLES
    roofline = matmul_gflops() * 1e9 / (2 * prep["params"])
    print(
        f"{args.prompts} prompts x {N_SAMPLES} samples, <= {MAX_NEW} new tokens, tiny Qwen2 "
        f"{prep['params'] / 1e6:.1f}M params, mean prompt {batch['prompt_mask'].sum(1).float().mean():.0f} "
        f"tokens; decode roofline {roofline:.0f} tok/s",
        flush=True,
    )
    shared_ok, sample_tokens = decode._can_share_prefix, decode.sample_tokens
    results: dict[str, tuple[float, float]] = {}
    for name in args.only.split(","):
        if name not in VARIANTS:
            raise SystemExit(f"--only: unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
        level = VARIANTS.index(name)
        loop = "transformers" if level == 0 else "lucidrl"
        rollout = HFRollout(model, tok, micro_batch_size=64 if level <= 1 else rows, decode_loop=loop)
        decode.sample_tokens = sample_tokens if level >= 3 else multinomial  # type: ignore[assignment]
        decode._can_share_prefix = shared_ok if level >= 4 else (lambda m: False)  # type: ignore[assignment]
        try:
            rollout.generate(warm, SamplingParams(n=N_SAMPLES, max_new_tokens=8))
            secs, toks = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = rollout.generate(batch, params)
                secs.append(time.perf_counter() - start)
                toks.append(int(out["response_mask"].sum()))
        finally:
            decode._can_share_prefix, decode.sample_tokens = shared_ok, sample_tokens
        tps = statistics.median(t / s for s, t in zip(secs, toks, strict=True))
        results[name] = (statistics.median(secs), tps)
        print(f"  {name}: {results[name][0]:.2f} s, {tps:.0f} tok/s", flush=True)
    base = results.get("lucidrl/64", next(iter(results.values())))[1]
    print(f"\n{'variant':16s} {f's/{rows}':>8s} {'tok/s':>8s} {'vs lucidrl/64':>14s} {'of roofline':>12s}")
    for name, (s, tps) in results.items():
        print(f"{name:16s} {s:8.2f} {tps:8.0f} {tps / base:14.2f} {tps / roofline:12.2f}")


if __name__ == "__main__":
    main()
