"""`lucidrl report RUN_DIR`: plots and an HTML page from a run's metrics."""

from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="plots and an HTML page from a run's metrics.jsonl")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    report.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
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
