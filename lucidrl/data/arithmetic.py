"""Multi-digit arithmetic questions, a task where a calculator tool helps (examples/grpo_calculator.yaml).

Each row asks one product or sum of numbers too long to do reliably in one's head ("What is 4821 *
37?") and says how to write the answer: "The answer is N." The rows carry verl's tool fields, so a
multi-turn run gives each the calculator: `extra_info.tools_kwargs = {"calculator": {}}`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "arithmetic"
OPERATIONS = ("*", "+", "-")

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
ARITHMETIC_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("expression", pa.string()),
                    (
                        "tools_kwargs",
                        pa.struct(
                            [
                                (
                                    "calculator",
                                    pa.struct([("create_kwargs", pa.map_(pa.string(), pa.string()))]),
                                )
                            ]
                        ),
                    ),
                ]
            ),
        ),
    ]
)


# word problems: (operation, text with {a} and {b}); the numbers are those of `_draw`
WORD_PROBLEMS = (
    ("*", "A crate holds {b} boxes with {a} pens in each box. How many pens are in the crate?"),
    ("*", "A train travels {a} km every day for {b} days. How many km does it travel in all?"),
    ("*", "Each of {b} classrooms has {a} books. How many books are there altogether?"),
    ("+", "A farmer has {a} sheep and buys {b} more. How many sheep does the farmer have now?"),
    ("+", "A library had {a} books and received {b} new ones. How many books does it have now?"),
    ("-", "A shop had {a} cans and sold {b} of them. How many cans are left?"),
    ("-", "A tank holds {a} liters and {b} liters leak out. How many liters remain?"),
)


def question(expression: str, tool_hint: bool) -> str:
    hint = " Use the calculator tool." if tool_hint else ""
    return f"What is {expression}?{hint} End with: The answer is N."


def word_question(template: str, a: int, b: int, tool_hint: bool) -> str:
    hint = " Use the calculator tool." if tool_hint else ""
    return f"{template.format(a=a, b=b)}{hint} End with: The answer is N."


def demonstration(tool_hint: bool) -> list[dict[str, str]]:
    """One worked exchange in the hermes tool-call format, put before the question with `few_shot`: small
    models that never write a tool call unprompted copy it (SmolLM2-135M-Instruct wrote none in 64 tries
    without it)."""
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123 * 45"}}\n</tool_call>'
    return [
        {"role": "user", "content": question("123 * 45", tool_hint)},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "5535"},
        {"role": "assistant", "content": "The answer is 5535."},
    ]


def _draw(
    rng: random.Random, digits: tuple[int, int], ops: tuple[str, ...], words: bool, tool_hint: bool
) -> tuple[str, str, int]:
    """(expression, question, value)."""
    template = None
    if words:
        template_op, template = rng.choice([w for w in WORD_PROBLEMS if w[0] in ops])
        op = template_op
    else:
        op = rng.choice(ops)
    a = rng.randint(10 ** (digits[0] - 1), 10 ** digits[0] - 1)
    b = rng.randint(10 ** (digits[1] - 1), 10 ** digits[1] - 1)
    value = a * b if op == "*" else a + b if op == "+" else a - b
    expression = f"{a} {op} {b}"
    text = word_question(template, a, b, tool_hint) if template else question(expression, tool_hint)
    return expression, text, value


def write_arithmetic_parquet(
    out: str | os.PathLike,
    *,
    n_train: int,
    n_val: int,
    digits: tuple[int, int] = (3, 2),
    ops: tuple[str, ...] = ("*",),
    tool_hint: bool = True,
    few_shot: bool = False,
    words: bool = False,
    seed: int = 0,
) -> dict:
    """train.parquet and val.parquet under `out`, no question in both; returns their paths and sizes.
    `few_shot`: each prompt starts with one worked tool-using exchange (`demonstration`); `words`: the
    questions are word problems (WORD_PROBLEMS), which the model must turn into an expression."""
    if min(digits) < 1 or max(digits) > 9:
        raise ValueError(f"digits={digits}: each operand has 1 to 9 digits")
    bad = [o for o in ops if o not in OPERATIONS]
    if bad or not ops:
        raise ValueError(f"operations {bad or ops} are not among {OPERATIONS}")
    rng = random.Random(seed)
    space = 9 * 10 ** (digits[0] - 1) * 9 * 10 ** (digits[1] - 1) * len(ops)
    if n_train + n_val > space // 2:
        raise ValueError(
            f"{n_train + n_val} distinct questions asked of {digits}-digit operands: use more digits"
        )
    seen: set[str] = set()
    rows: dict[str, list[dict]] = {"val": [], "train": []}
    for split, count in (("val", n_val), ("train", n_train)):
        while len(rows[split]) < count:
            expression, text, value = _draw(rng, digits, tuple(ops), words, tool_hint)
            if expression in seen:
                continue
            seen.add(expression)
            rows[split].append(
                {
                    "data_source": DATA_SOURCE,
                    "prompt": (demonstration(tool_hint) if few_shot else [])
                    + [{"role": "user", "content": text}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": str(value)},
                    "extra_info": {
                        "split": split,
                        "index": len(rows[split]),
                        "expression": expression,
                        "tools_kwargs": {"calculator": {"create_kwargs": []}},
                    },
                }
            )
    Path(out).mkdir(parents=True, exist_ok=True)
    paths = {split: str(Path(out) / f"{split}.parquet") for split in rows}
    for split, records in rows.items():
        pq.write_table(pa.Table.from_pylist(records, schema=ARITHMETIC_SCHEMA), paths[split])
    return {**paths, "n_train": n_train, "n_val": n_val}
