"""`lucidrl data TASK`: task data as verl-schema parquet (countdown, word-problems, arithmetic, kk)."""

from __future__ import annotations

import argparse
import re


def add(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="generate task data").add_subparsers(dest="task", required=True)
    cd = data.add_parser("countdown", help="Countdown puzzles (TinyZero's task) as verl-schema parquet")
    cd.add_argument("--numbers", default="3-4", help="numbers per puzzle: '3' or a range '3-4' (2 to 4)")
    cd.add_argument("--max-number", type=int, default=99, help="numbers are drawn from 1..N (default 99)")
    cd.add_argument("--max-target", type=int, default=100, help="targets are 1..N (default 100)")
    cd.add_argument("--train", type=int, default=1000)
    cd.add_argument("--val", type=int, default=100)
    cd.add_argument("--seed", type=int, default=0)
    cd.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    cd.set_defaults(fn=run_countdown)

    wp = data.add_parser(
        "word-problems",
        help="one-step word problems (add, subtract, multiply small numbers) with an exact rule reward",
    )
    wp.add_argument("--train", type=int, default=2000)
    wp.add_argument(
        "--val",
        type=int,
        default=150,
        help="val problems (default 150; with mul at most 179: there are 64 one-digit products); "
        "their numbers never occur in train",
    )
    wp.add_argument("--ops", default="add,sub,mul", help="operations, a comma list of add, sub, mul")
    wp.add_argument(
        "--format",
        default="answer_is",
        choices=["answer_is", "gsm8k"],
        help="the answer format asked for and rewarded: 'The answer is N.' (default) or GSM8K's '#### N'",
    )
    wp.add_argument(
        "--shots",
        type=int,
        default=0,
        choices=[0, 1],
        help="0 (default): the problem alone; 1: each prompt starts with a worked example of the format",
    )
    wp.add_argument("--seed", type=int, default=0)
    wp.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    wp.set_defaults(fn=run_word_problems)

    ar = data.add_parser("arithmetic", help="multi-digit arithmetic questions (a calculator tool helps)")
    ar.add_argument("--digits", default="3x2", help="operand digits 'AxB' (default 3x2: 482 * 37)")
    ar.add_argument("--ops", nargs="+", default=["*"], choices=["*", "+", "-"], help="operations (default *)")
    ar.add_argument("--no-tool-hint", action="store_true", help="do not tell the model to use the calculator")
    ar.add_argument(
        "--few-shot", action="store_true", help="start each prompt with one worked tool-using exchange"
    )
    ar.add_argument("--words", action="store_true", help="word problems, to be turned into an expression")
    ar.add_argument("--train", type=int, default=1000)
    ar.add_argument("--val", type=int, default=100)
    ar.add_argument("--seed", type=int, default=0)
    ar.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    ar.set_defaults(fn=run_arithmetic)

    kk = data.add_parser("kk", help="Knights & Knaves puzzles as verl-schema parquet")
    kk.add_argument("--people", default="2-4", help="number of people: '3' or a range '2-4'")
    # spread evenly over the sizes: 1000 + 100 over 2-4 asked 368 of the 285 distinct 2-person puzzles
    kk.add_argument(
        "--train", type=int, default=600, help="train puzzles, spread evenly over --people (default 600)"
    )
    kk.add_argument(
        "--val",
        type=int,
        default=60,
        help="val puzzles (default 60): the first of each size's stream from --seed, so a separate test file "
        "needs another --seed (the same seed repeats this file's puzzles)",
    )
    kk.add_argument("--seed", type=int, default=0)
    kk.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    kk.add_argument(
        "--trace",
        action="store_true",
        help="SFT responses reason through a truth table inside <think> before the answer",
    )
    kk.add_argument(
        "--no-system-prompt",
        action="store_true",
        help="leave out Logic-RL's instruction (~150 tokens): for tiny models trained from scratch",
    )
    kk.add_argument(
        "--renderings",
        type=int,
        default=1,
        help="each train puzzle this many times, under fresh names and sentences (default 1: once)",
    )
    kk.set_defaults(fn=run_kk)


def run_countdown(args: argparse.Namespace) -> int:
    from lucidrl.data.countdown import write_countdown_parquet
    from lucidrl.diagnostics.errors import UsageError

    parts = str(args.numbers).split("-")
    if len(parts) not in (1, 2) or not all(re.fullmatch(r"[0-9]+", p.strip()) for p in parts):
        raise UsageError(f"--numbers {args.numbers!r} is not understood: write 'N' or 'LO-HI' (e.g. '3-4')")
    try:
        info = write_countdown_parquet(
            args.out,
            n_train=args.train,
            n_val=args.val,
            numbers=(int(parts[0]), int(parts[-1])),
            max_number=args.max_number,
            max_target=args.max_target,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print(
        f"wrote {info['n_train']} train and {info['n_val']} val Countdown puzzles to {info['train']} and {info['val']}"
    )
    return 0


def run_word_problems(args: argparse.Namespace) -> int:
    from lucidrl.data.word_problems import OPERATIONS, write_word_problems_parquet
    from lucidrl.diagnostics.errors import UsageError

    ops = tuple(op.strip() for op in str(args.ops).split(",") if op.strip())
    bad = [op for op in ops if op not in OPERATIONS]
    if bad or not ops:
        raise UsageError(f"--ops {args.ops!r}: give a comma list of {', '.join(OPERATIONS)} (e.g. 'add,sub')")
    try:
        info = write_word_problems_parquet(
            args.out,
            n_train=args.train,
            n_val=args.val,
            seed=args.seed,
            ops=ops,
            shots=args.shots,
            fmt=args.format,
        )
    except ValueError as exc:
        raise UsageError(f"lucidrl data word-problems: {exc}") from exc
    print(
        f"wrote {info['n_train']} train and {info['n_val']} val word problems to {info['train']} and "
        f"{info['val']} ({info['cores']['val']} val number pairs, none of them in train; seed {args.seed})"
    )
    return 0


def run_arithmetic(args: argparse.Namespace) -> int:
    from lucidrl.data.arithmetic import write_arithmetic_parquet
    from lucidrl.diagnostics.errors import UsageError

    m = re.fullmatch(r"\s*([0-9])\s*[x,]\s*([0-9])\s*", str(args.digits))
    if not m:
        raise UsageError(
            f"--digits {args.digits!r} is not understood: write 'AxB', e.g. '3x2' (3-digit by 2-digit)"
        )
    try:
        info = write_arithmetic_parquet(
            args.out,
            n_train=args.train,
            n_val=args.val,
            digits=(int(m.group(1)), int(m.group(2))),
            ops=tuple(args.ops),
            tool_hint=not args.no_tool_hint,
            few_shot=args.few_shot,
            words=args.words,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print(
        f"wrote {info['n_train']} train and {info['n_val']} val questions to {info['train']} and {info['val']}"
    )
    return 0


def run_kk(args: argparse.Namespace) -> int:
    from lucidrl.data.kk import parse_people_range, write_kk_parquet
    from lucidrl.diagnostics.errors import UsageError

    if args.train < 1 or args.val < 0:
        raise UsageError(
            f"lucidrl data kk: --train {args.train} --val {args.val}: need --train >= 1 and --val >= 0"
        )
    try:
        people = parse_people_range(args.people)
        info = write_kk_parquet(
            args.out,
            people=people,
            n_train=args.train,
            n_val=args.val,
            seed=args.seed,
            trace=args.trace,
            system_prompt=not args.no_system_prompt,
            renderings=args.renderings,
        )
    except ValueError as e:  # a people range or count the generator cannot serve
        raise UsageError(f"lucidrl data kk: {e}") from e
    per = ", ".join(f"{n} people: {c}" for n, c in sorted(info["per_people"].items()))
    copies = f" ({args.train} puzzles x {args.renderings} renderings)" if args.renderings > 1 else ""
    print(f"wrote {info['n_train']} train rows{copies} to {info['train']}")
    print(f"wrote {info['n_val']} val rows to {info['val']}")
    print(f"(both splits: {per}; seed {args.seed})")
    if args.trace:
        print("responses reason with truth-table traces before the answer (lucidrl/data/kk/trace.py)")
    return 0
