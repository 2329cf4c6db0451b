"""`lucidrl experiment scarce-labels`: can RL turn a cheap verifier into accuracy where labels are scarce?

Labelled reasoning is scarce, a checker is cheap: can RL turn the checker into accuracy? Per seed:

1. data: 2-person (or with `people=3`, 3-person) Knights & Knaves puzzles with truth-table traces
   (`lucidrl data kk --trace`); a few
   hundred rows keep their traces (the labelled set, each puzzle also rendered `renderings - 1` more
   times under fresh names: data/kk/augment.py), the rest of the training pool is used as prompts
   only, scored by the K&K verifier; 100 held-out puzzles for validation;
2. a tiny Qwen2 built from scratch with a local tokenizer;
3. SFT on the labelled set for `sft_s` seconds (or `sft_steps` steps): the RL starting point;
4. from that checkpoint, two branches of equal wall time `rl_s` (or GRPO for `rl_steps` steps and the
   baseline for the time those steps took: GRPO's step times summed):
   a. GRPO on the unlabelled prompts with the verifier (KL loss, PPO clip, warm-up, collapse
      detection that stops the run and falls back to the last healthy weights);
   b. the baseline: the SFT run resumed (optimizer, schedule, data position) on the same labelled set;
5. held-out greedy accuracy (and sampled accuracy, k samples at temperature 1, and the share of
   traces right in every step) of the start and of both branches, and their greedy accuracy on the
   RL pool's puzzles GRPO drew (learning the task vs learning the pool's answers), printed per seed and
   written to `results.json`.

The RL user's budget is SFT + RL (`sft_s + rl_s`); the SFT-only baseline gets the same total.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lucidrl.config import config_from_dict
from lucidrl.data.kk.corpus import kk_tokenizer_corpus
from lucidrl.diagnostics.errors import UsageError

# per number of people, what the plan defaults to (ScarceLabelsPlan's fields left at None). 2-person K&K has 285
# distinct puzzles in all (TWO_PERSON_PUZZLES; 556 if the order people are introduced in counted, but a
# puzzle and its mirror are one puzzle): 100 held out, and the other 185 split between the labelled set and
# the RL pool, which GRPO then sees 20-odd times over. 3-person K&K has far more than any run gets
# through: a pool of 3000 never comes round twice, so what GRPO gains there it cannot gain by recalling
# answers. A 2-person trace is 60-150 tokens, a 3-person one 60-404 (seeds 0-2, 3400 puzzles each).
# The curve_every fields checkpoint the runs for held-out learning curves, evaluated after the seed: a few
# points per phase at the speeds of 2-core hosts.
PEOPLE_DEFAULTS = {
    2: {"labelled": 100, "unlabelled": 85, "renderings": 8, "max_new_tokens": 160, "sft_curve_every": 250,
        "rl_curve_every": 25},
    3: {"labelled": 200, "unlabelled": 3000, "renderings": 4, "max_new_tokens": 448, "sft_curve_every": 100,
        "rl_curve_every": 10},
}  # fmt: skip


@dataclass
class ScarceLabelsPlan:
    """What one seed of the experiment does."""

    people: int = 2  # puzzle size (2 or 3); the fields left at None take PEOPLE_DEFAULTS[people]
    labelled: int | None = None  # puzzles that keep their reasoning traces
    unlabelled: int | None = None  # prompts only, for RL
    # each labelled puzzle also rendered with fresh names and sentences (data/kk/augment.py), for both
    # SFT phases: with the traces alone the model copies names it memorised (docs/experiments)
    renderings: int | None = None
    pool_renderings: int = 1  # the same for the RL pool's prompts
    val: int = 100
    # SFT on the labelled rows before the branches: long enough for the 0.6M model to reach its plateau
    # on 2 cores (a 4.1M one is still at chance then)
    sft_s: float = 300.0
    rl_s: float = 360.0  # each branch's wall time
    # budgets in steps instead, so the phases do the same work on a busy or a slow machine: the first SFT
    # phase runs sft_steps steps; GRPO runs rl_steps steps, and the baseline then trains for as long as
    # they took (their step times summed: the branches stay of equal wall time). None: the seconds above
    sft_steps: int | None = None
    rl_steps: int | None = None
    # a model folder to start from (e.g. SmolLM2-135M-Instruct from `lucidrl model get`); None: a tiny
    # Qwen2 of `hidden` x `layers` built from scratch with a K&K tokenizer
    model: str | None = None
    hidden: int = 128
    layers: int = 2
    sft_batch: int = 32
    # length-sorted micro-batches of 8 rows (each padded to its own longest): the same gradient as one
    # forward of 32 in less time (benchmarks/sft_micro_batches.py), so the budget takes more steps
    sft_micro_batch: int = 8
    # None: by the start. 1e-3 SFT and 1e-4 GRPO for the tiny model trained from scratch; 2e-5 for both
    # from a pretrained --model, whose weights a scratch model's rates would wreck
    sft_lr: float | None = None
    rl_prompts: int = 16
    rl_n: int = 8
    rl_lr: float | None = None
    # rows per forward in GRPO's update and log-prob passes (the gradient does not depend on it); None:
    # 64 for the tiny model, 32 from a --model, whose LM head then runs on chunks of 1,024 tokens
    # (actor.head_chunk_tokens): SmolLM2's whole logits over 49,152 words do not fit at 64 rows
    # (benchmarks/README.md, "The LM head")
    rl_micro_batch: int | None = None
    rl_warmup: int = 3
    kl_coef: float = 0.02
    # model.compute_dtype of every phase. "auto": bf16 compute over float32 weights for a pretrained
    # --model on a CPU with native bf16 (AVX-512 BF16, AMX), else float32; the scratch model stays in
    # float32, as its measured tables were
    compute_dtype: str | None = "auto"
    max_new_tokens: int | None = None  # room for the longest trace of `people` (PEOPLE_DEFAULTS)
    eval_k: int = 4
    # held-out greedy accuracy every this many steps of each run (checkpoints evaluated once the seed's runs
    # are done, outside their time budgets); 0: no curves
    sft_curve_every: int | None = None
    rl_curve_every: int | None = None
    max_steps: int = 10_000  # the time budgets end the phases (without step budgets); this only bounds them

    def __post_init__(self) -> None:
        for key in ("sft_steps", "rl_steps"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(
                    f"lucidrl experiment scarce-labels: --{key.replace('_', '-')} must be an integer >= 1, "
                    f"got {value!r}"
                )
        if self.people not in PEOPLE_DEFAULTS:
            raise UsageError(
                f"lucidrl experiment scarce-labels: --people {self.people}: the experiment runs 2- or 3-person puzzles (a 4-person "
                "trace runs to about 700 tokens, more than a 2-core CPU trains and samples in the time)"
            )
        for key, value in PEOPLE_DEFAULTS[self.people].items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        pretrained = self.model is not None
        for key, scratch, tuned in (
            ("sft_lr", 1e-3, 2e-5),
            ("rl_lr", 1e-4, 2e-5),
            ("rl_micro_batch", 64, 32),
        ):
            if getattr(self, key) is None:
                setattr(self, key, tuned if pretrained else scratch)
        if self.compute_dtype == "auto":
            from lucidrl.models.precision import cpu_has_native_bf16

            self.compute_dtype = "bfloat16" if pretrained and cpu_has_native_bf16() else None


# the RL pool's accuracy (the table's last column) is measured on the first this many distinct puzzles GRPO
# drew, each once: all of a 2-person pool; of a 3-person pool of thousands, the first 200 of the ~1000 drawn
POOL_EVAL_MAX = 200


@dataclass
class SeedResult:
    seed: int
    start: dict = field(default_factory=dict)  # greedy/sampled accuracy and format of the SFT checkpoint
    rl: dict = field(default_factory=dict)
    sft_only: dict = field(default_factory=dict)
    sft_steps: int = 0  # of the shared SFT start
    rl_steps: int = 0  # steps GRPO ran (with a collapse, past the weights evaluated)
    rl_evaluated_step: int | None = (
        None  # the step whose weights were evaluated, when a collapse restored them
    )
    sft_only_steps: int = 0
    baseline_s: float = 0.0  # the baseline's budget: rl_s, or under rl_steps GRPO's step times summed
    pool_drawn: int = 0  # distinct pool puzzles GRPO drew (the "on RL prompts" column: up to POOL_EVAL_MAX)
    collapse: str | None = None
    saturation: str | None = None  # GRPO stopped because its prompts were solved (trainer/collapse.py)
    seconds: dict = field(default_factory=dict)  # wall time per phase, evaluations included
    # held-out greedy accuracy along each run, from its checkpoints: {"sft" | "grpo" | "sft_only": [{"step",
    # "train_s" (the run's step times summed, SFT alone's counted on from the first phase's), "greedy_acc",
    # "greedy_trace_ok"}]}
    curves: dict = field(default_factory=dict)


# the bar: GRPO at least this many points (whole points of held-out greedy accuracy) above both
# the RL start and SFT alone, in every one of at least MIN_SEEDS distinct seeds, the RL path (data,
# model, SFT, GRPO and their evaluations) within RL_PATH_LIMIT_S per seed
BAR_POINTS, MIN_SEEDS, RL_PATH_LIMIT_S = 20, 3, 900.0


def points(acc: float) -> int:
    """Greedy accuracy as whole points (an accuracy is n / 100 held-out puzzles: 0.75 - 0.55 >= 0.20
    is False in floats, and 38 of the 81 exact 20-point pairs failed the old test)."""
    return round(100 * acc)


def verdict(results: list[SeedResult]) -> dict:
    """The bar, seed by seed and as a whole: met only when every part of it is."""
    per_seed = []
    for r in results:
        gain = points(r.rl["greedy_acc"]) - max(
            points(r.start["greedy_acc"]), points(r.sft_only["greedy_acc"])
        )
        per_seed.append(
            {
                "seed": r.seed,
                "gain_over_both_points": gain,
                "beat_both": gain >= BAR_POINTS,
                "collapsed": r.collapse is not None,
                "saturated": r.saturation is not None,
                "rl_path_s": r.seconds.get("rl_path"),
            }
        )
    seeds = len({r.seed for r in results})
    wins = sum(s["beat_both"] for s in per_seed)
    in_time = all(s["rl_path_s"] is not None and s["rl_path_s"] <= RL_PATH_LIMIT_S for s in per_seed)
    return {
        "bar": f">= {BAR_POINTS} points over both the start and SFT alone, in {MIN_SEEDS} of {MIN_SEEDS} "
        f"distinct seeds, the RL path within {RL_PATH_LIMIT_S:.0f} s per seed",
        "seeds": seeds,
        "wins": wins,
        "within_time": in_time,
        "met": seeds >= MIN_SEEDS and wins == len(per_seed) and in_time,
        "per_seed": per_seed,
    }


def write_data(out: Path, plan: ScarceLabelsPlan, seed: int) -> dict[str, str]:
    """Labelled (with traces), unlabelled (prompts + the verifier's ground truth) and val parquet files."""
    from lucidrl.data.kk import write_kk_parquet
    from lucidrl.data.kk.augment import rerendered_rows

    info = write_kk_parquet(
        out, people=(plan.people, plan.people), n_train=plan.labelled + plan.unlabelled, n_val=plan.val, seed=seed,
        trace=True, system_prompt=False,
    )  # fmt: skip
    table = pq.read_table(info["train"])
    files = {
        "labelled": str(out / "labelled.parquet"),
        "unlabelled": str(out / "unlabelled.parquet"),
        # each pool puzzle once as first written; those GRPO drew go to pool_drawn.parquet after it
        "pool_puzzles": str(out / "pool_puzzles.parquet"),
        "pool_drawn": str(out / "pool_drawn.parquet"),
    }
    labelled = table.slice(0, plan.labelled)
    # the same labelled puzzles under fresh names and sentences: no new label, no new puzzle structure
    rows = rerendered_rows(labelled.to_pylist(), plan.renderings, seed, trace=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=labelled.schema), files["labelled"])
    # the RL pool: its traces are dropped, so nothing but the verifier's ground truth reaches training
    pool = table.slice(plan.labelled).drop_columns(["response"])
    pq.write_table(pool, files["pool_puzzles"])
    rows = rerendered_rows(pool.to_pylist(), plan.pool_renderings, f"{seed}-pool", trace=False)
    pq.write_table(pa.Table.from_pylist(rows, schema=pool.schema), files["unlabelled"])
    files["val"] = info["val"]
    return files


def sft_config(
    model: str, files: dict, run_dir: Path, plan: ScarceLabelsPlan, seed: int, seconds: float,
    resume_from: Path | None = None, steps: int | None = None,
) -> dict:  # fmt: skip
    """The first SFT phase (checkpointed at its last step), or with `resume_from` the baseline: that
    run continued, with its AdamW moments, LR schedule, data position and RNG. It ends after `seconds`
    of training, or with `steps` after that many steps."""
    # a save at the last step (the baseline resumes it), and one every sft_curve_every steps for the curve
    every = plan.sft_curve_every or plan.max_steps
    checkpoints = {"save_freq": every, "max_ckpt_to_keep": None if plan.sft_curve_every else 1}
    if resume_from is not None:
        # into its own run directory, out/sft_only: a resume may not empty it (run_seed clears it)
        checkpoints.update(resume_mode="resume_path", resume_from_path=str(resume_from), overwrite=False)
    return {
        "model": {"path": model, "compute_dtype": plan.compute_dtype},
        "data": {"train_files": [files["labelled"]], "batch_size": plan.sft_batch, "seed": seed},
        "micro_batch_size": min(plan.sft_micro_batch, plan.sft_batch),
        # a pretrained model's vocabulary: the LM head on chunks, never the whole logits, whose sizes change
        # with every micro-batch's length and grow the heap the allocator settings keep (docs/sft.md)
        "head_chunk_tokens": 1024 if plan.model else 0,
        "optim": {"lr": plan.sft_lr, "warmup_steps": 10},
        "trainer": {
            "experiment_name": "scarce-labels-sft",
            "run_dir": str(run_dir),
            "overwrite": True,
            "total_training_steps": steps or plan.max_steps,
            "max_time_s": None if steps else seconds,
            "seed": seed,
            **checkpoints,
        },
    }


def grpo_config(model: str, files: dict, run_dir: Path, plan: ScarceLabelsPlan, seed: int) -> dict:
    """GRPO with the stabilisers on: KL loss (k3), PPO clip, lr warm-up, collapse detection."""
    return {
        "model": {"path": model, "compute_dtype": plan.compute_dtype},
        "data": {
            "train_files": [files["unlabelled"]],
            "val_files": [],
            "max_prompt_length": 256,
            "max_response_length": plan.max_new_tokens,
            "train_batch_size": plan.rl_prompts,
            "seed": seed,
        },
        "rollout": {"n": plan.rl_n, "temperature": 1.0, "micro_batch_size": 128},
        "actor": {
            "optim": {"lr": plan.rl_lr, "warmup_steps": plan.rl_warmup},
            "ppo_mini_batch_size": plan.rl_prompts,
            "ppo_micro_batch_size": min(plan.rl_micro_batch, plan.rl_prompts * plan.rl_n),
            "log_prob_micro_batch_size": plan.rl_micro_batch,
            "use_kl_loss": True,
            "kl_loss_coef": plan.kl_coef,
            "kl_loss_type": "low_var_kl",
            "head_chunk_tokens": 1024 if plan.model else 0,
        },
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "experiment_name": "scarce-labels-grpo",
            "run_dir": str(run_dir),
            "overwrite": True,
            "total_training_steps": plan.rl_steps or plan.max_steps,
            "max_time_s": None if plan.rl_steps else plan.rl_s,
            "val_before_train": False,
            "seed": seed,
            "save_freq": plan.rl_curve_every or 0,
            "collapse": {
                "min_mixed_groups_ratio": 0.25,
                # a collapse takes the score from ~1.5 to -3 (format and answers lost) within a few
                # steps; 16 prompts' mean score swings by +-0.5 from step to step, so a 0.5 drop of a
                # 3-step EMA stopped a healthy run at step 78 from the renamed-label start
                "score_ema": 0.9,
                "max_score_drop": 1.0,
                "max_kl": 0.3,
                "patience": 3,
                "keep_last_healthy": True,
            },
        },
    }


def _accuracy(path: Path, files: dict, plan: ScarceLabelsPlan, seed: int) -> dict[str, float]:
    from lucidrl.trainer.evaluation import evaluate

    r = evaluate(str(path), [files["val"]], k=plan.eval_k, max_new_tokens=plan.max_new_tokens, seed=seed)[
        "data_sources"
    ]["kk_logic"]
    return {
        "greedy_acc": r["greedy"]["acc"],
        "greedy_format": r["greedy"]["format_ok"],
        # right answers can be lucky (1 in 4 for 2 people): the share of traces right in every step
        "greedy_trace_ok": r["greedy"]["trace_ok"],
        "sampled_acc": r["sampled"]["acc"],
        "sampled_format": r["sampled"]["format_ok"],
        "sampled_trace_ok": r["sampled"]["trace_ok"],
    }


def write_drawn_pool(files: dict, drawn: list) -> int:
    """pool_drawn.parquet: the first POOL_EVAL_MAX distinct pool puzzles GRPO drew (PromptSamples in draw
    order), each once as first written; returns how many distinct puzzles it drew in all."""
    table = pq.read_table(files["pool_puzzles"])
    row_of = {info["statements"]: i for i, info in enumerate(table.column("extra_info").to_pylist())}
    order = list(dict.fromkeys(sample.extra_info["statements"] for sample in drawn))
    pq.write_table(table.take([row_of[s] for s in order[:POOL_EVAL_MAX]]), files["pool_drawn"])
    return len(order)


def _pool_accuracy(path: Path, files: dict, plan: ScarceLabelsPlan, seed: int) -> dict[str, float]:
    """Greedy accuracy on the pool puzzles GRPO drew, each once as first written (pool_drawn.parquet).

    Set beside the held-out accuracy, it tells learning the task from learning the pool's answers:
    2-person K&K has only 285 distinct puzzles, and GRPO sees each of its pool's many times; a 3-person
    pool of thousands is drawn from once each, so there these are prompts GRPO saw one time.
    """
    from lucidrl.trainer.evaluation import evaluate

    r = evaluate(
        str(path), [files["pool_drawn"]], k=1, max_new_tokens=plan.max_new_tokens, seed=seed, sampled=False,
    )["data_sources"]["kk_logic"]["greedy"]  # fmt: skip
    return {"pool_greedy_acc": r["acc"], "pool_greedy_trace_ok": r["trace_ok"]}


def learning_curve(
    run_dir: Path,
    files: dict,
    plan: ScarceLabelsPlan,
    seed: int,
    start_s: float = 0.0,
    restored: dict | None = None,
) -> list[dict]:
    """Held-out greedy accuracy of each checkpoint a run saved, in step order, with its training time: the
    run's step times summed up to that step, from `start_s` (checkpoint saves are not counted).

    `restored`, for a GRPO run that ended on earlier weights (collapse detection's keep_last_healthy):
    {"step", "greedy_acc", "greedy_trace_ok"} of its final model. Its last checkpoint holds those
    weights, not its step's, so it is left out, and the final model is the point at the step it holds.
    """
    from lucidrl.trainer.checkpoint import saved_steps
    from lucidrl.trainer.evaluation import evaluate

    step_s = _step_times(run_dir)

    def train_s(step: int) -> float:
        return start_s + sum(t for s, t in step_s.items() if s <= step)

    saved = saved_steps(run_dir)
    if restored is not None:
        saved = [(step, p) for step, p in saved if step != max(step_s) and step != restored["step"]]
    points = []
    for step, folder in saved:
        g = evaluate(
            str(folder / "actor" / "model"), [files["val"]], k=1, max_new_tokens=plan.max_new_tokens,
            seed=seed, sampled=False,
        )["data_sources"]["kk_logic"]["greedy"]  # fmt: skip
        points.append(
            {"step": step, "train_s": train_s(step), "greedy_acc": g["acc"], "greedy_trace_ok": g["trace_ok"]}
        )
    if restored is not None:
        points.append({**restored, "train_s": train_s(restored["step"]), "restored": True})
    return sorted(points, key=lambda p: p["step"])


def run_seed(out: Path, plan: ScarceLabelsPlan, seed: int, console: Console) -> SeedResult:
    from lucidrl.config import SFTConfig
    from lucidrl.models import build_tiny_model
    from lucidrl.trainer.ppo import PPOTrainer
    from lucidrl.trainer.sft import SFTTrainer

    res, t0 = SeedResult(seed=seed), time.perf_counter()
    phase = {"at": t0}

    def lap(name: str) -> None:
        now = time.perf_counter()
        res.seconds[name] = now - phase["at"]
        phase["at"] = now

    files = write_data(out / "data", plan, seed)
    if plan.model is None:
        model = build_tiny_model(
            out / "model",
            kk_tokenizer_corpus(seed),
            hidden_size=plan.hidden,
            num_layers=plan.layers,
            seed=seed,
        )
        described = f"tiny Qwen2 {model['num_parameters'] / 1e6:.1f}M parameters"
    else:
        model = {"path": plan.model}
        described = f"the model in {plan.model}"
    console.print(
        f"[bold]seed {seed}[/bold]: {plan.people}-person puzzles, {plan.labelled} labelled traces "
        f"(x{plan.renderings} renderings), "
        f"{plan.unlabelled} unlabelled puzzles (x{plan.pool_renderings}), {plan.val} held out; "
        f"{described}"
    )

    def sft(
        model_path: str,
        run_dir: Path,
        seconds: float,
        resume_from: Path | None = None,
        steps: int | None = None,
    ) -> int:
        cfg = sft_config(model_path, files, run_dir, plan, seed, seconds, resume_from, steps)
        trainer = SFTTrainer(
            config_from_dict(cfg, source="lucidrl experiment scarce-labels", schema=SFTConfig)
        )
        trainer.fit()
        return trainer.global_step

    lap("data_and_model")
    console.print(f"  SFT on the labelled traces for {_budget(plan.sft_steps, plan.sft_s)}")
    res.sft_steps = sft(model["path"], out / "sft", plan.sft_s, steps=plan.sft_steps)
    lap("sft")
    start_model = out / "sft" / "final"
    res.start = _accuracy(start_model, files, plan, seed)  # its pool accuracy once GRPO has drawn
    lap("start_eval")
    console.print(f"  start (SFT checkpoint, {res.sft_steps} steps): {_line(res.start)}")

    console.print(
        f"  a. GRPO on the unlabelled puzzles with the verifier for {_budget(plan.rl_steps, plan.rl_s)}"
    )
    trainer = PPOTrainer(config_from_dict(grpo_config(str(start_model), files, out / "grpo", plan, seed)))
    trainer.announce()
    trainer.fit()
    res.rl_steps = trainer.global_step
    res.collapse = trainer.collapse.message() if trainer.collapse else None
    res.saturation = trainer.saturation.message() if trainer.saturation else None
    if trainer.restored_step is not None:
        res.rl_evaluated_step = trainer.restored_step
    lap("grpo")
    res.pool_drawn = write_drawn_pool(files, trainer.loader.drawn(trainer.batches_drawn))
    began = time.perf_counter()
    res.start.update(_pool_accuracy(start_model, files, plan, seed))
    res.seconds["start_eval"] += time.perf_counter() - began
    phase["at"] = time.perf_counter()
    evaluated = min(res.pool_drawn, POOL_EVAL_MAX)
    console.print(
        f"  GRPO drew {res.pool_drawn} distinct pool puzzles; the start on {evaluated} of them: greedy "
        f"{res.start['pool_greedy_acc']:.2f}"
    )
    res.rl = _accuracy(out / "grpo" / "final", files, plan, seed)
    res.rl.update(_pool_accuracy(out / "grpo" / "final", files, plan, seed))
    lap("grpo_eval")
    res.seconds["rl_path"] = sum(
        res.seconds[k] for k in ("data_and_model", "sft", "start_eval", "grpo", "grpo_eval")
    )
    evaluated = (
        f", the weights after step {res.rl_evaluated_step} evaluated"
        if res.rl_evaluated_step is not None
        else ""
    )
    console.print(f"  after GRPO ({res.rl_steps} steps{evaluated}): {_line(res.rl)}")

    # the first SFT run resumed from its last step, so SFT alone is one run of sft_s + rl_s: its AdamW
    # moments, LR schedule and place in the shuffled epochs carry on (a fresh run from the start
    # weights would warm up again and replay the first phase's batch order)
    # the branches' equal wall time: under a step budget, the time GRPO's steps took (the clock the
    # learning curves use), with or without the collapse guard's early stop
    res.baseline_s = plan.rl_s if plan.rl_steps is None else sum(_step_times(out / "grpo").values())
    console.print(
        f"  b. baseline: the SFT run resumed on the same labelled traces for {res.baseline_s:.0f} s more"
        + (" (as long as GRPO's steps took)" if plan.rl_steps is not None else "")
    )
    # model.path as in the first run (a key its checkpoint holds to); the weights come from the checkpoint.
    # A resume into another folder may not empty it (trainer.overwrite), and a previous demo's baseline
    # may be there: the demo owns out/, so it clears that folder itself
    shutil.rmtree(out / "sft_only", ignore_errors=True)
    resumed = sft(model["path"], out / "sft_only", res.baseline_s, resume_from=out / "sft")
    res.sft_only_steps = resumed - res.sft_steps
    lap("baseline")
    res.sft_only = _accuracy(out / "sft_only" / "final", files, plan, seed)
    res.sft_only.update(_pool_accuracy(out / "sft_only" / "final", files, plan, seed))
    lap("baseline_eval")
    console.print(f"  SFT only: {_line(res.sft_only)}")
    if plan.sft_curve_every or plan.rl_curve_every:
        console.print("  learning curves: held-out greedy accuracy of each run's checkpoints")
        res.curves["sft"] = learning_curve(out / "sft", files, plan, seed)
        sft_s = res.curves["sft"][-1]["train_s"] if res.curves["sft"] else 0.0
        restored = None
        if res.rl_evaluated_step is not None:
            restored = {
                "step": res.rl_evaluated_step,
                **{k: res.rl[k] for k in ("greedy_acc", "greedy_trace_ok")},
            }
        res.curves["grpo"] = learning_curve(out / "grpo", files, plan, seed, start_s=sft_s, restored=restored)
        res.curves["sft_only"] = learning_curve(out / "sft_only", files, plan, seed, start_s=sft_s)
        for name, points in res.curves.items():
            console.print(
                f"    {name}: "
                + ", ".join(
                    f"{p['greedy_acc']:.2f} at {p['train_s']:.0f} s"
                    + (" (restored)" if p.get("restored") else "")
                    for p in points
                )
            )
        lap("curves")
    res.seconds["total"] = time.perf_counter() - t0
    return res


def _budget(steps: int | None, seconds: float) -> str:
    return f"{steps} steps" if steps is not None else f"{seconds:.0f} s"


def _step_times(run_dir: Path) -> dict[int, float]:
    """{step: seconds} from a run's metrics.jsonl (timing_s/step): its training time, evaluation and
    checkpoint saves left out."""
    from lucidrl.trainer.report import read_metrics

    return dict(read_metrics(run_dir / "metrics.jsonl").series.get("timing_s/step", []))


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}"


def _line(acc: dict[str, float]) -> str:
    return (
        f"greedy accuracy {acc['greedy_acc']:.2f} (format {acc['greedy_format']:.2f}, traces right "
        f"{_share(acc['greedy_trace_ok'])}), sampled {acc['sampled_acc']:.2f} (format "
        f"{acc['sampled_format']:.2f}, traces right {_share(acc['sampled_trace_ok'])})"
        + (f"; on the RL prompts greedy {acc['pool_greedy_acc']:.2f}" if "pool_greedy_acc" in acc else "")
    )


def results_table(results: list[SeedResult]) -> Table:
    table = Table(
        title="held-out greedy accuracy (sampled accuracy, k samples at T=1, in brackets)",
        caption=(
            "traces right: % of greedy traces right in every step; on RL prompts: greedy accuracy % on the "
            f"puzzles GRPO drew (never held out; the first {POOL_EVAL_MAX} of them); both as start/GRPO/SFT only"
        ),
    )
    for col in (
        "seed",
        "RL start (SFT)",
        "after GRPO",
        "SFT only, same time",
        "GRPO - start",
        "GRPO - SFT only",
        "traces right %",
        "on RL prompts %",
    ):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            str(r.seed),
            f"{r.start['greedy_acc']:.2f} ({r.start['sampled_acc']:.2f})",
            f"{r.rl['greedy_acc']:.2f} ({r.rl['sampled_acc']:.2f})"
            + (" collapse" if r.collapse else " saturated" if r.saturation else ""),
            f"{r.sft_only['greedy_acc']:.2f} ({r.sft_only['sampled_acc']:.2f})",
            f"{100 * (r.rl['greedy_acc'] - r.start['greedy_acc']):+.0f} pts",
            f"{100 * (r.rl['greedy_acc'] - r.sft_only['greedy_acc']):+.0f} pts",
            "/".join(_percent(x.get("greedy_trace_ok")) for x in (r.start, r.rl, r.sft_only)),
            "/".join(_percent(x.get("pool_greedy_acc")) for x in (r.start, r.rl, r.sft_only)),
        )
    return table


def run_experiment(out: Path, seeds: list[int], plan: ScarceLabelsPlan | None = None) -> list[SeedResult]:
    """Run the experiment for each seed; print the per-seed table and the verdict; write JSON."""
    plan = plan or ScarceLabelsPlan()
    if len(set(seeds)) != len(seeds):  # a repeat shares the folder, data and weights, and counted as a seed
        raise UsageError(
            f"lucidrl experiment scarce-labels: --seeds {' '.join(map(str, seeds))} repeats a seed; give distinct seeds"
        )
    if plan.unlabelled < plan.rl_prompts:  # else refused only after the SFT phase and its evaluation
        raise UsageError(
            f"lucidrl experiment scarce-labels: --unlabelled {plan.unlabelled} is fewer than the {plan.rl_prompts} prompts of one GRPO "
            "step; give at least that many"
        )
    console = Console(highlight=False)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]lucidrl experiment scarce-labels[/bold]: a cheap verifier, GRPO vs SFT alone (CPU)")
    results = []
    for seed in seeds:
        results.append(run_seed(out / f"seed{seed}", plan, seed, console))
        summary = {"plan": asdict(plan), "seeds": [asdict(r) for r in results], "verdict": verdict(results)}
        summary["wall_s"] = time.perf_counter() - start
        (out / "results.json").write_text(json.dumps(summary, indent=2))
    console.rule("[bold]results[/bold]")
    console.print(results_table(results))
    v = verdict(results)
    collapsed_wins = sum(s["beat_both"] and s["collapsed"] for s in v["per_seed"])
    gains = [points(r.rl["greedy_acc"]) - points(r.sft_only["greedy_acc"]) for r in results]
    console.print(
        f"GRPO beat both the start and SFT alone by >= {BAR_POINTS} points in {v['wins']} of {len(results)} "
        f"seeds"
        + (f" ({collapsed_wins} of them after a collapse)" if collapsed_wins else "")
        + f" (mean GRPO - SFT only: {statistics.mean(gains):+.1f} points)"
    )
    for r in results:
        if r.collapse:
            console.print(
                escape(
                    f"seed {r.seed}: {r.collapse} (the weights after step {r.rl_evaluated_step} were evaluated)"
                )
            )
        if r.saturation:
            console.print(escape(f"seed {r.seed}: {r.saturation} (GRPO's last weights were evaluated)"))
    slowest = max((s["rl_path_s"] or 0.0) for s in v["per_seed"])
    console.print(
        f"the bar ({v['bar']}): {'MET' if v['met'] else 'NOT MET'} ({v['seeds']} distinct seed(s), "
        f"{v['wins']} beat both, the slowest RL path {slowest:.0f} s)"
    )
    per_seed = statistics.mean(r.seconds["total"] for r in results)
    sft_budget, rl_budget = _budget(plan.sft_steps, plan.sft_s), _budget(plan.rl_steps, plan.rl_s)
    baseline = f"{plan.rl_s:.0f} s" if plan.rl_steps is None else "the time GRPO's steps took"
    console.print(
        f"budget per seed: SFT {sft_budget} + GRPO {rl_budget} (the baseline: SFT {sft_budget} + {baseline}); "
        f"wall time {time.perf_counter() - start:.0f} s ({per_seed:.0f} s per seed, evaluation and the "
        "baseline included)"
    )
    console.print(escape(f"results: {out / 'results.json'}; runs under {out}/seed*/ (sft, grpo, sft_only)"))
    return results
