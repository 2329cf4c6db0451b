"""Label-preserving copies of K&K rows: the same puzzle under fresh names and sentence templates.

Renaming a solved puzzle needs no solver and no new label: who says what about whom, and so the
solution and the truth-table trace, stay the same up to the names. A tiny model trained on a few
hundred traces learns which names and roles appear in *those* sentences instead of how to read one
(its wrong held-out traces mostly copy the wrong name or role); re-rendered copies of the same
labelled puzzles make that shortcut fail. Structures do not change, so copies of training puzzles
never coincide with held-out ones (generated puzzles are distinct up to names, the order of and/or/iff
arguments and the order people are introduced in: logic.puzzle_key; logically equal statements in
other words, "it is not the case that A is a knight" for "A is a knave", count as other puzzles, and
the 285 two-person puzzles fall into 57 classes of the same logic)
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from lucidrl.data.kk.generator import NAMES, make_row, render_puzzle
from lucidrl.data.kk.logic import Puzzle, from_json


def puzzle_from_row(row: dict) -> Puzzle:
    """The Puzzle a row was made from: extra_info.statements and the ground truth's names and roles."""
    info, truth = row.get("extra_info") or {}, row.get("reward_model", {}).get("ground_truth") or {}
    if info.get("statements") is None or truth.get("names") is None or truth.get("knights") is None:
        raise ValueError(
            f"row {info.get('index', '?')} has no extra_info.statements or ground-truth names/knights; only rows "
            "written by `lucidrl data kk` can be re-rendered"
        )
    raw = info["statements"]
    statements = tuple(from_json(s) for s in (json.loads(raw) if isinstance(raw, str) else raw))
    return Puzzle(statements, tuple(truth["names"]), tuple(bool(k) for k in truth["knights"]))


def rerendered_rows(rows: Sequence[dict], copies: int, seed: int | str, trace: bool) -> list[dict]:
    """Every row as it is, then `copies - 1` re-renderings of each, shuffled together.

    A re-rendering draws new distinct names from NAMES and a new sentence template per speaker; its
    response (the trace when `trace`, else the direct answer) is rebuilt for the new names, and a
    row's layout is kept (with or without the system prompt, with or without a `response` column).
    """
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies={copies!r}: must be an integer >= 1 (1 keeps the rows as they are)")
    rng = random.Random(f"lucidrl-kk-rerender-{seed}")
    out = [dict(r) for r in rows]
    puzzles = [puzzle_from_row(row) for row in rows] if copies > 1 else []
    for _ in range(copies - 1):
        for row, puzzle in zip(rows, puzzles, strict=True):
            renamed = Puzzle(puzzle.statements, tuple(rng.sample(NAMES, puzzle.n_people)), puzzle.knights)
            new = make_row(renamed, render_puzzle(renamed, rng), row["extra_info"]["split"], 0, trace=trace)
            if not any(m["role"] == "system" for m in row["prompt"]):
                new["prompt"] = [m for m in new["prompt"] if m["role"] != "system"]
            if "response" not in row:
                del new["response"]
            out.append(new)
    rng.shuffle(out)
    for i, row in enumerate(out):
        row["extra_info"] = {**row["extra_info"], "index": i}
    return out
