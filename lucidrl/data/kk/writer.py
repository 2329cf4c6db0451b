"""Writing generated Knights & Knaves rows to train/val parquet files (verl's dataset layout)."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lucidrl.data.kk.generator import MAX_PEOPLE, MIN_PEOPLE, generate_dataset, people_values

# Explicit so that an empty split still gets the same columns, and types never depend on the data.
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
KK_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("response", pa.string()),  # the supervised answer, for `lucidrl sft`
        (
            "reward_model",
            pa.struct(
                [
                    ("style", pa.string()),
                    (
                        "ground_truth",
                        pa.struct(
                            [
                                ("solution_text_format", pa.string()),
                                ("names", pa.list_(pa.string())),
                                ("knights", pa.list_(pa.bool_())),
                            ]
                        ),
                    ),
                ]
            ),
        ),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("n_people", pa.int64()),
                    ("statements", pa.string()),
                ]
            ),
        ),
    ]
)


def parse_people_range(text: str) -> tuple[int, int]:
    """Parse a people range from the command line: "3" -> (3, 3), "2-4" -> (2, 4)."""
    allowed = f"a number of people from {MIN_PEOPLE} to {MAX_PEOPLE}, as 'N' or 'LO-HI' (e.g. '2-4')"
    parts = str(text).strip().split("-")
    # ASCII digits only: str.isdigit() takes '²' (then int() failed) and '٣' (read as 3)
    if len(parts) not in (1, 2) or not all(re.fullmatch(r"[0-9]+", p.strip()) for p in parts):
        raise ValueError(f"people range {text!r} is not understood; expected {allowed}")
    lo, hi = int(parts[0]), int(parts[-1])
    if not (MIN_PEOPLE <= lo <= MAX_PEOPLE and MIN_PEOPLE <= hi <= MAX_PEOPLE):
        raise ValueError(f"people range {text!r} is out of bounds; expected {allowed}")
    if lo > hi:
        raise ValueError(f"people range {text!r} is empty (low end above high end); write '{hi}-{lo}'")
    return lo, hi


def write_kk_parquet(
    out_dir: str | os.PathLike[str],
    people: tuple[int, int] | list[int] = (2, 4),
    n_train: int = 600,
    n_val: int = 60,
    seed: int = 0,
    trace: bool = False,
    system_prompt: bool = True,
    renderings: int = 1,
) -> dict:
    """Generate K&K puzzles and write `train.parquet` and `val.parquet` under `out_dir` (created if missing).

    Returns {"train": path, "val": path, "n_train": rows, "n_val": rows, "per_people": {n: rows in both}}.
    With `trace`, each row's `response` reasons through a truth table before the answer (kk/trace.py).
    There are only 285 distinct 2-person puzzles (generator.TWO_PERSON_PUZZLES); a request needing more
    raises ValueError.
    `system_prompt=False` leaves out Logic-RL's instruction (about 150 of a 2-person prompt's 220 tokens):
    for models trained from scratch, which cannot read it anyway, it is pure cost. The reward is unchanged.
    `renderings` > 1 adds that many - 1 copies of each train puzzle under fresh names and sentences
    (kk/augment.py): `n_train` puzzles, `n_train * renderings` train rows; val is never copied.
    """
    from lucidrl.data.kk.augment import rerendered_rows

    people_values(people)  # validate before touching the file system
    if isinstance(renderings, bool) or not isinstance(renderings, int) or renderings < 1:
        raise ValueError(f"renderings={renderings!r}: must be an integer >= 1 (1: each puzzle once)")
    out = Path(out_dir)
    # checked before generating (found after it, this was a traceback): the folder, or its nearest parent
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(
            f"--out {os.fspath(out_dir)!r}: {os.fspath(existing)!r} is a file; name a folder for "
            "train.parquet and val.parquet"
        )
    train, val = generate_dataset(people, n_train=n_train, n_val=n_val, seed=seed, trace=trace)
    if not system_prompt:
        for row in train + val:
            row["prompt"] = [m for m in row["prompt"] if m["role"] != "system"]
    if renderings > 1:
        train = rerendered_rows(train, renderings, seed, trace=trace)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {os.fspath(out_dir)!r} cannot be created: {e.strerror or e}") from e
    paths = {}
    for split, rows in (("train", train), ("val", val)):
        path = os.path.join(os.fspath(out_dir), f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=KK_SCHEMA), path)
        paths[split] = path
    per_people = Counter(row["extra_info"]["n_people"] for row in train + val)
    return {
        "train": paths["train"],
        "val": paths["val"],
        "n_train": len(train),
        "n_val": len(val),
        "per_people": dict(sorted(per_people.items())),
    }
