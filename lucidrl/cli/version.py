"""`lucidrl version`."""

from __future__ import annotations

import argparse

from lucidrl import __version__


def add(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("version", help="print the version").set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    print(f"lucidrl {__version__}")
    return 0
