"""`lucidrl sft CONFIG key=value`: supervised fine-tuning."""

from __future__ import annotations

import argparse

from lucidrl.cli.common import print_keys, run_dir_contents, split_config_args


def add(sub: argparse._SubParsersAction) -> None:
    sft = sub.add_parser("sft", help="supervised fine-tuning on (prompt, response) parquet")
    sft.add_argument("args", nargs="*", metavar="CONFIG.yaml key=value", help="config file, then overrides")
    sft.add_argument(
        "--help-config", action="store_true", help="print every config key, its default and type"
    )
    sft.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from lucidrl.config import SFTConfig, load_config
    from lucidrl.trainer.interrupt import RaiseOnSigterm
    from lucidrl.trainer.sft import SFTTrainer

    if args.help_config:
        return print_keys(SFTConfig)
    config_path, overrides = split_config_args(args.args)
    cfg = load_config(config_path, overrides, schema=SFTConfig)
    with RaiseOnSigterm():  # loading the model and data: SIGTERM stops with a word, not silently
        trainer = SFTTrainer(cfg)
    run_dir = trainer.fit()
    print(f"run directory: {run_dir} ({run_dir_contents(cfg.trainer)})")
    return 0
