"""Data files in the exact formats of verl's TinyZero and Logic-RL forks, for tests.

The prompt templates are copied from the forks' preprocessing scripts (Apache-2.0):
Unakar/Logic-RL examples/data_preprocess/kk.py `make_prefix` at 9d2c457525ec14639e85afa12d49bb16efb053a4,
Jiayi-Pan/TinyZero examples/data_preprocess/countdown.py `make_prefix` at
95df88f2dcb05f33bd18da546531b52d0954c18b. The columns are those of Logic-RL's
data/kk/instruct/{3..7}ppl/*.parquet (read with pyarrow) and of TinyZero's countdown parquet (the
HuggingFace data set's target and nums, then the preprocessing's columns). The puzzles are lucidrl's
own: the public K&K data set that Logic-RL's files hold is licensed non-commercial.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lucidrl.data.kk.generator import render_puzzle, sample_puzzle
from lucidrl.data.kk.logic import Binary, Leaf, Not, format_solution

LOGIC_RL_SYSTEM = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> "
    "and<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer "
    "here </answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, when you "
    "finally reach a conclusion, clearly state the identity of each character within <answer> </answer> tags. "
    "i.e., <answer> (1) Zoey is a knight\n(2) ... </answer>.\n"
)


def logic_rl_prompt(quiz: str, template: str = "qwen-instruct") -> str:
    """Logic-RL's make_prefix."""
    if template == "base":
        return (
            "The user asks a question, and the Assistant solves it.The assistant first thinks about the reasoning "
            "process in the mind and then provides the user with the final answer. The reasoning process and answer "
            "are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> "
            "reasoning process here </think><answer> answer here </answer>. Now the user asks you to solve a "
            "logical reasoning problem. After thinking, when you finally reach a conclusion, clearly state the "
            "identity of each character within <answer> </answer> tags. List the identity of each person one by "
            "one, for example, <answer> (1) Zoey is a knight\n(2) Oliver is a knight\n(3)... </answer>.\n\n"
            f"User:{quiz}\nAssistant: <think>"
        )
    return (
        f"<|im_start|>system\n{LOGIC_RL_SYSTEM}<|im_end|>\n<|im_start|>user\n{quiz}\n<|im_end|>\n"
        "<|im_start|>assistant\n<think>"
    )


def tinyzero_prompt(numbers: list[int], target: int, template: str = "base") -> str:
    """TinyZero's make_prefix."""
    task = (
        f"Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
        "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. "
        "And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )
    if template == "base":
        return (
            "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
            "assistant first thinks about the reasoning process in the mind and then provides the user with the "
            f"answer.\nUser: {task}\nAssistant: Let me solve this step by step.\n<think>"
        )
    return (
        "<|im_start|>system\nYou are a helpful assistant. You first thinks about the reasoning process in the mind "
        f"and then provides the user with the answer.<|im_end|>\n<|im_start|>user\n {task}<|im_end|>\n"
        "<|im_start|>assistant\nLet me solve this step by step.\n<think>"
    )


def _logic_rl_statement(statement) -> tuple:
    """A statement as Logic-RL's files write it: ('telling-truth', i), ('not', s), ('->', a, b), ..."""
    if isinstance(statement, Leaf):
        return ("telling-truth" if statement.knight else "lying", statement.person)
    if isinstance(statement, Not):
        return ("not", _logic_rl_statement(statement.leaf))
    assert isinstance(statement, Binary)
    op = {"and": "and", "or": "or", "implies": "->", "iff": "<=>"}[statement.op]
    return (op, _logic_rl_statement(statement.left), _logic_rl_statement(statement.right))


_KK_SCHEMA = pa.schema(
    [
        ("quiz", pa.string()),
        ("names", pa.list_(pa.string())),
        (
            "knight_knave",
            pa.struct(
                [(k, pa.string()) for k in ("Knave", "Knight", "a_knave", "a_knight", "knave", "knight")]
            ),
        ),
        ("solution", pa.list_(pa.bool_())),
        ("solution_text", pa.string()),
        ("solution_text_format", pa.string()),
        ("cot_head", pa.string()),
        ("cot_repeat_steps", pa.list_(pa.string())),
        ("cot_foot", pa.string()),
        ("statements", pa.string()),
        ("index", pa.int64()),
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        (
            "reward_model",
            pa.struct(
                [
                    (
                        "ground_truth",
                        pa.struct([("solution_text_format", pa.string()), ("statements", pa.string())]),
                    ),
                    ("style", pa.string()),
                ]
            ),
        ),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
    ]
)


def write_logic_rl_kk(
    path: Path,
    people: tuple[int, ...] = (3, 5, 7),
    per_size: int = 2,
    seed: int = 0,
    template: str = "qwen-instruct",
) -> list[dict]:
    """A parquet file of K&K rows as Logic-RL's data/kk/instruct files hold them; returns the rows."""
    rng = random.Random(seed)
    rows = []
    for n in people:
        for _ in range(per_size):
            puzzle = sample_puzzle(n, rng)
            quiz = render_puzzle(puzzle, rng)
            answer = format_solution(puzzle.names, puzzle.knights)
            statements = repr(tuple(_logic_rl_statement(s) for s in puzzle.statements))
            words = ["knight" if k else "knave" for k in puzzle.knights]
            rows.append(
                {
                    "quiz": quiz,
                    "names": list(puzzle.names),
                    "knight_knave": {
                        "Knave": "Knave",
                        "Knight": "Knight",
                        "a_knave": "a knave",
                        "a_knight": "a knight",
                        "knave": "knave",
                        "knight": "knight",
                    },
                    "solution": list(puzzle.knights),
                    "solution_text": ", ".join(
                        f"{m} is a {w}" for m, w in zip(puzzle.names, words, strict=True)
                    ),
                    "solution_text_format": answer,
                    "cot_head": "Let's think step by step.",
                    "cot_repeat_steps": [],
                    "cot_foot": "This leads to a feasible solution.",
                    "statements": statements,
                    "index": len(rows),
                    "data_source": "kk_logic",
                    "prompt": [{"content": logic_rl_prompt(quiz, template), "role": "user"}],
                    "ability": "logic",
                    "reward_model": {
                        "ground_truth": {"solution_text_format": answer, "statements": statements},
                        "style": "rule",
                    },
                    "extra_info": {"index": len(rows), "split": "test"},
                }
            )
    pq.write_table(pa.Table.from_pylist(rows, schema=_KK_SCHEMA), path)
    return rows


def write_tinyzero_countdown(
    path: Path, puzzles: list[tuple[int, list[int]]], template: str = "base"
) -> list[dict]:
    """A parquet file of countdown rows as TinyZero's preprocessing writes them; returns the rows."""
    rows = [
        {
            "target": target,
            "nums": numbers,
            "data_source": "countdown",
            "prompt": [{"content": tinyzero_prompt(numbers, target, template), "role": "user"}],
            "ability": "math",
            "reward_model": {"ground_truth": {"numbers": numbers, "target": target}, "style": "rule"},
            "extra_info": {"index": i, "split": "train"},
        }
        for i, (target, numbers) in enumerate(puzzles)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return rows
