"""`lucidrl export CHECKPOINT OUT`: a HuggingFace model folder from a checkpoint's actor."""

from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
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
    export.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from lucidrl.trainer.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    print(f"wrote a HuggingFace model folder to {out} (the actor of {args.checkpoint})")
    return 0
