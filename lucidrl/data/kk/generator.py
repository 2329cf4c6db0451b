"""Knights & Knaves puzzle generation: random statements, English text and verl-schema rows.

`generate_dataset` is the entry point: it draws puzzles with a unique solution for each number of
people, never repeats a puzzle (across train and val), and returns rows in the schema verl and
Logic-RL use (see `make_row`). Everything is deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from lucidrl.data.kk.logic import (
    BINARY_OPS,
    Binary,
    Leaf,
    Not,
    Puzzle,
    Statement,
    format_solution,
    puzzle_key,
    solve,
    to_json,
)
from lucidrl.data.kk.trace import trace_response

DATA_SOURCE = "kk_logic"
MIN_PEOPLE = 2
MAX_PEOPLE = 8
# Consecutive draws without a new puzzle before `generate_dataset` concludes the pool is exhausted.
MAX_STALE_ATTEMPTS = 20_000

# Logic-RL's instruction, with its "<think> ... </think> <answer> ... </answer>" protocol.
SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind "
    "and then provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process here "
    "</think><answer> answer here </answer>.  Now the user asks you to solve a logical reasoning problem. "
    "After thinking, when you finally reach a conclusion, clearly state the identity of each character "
    "within <answer> </answer> tags. i.e., <answer> (1) Zoey is a knight\n(2) ... </answer>."
)
# The pre-filled start of the assistant turn (rendered with continue_final_message).
ASSISTANT_PREFIX = "<think>"

# Single capitalised words; no name is a substring of another (the reward matches names with \b but
# a model's answer is easier to read unambiguously this way), and none contains "knight"/"knave".
NAMES = (
    "Zoey", "Oliver", "Ethan", "Mia", "Liam", "Noah", "Emma", "Sophia", "Isabella", "Lucas", "Mason",
    "Logan", "Harper", "Amelia", "Henry", "Jack", "Owen", "Chloe", "Grace", "Lily", "Aria", "Scarlett",
    "Nora", "Riley", "Aiden", "Jacob", "Michael", "Daniel", "Matthew", "Samuel", "David", "Joseph",
    "Carter", "Wyatt", "Luke", "Gabriel", "Isaac", "Victoria", "Madison", "Abigail", "Ruby", "Avery",
    "Evelyn", "Penelope", "Layla", "Hannah", "Stella", "Aurora", "Violet", "Hazel", "Leo", "Julian",
    "Sebastian", "James", "Benjamin", "Alexander", "Theodore", "Elizabeth", "Charlotte", "Sofia", "Emily",
)  # fmt: skip

INTRO = (
    "A very special island is inhabited only by knights and knaves. "
    "Knights always tell the truth, and knaves always lie."
)
QUESTION = "So who is a knight and who is a knave?"
# {name} is the speaker, {s} the statement as written after "that", {S} the same capitalised.
SENTENCE_TEMPLATES = (
    "{name} said that {s}.",
    "{name} claimed that {s}.",
    "{name} told you that {s}.",
    'In {name}\'s words: "{S}".',
    "{name} stated that {s}.",
    '{name} remarked, "{S}".',
)


def sample_statement(speaker: int, n_people: int, rng: random.Random) -> Statement:
    """Draw one statement for `speaker`: a leaf, a negated leaf or one of four binary ops (equally likely).

    A lone leaf or negated leaf is about someone else: "I am a knave" (and "it is not the case that I
    am a knight") has no consistent assignment, and "I am a knight" says nothing. Inside a binary op
    any two different leaves may appear, the speaker's own role included ("I am a knave or Ethan is a
    knight" is a classic, solvable Smullyan statement).
    """
    kind = rng.choice(("leaf", "not") + BINARY_OPS)
    if kind in ("leaf", "not"):
        other = rng.choice([p for p in range(n_people) if p != speaker])
        leaf = Leaf(other, rng.random() < 0.5)
        return leaf if kind == "leaf" else Not(leaf)
    first = _random_leaf(n_people, rng)
    second = _random_leaf(n_people, rng)
    while second == first:
        second = _random_leaf(n_people, rng)
    return Binary(kind, first, second)


def _random_leaf(n_people: int, rng: random.Random) -> Leaf:
    """A leaf about a uniformly drawn person with a uniformly drawn role."""
    return Leaf(rng.randrange(n_people), rng.random() < 0.5)


def sample_puzzle(n_people: int, rng: random.Random, max_attempts: int = 10_000) -> Puzzle:
    """Draw statements until exactly one assignment satisfies them; names are drawn afterwards."""
    _check_n_people(n_people, "n_people")
    for _ in range(max_attempts):
        statements = tuple(sample_statement(i, n_people, rng) for i in range(n_people))
        solutions = solve(statements)
        if len(solutions) == 1:
            names = tuple(rng.sample(NAMES, n_people))
            return Puzzle(statements, names, solutions[0])
    raise RuntimeError(f"no uniquely solvable {n_people}-person puzzle in {max_attempts} draws")


def statement_text(statement: Statement, names: Sequence[str]) -> str:
    """The statement in English, naming people (also the speaker) by name, e.g. "if Zoey is a knight then Ethan is a knave"."""
    if isinstance(statement, Leaf):
        return f"{names[statement.person]} is a {'knight' if statement.knight else 'knave'}"
    if isinstance(statement, Not):
        return f"it is not the case that {statement_text(statement.leaf, names)}"
    left = statement_text(statement.left, names)
    right = statement_text(statement.right, names)
    if statement.op == "and":
        return f"{left} and {right}"
    if statement.op == "or":
        return f"{left} or {right}"
    if statement.op == "implies":
        return f"if {left} then {right}"
    return f"{left} if and only if {right}"


def render_puzzle(puzzle: Puzzle, rng: random.Random) -> str:
    """The puzzle text a model sees: the island rules, who you meet, one sentence per person, the question."""
    names = puzzle.names
    if len(names) == 2:
        listed = f"{names[0]} and {names[1]}"
    else:
        listed = ", ".join(names[:-1]) + f", and {names[-1]}"
    parts = [INTRO, f"You meet {len(names)} inhabitants: {listed}."]
    for speaker, statement in enumerate(puzzle.statements):
        text = statement_text(statement, names)
        template = rng.choice(SENTENCE_TEMPLATES)
        parts.append(template.format(name=names[speaker], s=text, S=text[0].upper() + text[1:]))
    parts.append(QUESTION)
    return " ".join(parts)


def answer_response(puzzle: Puzzle) -> str:
    """The supervised response for a row: the rest of the assistant turn after the pre-filled "<think>".

    A direct answer with an empty reasoning block; with the prefix it passes Logic-RL's format rule.
    """
    return f" </think> <answer> {format_solution(puzzle.names, puzzle.knights)} </answer>"


def make_row(puzzle: Puzzle, text: str, split: str, index: int, trace: bool = False) -> dict:
    """One dataset row in verl's schema, with the assistant turn pre-filled with "<think>" (Logic-RL).

    With `trace`, the supervised `response` reasons through a truth table first (see kk/trace.py).
    """
    if trace:
        response = trace_response(puzzle)
    else:
        response = answer_response(puzzle)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": text},
            {"role": "assistant", "content": ASSISTANT_PREFIX},
        ],
        "ability": "logic",
        "response": response,
        "reward_model": {
            "style": "rule",
            "ground_truth": {
                "solution_text_format": format_solution(puzzle.names, puzzle.knights),
                "names": list(puzzle.names),
                "knights": list(puzzle.knights),
            },
        },
        "extra_info": {
            "split": split,
            "index": index,
            "n_people": puzzle.n_people,
            "statements": json.dumps([to_json(s) for s in puzzle.statements]),
        },
    }


def people_values(people: tuple[int, int] | list[int]) -> list[int]:
    """The numbers of people to generate: a tuple (lo, hi) is the inclusive range, a list is taken as is."""
    if isinstance(people, tuple):
        if len(people) != 2:
            raise ValueError(f"people={people!r}: a tuple must be an inclusive range (lo, hi), e.g. (2, 4)")
        lo, hi = people
        _check_n_people(lo, "people[0]")
        _check_n_people(hi, "people[1]")
        if lo > hi:
            raise ValueError(f"people={people!r}: the range is empty (lo > hi); write ({hi}, {lo})")
        return list(range(lo, hi + 1))
    if isinstance(people, list):
        if not people:
            raise ValueError("people=[] names no puzzle size; give e.g. [2, 3] or a range (2, 4)")
        for n in people:
            _check_n_people(n, f"people entry {n!r}")
        if len(set(people)) != len(people):
            raise ValueError(f"people={people!r} repeats a size; list each number of people once")
        return list(people)
    raise ValueError(
        f"people={people!r} (type {type(people).__name__}): give a range tuple (lo, hi) or a list of sizes"
    )


def _check_n_people(n: object, where: str) -> None:
    """Raise if `n` is not an int in MIN_PEOPLE..MAX_PEOPLE."""
    if isinstance(n, bool) or not isinstance(n, int) or not MIN_PEOPLE <= n <= MAX_PEOPLE:
        raise ValueError(
            f"{where} = {n!r}: the number of people must be an integer from {MIN_PEOPLE} to {MAX_PEOPLE}"
        )


# 2-person puzzles that differ in more than names, wording and the order people are introduced in
# (logic.puzzle_key): 556 in speaker order, 542 of them mirror pairs of each other
TWO_PERSON_PUZZLES = 285


def _even_counts(total: int, sizes: list[int]) -> dict[int, int]:
    """Split `total` rows over `sizes` as evenly as possible, earlier sizes taking the remainder."""
    base, extra = divmod(total, len(sizes))
    return {n: base + (1 if k < extra else 0) for k, n in enumerate(sizes)}


def _distinct_puzzles(n_people: int, count: int, rng: random.Random) -> list[tuple[Puzzle, str]]:
    """Up to `count` uniquely solvable puzzles with pairwise different statement structure, with their text.

    Each puzzle is rendered as soon as it is drawn, so the first k puzzles (and texts) do not depend on
    `count`. Returns fewer when MAX_STALE_ATTEMPTS draws in a row bring no new puzzle (the pool is exhausted:
    there are only TWO_PERSON_PUZZLES = 285 distinct 2-person puzzles).
    """
    seen: set[tuple] = set()
    puzzles: list[tuple[Puzzle, str]] = []
    stale = 0
    while len(puzzles) < count and stale < MAX_STALE_ATTEMPTS:
        puzzle = sample_puzzle(n_people, rng)
        key = puzzle_key(puzzle.statements)
        if key in seen:
            stale += 1
            continue
        stale = 0
        seen.add(key)
        puzzles.append((puzzle, render_puzzle(puzzle, rng)))
    return puzzles


def generate_dataset(
    people: tuple[int, int] | list[int], n_train: int, n_val: int, seed: int, trace: bool = False
) -> tuple[list[dict], list[dict]]:
    """Train and val rows for K&K, sizes spread evenly (round-robin) over `people`, no puzzle in both.

    `people` is an inclusive range (lo, hi) or an explicit list of sizes. Each size has its own random
    stream derived from `seed`, so adding a size leaves the other sizes' puzzles unchanged, and val
    draws first, so a larger n_train leaves the val rows unchanged. The sampler finds its likeliest
    structures first, so a request that uses up most of a size would give val the simple puzzles and
    train the rare ones: 2-person K&K has only 285, and in the demo's split of all of them val took
    22-24% bare claims and negations against 0-2% in the last 85. So all 285 are drawn and
    shuffled, and both splits are taken in that order: random parts of the whole, val still first.
    With `trace`, responses hold a truth-table reasoning trace before the answer (same puzzles). Raises
    ValueError when a size has fewer distinct puzzles than requested.
    """
    sizes = people_values(people)
    for label, count in (("n_train", n_train), ("n_val", n_val)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{label}={count!r}: must be an integer >= 0")
    train_counts = _even_counts(n_train, sizes)
    val_counts = _even_counts(n_val, sizes)
    train_by_size: dict[int, list[tuple[Puzzle, str]]] = {}
    val_by_size: dict[int, list[tuple[Puzzle, str]]] = {}
    for n in sizes:
        rng = random.Random(f"lucidrl-kk-{seed}-{n}")
        need = train_counts[n] + val_counts[n]
        if n == 2:  # the whole space, shuffled (see the docstring)
            puzzles = _distinct_puzzles(n, TWO_PERSON_PUZZLES, rng)
            rng.shuffle(puzzles)
            puzzles = puzzles[:need]
        else:
            puzzles = _distinct_puzzles(n, need, rng)
        if len(puzzles) < need:
            raise ValueError(
                f"n_train={n_train}, n_val={n_val} over people {sizes} puts {need} puzzles on {n} people "
                f"({train_counts[n]} train + {val_counts[n]} val), but only {len(puzzles)} distinct "
                f"{n}-person puzzles "
                + (
                    "exist. "
                    if n == 2
                    else f"were found ({MAX_STALE_ATTEMPTS} draws in a row gave no new one). "
                )
                + f"Ask for at most {len(puzzles)} {n}-person rows in train and val together (about "
                f"{len(puzzles) * len(sizes)} rows over these sizes), or leave {n} out of the people range."
            )
        # Val takes the first puzzles, so the val set stays the same when only n_train changes.
        val_by_size[n] = puzzles[: val_counts[n]]
        train_by_size[n] = puzzles[val_counts[n] :]
    return (
        _interleave(train_by_size, sizes, "train", trace),
        _interleave(val_by_size, sizes, "val", trace),
    )


def _interleave(
    by_size: dict[int, list[tuple[Puzzle, str]]], sizes: list[int], split: str, trace: bool = False
) -> list[dict]:
    """Rows taking one puzzle of each size in turn (2, 3, 4, 2, 3, 4, ...), indexed in that order."""
    rows: list[dict] = []
    longest = max((len(v) for v in by_size.values()), default=0)
    for k in range(longest):
        for n in sizes:
            if k < len(by_size[n]):
                puzzle, text = by_size[n][k]
                rows.append(make_row(puzzle, text, split, len(rows), trace))
    return rows
