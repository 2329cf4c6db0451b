"""GRPO from the same SFT'd model: lucidrl against TRL's GRPOTrainer, held-out accuracy side by side.

The same starting model (the demo's SFT checkpoint), the same unlabelled K&K prompts (2-person, or
3-person from `lucidrl demo --people 3`), the same verifier (lucidrl's Logic-RL K&K reward, called on
"<think>" + completion in both), the same number of generated samples per step (16 prompts x 8, T=1,
<= the demo's own response length: 160 new tokens at 2 people, 448 at 3), the same update
(one optimizer step per generation batch, lr 1e-4 with a 3-step warm-up, PPO clip 0.2, k3 KL loss
0.02, token-mean loss, grad clip 1). Every `--eval-every` steps each framework's weights are saved
and scored by the same evaluator (`lucidrl.trainer.evaluation.evaluate`: greedy on the held-out puzzles),
so the two curves differ only in the training. Each framework runs in its own process, one after
the other; evaluation time is not counted in the training time.

    .venv/bin/lucidrl demo --out outputs/demo             # makes the SFT'd model and the puzzles
    .venv/bin/python benchmarks/learning_vs_trl.py --from-demo outputs/demo/seed0 [--steps 24] [--eval-every 6]

TRL is a benchmark dependency only: `pip install -c constraints.txt trl==1.16.0`. TRL's configs default
to `bf16=True` even with `use_cpu=True`; on a CPU without native bf16 (AVX2 only, like ours) that sends
its matmuls to torch's emulated bf16 gemm and a step took 350 s instead of ~25 s, so TRL runs here in
float32 (`bf16=False`), without gradient checkpointing, as lucidrl does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

N_PROMPTS, N_SAMPLES = 16, 8
MAX_NEW = 160  # new tokens per response: main() sets the demo's own (ScarceLabelsPlan.max_new_tokens by puzzle size)
LR, WARMUP, KL_COEF, CLIP = 1e-4, 3, 0.02, 0.2


def response_tokens(demo: Path) -> int:
    """The demo's room for a response, by the size of its held-out puzzles (demo.PEOPLE_DEFAULTS): a
    3-person trace cut at the 2-person 160 tokens scores as a format failure in both frameworks."""
    import pyarrow.parquet as pq

    from lucidrl.experiments.scarce_labels import PEOPLE_DEFAULTS

    infos = pq.read_table(demo / "data" / "val.parquet", columns=["extra_info"]).column("extra_info")
    sizes = sorted({info["n_people"] for info in infos.to_pylist()})
    if len(sizes) != 1 or sizes[0] not in PEOPLE_DEFAULTS:
        sys.exit(
            f"--from-demo {demo}: its held-out puzzles have {sizes} people; give a `lucidrl demo` seed folder "
            f"(one size: {' or '.join(map(str, PEOPLE_DEFAULTS))} people)"
        )
    return PEOPLE_DEFAULTS[sizes[0]]["max_new_tokens"]


def greedy_accuracy(model_dir: str, val: str) -> float:
    from lucidrl.trainer.evaluation import evaluate

    result = evaluate(model_dir, [val], k=1, max_new_tokens=MAX_NEW, seed=0, sampled=False)
    return result["data_sources"]["kk_logic"]["greedy"]["acc"]


# -- workers: each runs in its own process and prints one JSON line -------------------------------------


def worker_lucidrl(demo: Path, steps: int, every: int, work: Path) -> dict:
    from lucidrl.config import config_from_dict
    from lucidrl.experiments.scarce_labels import ScarceLabelsPlan, grpo_config
    from lucidrl.trainer.ppo import PPOTrainer

    plan = ScarceLabelsPlan(rl_prompts=N_PROMPTS, rl_n=N_SAMPLES, rl_lr=LR, rl_warmup=WARMUP, kl_coef=KL_COEF)
    plan.max_new_tokens = MAX_NEW
    files = {"unlabelled": str(demo / "data" / "unlabelled.parquet")}
    cfg = grpo_config(str(demo / "sft" / "final"), files, work / "lucidrl", plan, seed=0)
    cfg["trainer"].update({"max_time_s": None, "total_training_steps": steps, "logger": ["jsonl"]})
    cfg["trainer"]["collapse"] = {"enable": False}  # the same steps as TRL, whatever happens
    trainer = PPOTrainer(config_from_dict(cfg, source="learning_vs_trl"))
    val = str(demo / "data" / "val.parquet")
    curve, train_s = [(0, 0.0, greedy_accuracy(str(demo / "sft" / "final"), val))], 0.0
    for step in range(1, steps + 1):
        trainer.global_step = step
        start = time.perf_counter()
        metrics = trainer.step()
        train_s += time.perf_counter() - start
        trainer.tracker.log(metrics, step=step)
        if step % every == 0 or step == steps:
            path = work / f"lucidrl_step{step}"
            trainer.save_model(path)
            curve.append((step, train_s, greedy_accuracy(str(path), val)))
        print(f"lucidrl step {step}: {train_s:.0f} s of training", file=sys.stderr, flush=True)
    return {"curve": curve, "threads": torch.get_num_threads()}


def worker_trl(demo: Path, steps: int, every: int, work: Path) -> dict:
    import datasets
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lucidrl.data.prompt_format import render_chat
    from lucidrl.rewards.kk import compute_score

    rows = pq.read_table(demo / "data" / "unlabelled.parquet").to_pylist()
    model_dir = str(demo / "sft" / "final")
    tok = AutoTokenizer.from_pretrained(model_dir)
    # the prompt as lucidrl renders it, a plain string: TRL renders chat messages with
    # add_generation_prompt only, so the rows' pre-filled "<think>" turn was closed and a new assistant
    # turn opened (7 tokens more, a format the SFT checkpoint never saw); its string path gives the same ids
    dataset = datasets.Dataset.from_list(
        [
            {"prompt": render_chat(tok, r["prompt"])[0], "ground_truth": r["reward_model"]["ground_truth"]}
            for r in rows
        ]
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    val = str(demo / "data" / "val.parquet")

    def reward(prompts, completions, ground_truth, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [
            float(compute_score("<think>" + t, gt)["score"])
            for t, gt in zip(texts, ground_truth, strict=True)
        ]

    curve = [(0, 0.0, greedy_accuracy(model_dir, val))]
    clock = {"train_s": 0.0}

    class Curve(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            clock["train_s"] += time.perf_counter() - self.start
            step = state.global_step
            print(f"trl step {step}: {clock['train_s']:.0f} s of training", file=sys.stderr, flush=True)
            if step % every == 0 or step == steps:
                path = work / f"trl_step{step}"
                model.save_pretrained(path)
                tok.save_pretrained(path)
                curve.append((step, clock["train_s"], greedy_accuracy(str(path), val)))

    config = GRPOConfig(
        output_dir=str(work / "trl"),
        use_cpu=True,
        bf16=False,  # TRL's configs default to bf16=True even on CPU: emulated bf16 gemm without AVX-512 BF16
        gradient_checkpointing=False,  # TRL's GRPOConfig turns it on by default: recompute costs time
        max_steps=steps,
        per_device_train_batch_size=64,
        gradient_accumulation_steps=N_PROMPTS * N_SAMPLES // 64,
        num_generations=N_SAMPLES,
        max_completion_length=MAX_NEW,
        learning_rate=LR,
        beta=KL_COEF,
        use_bias_correction_kl=False,  # TRL's default multiplies the k3 term by the ratio; lucidrl's is plain k3
        epsilon=CLIP,
        loss_type="dapo",  # token-mean over the batch, lucidrl's default aggregation
        scale_rewards="group",
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
    # lucidrl's warm-up: step k (from 0) at lr * (k + 1) / WARMUP; transformers' constant_with_warmup
    # runs the first step at lr 0 (one step behind all run)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / WARMUP))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Curve()],
        optimizers=(optimizer, schedule),
    )
    trainer.train()
    return {"curve": curve, "threads": torch.get_num_threads()}


def run_worker(kind: str, demo: Path, steps: int, every: int, work: Path) -> dict:
    from lucidrl.launch import tuned_env

    cmd = [sys.executable, __file__, "--worker", kind, "--from-demo", str(demo), "--steps", str(steps)]
    cmd += ["--eval-every", str(every), "--work", str(work)]
    env = {**tuned_env(), "TOKENIZERS_PARALLELISM": "false"}  # the same allocator settings for both
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env)  # progress: stderr
    if proc.returncode:
        sys.exit(f"{kind} failed (its stderr is above):\n{proc.stdout[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-demo", required=True, help="a demo seed folder (holds sft/final and data/)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--eval-every", type=int, default=6)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    demo = Path(args.from_demo)
    for need in ("sft/final/config.json", "data/unlabelled.parquet", "data/val.parquet"):
        if not (demo / need).exists():
            sys.exit(f"--from-demo {demo}: no {need}; run `lucidrl demo --out DIR` first and pass DIR/seed0")
    global MAX_NEW
    MAX_NEW = response_tokens(demo)
    if args.worker:
        fn = worker_lucidrl if args.worker == "lucidrl" else worker_trl
        print(json.dumps(fn(demo, args.steps, args.eval_every, Path(args.work))))
        return

    curves = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("lucidrl", "trl"):
            os.makedirs(Path(tmp) / kind, exist_ok=True)
            curves[kind] = run_worker(kind, demo, args.steps, args.eval_every, Path(tmp) / kind)["curve"]
            print(f"  {kind}: done, {curves[kind][-1][1]:.0f} s of training", flush=True)
    print(
        f"\nGRPO from {demo / 'sft' / 'final'}: {N_PROMPTS} prompts x {N_SAMPLES} samples per step, <= {MAX_NEW} "
        f"new tokens, lr {LR}, k3 KL {KL_COEF}; held-out greedy accuracy (same evaluator for both)\n"
    )
    print(f"{'step':>5s} {'lucidrl acc':>12s} {'lucidrl train s':>16s} {'TRL acc':>8s} {'TRL train s':>12s}")
    for (step, ls, la), (_, ts, ta) in zip(curves["lucidrl"], curves["trl"], strict=True):
        print(f"{step:5d} {la:12.2f} {ls:16.0f} {ta:8.2f} {ts:12.0f}")
    (_, ls, la), (_, ts, ta) = curves["lucidrl"][-1], curves["trl"][-1]
    print(
        f"\nfinal: lucidrl {la:.2f} in {ls:.0f} s, TRL {ta:.2f} in {ts:.0f} s "
        f"(start {curves['lucidrl'][0][2]:.2f}); lucidrl trained {ts / max(ls, 1e-9):.2f}x faster per step"
    )


if __name__ == "__main__":
    main()
