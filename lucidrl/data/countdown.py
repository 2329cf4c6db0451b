"""Countdown puzzles (TinyZero's task): numbers and a target that they reach, each used exactly once.

Every generated puzzle is solved here before it is written: the target is drawn among the values
that the numbers can reach with + - * / (exact fractions along the way, an integer at the end), and
the row's `response` is one solution written out step by step, for `lucidrl sft`. Train and
validation never share a puzzle (the same numbers, in any order, with the same target).
"""

from __future__ import annotations

import os
import random
from fractions import Fraction
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "countdown"
MIN_NUMBERS, MAX_NUMBERS = 2, 4  # 5 numbers: ~230k combinations per puzzle, minutes per 100

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
COUNTDOWN_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("response", pa.string()),  # one solution, step by step: for `lucidrl sft`
        (
            "reward_model",
            pa.struct(
                [
                    ("style", pa.string()),
                    ("ground_truth", pa.struct([("target", pa.int64()), ("numbers", pa.list_(pa.int64()))])),
                ]
            ),
        ),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("n_numbers", pa.int64())])),
    ]
)

# (value, expression text, steps "a op b = c") for each way of combining a multiset of numbers
Solution = tuple[Fraction, str, tuple[str, ...]]


def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def _combine(a: Solution, b: Solution) -> list[Solution]:
    (x, ex, sx), (y, ey, sy) = a, b
    out = []
    for value, op, left, right in (
        (x + y, "+", ex, ey),
        (x * y, "*", ex, ey),
        (x - y, "-", ex, ey),
        (y - x, "-", ey, ex),
        (x / y if y else None, "/", ex, ey),
        (y / x if x else None, "/", ey, ex),
    ):
        if value is None:
            continue
        lv = x if left is ex else y
        rv = y if left is ex else x
        step = f"{_fmt(lv)} {op} {_fmt(rv)} = {_fmt(value)}"
        out.append((value, f"({left} {op} {right})", sx + sy + (step,)))
    return out


def solutions(numbers: list[int]) -> dict[int, Solution]:
    """Every integer value reachable using each of `numbers` exactly once, with one way to reach it."""
    found: dict[int, Solution] = {}

    def search(items: list[Solution]) -> None:
        if len(items) == 1:
            value, expr, steps = items[0]
            if value.denominator == 1 and int(value) not in found:
                found[int(value)] = (value, expr[1:-1] if expr.startswith("(") else expr, steps)
            return
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                for combined in _combine(items[i], items[j]):
                    search(rest + [combined])

    search([(Fraction(n), str(n), ()) for n in numbers])
    return found


def prompt_text(numbers: list[int], target: int) -> str:
    """TinyZero's instruction for one puzzle."""
    return (
        f"Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
        "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
        "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )


def generate_puzzles(
    n: int, *, numbers: tuple[int, int] = (3, 4), max_number: int = 99, max_target: int = 100, seed: int = 0
) -> list[dict]:
    """`n` distinct solvable puzzles: {"numbers", "target", "expression", "steps"}."""
    lo, hi = numbers
    if not MIN_NUMBERS <= lo <= hi <= MAX_NUMBERS:
        raise ValueError(
            f"numbers per puzzle {lo}-{hi}: expected a range within {MIN_NUMBERS}-{MAX_NUMBERS} (e.g. '3-4')"
        )
    if n < 0:
        raise ValueError(f"cannot generate {n} puzzles: ask for 0 or more")
    if max_number < 1 or max_target < 1:
        raise ValueError(f"--max-number ({max_number}) and --max-target ({max_target}) must be >= 1")
    rng = random.Random(seed)
    seen: set[tuple[tuple[int, ...], int]] = set()
    out: list[dict] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(
                f"found only {len(out)} distinct solvable puzzles of {n} asked for with {lo}-{hi} numbers up to "
                f"{max_number} and targets up to {max_target}; ask for fewer, or widen the ranges"
            )
        nums = [rng.randint(1, max_number) for _ in range(rng.randint(lo, hi))]
        reachable = {t: s for t, s in solutions(nums).items() if 1 <= t <= max_target}
        if not reachable:
            continue
        target = rng.choice(sorted(reachable))
        key = (tuple(sorted(nums)), target)
        if key in seen:
            continue
        seen.add(key)
        _, expression, steps = reachable[target]
        out.append({"numbers": nums, "target": target, "expression": expression, "steps": list(steps)})
    return out


def response_text(puzzle: dict) -> str:
    """One solution in the reward's format: the steps in <think>, the expression in <answer>."""
    return f"<think>{', '.join(puzzle['steps'])}</think> <answer>{puzzle['expression']}</answer>"


def write_countdown_parquet(
    out_dir: str | os.PathLike[str],
    *,
    n_train: int = 1000,
    n_val: int = 100,
    numbers: tuple[int, int] = (3, 4),
    max_number: int = 99,
    max_target: int = 100,
    seed: int = 0,
) -> dict:
    """Generate puzzles and write `train.parquet` and `val.parquet` under `out_dir` (created if missing).

    Returns {"train": path, "val": path, "n_train": rows, "n_val": rows}.
    """
    if n_train < 1 or n_val < 0:
        raise ValueError(
            f"--train {n_train} and --val {n_val}: need at least 1 training puzzle and 0 or more val"
        )
    puzzles = generate_puzzles(
        n_train + n_val, numbers=numbers, max_number=max_number, max_target=max_target, seed=seed
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in (("train", puzzles[:n_train]), ("val", puzzles[n_train:])):
        records = [
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": prompt_text(p["numbers"], p["target"])}],
                "ability": "math",
                "response": response_text(p),
                "reward_model": {
                    "style": "rule",
                    "ground_truth": {"target": p["target"], "numbers": p["numbers"]},
                },
                "extra_info": {"split": split, "index": i, "n_numbers": len(p["numbers"])},
            }
            for i, p in enumerate(rows)
        ]
        paths[split] = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(records, schema=COUNTDOWN_SCHEMA), paths[split])
    return {"train": paths["train"], "val": paths["val"], "n_train": n_train, "n_val": n_val}
