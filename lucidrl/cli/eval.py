"""`lucidrl eval MODEL --data FILE`: greedy and sampled accuracy of a model on prompts."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
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
    ev.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
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
