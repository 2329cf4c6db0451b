"""One GRPO step, lucidrl against TRL's GRPOTrainer, side by side from one run.

The same tiny Qwen2 (hidden 256, 4 layers, built locally), the same 64 Knights & Knaves prompts,
8 samples each, up to 128 new tokens, one optimizer step per generation batch (64 prompts x 8 =
512 completions, micro-batches of 64), no KL term, the same toy reward. Runs alternate
(lucidrl, TRL, lucidrl, TRL, ...), each in a fresh process that reports its own peak RSS. Printed:
median seconds per step (the first step of each run is warm-up and not counted), generation
tokens/s, peak RSS, and the ratios: like for like (lucidrl against TRL in the same precision) and
fastest against fastest (issue 5's bar: TRL in its fastest CPU setting). Also the decode roofline: the
measured matmul rate of this machine, in each precision, divided by the model's FLOPs per generated
token.

--precision both (the default) runs each framework in float32 and in bfloat16 compute: lucidrl-bf16 is
`model.compute_dtype=bfloat16` (float32 weights and AdamW state, bf16 autocast in every forward), TRL's
is `bf16=True`. bfloat16 is only fast on CPUs with AVX-512 BF16 or AMX (`grep -o amx_bf16
/proc/cpuinfo`); elsewhere it is emulated and a bf16 run takes many times longer: use --precision fp32.

    .venv/bin/python benchmarks/step_vs_trl.py [--steps 3] [--repeats 2] [--precision both|fp32|bf16]
        [--prompts 64] [--ablations]

--ablations adds lucidrl runs with its speed-ups removed, cumulatively: lucidrl-base (transformers
generate, full-sequence forwards, old log-probs recomputed), +decode (lucidrl's decode loop), +shared
(shared-prompt forwards), +reuse (on-policy: old log-probs from the update's own forward, no separate pass), then lucidrl (+ length-sorted,
padding-trimmed micro-batches); and lucidrl-untuned:
everything on but started without the glibc allocator settings the `lucidrl` command sets
(lucidrl/launch.py); and lucidrl-repeat-kv (lucidrl-bf16-repeat-kv with --only): everything on but
masked grouped-query attention on the CPU, so transformers copies the key/value heads (repeat_kv); and
lucidrl-bf16-attn-bf16 (with --only): bf16 compute with the SDPA attention left in bfloat16, where
lucidrl runs it in float32 on CPUs without AMX (lucidrl/models/precision.py: float32_attention). TRL runs as plain `python` would start it; --trl-malloc adds TRL runs with the
same allocator settings (trl-fp32+malloc), to show how much of the gap they are.

TRL is a benchmark dependency only: `pip install -c constraints.txt trl==1.16.0`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N_SAMPLES, MAX_NEW, MICRO = 8, 128, 64
N_PROMPTS = int(os.environ.get("BENCH_PROMPTS", "64"))  # set by --prompts; the workers read it here

# lucidrl with its speed-ups switched off one at a time, cumulatively (--ablations)
_NO_SORT = "actor.length_sorted_micro_batches=false"
VARIANTS = {
    "lucidrl-base": [
        "rollout.decode_loop=transformers",
        "actor.share_prompt_forward=false",
        "actor.on_policy_skip_old_log_prob=false",
        _NO_SORT,
    ],
    "+decode": ["actor.share_prompt_forward=false", "actor.on_policy_skip_old_log_prob=false", _NO_SORT],
    "+shared": ["actor.on_policy_skip_old_log_prob=false", _NO_SORT],
    "+reuse": [_NO_SORT],
}
# lucidrl's mixed precision: bfloat16 compute over float32 weights (fast where the CPU has AVX-512 BF16
# or AMX; emulated and slow where it has not, as TRL's bf16=True is)
PRECISIONS = {"lucidrl-bf16": ["model.compute_dtype=bfloat16"]}
# everything on but attention's masked GQA on the CPU (lucidrl/models/precision.py: masked_gqa): a
# user's TRANSFORMERS_SDPA_FORCE_GQA=0 is left alone, so transformers copies each key/value head per
# query head (repeat_kv) as before
REPEAT_KV = {"lucidrl-repeat-kv": [], "lucidrl-bf16-repeat-kv": PRECISIONS["lucidrl-bf16"]}
# bf16 compute with transformers' SDPA attention left in bfloat16 (lucidrl/models/precision.py:
# float32_attention, on by default on CPUs without AMX)
ATTN_BF16 = {"lucidrl-bf16-attn-bf16": PRECISIONS["lucidrl-bf16"]}
KIND_ENV = {
    **{kind: {"TRANSFORMERS_SDPA_FORCE_GQA": "0"} for kind in REPEAT_KV},
    **{kind: {"LUCIDRL_CPU_FLOAT32_ATTENTION": "0"} for kind in ATTN_BF16},
}
LR = 1e-5


def toy_reward_text(text: str) -> float:
    text = text.removeprefix("<think>")
    return text.count("e") / max(len(text), 1)


REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str.removeprefix("<think>")
    return text.count("e") / max(len(text), 1)
"""


def prepare(work: Path) -> dict[str, str]:
    from lucidrl.data.kk import write_kk_parquet
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model

    data = write_kk_parquet(work / "data", people=(2, 4), n_train=N_PROMPTS, n_val=1, seed=0)
    model = build_tiny_model(work / "model", kk_tokenizer_corpus(0), hidden_size=256, num_layers=4, seed=0)
    (work / "reward.py").write_text(REWARD_FILE)
    return {
        "train": data["train"],
        "model": model["path"],
        "reward": str(work / "reward.py"),
        "params": model["num_parameters"],
    }


# -- workers: each runs in its own process and prints one JSON line -------------------------------------


def worker_lucidrl(work: Path, steps: int, extra: list[str]) -> dict:
    from lucidrl.config import load_config
    from lucidrl.trainer.ppo import PPOTrainer

    prep = json.loads((work / "prep.json").read_text())
    run = work / f"lucidrl_{time.time_ns()}"
    cfg = load_config(
        None,
        [
            f"model.path={prep['model']}",
            f"data.train_files=[{prep['train']}]",
            "data.val_files=[]",
            f"data.train_batch_size={N_PROMPTS}",
            f"data.max_response_length={MAX_NEW}",
            f"rollout.n={N_SAMPLES}",
            f"actor.ppo_mini_batch_size={N_PROMPTS}",
            f"actor.ppo_micro_batch_size={MICRO}",
            f"actor.log_prob_micro_batch_size={MICRO}",
            f"actor.optim.lr={LR}",
            "actor.use_kl_loss=false",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.save_final_model=false",
            f"trainer.run_dir={run}",
            "trainer.logger=[jsonl]",
            f"reward.custom_function.path={prep['reward']}",
            *extra,
        ],
    )
    PPOTrainer(cfg).fit()
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "step_s": [r["timing_s/step"] for r in records],
        "gen_s": [r["timing_s/gen"] for r in records],
        "gen_tokens": [r["response_length/mean"] * N_PROMPTS * N_SAMPLES for r in records],
    }


def worker_trl(work: Path, steps: int, bf16: bool) -> dict:
    import datasets
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prep = json.loads((work / "prep.json").read_text())
    from lucidrl.data.prompt_format import render_chat

    rows = pq.read_table(prep["train"]).to_pylist()
    tok = AutoTokenizer.from_pretrained(prep["model"])
    # the prompt as lucidrl renders it, a plain string: from chat messages TRL closes the rows' pre-filled
    # "<think>" turn and opens another (7 tokens more per prompt, ~3% more prefill and training tokens)
    dataset = datasets.Dataset.from_list([{"prompt": render_chat(tok, r["prompt"])[0]} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(prep["model"])
    gen = {"s": 0.0, "tokens": 0}
    original = model.generate

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        gen["s"] += time.perf_counter() - start
        prompt_len = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape[1]
        completion = out[:, prompt_len:] if not hasattr(out, "sequences") else out.sequences[:, prompt_len:]
        done = (completion == tok.eos_token_id).cumsum(1) - (completion == tok.eos_token_id).long()
        gen["tokens"] += int((done == 0).sum())
        return out

    model.generate = timed_generate

    def reward(prompts, completions, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [toy_reward_text(t) for t in texts]

    times, gens, toks = [], [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()
            gen["s"], gen["tokens"] = 0.0, 0

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.start)
            gens.append(gen["s"])
            toks.append(gen["tokens"])

    config = GRPOConfig(
        output_dir=str(work / f"trl_{time.time_ns()}"),
        use_cpu=True,
        gradient_checkpointing=False,  # TRL's GRPOConfig turns it on by default: recompute costs time
        bf16=bf16,
        max_steps=steps,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=N_PROMPTS * N_SAMPLES // MICRO,
        num_generations=N_SAMPLES,
        max_completion_length=MAX_NEW,
        learning_rate=LR,
        beta=0.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Timer()],
    )
    trainer.train()
    return {"step_s": times, "gen_s": gens, "gen_tokens": toks}


def matmul_gflops(dtype: str = "float32") -> float:
    import torch

    a, b = (torch.randn(2048, 2048, dtype=getattr(torch, dtype)) for _ in range(2))
    a @ b
    start = time.perf_counter()
    for _ in range(5):
        a @ b
    return 5 * 2 * 2048**3 / (time.perf_counter() - start) / 1e9


def run_worker(work: Path, kind: str, steps: int, extra: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        kind,
        "--work",
        str(work),
        "--steps",
        str(steps),
        "--extra",
        extra,
    ]
    from lucidrl.launch import MALLOC_ENV, tuned_env

    # lucidrl runs as its launcher would start it (glibc allocator settings, lucidrl/launch.py); TRL and
    # lucidrl-untuned run as a plain `python` would, unless --trl-malloc gives TRL the same settings
    plain = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    tuned = (kind.startswith(("lucidrl", "+")) and kind != "lucidrl-untuned") or kind.endswith("+malloc")
    env = {**(tuned_env(plain) if tuned else plain), **KIND_ENV.get(kind, {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode:
        sys.exit(f"{kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="steps per run; the first is warm-up")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--precision",
        choices=["both", "fp32", "bf16"],
        default="both",
        help="float32, bfloat16 compute (lucidrl-bf16, TRL's bf16=True), or both, for each framework",
    )
    p.add_argument("--prompts", type=int, default=64, help="prompts per step (64 in the reference setting)")
    p.add_argument("--ablations", action="store_true", help="also run lucidrl with its speed-ups removed")
    p.add_argument(
        "--trl-malloc", action="store_true", help="also run TRL with lucidrl's allocator settings (+malloc)"
    )
    p.add_argument(
        "--only", help="comma-separated kinds to run instead (e.g. lucidrl,lucidrl-untuned,trl-fp32)"
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--extra", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        work = Path(args.work)
        if args.worker.startswith("lucidrl") or args.worker.startswith("+"):
            out = worker_lucidrl(
                work, args.steps, {**VARIANTS, **PRECISIONS, **REPEAT_KV, **ATTN_BF16}.get(args.worker, [])
            )
        else:
            out = worker_trl(work, args.steps, bf16=args.worker.startswith("trl-bf16"))
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return

    os.environ["BENCH_PROMPTS"] = str(args.prompts)
    global N_PROMPTS
    N_PROMPTS = args.prompts
    trl_kinds = {"both": ["trl-fp32", "trl-bf16"], "bf16": ["trl-bf16"], "fp32": ["trl-fp32"]}[args.precision]
    kinds = (
        (list(VARIANTS) + ["lucidrl-untuned", "lucidrl-repeat-kv"] if args.ablations else [])
        + ["lucidrl"]
        + (["lucidrl-bf16"] if args.precision != "fp32" else [])
        + trl_kinds
        + ([f"{k}+malloc" for k in trl_kinds] if args.trl_malloc else [])
    )
    if args.only:
        kinds = args.only.split(",")
        known = [
            *VARIANTS,
            "lucidrl",
            *PRECISIONS,
            *REPEAT_KV,
            *ATTN_BF16,
            "lucidrl-untuned",
            "trl-fp32",
            "trl-bf16",
            "trl-fp32+malloc",
            "trl-bf16+malloc",
        ]
        if "lucidrl" not in kinds or any(k not in known for k in kinds):
            sys.exit(f"--only {args.only}: kinds come from {known}, and 'lucidrl' must be one (the baseline)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prep = prepare(work)
        (work / "prep.json").write_text(json.dumps(prep))
        gflops = {"fp32": matmul_gflops("float32"), "bf16": matmul_gflops("bfloat16")}
        results: dict[str, dict[str, list[float]]] = {k: {"step": [], "tps": [], "rss": []} for k in kinds}
        for rep in range(args.repeats):
            for kind in kinds:
                r = run_worker(work, kind, args.steps, "")
                steps = r["step_s"][1:]
                tps = [t / g for t, g in zip(r["gen_tokens"][1:], r["gen_s"][1:], strict=True) if g > 0]
                results[kind]["step"] += steps
                results[kind]["tps"] += tps
                results[kind]["rss"].append(r["peak_rss_mb"])
                print(
                    f"  {kind:12s} repeat {rep}: steps {[round(s, 2) for s in steps]}, "
                    f"gen {statistics.median(tps):.0f} tok/s, peak RSS {r['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
    flops_per_token = 2 * prep["params"]
    roofline = {p: g * 1e9 / flops_per_token for p, g in gflops.items()}
    print(
        f"\nGRPO step: tiny Qwen2 (hidden 256, 4 layers, {prep['params'] / 1e6:.1f}M params), {N_PROMPTS} prompts "
        f"x {N_SAMPLES} samples, <= {MAX_NEW} new tokens, one optimizer step; median of "
        f"{args.steps - 1} steps x {args.repeats} runs each"
    )
    print(
        f"matmul here: float32 {gflops['fp32']:.0f} GFLOP/s, bfloat16 {gflops['bf16']:.0f} GFLOP/s -> decode "
        f"roofline ~{roofline['fp32']:.0f} / ~{roofline['bf16']:.0f} tok/s (2 x params FLOPs per token, attention "
        f"ignored; each kind against its own precision's)\n"
    )
    med = {kind: statistics.median(r["step"]) for kind, r in results.items()}
    base = med["lucidrl"]
    print(
        f"{'framework':16s} {'s/step':>8s} {'steps/s vs lucidrl':>19s} {'gen tok/s':>10s} {'of roofline':>12s} "
        f"{'peak RSS MB':>12s}"
    )
    for kind, r in results.items():
        tps = statistics.median(r["tps"])
        print(
            f"{kind:16s} {med[kind]:8.2f} {base / med[kind]:19.2f} {tps:10.0f} "
            f"{tps / roofline[precision_of(kind)]:12.2f} {statistics.median(r['rss']):12.0f}"
        )
    for line in ratio_lines(med):
        print(line)


def precision_of(kind: str) -> str:
    return "bf16" if "bf16" in kind else "fp32"


def ratio_lines(med: dict[str, float]) -> list[str]:
    """lucidrl's step throughput over TRL's: like for like (same precision), then fastest against fastest."""
    ours = {k: v for k, v in med.items() if not k.startswith("trl")}
    theirs = {k: v for k, v in med.items() if k.startswith("trl")}
    lines = []
    for kind, t in theirs.items():
        same = "lucidrl-bf16" if precision_of(kind) == "bf16" and "lucidrl-bf16" in ours else "lucidrl"
        lines.append(f"lucidrl step throughput = {t / ours[same]:.2f}x {kind} ({same} against it)")
    if theirs:
        best_ours = min(("lucidrl", "lucidrl-bf16"), key=lambda k: ours.get(k, float("inf")))
        best_theirs = min(theirs, key=theirs.get)
        lines.append(
            f"fastest against fastest: {best_ours} {ours[best_ours]:.2f} s, {best_theirs} {theirs[best_theirs]:.2f} s "
            f"= {theirs[best_theirs] / ours[best_ours]:.2f}x"
        )
    return lines


if __name__ == "__main__":
    main()
