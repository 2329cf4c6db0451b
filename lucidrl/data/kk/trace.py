"""Truth-table reasoning traces for Knights & Knaves: a mechanical derivation a tiny model can copy.

A tiny model trained on the bare answer learns surface cues, not the logic; a terse truth table does
not help either, because the model cannot tell which truth value each leaf has. This trace writes
every lookup out: for each candidate assignment (row), each speaker's role in the row, and for each
leaf of their statement the person named, the role claimed, that person's role in the row and the
resulting truth value.

Grammar (K = knight, N = knave, T/F = true/false)::

    trace   := row ("; " row)*
    row     := header ":" clause ("," clause)*
    header  := NAME " " ROLE (" " NAME " " ROLE)*      every person, in puzzle order
    clause  := " " NAME " " ROLE " says " expr " =" VAL " " ("ok" | "x")
    expr    := leaf | "not " leaf | leaf " " OP " " leaf
    leaf    := NAME " " ROLE ":" ROLE " " VAL           named person, claimed role : role in this row
    OP      := "and" | "or" | "then" (if left then right) | "iff"

A clause's VAL is the statement's truth value in the row; "ok" when it fits the speaker (a knight's
statement true, a knave's false), "x" when it does not. Rows run through the assignments in a fixed
order (person 1 varies slowest, K before N, so the first row is all knights); a row stops at its
first "x" and the trace stops after the first row whose clauses are all "ok" — the unique solution,
since generated puzzles have exactly one. Stopping early keeps traces short (about half the table,
and rarely every clause of a rejected row), which is what a CPU model can afford to learn and generate.

Example (Henry: "Ava is a knave"; Ava: "Henry is a knight and Ava is a knight")::

    Henry K Ava K: Henry K says Ava N:K F =F x; Henry K Ava N: Henry K says Ava N:N T =T ok, Ava N
    says Henry K:K T and Ava K:N F =F ok
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from lucidrl.data.kk.logic import Binary, Leaf, Not, Puzzle, Statement, evaluate, format_solution

# "implies" reads "if A then B" in the puzzle text; the trace keeps only the joining word.
OP_WORDS = {"and": "and", "or": "or", "implies": "then", "iff": "iff"}


def role(knight: bool) -> str:
    """One letter per role: K for a knight, N for a knave."""
    return "K" if knight else "N"


def truth(value: bool) -> str:
    """One letter per truth value: T or F."""
    return "T" if value else "F"


def leaf_text(leaf: Leaf, names: Sequence[str], row: Sequence[bool]) -> str:
    """A leaf evaluated in `row`: "Ava N:K F" = Ava is claimed a knave, is a knight in the row, so false."""
    actual = row[leaf.person]
    return f"{names[leaf.person]} {role(leaf.knight)}:{role(actual)} {truth(actual == leaf.knight)}"


def expression_text(statement: Statement, names: Sequence[str], row: Sequence[bool]) -> str:
    """The statement with each leaf evaluated in `row`, followed by its overall value: "... =F"."""
    if isinstance(statement, Leaf):
        body = leaf_text(statement, names, row)
    elif isinstance(statement, Not):
        body = f"not {leaf_text(statement.leaf, names, row)}"
    elif isinstance(statement, Binary):
        left = leaf_text(statement.left, names, row)
        right = leaf_text(statement.right, names, row)
        body = f"{left} {OP_WORDS[statement.op]} {right}"
    else:
        raise TypeError(f"not a K&K statement: {statement!r} (type {type(statement).__name__})")
    return f"{body} ={truth(evaluate(statement, row))}"


def row_text(statements: Sequence[Statement], names: Sequence[str], row: Sequence[bool]) -> tuple[str, bool]:
    """One truth-table row: its header and clauses up to the first inconsistent speaker; and whether all fit."""
    header = " ".join(f"{name} {role(knight)}" for name, knight in zip(names, row, strict=True))
    clauses = []
    for speaker, statement in enumerate(statements):
        fits = evaluate(statement, row) == row[speaker]
        clauses.append(
            f" {names[speaker]} {role(row[speaker])} says {expression_text(statement, names, row)} "
            + ("ok" if fits else "x")
        )
        if not fits:
            return header + ":" + ",".join(clauses), False
    return header + ":" + ",".join(clauses), True


def assignments(n_people: int) -> list[tuple[bool, ...]]:
    """Every assignment in trace order: person 1 varies slowest, knight before knave (all knights first)."""
    return list(itertools.product((True, False), repeat=n_people))


def build_trace(statements: Sequence[Statement], names: Sequence[str]) -> tuple[str, tuple[bool, ...]]:
    """The trace for a puzzle (see the module docstring) and the assignment it ends on.

    Raises ValueError when no assignment fits every statement (a puzzle with no solution).
    """
    if len(names) != len(statements):
        raise ValueError(f"build_trace got {len(statements)} statements but {len(names)} names {list(names)}")
    rows = []
    for row in assignments(len(statements)):
        text, solved = row_text(statements, names, row)
        rows.append(text)
        if solved:
            return "; ".join(rows), row
    raise ValueError(
        f"the puzzle of {list(names)} has no consistent assignment, so no trace ends in a solution; "
        "only uniquely solvable puzzles (sample_puzzle) get traces"
    )


def trace_response(puzzle: Puzzle) -> str:
    """The supervised response with reasoning: " TRACE </think> <answer> (1) ... </answer>".

    Follows the pre-filled "<think>", so the whole assistant turn passes Logic-RL's format rule.
    Raises ValueError if the trace's solution differs from the puzzle's stored one (not unique).
    """
    trace, solution = build_trace(puzzle.statements, puzzle.names)
    if solution != tuple(puzzle.knights):
        raise ValueError(
            f"the trace of the puzzle of {list(puzzle.names)} ends on {[role(k) for k in solution]} but the "
            f"stored solution is {[role(k) for k in puzzle.knights]}: the puzzle has more than one solution"
        )
    return f" {trace} </think> <answer> {format_solution(puzzle.names, puzzle.knights)} </answer>"
