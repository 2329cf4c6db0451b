"""The `lucidrl` command: demo, train, sft, data, model, eval, export, report, serve, doctor, experiment,
version."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

COMMANDS = (
    "version",
    "demo",
    "experiment",
    "doctor",
    "train",
    "sft",
    "data",
    "eval",
    "export",
    "report",
    "model",
    "serve",
)


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser, each added by its own module (cli/COMMAND.py, its handler beside it)."""
    p = argparse.ArgumentParser(prog="lucidrl", description="RL post-training for LLMs (GRPO, PPO, ...).")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"lucidrl.cli.{name}").add(sub)
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
