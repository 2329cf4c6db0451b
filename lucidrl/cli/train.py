"""`lucidrl train CONFIG key=value` (or a verl command line)."""

from __future__ import annotations

import argparse

from lucidrl.cli.common import print_keys, run_dir_contents, split_config_args


def add(sub: argparse._SubParsersAction) -> None:
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
    train.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from lucidrl.config import LucidConfig, load_config
    from lucidrl.trainer.restart import fit_with_restarts

    if args.help_config:
        return print_keys(LucidConfig)
    config_path, overrides = split_config_args(args.args)
    # a verl command line (an actor_rollout_ref.* key, or --verl) is translated and the translation printed
    cfg = load_config(config_path, overrides, verl=True if args.verl else None)
    # on a Ray worker's death it resumes from the latest checkpoint, trainer.max_restarts times
    trainer = fit_with_restarts(cfg)
    print(f"run directory: {trainer.run_dir} ({run_dir_contents(cfg.trainer)})")
    return 0
