"""One-step word problems (add, subtract, multiply small numbers) in the GSM8K answer style.

"Mia has 7 stickers. She gets 5 more. How many stickers does Mia have now?" Each problem is one
operation on two small numbers, told in one of several templates with varied names, objects and
verbs, so that a 135M instruct model solves some of them and RL has something to sharpen (the
measurements are in docs/tasks.md). A problem's "core" is its operation and numbers: train and val
never share a core, so a val problem is never a train problem under other names.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OPERATIONS = ("add", "sub", "mul")

# common first names with their pronoun; one word each, none a substring of another
_NAMES = (
    ("Mia", "she"), ("Sam", "he"), ("Lena", "she"), ("Omar", "he"), ("Ava", "she"), ("Leo", "he"),
    ("Nora", "she"), ("Ben", "he"), ("Zoe", "she"), ("Ravi", "he"), ("Emma", "she"), ("Jack", "he"),
    ("Lucy", "she"), ("Hugo", "he"), ("Iris", "she"), ("Tom", "he"), ("Maya", "she"), ("Noah", "he"),
    ("Ella", "she"), ("Owen", "he"), ("Sara", "she"), ("Liam", "he"), ("Anna", "she"), ("Kai", "he"),
)  # fmt: skip
_ITEMS = (
    "apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells", "cards",
    "balloons", "eggs", "flowers", "crayons", "coins", "buttons", "toy cars", "oranges", "candles",
)  # fmt: skip
_CONTAINERS = ("boxes", "bags", "packs", "baskets", "jars", "trays")
_GAIN = ("gets", "buys", "finds", "is given", "wins")
_LOSS = ("gives away", "loses", "sells", "uses")

# (operation, template): {n}/{m} names, {p} pronoun, {P} capitalised, {i} items, {c} containers,
# {c1} one container, {g} a gain verb, {l} a loss verb, {a} {b} the numbers
TEMPLATES = (
    ("add", "{n} has {a} {i}. {P} {g} {b} more. How many {i} does {n} have now?"),
    ("add", "{n} picked {a} {i} in the morning and {b} {i} in the afternoon. How many {i} did {n} pick in all?"),
    ("add", "There are {a} {i} in a box. {n} puts {b} more {i} in the box. How many {i} are in the box now?"),
    ("add", "{n} has {a} {i} and {m} has {b} {i}. How many {i} do they have together?"),
    ("sub", "{n} has {a} {i}. {P} {l} {b} of them. How many {i} does {n} have left?"),
    ("sub", "There were {a} {i} on the table. {n} took {b} of them away. How many {i} are on the table now?"),
    ("sub", "{n} had {a} {i} and gave {b} of them to {m}. How many {i} does {n} have left?"),
    ("sub", "{n} has {a} {i} and {m} has {b} {i}. How many more {i} does {n} have than {m}?"),
    ("mul", "{n} buys {a} {c}. Each {c1} holds {b} {i}. How many {i} does {n} buy?"),
    ("mul", "{n} has {a} {c} with {b} {i} in each. How many {i} does {n} have?"),
    ("mul", "{n} puts {b} {i} in each of {a} {c}. How many {i} does {n} put in the {c}?"),
)  # fmt: skip


@dataclass(frozen=True)
class Problem:
    """One word problem: its text, answer, and the core (op, a, b) that train and val never share."""

    question: str
    answer: int
    op: str
    a: int
    b: int
    template: int  # index into TEMPLATES

    @property
    def core(self) -> tuple[str, int, int]:
        return (self.op, self.a, self.b)

    @property
    def equation(self) -> str:
        sign = {"add": "+", "sub": "-", "mul": "*"}[self.op]
        return f"{self.a} {sign} {self.b} = {self.answer}"


def _numbers(op: str, rng: random.Random) -> tuple[int, int]:
    """Operands small enough for a 135M model to get some right: sums to 40, differences of numbers to
    30, products of one-digit numbers."""
    if op == "add":
        return rng.randint(2, 20), rng.randint(2, 20)
    if op == "sub":
        a = rng.randint(5, 30)
        return a, rng.randint(1, a - 1)
    return rng.randint(2, 9), rng.randint(2, 9)


def _answer(op: str, a: int, b: int) -> int:
    return a + b if op == "add" else a - b if op == "sub" else a * b


def cores(ops: tuple[str, ...] = OPERATIONS) -> set[tuple[str, int, int]]:
    """Every (op, a, b) the generator can draw: how many distinct problems exist, names aside."""
    out = set()
    for op in ops:
        if op == "add":
            out |= {(op, a, b) for a in range(2, 21) for b in range(2, 21)}
        elif op == "sub":
            out |= {(op, a, b) for a in range(5, 31) for b in range(1, a)}
        else:
            out |= {(op, a, b) for a in range(2, 10) for b in range(2, 10)}
    return out


def render(op: str, a: int, b: int, rng: random.Random) -> Problem:
    """The problem (op, a, b) told in a template of `op` drawn from `rng`, with drawn names and objects."""
    choices = [i for i, (kind, _) in enumerate(TEMPLATES) if kind == op]
    index = rng.choice(choices)
    (n, pronoun), (m, _) = rng.sample(_NAMES, 2)
    container = rng.choice(_CONTAINERS)
    question = TEMPLATES[index][1].format(
        n=n,
        m=m,
        p=pronoun,
        P=pronoun.capitalize(),
        i=rng.choice(_ITEMS),
        c=container,
        c1=container[:-2] if container.endswith("xes") else container[:-1],
        g=rng.choice(_GAIN),
        l=rng.choice(_LOSS),
        a=a,
        b=b,
    )
    return Problem(question, _answer(op, a, b), op, a, b, index)


def generate_problems(
    n: int,
    *,
    seed: int = 0,
    ops: tuple[str, ...] = OPERATIONS,
    exclude: set[tuple[str, int, int]] | frozenset = frozenset(),
    distinct_cores: bool = False,
) -> list[Problem]:
    """`n` problems with distinct texts, operations drawn in turn from `ops`, none with a core in
    `exclude`; with `distinct_cores` no two share a core either (a val set). Deterministic per seed."""
    unknown = [op for op in ops if op not in OPERATIONS]
    if unknown or not ops:
        raise ValueError(f"operations {list(ops)!r}: choose among {', '.join(OPERATIONS)}")
    if n < 0:
        raise ValueError(f"cannot generate {n} problems: ask for 0 or more")
    available = cores(ops) - set(exclude)
    if distinct_cores and n > len(available):
        raise ValueError(
            f"{n} problems with distinct numbers asked for, but only {len(available)} exist for "
            f"{', '.join(ops)} (outside the ones excluded); ask for fewer"
        )
    for i, op in enumerate(ops):  # operations are drawn in turn: each needs its share
        share = len(range(i, n, len(ops)))
        left = sum(core[0] == op for core in available)
        if share and (left == 0 or (distinct_cores and share > left)):
            what = "with distinct numbers" if distinct_cores else "(any numbers)"
            raise ValueError(
                f"{n} problems drawn in turn from {', '.join(ops)} need {share} {op} problems {what}, but "
                f"only {left} exist outside the ones excluded (a val set's); ask for fewer"
                + (", or leave out mul (--ops add,sub), which has the fewest (64)" if op == "mul" else "")
            )
    rng = random.Random(seed)
    out: list[Problem] = []
    texts: set[str] = set()
    used: set[tuple[str, int, int]] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ValueError(f"found only {len(out)} distinct problems of {n} asked for; ask for fewer")
        op = ops[len(out) % len(ops)]
        a, b = _numbers(op, rng)
        if (op, a, b) in exclude or (distinct_cores and (op, a, b) in used):
            continue
        problem = render(op, a, b, rng)
        if problem.question in texts:
            continue
        texts.add(problem.question)
        used.add(problem.core)
        out.append(problem)
    return out


# ---------------------------------------------------------------- rows in verl's schema

DATA_SOURCE = "word_problems"
# the answer formats a prompt can ask for, each with its instruction; the reward
# (lucidrl/rewards/word_problems.py) reads the one a row names in extra_info["format"]. No digit in an
# instruction: "for example: #### 3" made a small model answer "#### 3" after the right working.
INSTRUCTIONS = {
    "answer_is": '\nEnd your reply with "The answer is N." where N is the number.',
    "gsm8k": "\nWrite the final answer as a number after ####.",
}
FORMATS = tuple(INSTRUCTIONS)

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
WORD_PROBLEMS_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("response", pa.string()),  # a worked answer in the asked format: for `lucidrl sft`
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("op", pa.string()),
                    ("a", pa.int64()),
                    ("b", pa.int64()),
                    ("template", pa.int64()),
                    ("format", pa.string()),
                ]
            ),
        ),
    ]
)


def response_text(problem: Problem, fmt: str = "gsm8k") -> str:
    """A worked answer: the one operation, then the final answer in the format `fmt`."""
    if fmt == "answer_is":
        return f"{problem.equation}\nThe answer is {problem.answer}."
    return f"{problem.equation}\n#### {problem.answer}"


def prompt_messages(problem: Problem, example: Problem | None, fmt: str = "gsm8k") -> list[dict[str, str]]:
    """The chat of one row: a worked `example` (another problem and its answer) as a first exchange,
    then `problem`, each user turn ending with the instruction for `fmt`. A small instruct model follows
    a format it has seen far more often than one it was only told (docs/tasks.md measures both)."""
    chat = []
    if example is not None:
        chat += [
            {"role": "user", "content": example.question + INSTRUCTIONS[fmt]},
            {"role": "assistant", "content": response_text(example, fmt)},
        ]
    return chat + [{"role": "user", "content": problem.question + INSTRUCTIONS[fmt]}]


def _with_examples(problems: list[Problem], examples: list[Problem]) -> list[tuple[Problem, Problem]]:
    """Each problem with an example of another core (the next one along where the drawn one matches)."""
    pairs = []
    for i, p in enumerate(problems):
        j = i
        while examples[j % len(examples)].core == p.core:
            j += 1
        pairs.append((p, examples[j % len(examples)]))
    return pairs


def write_word_problems_parquet(
    out_dir: str | os.PathLike[str],
    *,
    n_train: int = 2000,
    n_val: int = 150,
    seed: int = 0,
    ops: tuple[str, ...] = OPERATIONS,
    shots: int = 0,
    fmt: str = "answer_is",
) -> dict:
    """Generate problems and write `train.parquet` and `val.parquet` under `out_dir` (created if missing).

    Val is drawn first, with distinct cores (op, a, b); train draws only other cores, so no val
    problem appears in train under other names. Each prompt asks for the answer in `fmt` (a key of
    INSTRUCTIONS). With `shots=1` each prompt starts with a worked example, another problem of any
    operation whose numbers are no val problem's; with 0 (default) the problem stands alone. Returns
    {"train": path, "val": path, "n_train": rows, "n_val": rows, "cores": {"train": distinct, "val": distinct}}.
    """
    if n_train < 1 or n_val < 0:
        raise ValueError(
            f"--train {n_train} and --val {n_val}: need at least 1 training problem and 0 or more val"
        )
    if shots not in (0, 1):
        raise ValueError(f"--shots {shots}: 0 (the problem alone) or 1 (a worked example first)")
    if fmt not in INSTRUCTIONS:
        raise ValueError(f"--format {fmt!r}: choose among {', '.join(FORMATS)}")
    out = Path(out_dir)
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {os.fspath(out_dir)!r}: {os.fspath(existing)!r} is a file; name a folder")
    val = generate_problems(n_val, seed=seed, ops=ops, distinct_cores=True)
    val_cores = {p.core for p in val}
    # other streams for train and the examples: a larger --val must not reshuffle them more than needed
    train = generate_problems(n_train, seed=seed + 1_000_003, ops=ops, exclude=val_cores)
    # worked examples never show a val problem's numbers, in either split; 16 distinct are enough to vary
    examples = generate_problems(
        16, seed=seed + 2_000_003, ops=OPERATIONS, exclude=val_cores, distinct_cores=True
    )
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, problems in (("train", train), ("val", val)):
        records = [
            {
                "data_source": DATA_SOURCE,
                "prompt": prompt_messages(p, example if shots else None, fmt),
                "ability": "math",
                "response": response_text(p, fmt),
                "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "op": p.op,
                    "a": p.a,
                    "b": p.b,
                    "template": p.template,
                    "format": fmt,
                },
            }
            for i, (p, example) in enumerate(_with_examples(problems, examples))
        ]
        paths[split] = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(records, schema=WORD_PROBLEMS_SCHEMA), paths[split])
    return {
        "train": paths["train"],
        "val": paths["val"],
        "n_train": len(train),
        "n_val": len(val),
        "cores": {"train": len({p.core for p in train}), "val": len({p.core for p in val})},
    }
