"""Rollout throughput on a lent GPU: vLLM against transformers' generate and lucidrl's decode loop.

One small Qwen2 built locally (no hub: hidden 1024, 8 layers by default, about 100M parameters, with
the K&K tokenizer), the same K&K prompts, n samples each at T=1, up to --max-new tokens, min_tokens
unset so each engine stops rows at eos as it would in training. Engines run one after the other in
this process, the first call of each is warm-up (CUDA graphs, kernels) and not counted; printed:
median seconds per batch, generated tokens/s and the ratio to transformers' generate, plus the peak
GPU memory each engine held. vLLM is measured only when it imports and CUDA is there (`pip install
-c constraints.txt 'lucidrl[vllm]'` once the extra exists; vllm 0.32.0 pins torch 2.13.0).

    python benchmarks/gpu_rollout.py                      # on the GPU machine, a few minutes
    python benchmarks/gpu_rollout.py --device cpu --hidden 128 --layers 2 --prompts 4 --max-new 16   # smoke test
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def build(work: Path, hidden: int, layers: int, n_prompts: int):
    from lucidrl.data.dataset import load_prompts
    from lucidrl.data.kk import write_kk_parquet
    from lucidrl.models import build_tiny_model, load_tokenizer
    from lucidrl.trainer.demo import kk_tokenizer_corpus

    data = write_kk_parquet(work / "data", people=(2, 4), n_train=n_prompts, n_val=1, seed=0)
    heads = max(4, hidden // 64)
    info = build_tiny_model(
        work / "model", kk_tokenizer_corpus(0), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=max(1, heads // 4), seed=0,
    )  # fmt: skip
    tok = load_tokenizer(info["path"])
    samples, _ = load_prompts([data["train"]], tok, max_prompt_length=4096)
    return info, tok, samples


def time_runs(fn, repeats: int) -> tuple[list[float], list[int]]:
    secs, toks = [], []
    for _ in range(repeats + 1):  # the first is warm-up
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        n_tokens = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        secs.append(time.perf_counter() - start)
        toks.append(n_tokens)
    return secs[1:], toks[1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default: bf16 on GPU")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))

    from lucidrl.data.dataset import collate
    from lucidrl.models import load_model
    from lucidrl.workers.rollout_hf import HFRollout, SamplingParams

    results: dict[str, tuple[list[float], list[int], float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        info, tok, samples = build(Path(tmp), args.hidden, args.layers, args.prompts)
        print(
            f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, {info['num_parameters'] / 1e6:.0f}M params, {dtype}"
        )
        batch = collate(samples, tok.pad_token_id)
        params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new)
        model = load_model(info["path"], dtype=dtype).to(args.device).eval()
        for name, loop in (("transformers", "transformers"), ("lucidrl", "lucidrl")):
            rollout = HFRollout(model, tok, micro_batch_size=args.prompts * args.n, decode_loop=loop)

            def run(rollout=rollout) -> int:
                return int(rollout.generate(batch, params)["response_mask"].sum())

            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            secs, toks = time_runs(run, args.repeats)
            peak = (
                torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else float("nan")
            )
            results[name] = (secs, toks, peak)
            print(f"  {name}: {statistics.median(secs):.2f} s per batch", flush=True)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        try:
            import vllm  # noqa: F401

            have_vllm = args.device.startswith("cuda")
        except ImportError:
            have_vllm = False
        if have_vllm:
            from vllm import LLM
            from vllm import SamplingParams as VSampling

            llm = LLM(
                model=info["path"],
                dtype=str(dtype).removeprefix("torch."),
                gpu_memory_utilization=0.5,
                seed=0,
            )
            vparams = VSampling(n=args.n, temperature=1.0, max_tokens=args.max_new)
            prompts = [{"prompt_token_ids": list(s.input_ids)} for s in samples]

            def run_vllm() -> int:
                outs = llm.generate(prompts, vparams, use_tqdm=False)
                return sum(len(c.token_ids) for o in outs for c in o.outputs)

            secs, toks = time_runs(run_vllm, args.repeats)
            results["vllm"] = (secs, toks, float("nan"))  # vLLM reserves gpu_memory_utilization up front
        else:
            print("  vllm: not measured (needs `import vllm` to work and --device cuda)")

    base = statistics.median(
        t / s for s, t in zip(results["transformers"][0], results["transformers"][1], strict=True)
    )
    print(f"\n{args.prompts} prompts x {args.n} samples, <= {args.max_new} new tokens, T=1, {args.device}")
    print(f"{'engine':14s} {'s/batch':>8s} {'tok/s':>10s} {'vs generate':>12s} {'peak GiB':>9s}")
    for name, (secs, toks, peak) in results.items():
        tps = statistics.median(t / s for s, t in zip(secs, toks, strict=True))
        print(f"{name:14s} {statistics.median(secs):8.2f} {tps:10.0f} {tps / base:12.2f} {peak:9.2f}")


if __name__ == "__main__":
    main()
