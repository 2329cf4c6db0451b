"""GRPO from the same model: lucidrl against TRL's GRPOTrainer, held-out accuracy side by side.

Two settings (`--setting`), each with lucidrl's own config for it and TRL given the same:

- `smollm2` (the default without --from-demo): the new demo's run. SmolLM2-135M-Instruct (--model,
  default outputs/demo/model, which `lucidrl demo` writes) trained with only a verifier on one-step
  word problems asking for "The answer is N." (2,000 training problems, 150 held-out ones whose numbers
  training never shows; `lucidrl.data.word_problems`, zero-shot). lucidrl runs exactly the demo's config
  (`lucidrl.demo.run.grpo_config` with a default `DemoPlan`): 16 prompts x 8 samples per step, T=0.7,
  <= 64 new tokens, lr 5e-5 without warm-up, no KL (no reference model), full fine-tuning, one
  optimizer step per generation batch, bf16 compute over float32 weights, token-mean loss, PPO clip
  0.2, grad clip 1, no forward for tied groups (actor.skip_zero_advantage: the same gradient, which
  `grpo_gradient_vs_trl.py` checks against TRL's loss). Reward: `lucidrl.rewards.word_problems` (1 for the right number, else 0).
- `kk` (with --from-demo): the scarce-label experiment's SFT checkpoint on its unlabelled K&K puzzles
  (2-person, or 3-person from `lucidrl experiment scarce-labels --people 3`), lucidrl's Logic-RL K&K
  reward on "<think>" + completion, 16 x 8 samples, <= the experiment's response length (160 new
  tokens at 2 people, 448 at 3), lr 1e-4 with a 3-step warm-up, k3 KL loss 0.02, float32.

TRL's GRPOConfig is filled from lucidrl's config (`recipe`): the same prompts rendered the same way
(lucidrl's chat-template rendering, passed as strings so the token ids match), samples per step,
temperature, max_completion_length, AdamW settings and warm-up, beta (the KL coefficient), epsilon (the
PPO clip), loss_type="dapo" (token-mean over the step's batch, lucidrl's token-mean), group-scaled
advantages (GRPO's std), grad clip, and a training micro-batch of lucidrl's ppo_micro_batch_size; no
gradient checkpointing (TRL's default turns it on; recomputing costs time). Precision, where lucidrl
sets `model.compute_dtype=bfloat16` (smollm2): lucidrl keeps float32 weights, gradients and AdamW state
and runs every forward (decoding and the update) under `torch.autocast("cpu", bfloat16)`, backward
replaying each op in its forward's dtype; TRL gets `bf16=True`, for which accelerate wraps the model's
forward in the same `torch.autocast("cpu", bfloat16)` (weights, gradients and AdamW state float32) and,
as `generate` calls that forward, TRL's decoding computes in bf16 as well (the worker checks the wrapper
is there). Both are fast only on a CPU with native bf16 (AVX-512 BF16 or AMX, as this one has); on an
AVX2 CPU bf16 matmuls are emulated and several times slower. For `kk` both run in float32 (`bf16=False`).
Attention: TRL's model is loaded with lucidrl's `model.attn_implementation` (the demo's is eager under
bf16 compute on an AMX CPU, else transformers' default).

Every `--eval-every` steps each framework's weights are saved and scored by the same evaluator
(`lucidrl.trainer.evaluation.evaluate`: greedy, on the held-out set), so the two curves differ only in
the training. Each framework runs in its own process (`--threads` torch threads), one after the other;
the training seconds exclude evaluation. A second table gives each step's training batch on both sides
(mean reward, format rate, mean response length), where a difference in learning shows before the
held-out points do, and each update's gradient norm before clipping (lucidrl's `actor/grad_norm`,
the `grad_norm` TRL's Trainer logs): both losses are a token-mean over the step's batch, so the
two should be close, and a gap would say the two weigh tokens differently. The last line says when lucidrl's curve first reached TRL's
final accuracy, and the ratio of its training time then to TRL's whole (the goal: at most a third).

Which framework learns more in a few steps changes from seed to seed (each draws its own samples), so
one seed's verdict is mostly its draw (benchmarks/README.md has the spread). With several `--seeds` each runs both frameworks
in turn and gets its own tables; a last table puts the seeds side by side, and both curves averaged
over the seeds (accuracy and training time, point by point) give the verdict on the mean as well as
the count of seeds that met the goal. `--combine` prints the same from --json files of runs made apart.

    .venv/bin/lucidrl demo                                 # writes outputs/demo/model (SmolLM2-135M-Instruct)
    .venv/bin/python benchmarks/learning_vs_trl.py [--model outputs/demo/model] [--steps 3] [--eval-every 1] \\
        [--seeds 0 1 2] [--json outputs/learning_vs_trl_smollm2.json]
    .venv/bin/python benchmarks/learning_vs_trl.py --combine seed0.json seed1.json ...  # runs made apart

    .venv/bin/lucidrl experiment scarce-labels     # the SFT'd model and the puzzles, in outputs/scarce_labels
    .venv/bin/python benchmarks/learning_vs_trl.py --setting kk --from-demo outputs/scarce_labels/seed0 \\
        [--steps 24] [--eval-every 6]

TRL is a benchmark dependency only: `pip install -c constraints.txt trl==1.16.0`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lucidrl.demo.plan import DemoPlan

DEFAULT_MODEL = "outputs/demo/model"  # where `lucidrl demo` writes SmolLM2-135M-Instruct
N_TRAIN, N_VAL = DemoPlan.n_train, DemoPlan.n_val  # the smollm2 setting's word problems: the demo's
# smollm2: the demo's steps, with a held-out point after each
DEFAULTS = {"kk": {"steps": 24, "eval_every": 6}, "smollm2": {"steps": DemoPlan.steps, "eval_every": 1}}


@dataclass(frozen=True)
class Setting:
    """One comparison: the starting model, its training prompts and held-out set, the response room."""

    name: str  # "kk" or "smollm2"
    model: str
    train: str
    val: str
    data_source: str  # the evaluator's entry for the held-out set
    max_new: int  # new tokens per response, in training and in evaluation


def response_tokens(demo: Path) -> int:
    """The K&K demo's room for a response, by the size of its held-out puzzles (PEOPLE_DEFAULTS): a
    3-person trace cut at the 2-person 160 tokens scores as a format failure in both frameworks."""
    import pyarrow.parquet as pq

    from lucidrl.experiments.scarce_labels import PEOPLE_DEFAULTS

    infos = pq.read_table(demo / "data" / "val.parquet", columns=["extra_info"]).column("extra_info")
    sizes = sorted({info["n_people"] for info in infos.to_pylist()})
    if len(sizes) != 1 or sizes[0] not in PEOPLE_DEFAULTS:
        sys.exit(
            f"--from-demo {demo}: its held-out puzzles have {sizes} people; give a scarce-labels seed folder "
            f"(one size: {' or '.join(map(str, PEOPLE_DEFAULTS))} people)"
        )
    return PEOPLE_DEFAULTS[sizes[0]]["max_new_tokens"]


def kk_setting(demo: Path) -> Setting:
    for need in ("sft/final/config.json", "data/unlabelled.parquet", "data/val.parquet"):
        if not (demo / need).exists():
            sys.exit(
                f"--from-demo {demo}: no {need}; run `lucidrl experiment scarce-labels --out DIR` first "
                "and pass DIR/seed0"
            )
    data = demo / "data"
    return Setting(
        name="kk",
        model=str(demo / "sft" / "final"),
        train=str(data / "unlabelled.parquet"),
        val=str(data / "val.parquet"),
        data_source="kk_logic",
        max_new=response_tokens(demo),
    )


def smollm2_setting(model: Path, data: Path) -> Setting:
    if not (model / "config.json").is_file():
        sys.exit(
            f"--model {model}: not a HuggingFace model folder (no config.json); `lucidrl demo` writes "
            f"SmolLM2-135M-Instruct to {DEFAULT_MODEL}"
        )
    return Setting(
        name="smollm2",
        model=str(model),
        train=str(data / "train.parquet"),
        val=str(data / "val.parquet"),
        data_source="word_problems",
        max_new=DemoPlan().max_new_tokens,
    )


def write_word_problems(data: Path) -> None:
    from lucidrl.data.word_problems import write_word_problems_parquet

    write_word_problems_parquet(data, n_train=N_TRAIN, n_val=N_VAL, seed=0, fmt="answer_is", shots=0)


def lucidrl_config(setting: Setting, steps: int, run_dir: Path, threads: int, seed: int = 0) -> dict:
    """lucidrl's config for the setting: the demo's (smollm2) or the scarce-label experiment's (kk)."""
    if setting.name == "smollm2":
        from lucidrl.demo.run import grpo_config

        files = {"train": setting.train, "val": setting.val}
        cfg = grpo_config(setting.model, files, run_dir, DemoPlan(steps=steps), seed=seed)
    else:
        from lucidrl.experiments.scarce_labels import ScarceLabelsPlan
        from lucidrl.experiments.scarce_labels import grpo_config as kk_grpo_config

        plan = ScarceLabelsPlan(rl_prompts=16, rl_n=8, rl_lr=1e-4, rl_warmup=3, kl_coef=0.02)
        plan.max_new_tokens = setting.max_new
        cfg = kk_grpo_config(setting.model, {"unlabelled": setting.train}, run_dir, plan, seed=seed)
    cfg["trainer"].update(
        {"max_time_s": None, "total_training_steps": steps, "logger": ["jsonl"], "num_threads": threads}
    )
    cfg["trainer"]["collapse"] = {"enable": False}  # the same steps as TRL, whatever happens
    return cfg


def recipe(cfg: dict) -> dict:
    """What TRL is given, read from lucidrl's resolved config (defaults included) so the two cannot drift;
    exits where lucidrl's config asks for something this translation does not carry over."""
    from lucidrl.config import config_from_dict
    from lucidrl.models.precision import autocast_dtype

    c = config_from_dict(cfg, source="learning_vs_trl")
    a, r = c.actor, c.rollout
    samples = c.data.train_batch_size * r.n
    unmatched = {
        "one update per step (actor.ppo_mini_batch_size = data.train_batch_size, ppo_epochs 1)": (
            a.ppo_mini_batch_size == c.data.train_batch_size and a.ppo_epochs == 1
        ),
        "actor.loss_agg_mode=token-mean": a.loss_agg_mode == "token-mean",
        "a symmetric clip (clip_ratio_low = clip_ratio_high)": a.clip_ratio_low == a.clip_ratio_high,
        "k3 KL (kl_loss_type=low_var_kl)": not a.use_kl_loss or a.kl_loss_type == "low_var_kl",
        "full fine-tuning (model.lora_rank=0)": c.model.lora_rank == 0,
        "GRPO's std-scaled advantages": c.algorithm.norm_adv_by_std_in_grpo,
        "no entropy bonus": a.entropy_coeff == 0,
        "plain sampling (top_p 1, no top_k)": r.top_p == 1.0 and r.top_k == -1,
        "micro-batches that divide the step's samples": samples % a.ppo_micro_batch_size == 0,
    }
    missing = [what for what, ok in unmatched.items() if not ok]
    if missing:
        sys.exit(f"lucidrl's config has settings TRL is not given here; it needs {', '.join(missing)}")
    return {
        "prompts": c.data.train_batch_size,
        "n": r.n,
        "temperature": r.temperature,
        "max_new": c.data.max_response_length,
        "lr": a.optim.lr,
        "warmup": a.optim.warmup_steps,
        "betas": list(a.optim.betas),
        "weight_decay": a.optim.weight_decay,
        "grad_clip": a.optim.grad_clip,
        "clip": a.clip_ratio_low,
        "kl": a.kl_loss_coef if a.use_kl_loss else 0.0,
        "micro_batch": a.ppo_micro_batch_size,
        "bf16": autocast_dtype(c.model.dtype, c.model.compute_dtype) == torch.bfloat16,
        "attn_implementation": c.model.attn_implementation,
        "stop_regex": r.stop_regex,
    }


def greedy_accuracy(
    model_dir: str, setting: Setting, n_val: int | None, stop_regex: str | None
) -> tuple[float, int]:
    """Greedy held-out accuracy of the model at `model_dir` (the first `n_val` prompts; None: all), and
    how many prompts it was measured on; responses end by the run's stop rule, if it has one."""
    from lucidrl.trainer.evaluation import evaluate

    result = evaluate(
        model_dir,
        [setting.val],
        k=1,
        max_new_tokens=setting.max_new,
        limit=n_val,
        seed=0,
        sampled=False,
        stop_regex=stop_regex,
    )
    entry = result["data_sources"][setting.data_source]
    return entry["greedy"]["acc"], entry["n_prompts"]


def score(setting: Setting, completion: str, ground_truth: str, extra_info: dict) -> dict[str, float]:
    """The verifier's result for one completion, as lucidrl's reward manager calls it for the setting:
    {"score", "acc", "format_ok"}."""
    if setting.name == "kk":
        from lucidrl.rewards.kk import compute_score as kk_score

        return kk_score("<think>" + completion, ground_truth)
    from lucidrl.rewards.word_problems import compute_score

    return compute_score(completion, ground_truth, extra_info)


def train_point(scores: list[float], formats: list[float], lengths: list[int]) -> dict[str, float]:
    """One step's training batch: mean reward, format rate and mean response length (tokens, EOS included)."""
    return {
        "score": sum(scores) / len(scores),
        "format": sum(formats) / len(formats),
        "length": sum(lengths) / len(lengths),
    }


def worker_result(curve: list, step_s: list[float], train: list[dict], n_eval: int, **extra) -> dict:
    """What a worker prints: its accuracy curve, step times, training batches, and its own extras."""
    return {
        "curve": curve,
        "step_s": step_s,
        "train": train,
        "n_eval": n_eval,
        "threads": torch.get_num_threads(),
        **extra,
    }


def trl_dataset(setting: Setting, tok):
    """The setting's training rows as TRL's dataset: prompt, ground_truth and extra_info columns."""
    import datasets
    import pyarrow.parquet as pq

    from lucidrl.data.prompt_format import render_chat

    rows = pq.read_table(setting.train).to_pylist()
    # the prompt as lucidrl renders it, a plain string: TRL renders chat messages with
    # add_generation_prompt only, so K&K rows' pre-filled "<think>" turn was closed and a new assistant
    # turn opened (7 tokens more, a format the SFT checkpoint never saw); its string path gives the same ids
    return datasets.Dataset.from_list(
        [
            {
                "prompt": render_chat(tok, row["prompt"])[0],
                "ground_truth": row["reward_model"]["ground_truth"],
                "extra_info": json.dumps(row.get("extra_info")),  # a string: K&K's and ours differ in fields
            }
            for row in rows
        ]
    )


def trl_grpo_config(r: dict, output_dir: Path, steps: int, seed: int):
    """TRL's GRPOConfig for `recipe`'s settings: one generation batch, and one optimizer step, a step."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=r["bf16"],  # accelerate's autocast around the model's forward; float32 weights and AdamW state
        gradient_checkpointing=False,  # TRL's GRPOConfig turns it on by default: recompute costs time
        max_steps=steps,
        per_device_train_batch_size=r["micro_batch"],
        gradient_accumulation_steps=r["prompts"] * r["n"] // r["micro_batch"],  # one generation batch a step
        num_generations=r["n"],
        max_completion_length=r["max_new"],
        learning_rate=r["lr"],
        max_grad_norm=r["grad_clip"],
        beta=r["kl"],
        use_bias_correction_kl=False,  # TRL's default multiplies the k3 term by the ratio; lucidrl's is plain k3
        epsilon=r["clip"],
        loss_type="dapo",  # token-mean over the step's batch, lucidrl's token-mean
        scale_rewards="group",  # GRPO's advantage: (score - group mean) / group std
        temperature=r["temperature"],
        top_p=1.0,
        top_k=0,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=seed,
    )


def with_stop_rule(base: type, model, tok, pattern: str, calls: dict) -> type:
    """TRL's GRPOTrainer ending completions by lucidrl's stop rule (rollout.stop_regex), as lucidrl's
    rollout does: `generate` stops a row once its text has matched (a stopping criterion, so TRL spends no
    time on tokens that are dropped), and each completion is cut after the token that completed the match
    (generate pads a stopped row with the pad token, which is the eos here and would otherwise be trained
    on as if sampled). `calls` counts the generate calls that had the criterion."""
    from transformers import StoppingCriteriaList

    from lucidrl.workers.rollout.engine import eos_token_ids
    from lucidrl.workers.rollout.stop_rule import StopRule, StopRuleCriteria

    rule = StopRule(pattern, tok, eos_token_ids(model, tok))
    plain = model.generate

    def generate(*args, **kwargs):
        calls["generate_calls"] += 1
        criterion = StopRuleCriteria(rule, kwargs["input_ids"].shape[1])
        return plain(*args, stopping_criteria=StoppingCriteriaList([criterion]), **kwargs)

    model.generate = generate  # what TRL's unwrap_model_for_generation hands back on one CPU process

    class StopRuleGRPOTrainer(base):
        def _generate_single_turn(self, *args, **kwargs):
            ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            keep = [rule.stop_length(row) or len(row) for row in ids]
            ids = [row[:k] for row, k in zip(ids, keep, strict=True)]
            if logprobs is not None:
                logprobs = [row[:k] for row, k in zip(logprobs, keep, strict=True)]
            return ids, logprobs

    return StopRuleGRPOTrainer


# -- workers: each runs in its own process and prints one JSON line -------------------------------------


def worker_lucidrl(
    setting: Setting, steps: int, every: int, n_val: int | None, work: Path, threads: int, seed: int
) -> dict:
    from lucidrl.config import config_from_dict
    from lucidrl.trainer.ppo import PPOTrainer

    cfg = lucidrl_config(setting, steps, work / "lucidrl", threads, seed)
    trainer = PPOTrainer(config_from_dict(cfg, source="learning_vs_trl"))
    stop = trainer.cfg.rollout.stop_regex
    acc, n_eval = greedy_accuracy(setting.model, setting, n_val, stop)
    curve, step_s, train = [(0, 0.0, acc)], [], []
    for step in range(1, steps + 1):
        trainer.global_step = step
        start = time.perf_counter()
        metrics = trainer.step()
        step_s.append(time.perf_counter() - start)
        trainer.tracker.log(metrics, step=step)
        train.append(
            {
                "score": metrics["critic/score/mean"],
                "format": metrics["reward/format_ok/mean"],
                "length": metrics["response_length/mean"],
                "grad_norm": metrics["actor/grad_norm"],  # the total norm before clipping
            }
        )
        if step % every == 0 or step == steps:
            path = work / f"lucidrl_step{step}"
            trainer.save_model(path)
            curve.append((step, sum(step_s), greedy_accuracy(str(path), setting, n_val, stop)[0]))
        print(
            f"lucidrl step {step}: {step_s[-1]:.1f} s ({sum(step_s):.0f} s of training)",
            file=sys.stderr,
            flush=True,
        )
    return worker_result(curve, step_s, train, n_eval)


def worker_trl(
    setting: Setting, steps: int, every: int, n_val: int | None, work: Path, threads: int, seed: int
) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from lucidrl.config.schema import OptimConfig
    from lucidrl.workers.training.optim import build_optimizer

    r = recipe(lucidrl_config(setting, steps, work / "lucidrl", threads))
    tok = AutoTokenizer.from_pretrained(setting.model)
    dataset = trl_dataset(setting, tok)
    # lucidrl's model.dtype, and its model.attn_implementation where the config sets one
    attn = {"attn_implementation": r["attn_implementation"]} if r["attn_implementation"] else {}
    model = AutoModelForCausalLM.from_pretrained(setting.model, dtype=torch.float32, **attn)

    # the step's completions as the reward saw them, for its training point (TRL may score a step's
    # generation batch in more than one call)
    pending: dict[str, list] = {"scores": [], "formats": [], "lengths": []}

    def reward(prompts, completions, ground_truth, extra_info, completion_ids, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        results = [
            score(setting, t, gt, json.loads(info) or {})
            for t, gt, info in zip(texts, ground_truth, extra_info, strict=True)
        ]
        pending["scores"] += [float(res["score"]) for res in results]
        pending["formats"] += [float(res["format_ok"]) for res in results]
        pending["lengths"] += [len(ids) for ids in completion_ids]
        return [float(res["score"]) for res in results]

    acc, n_eval = greedy_accuracy(setting.model, setting, n_val, r["stop_regex"])
    curve, step_s, train = [(0, 0.0, acc)], [], []
    grad_norms: dict[int, float] = {}  # step -> the total norm before clipping, as the Trainer logs it

    class Curve(TrainerCallback):
        """Times each step from the end of the one before (generation, scoring, forwards, backwards and
        the optimizer step), evaluation left out."""

        def on_train_begin(self, args, state, control, **kw):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            step_s.append(time.perf_counter() - self.last)
            step = state.global_step
            train.append(train_point(pending["scores"], pending["formats"], pending["lengths"]))
            for values in pending.values():
                values.clear()
            print(
                f"trl step {step}: {step_s[-1]:.1f} s ({sum(step_s):.0f} s of training)",
                file=sys.stderr,
                flush=True,
            )
            if step % every == 0 or step == steps:
                path = work / f"trl_step{step}"
                model.save_pretrained(path)
                tok.save_pretrained(path)
                curve.append(
                    (step, sum(step_s), greedy_accuracy(str(path), setting, n_val, r["stop_regex"])[0])
                )
            self.last = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "grad_norm" in logs:
                grad_norms[state.global_step] = float(logs["grad_norm"])

    config = trl_grpo_config(r, work / "trl", steps, seed)
    # lucidrl's own AdamW and warm-up (the fused kernel on the CPU; step k from 0 at lr * (k + 1) / warmup),
    # where transformers' constant_with_warmup runs the first step at lr 0 (one step behind all run)
    optimizer, schedule = build_optimizer(
        model,
        OptimConfig(
            lr=r["lr"], betas=list(r["betas"]), weight_decay=r["weight_decay"], warmup_steps=r["warmup"]
        ),
    )
    stopped = {"generate_calls": 0}
    trainer_cls = GRPOTrainer
    if r["stop_regex"] is not None:
        trainer_cls = with_stop_rule(GRPOTrainer, model, tok, r["stop_regex"], stopped)
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Curve()],
        optimizers=(optimizer, schedule),
    )
    trainer.train()
    if r["stop_regex"] is not None and stopped["generate_calls"] == 0:
        sys.exit("TRL was given lucidrl's stop rule, but its generate was never called with it")
    # accelerate's mixed precision replaces the model's forward with an autocast-wrapped one (and keeps
    # the original): with bf16 asked for, decoding and the loss's forwards went through it
    autocast = hasattr(trainer.model, "_original_forward")
    if r["bf16"] and not autocast:
        sys.exit(
            "TRL was given bf16=True but the model's forward was not wrapped in autocast: it ran float32"
        )
    for step, point in enumerate(train, 1):
        point["grad_norm"] = grad_norms.get(step, float("nan"))
    return worker_result(curve, step_s, train, n_eval, recipe=r, bf16_autocast=autocast)


def run_worker(kind: str, args: argparse.Namespace, seed: int, data: Path | None, work: Path) -> dict:
    from lucidrl.launch import tuned_env

    cmd = [sys.executable, __file__, "--worker", kind, "--setting", args.setting, "--steps", str(args.steps)]
    cmd += ["--eval-every", str(args.eval_every), "--threads", str(args.threads), "--work", str(work)]
    cmd += ["--seeds", str(seed)]
    cmd += (
        ["--from-demo", args.from_demo]
        if args.setting == "kk"
        else ["--model", args.model, "--data", str(data)]
    )
    cmd += ["--n-val", str(args.n_val)] if args.n_val is not None else []
    env = {**tuned_env(), "TOKENIZERS_PARALLELISM": "false"}  # the same allocator settings for both
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env)  # progress: stderr
    if proc.returncode:
        sys.exit(f"{kind}, seed {seed} failed (its stderr is above):\n{proc.stdout[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def reached(lucid: list[dict], trl: list[dict], every: int) -> tuple[dict | None, str]:
    """When lucidrl's curve first reached TRL's final accuracy, and the line that says it. The curves
    are points ({"step", "train_s", "acc"}) every `every` steps: the step is the first such point at or
    above TRL's final."""
    trl_s, target = trl[-1]["train_s"], trl[-1]["acc"]
    for point in lucid:
        step, s, acc = point["step"], point["train_s"], point["acc"]
        if acc >= target - 1e-9:
            ratio = s / max(trl_s, 1e-9)
            hit = {"target": target, "step": step, "train_s": s, "trl_train_s": trl_s, "ratio": ratio}
            line = (
                f"lucidrl reached TRL's final accuracy {target:.3f} at step {step} after {s:.0f} s "
                f"(TRL: {trl_s:.0f} s), a ratio of {ratio:.2f} (goal: at most 1/3, "
                f"{'met' if ratio <= 1 / 3 else 'not met'}; curves measured every {every} steps)"
            )
            if step == 0:
                line += "; TRL ended no higher than the starting model"
            return hit, line
    best = max(lucid, key=lambda point: point["acc"])
    return None, (
        f"lucidrl never reached TRL's final accuracy {target:.3f} (TRL: {trl_s:.0f} s); its best was "
        f"{best['acc']:.3f} at step {best['step']}: no ratio"
    )


def run_seed(args: argparse.Namespace, seed: int, data: Path | None, work: Path) -> dict:
    """Both frameworks from the same model with one training seed, one after the other: the run's
    summary (what --json holds for it). Each worker's saved weights go with `work` when it is done."""
    results = {}
    for kind in ("lucidrl", "trl"):
        (work / kind).mkdir(parents=True)
        results[kind] = run_worker(kind, args, seed, data, work / kind)
        shutil.rmtree(work / kind)  # a float32 copy of the model per evaluated step
        print(f"  seed {seed}, {kind}: done, {results[kind]['curve'][-1][1]:.0f} s of training", flush=True)
    names = ("step", "train_s", "acc")
    curves = {
        kind: [dict(zip(names, point, strict=True)) for point in res["curve"]]
        for kind, res in results.items()
    }
    return {
        "setting": args.setting,
        "model": args.model if args.setting == "smollm2" else str(Path(args.from_demo) / "sft" / "final"),
        "steps": args.steps,
        "eval_every": args.eval_every,
        "n_eval": results["lucidrl"]["n_eval"],
        "threads": args.threads,
        "seed": seed,
        "recipe": results["trl"]["recipe"],
        "trl_bf16_autocast": results["trl"]["bf16_autocast"],
        "curves": curves,
        "step_s": {kind: res["step_s"] for kind, res in results.items()},
        "train": {kind: res["train"] for kind, res in results.items()},
        "reached": reached(curves["lucidrl"], curves["trl"], args.eval_every)[0],
    }


def print_curves(lucid: list[dict], trl: list[dict]) -> None:
    """Both held-out curves side by side: accuracy and training seconds at each evaluated step."""
    print(f"{'step':>5s} {'lucidrl acc':>12s} {'lucidrl train s':>16s} {'TRL acc':>8s} {'TRL train s':>12s}")
    for lp, tp in zip(lucid, trl, strict=True):
        print(
            f"{lp['step']:5d} {lp['acc']:12.3f} {lp['train_s']:16.0f} {tp['acc']:8.3f} {tp['train_s']:12.0f}"
        )


def print_run(run: dict) -> None:
    """One seed's tables: held-out accuracy against training time, the training batches, the verdict."""
    r, lucid, trl = run["recipe"], run["curves"]["lucidrl"], run["curves"]["trl"]
    kl = f"k3 KL {r['kl']}" if r["kl"] else "no KL"
    print(
        f"\nGRPO from {run['model']} ({run['setting']}): {r['prompts']} prompts x {r['n']} samples per step, "
        f"T={r['temperature']}, <= {r['max_new']} new tokens, lr {r['lr']} ({r['warmup']} warm-up steps), {kl}, "
        f"{'bf16 compute over float32 weights' if r['bf16'] else 'float32'}, {run['threads']} threads, "
        f"seed {run['seed']}; held-out greedy accuracy on {run['n_eval']} prompts (the same evaluator for both)\n"
    )
    print_curves(lucid, trl)
    print(
        "\neach step's training batch (before its update): mean reward, format rate, mean response tokens,\n"
        "and the update's gradient norm before clipping\n"
        f"{'step':>5s} {'lucidrl reward':>15s} {'format':>7s} {'tokens':>7s} {'grad':>7s} {'TRL reward':>11s} "
        f"{'format':>7s} {'tokens':>7s} {'grad':>7s}"
    )
    for step, (lt, tt) in enumerate(zip(run["train"]["lucidrl"], run["train"]["trl"], strict=True), 1):
        print(
            f"{step:5d} {lt['score']:15.3f} {lt['format']:7.3f} {lt['length']:7.1f} {lt['grad_norm']:7.3f} "
            f"{tt['score']:11.3f} {tt['format']:7.3f} {tt['length']:7.1f} {tt['grad_norm']:7.3f}"
        )
    last, tlast, steps = lucid[-1], trl[-1], run["steps"]
    print(
        f"\nfinal: lucidrl {last['acc']:.3f} in {last['train_s']:.0f} s, TRL {tlast['acc']:.3f} in "
        f"{tlast['train_s']:.0f} s (start {lucid[0]['acc']:.3f}); per step {last['train_s'] / steps:.1f} s "
        f"against {tlast['train_s'] / steps:.1f} s"
    )
    print(reached(lucid, trl, run["eval_every"])[1])


def mean_curves(runs: list[dict]) -> dict[str, list[dict]]:
    """Each framework's curve averaged over the runs (seeds), point by point: mean accuracy and mean
    training seconds at each evaluated step. The runs must share the setting, steps and evaluation points."""
    keys = ("setting", "model", "steps", "eval_every", "n_eval")
    first = runs[0]
    for run in runs[1:]:
        for key in keys:
            if run[key] != first[key]:
                sys.exit(
                    f"seed {run['seed']}'s run has {key}={run[key]!r}, seed {first['seed']}'s {first[key]!r}: "
                    "only runs of the same setting, steps and evaluation points average"
                )
    return {
        kind: [
            {
                "step": points[0]["step"],
                "train_s": sum(p["train_s"] for p in points) / len(points),
                "acc": sum(p["acc"] for p in points) / len(points),
            }
            for points in zip(*(run["curves"][kind] for run in runs), strict=True)
        ]
        for kind in ("lucidrl", "trl")
    }


def print_seeds(runs: list[dict]) -> dict:
    """The runs side by side, one line a seed, then both curves averaged over the seeds and when
    lucidrl's mean curve reached TRL's mean final accuracy. Returns the mean curves and that point."""
    print(
        f"\n{len(runs)} seeds: per-seed results\n"
        f"{'seed':>5s} {'lucidrl s/step':>15s} {'TRL s/step':>11s} {'faster':>7s} {'lucidrl final':>14s} "
        f"{'TRL final':>10s} {'reached at step':>16s} {'ratio':>6s}"
    )
    met = 0
    for run in runs:
        lucid, trl, hit = run["curves"]["lucidrl"], run["curves"]["trl"], run["reached"]
        ls, ts = lucid[-1]["train_s"] / run["steps"], trl[-1]["train_s"] / run["steps"]
        met += hit is not None and hit["ratio"] <= 1 / 3
        where = f"{hit['step']:16d} {hit['ratio']:6.2f}" if hit else f"{'never':>16s} {'-':>6s}"
        print(
            f"{run['seed']:5d} {ls:15.1f} {ts:11.1f} {ts / ls:6.2f}x {lucid[-1]['acc']:14.3f} "
            f"{trl[-1]['acc']:10.3f} {where}"
        )
    mean = mean_curves(runs)
    print(f"\nthe curves averaged over the {len(runs)} seeds\n")
    print_curves(mean["lucidrl"], mean["trl"])
    hit, line = reached(mean["lucidrl"], mean["trl"], runs[0]["eval_every"])
    print(f"\ngoal met in {met} of {len(runs)} seeds; on the mean curves, {line}")
    return {"seeds": [run["seed"] for run in runs], "curves": mean, "reached": hit, "seeds_met": met}


def check_seeds(seeds: list[int]) -> None:
    """Exit naming --seeds when a seed repeats (its run would be counted twice)."""
    if len(set(seeds)) != len(seeds):
        sys.exit(f"--seeds {' '.join(map(str, seeds))}: a seed repeats")


def load_runs(paths: list[str]) -> list[dict]:
    """The runs in --json files this script wrote (one seed's summary, or {"runs": [...]})."""
    runs = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"--combine {path}: cannot read it as this script's --json output ({e})")
        found = data["runs"] if isinstance(data, dict) and "runs" in data else [data]
        if not all(isinstance(run, dict) and {"seed", "curves", "reached"} <= run.keys() for run in found):
            sys.exit(f"--combine {path}: not this script's --json output (no seed, curves and reached)")
        runs += found
    seeds = [run["seed"] for run in runs]
    if len(set(seeds)) != len(seeds):
        sys.exit(f"--combine: seeds {seeds} repeat; give each seed's run once")
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=("kk", "smollm2"), help="default: kk with --from-demo, else smollm2")
    p.add_argument("--from-demo", help="kk: a scarce-labels seed folder (holds sft/final and data/)")
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"smollm2: the model folder (default {DEFAULT_MODEL})"
    )
    defaults = {
        key: " and ".join(f"{v[key]} for {k}" for k, v in DEFAULTS.items()) for key in ("steps", "eval_every")
    }
    p.add_argument("--steps", type=int, help=f"GRPO steps (default {defaults['steps']})")
    p.add_argument(
        "--eval-every", type=int, help=f"steps between evaluations (default {defaults['eval_every']})"
    )
    p.add_argument("--n-val", type=int, help="evaluate on the first N held-out prompts only (default: all)")
    p.add_argument("--threads", type=int, default=2, help="torch threads in each worker (default 2)")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="training seeds, both frameworks each, one after the other; with several, a table of all "
        "and the curves averaged over them (default 0)",
    )
    p.add_argument("--json", help="write the curves and the result to this file")
    p.add_argument(
        "--combine",
        nargs="+",
        metavar="JSON",
        help="run nothing: print the seeds' table and mean curves of runs this script wrote with --json",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.combine:
        runs = load_runs(args.combine)
        for run in runs:
            print_run(run)
        if len(runs) > 1:
            print_seeds(runs)
        return
    args.setting = args.setting or ("kk" if args.from_demo else "smollm2")
    if args.setting == "kk" and not args.from_demo:
        sys.exit("--setting kk starts from a scarce-labels seed folder: give --from-demo DIR/seed0")
    for key, value in DEFAULTS[args.setting].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("steps", "eval_every", "n_val", "threads"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            sys.exit(f"--{key.replace('_', '-')} {getattr(args, key)}: must be >= 1")
    check_seeds(args.seeds)

    if args.worker:
        torch.set_num_threads(args.threads)
        if args.setting == "kk":
            setting = kk_setting(Path(args.from_demo))
        else:
            setting = smollm2_setting(Path(args.model), Path(args.data))
        fn = worker_lucidrl if args.worker == "lucidrl" else worker_trl
        out = fn(
            setting, args.steps, args.eval_every, args.n_val, Path(args.work), args.threads, args.seeds[0]
        )
        print(json.dumps(out))
        return

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        data = None
        if args.setting == "smollm2":
            smollm2_setting(Path(args.model), Path(tmp) / "data")  # checks --model before any work
            data = Path(tmp) / "data"
            write_word_problems(data)
        else:
            kk_setting(Path(args.from_demo))
        for seed in args.seeds:
            runs.append(run_seed(args, seed, data, Path(tmp) / f"seed{seed}"))
            print_run(runs[-1])
    mean = print_seeds(runs) if len(runs) > 1 else None
    if args.json:
        out = runs[0] if len(runs) == 1 else {"runs": runs, "mean": mean}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"curves: {args.json}")


if __name__ == "__main__":
    main()
