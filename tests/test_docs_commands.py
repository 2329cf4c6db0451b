"""Every `lucidrl ...` command the README and docs show parses with the real CLI parser.

Code blocks are held whole: each command line (a `\\` continues it, `$ ` and `VAR=value` prefixes and
`# comments` are dropped) must parse as written, placeholders such as MODEL or RUN_DIR included. Inline
code spans are often fragments (`lucidrl data kk --trace`), so for them a missing required argument
is allowed, but every subcommand, option and choice they name must exist and no argument may be left
over: `lucidrl eval MODEL DATA` fails (the data file is `--data`).

Parsing only: nothing runs. The count of commands checked is printed (`pytest -s`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from lucidrl.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^\s*(```|~~~)")
# what may stand before the command on its line: a shell prompt, VAR=value, a wrapper; then lucidrl itself
# (bare, as a path such as .venv/bin/lucidrl, or python -m lucidrl)
PREFIX = r"(?:\$\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:(?:taskset\s+-c\s+\S+|nohup|time|env)\s+)*"
COMMAND = re.compile(rf"^\s*{PREFIX}(?:\S*/)?(?:(?:\S*python\S*\s+-m\s+)?lucidrl)(?=\s|$)(.*)$")
INLINE = re.compile(r"(?<!`)`(lucidrl\s[^`]+)`(?!`)")
SHELL_SPLIT = re.compile(r"\s(?:&&|\|\||\||;)\s")


class ParseFailure(Exception):
    pass


def _raise(message: str) -> None:
    raise ParseFailure(message)


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def make_parser(lenient: bool) -> argparse.ArgumentParser:
    """lucidrl's parser, raising instead of exiting; `lenient`: no argument is required (fragments)."""
    parser = build_parser()
    for p in _parsers(parser):
        p.error = _raise  # type: ignore[method-assign]
        p.exit_on_error = False
        if not lenient:
            continue
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                action.required = False
            elif not action.option_strings:  # a positional: may be left out
                action.nargs = {None: "?", "+": "*"}.get(action.nargs, action.nargs)
            else:
                action.required = False
    return parser


def parses(parser: argparse.ArgumentParser, argv: list[str], fragment: bool = False) -> str | None:
    """None when `argv` parses (or asks for --help), else argparse's message. A `fragment` may end in an
    option that takes a value without giving it (`lucidrl eval --stop-regex`)."""
    if fragment and argv and argv[-1].startswith("-"):
        error = parses(parser, argv)
        return error if error is None or "expected" not in error else parses(parser, [*argv, "X"])
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # --help prints
            parser.parse_args(argv)
    except ParseFailure as e:
        return str(e)
    except SystemExit as e:  # --help, --version: parsed
        return None if e.code in (0, None) else f"exit {e.code}"
    except argparse.ArgumentError as e:
        return str(e)
    return None


def _argv(rest: str) -> list[str]:
    """The arguments as the shell passes them, less a trailing `&` and the `...` that elide the rest."""
    argv = shlex.split(rest, comments=True)
    if argv and argv[-1] == "&":
        argv = argv[:-1]
    return [a for a in argv if a not in ("...", "…")]


def block_commands(text: str) -> list[tuple[int, list[str], str]]:
    """(line, argv after `lucidrl`, the command as written) of each command line in fenced code blocks."""
    found, in_block, pending, start = [], False, "", 0
    for no, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_block, pending = not in_block, ""
            continue
        if not in_block:
            continue
        if pending:
            line = pending + " " + line.strip()
        else:
            start = no
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1]
            continue
        pending = ""
        for part in SHELL_SPLIT.split(line):
            m = COMMAND.match(part)
            if m:
                found.append((start, _argv(m.group(1)), part.strip()))
    return found


def inline_commands(text: str) -> list[tuple[int, list[str], str]]:
    """(line, argv after `lucidrl`, the span) of each `lucidrl ...` inline code span outside code blocks."""
    found, in_block = [], False
    for no, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_block = not in_block
            continue
        if in_block:
            continue
        for m in INLINE.finditer(line):
            span = m.group(1)
            for part in SHELL_SPLIT.split(span):
                c = COMMAND.match(part)
                if c:
                    found.append((no, _argv(c.group(1)), part.strip()))
    return found


def test_the_extraction_finds_commands_and_leaves_out_what_is_not_one():
    text = "\n".join(
        [
            "```bash",
            "source .venv/bin/activate",
            "lucidrl model tiny --out models/tiny        # a comment",
            "OMP_NUM_THREADS=1 taskset -c 1 lucidrl train x.yaml \\",
            "    trainer.num_threads=1",
            "$ lucidrl train typo.yaml          # a file with actor.clip_ratio in it",
            "lucidrl: run directory runs/grpo_kk (a log line, not a command)",
            "python -m lucidrl.config.reference docs/x.md",
            "```",
            "See `lucidrl eval MODEL --data FILE` and `lucidrl.rewards` and `lucidrl`.",
        ]
    )
    assert [(n, a) for n, a, _ in block_commands(text)] == [
        (3, ["model", "tiny", "--out", "models/tiny"]),
        (4, ["train", "x.yaml", "trainer.num_threads=1"]),
        (6, ["train", "typo.yaml"]),
    ]
    assert [(n, a) for n, a, _ in inline_commands(text)] == [(10, ["eval", "MODEL", "--data", "FILE"])]


def test_a_command_that_does_not_parse_is_caught():
    strict, lenient = make_parser(lenient=False), make_parser(lenient=True)
    assert parses(strict, ["eval", "MODEL", "--data", "FILE"]) is None
    assert "--data" in parses(strict, ["eval", "MODEL", "DATA"])
    assert "unrecognized arguments: DATA" in parses(lenient, ["eval", "MODEL", "DATA"])
    assert "--out" in parses(strict, ["data", "kk", "--trace"])  # required: a whole command needs it
    assert parses(lenient, ["data", "kk", "--trace"]) is None  # a fragment need not
    assert parses(lenient, ["data", "kk", "--tarce"]) is not None
    assert parses(lenient, ["trian"]) is not None
    assert parses(strict, ["train", "--help"]) is None
    assert parses(lenient, ["eval", "--stop-regex"], fragment=True) is None
    assert parses(lenient, ["eval", "--stop-regx"], fragment=True) is not None
    assert _argv("serve models/tiny --port 8100 &  # in the background") == [
        "serve",
        "models/tiny",
        "--port",
        "8100",
    ]
    assert _argv("data ...") == ["data"]


def test_every_lucidrl_command_in_the_readme_and_docs_parses(capsys):
    strict, lenient = make_parser(lenient=False), make_parser(lenient=True)
    failures, counts = [], {"block": 0, "inline": 0}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(ROOT)
        for kind, commands, parser in (
            ("block", block_commands(text), strict),
            ("inline", inline_commands(text), lenient),
        ):
            for line, argv, written in commands:
                counts[kind] += 1
                error = parses(parser, argv, fragment=kind == "inline")
                if error:
                    failures.append(f"{where}:{line}: `{written}`: {error}")
    with capsys.disabled():
        print(
            f"\ndocs commands checked: {counts['block'] + counts['inline']} "
            f"({counts['block']} in code blocks, {counts['inline']} inline) in {len(PAGES)} pages"
        )
    assert counts["block"] >= 40, counts  # the extraction found the pages' commands
    assert not failures, "commands in the docs that lucidrl's parser refuses:\n" + "\n".join(failures)


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_the_quick_start_commands_are_found(page):
    commands = [a[0] for _, a, _ in block_commands((ROOT / page).read_text(encoding="utf-8"))]
    assert {"model", "data", "sft", "train", "eval", "export", "report"} <= set(commands)
