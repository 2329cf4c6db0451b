"""Rollout throughput on a lent GPU: vLLM against transformers' generate and lucidrl's decode loop.

One small Qwen2 built locally (no hub: hidden 1024, 8 layers by default, about 100M parameters, with
the K&K tokenizer), the same K&K prompts, n samples each at T=1, up to --max-new tokens, min_tokens
unset so each engine stops rows at eos as it would in training. Engines run one after the other in
this process, the first call of each is warm-up (CUDA graphs, kernels) and not counted; printed:
median seconds per batch, generated tokens/s and the ratio to transformers' generate, plus the peak
GPU memory the HF engines allocated through PyTorch (vLLM allocates outside PyTorch's allocator in
sleep mode: its row has no peak; its "in use" figures are the whole device's, from
cudaMemGetInfo, the HF model and PyTorch's cache included). vLLM is measured only when it imports and CUDA is there (`pip install
-c constraints.txt 'lucidrl[vllm]'`; vllm 0.32.0 pins torch 2.13.0), through lucidrl's own engine
(`rollout.name=vllm`: weights pushed in memory, sleep between generations, its s/batch includes the
push); it also checks that the pushed weights are the ones vLLM samples with (log-probs of its samples
against the HF forward, before and after the push of perturbed weights).

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

MAX_PROMPT = 4096  # prompt tokens the engines are sized for (K&K prompts of 2-4 people are ~300)


def build(work: Path, hidden: int, layers: int, n_prompts: int, max_new: int):
    from lucidrl.data.dataset import load_prompts
    from lucidrl.data.kk import write_kk_parquet
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model, load_tokenizer

    data = write_kk_parquet(work / "data", people=(2, 4), n_train=n_prompts, n_val=1, seed=0)
    heads = max(4, hidden // 64)
    info = build_tiny_model(
        work / "model", kk_tokenizer_corpus(0), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=max(1, heads // 4), seed=0,
        # vLLM refuses a max_model_len above the model's max_position_embeddings
        max_position_embeddings=MAX_PROMPT + max_new,
    )  # fmt: skip
    tok = load_tokenizer(info["path"])
    samples, _ = load_prompts([data["train"]], tok, max_prompt_length=MAX_PROMPT)
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
    p.add_argument(
        "--engines",
        choices=["all", "hf", "vllm"],
        default="all",
        help="hf: transformers' generate and lucidrl's loop only; vllm: lucidrl's vLLM engine only (its "
        "cold start, compiling and CUDA-graph capture, can take minutes: give it a step of its own)",
    )
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))

    from lucidrl.data.dataset import collate
    from lucidrl.models import load_model
    from lucidrl.workers.rollout.engine import SamplingParams
    from lucidrl.workers.rollout.hf_engine import HFRollout

    results: dict[str, tuple[list[float], list[int], float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        info, tok, samples = build(Path(tmp), args.hidden, args.layers, args.prompts, args.max_new)
        print(
            f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, {info['num_parameters'] / 1e6:.0f}M params, {dtype}"
        )
        batch = collate(samples, tok.pad_token_id)
        params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new)
        model = load_model(info["path"], dtype=dtype).to(args.device).eval()
        loops = (("transformers", "transformers"), ("lucidrl", "lucidrl")) if args.engines != "vllm" else ()
        for name, loop in loops:
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
        check = None
        if args.engines == "hf":
            print("  vllm: not measured (--engines hf)")
        try:
            if args.engines == "hf":
                raise ImportError("not asked for")
            # not `import vllm`: it loads its names lazily, so a vLLM built for another torch imports fine
            # and fails only here (or when its compiled ops load)
            from vllm import LLM, SamplingParams  # noqa: F401

            have_vllm = args.device.startswith("cuda")
            if not have_vllm:
                print("  vllm: not measured (needs --device cuda)")
        except Exception as e:  # noqa: BLE001 - an ImportError, or a torch/vLLM mismatch of any kind
            have_vllm = False
            if args.engines != "hf":
                print(f"  vllm: not measured ({type(e).__name__}: {' '.join(str(e).split())[:300]})")
        if have_vllm:
            try:
                check = vllm_engine_check(info, tok, model, batch, samples, args, dtype)
                results["vllm"] = check.pop("timing")
            except Exception as e:  # noqa: BLE001 - the other engines' table still prints
                check = None
                print(f"  vllm: failed: {type(e).__name__}: {' '.join(str(e).split())[:500]}")

    base = (
        statistics.median(
            t / s for s, t in zip(results["transformers"][0], results["transformers"][1], strict=True)
        )
        if "transformers" in results
        else float("nan")  # --engines vllm: no generate to compare with in this run
    )
    print(f"\n{args.prompts} prompts x {args.n} samples, <= {args.max_new} new tokens, T=1, {args.device}")
    print(f"{'engine':14s} {'s/batch':>8s} {'tok/s':>10s} {'vs generate':>12s} {'peak GiB':>9s}")
    for name, (secs, toks, peak) in results.items():
        tps = statistics.median(t / s for s, t in zip(secs, toks, strict=True))
        print(f"{name:14s} {statistics.median(secs):8.2f} {tps:10.0f} {tps / base:12.2f} {peak:9.2f}")
    if check is not None:
        print(
            "\nlucidrl's vllm engine (rollout.name=vllm), weights pushed in memory from a perturbed HF model:\n"
            f"  sampled-token log-prob |vLLM - HF forward|: max {check['lp_max']:.4f}, mean {check['lp_mean']:.5f} "
            f"(the checkpoint vLLM loaded, before the push: mean {check['lp_mean_before']:.3f})\n"
            f"  push {check['push_s']:.2f} s, generate (then sleep) {check['gen_s']:.2f} s, device memory in use "
            f"(everything on the GPU, not vLLM alone) while it sleeps {check['asleep_gib']:.2f} GiB, awake with "
            f"weights and KV cache {check['awake_gib']:.2f} GiB"
        )


def vllm_engine_check(info, tok, model, batch, samples, args, dtype) -> dict:
    """Time lucidrl's VLLMRollout and check that pushed weights are the ones it samples with."""
    from lucidrl.workers.rollout.engine import SamplingParams, eos_token_ids
    from lucidrl.workers.rollout.vllm_engine import VLLMRollout
    from lucidrl.workers.training.forward import response_log_probs

    engine = VLLMRollout(
        info["path"], tok, eos_ids=eos_token_ids(model, tok), dtype=str(dtype).removeprefix("torch."),
        gpu_memory_utilization=0.5, max_model_len=MAX_PROMPT + args.max_new, enable_sleep_mode=True, seed=0,
        enforce_eager=args.enforce_eager,
    )  # fmt: skip
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new)

    def mean_lp_gap(out) -> tuple[float, float]:
        with torch.no_grad():
            lp, _ = response_log_probs(model, out.to(args.device), temperature=1.0, with_entropy=False)
        mask = out["response_mask"].to(args.device).bool()
        gap = (lp - out["rollout_log_probs"].to(args.device)).abs()[mask]
        return gap.max().item(), gap.mean().item()

    # before any push the engine holds the checkpoint; the HF model is about to move away from it
    engine.load_weights(dict(model.named_parameters()))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    _, before = mean_lp_gap(engine.generate(batch, params))
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.load_weights(dict(model.named_parameters()))
    torch.cuda.synchronize()
    push_s = time.perf_counter() - start
    engine._wake("kv_cache")  # the weights are awake after the push: now all it holds while generating
    awake = torch.cuda.mem_get_info()
    start = time.perf_counter()
    out = engine.generate(batch, params)
    gen_s = time.perf_counter() - start
    asleep = torch.cuda.mem_get_info()
    lp_max, lp_mean = mean_lp_gap(out)

    def run_vllm() -> int:
        engine.load_weights(dict(model.named_parameters()))
        return int(engine.generate(batch, params)["response_mask"].sum())

    secs, toks = time_runs(run_vllm, args.repeats)  # includes the push and the sleep/wake cycle
    return {
        "timing": (secs, toks, float("nan")),
        "lp_max": lp_max,
        "lp_mean": lp_mean,
        "lp_mean_before": before,
        "push_s": push_s,
        "gen_s": gen_s,
        "awake_gib": (awake[1] - awake[0]) / 2**30,
        "asleep_gib": (asleep[1] - asleep[0]) / 2**30,
    }


if __name__ == "__main__":
    main()
