"""`lucidrl doctor [CONFIG key=value]`: what training needs on this machine, with fixes."""

from __future__ import annotations

import argparse
from pathlib import Path

from lucidrl.cli.common import split_config_args


def add(sub: argparse._SubParsersAction) -> None:
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
    doctor.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
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
    config_path, overrides = split_config_args(args.args)
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
