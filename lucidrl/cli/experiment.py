"""`lucidrl experiment`: experiments beyond the demo (scarce-labels)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
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
    scarce.set_defaults(fn=run_scarce_labels)


def run_scarce_labels(args: argparse.Namespace) -> int:
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
