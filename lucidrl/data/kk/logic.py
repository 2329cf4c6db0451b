"""Knights & Knaves statements: trees, truth values, the solver and a small JSON form.

People are numbered 0..n-1. A statement is a tree of depth at most 2:

- a leaf claims one person's role: ``Leaf(person=j, knight=True)`` is "j is a knight";
- ``Not(leaf)`` negates one leaf;
- ``Binary(op, left, right)`` joins two different leaves with ``op`` one of
  "and", "or", "implies" (if left then right) and "iff" (left if and only if right).

An assignment is a tuple of booleans, ``knights[i]`` True when person i is a knight. A knight's
statement is true and a knave's is false, so an assignment is a solution when, for every speaker i,
``knights[i] == evaluate(statements[i], knights)``.

JSON form (what ``extra_info.statements`` holds, one entry per speaker in speaker order)::

    ["knight", j]                  j is a knight
    ["knave", j]                   j is a knave
    ["not", LEAF]                  it is not the case that LEAF
    ["and", LEAF, LEAF]            LEAF and LEAF        (also "or", "implies", "iff")
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BINARY_OPS = ("and", "or", "implies", "iff")
# Swapping the children of these leaves the truth value unchanged, so the canonical form sorts them.
_SYMMETRIC_OPS = frozenset({"and", "or", "iff"})


@dataclass(frozen=True)
class Leaf:
    """The claim "person is a knight" (knight=True) or "person is a knave" (knight=False)."""

    person: int
    knight: bool


@dataclass(frozen=True)
class Not:
    """The negation of one leaf: "it is not the case that <leaf>"."""

    leaf: Leaf


@dataclass(frozen=True)
class Binary:
    """Two different leaves joined by "and", "or", "implies" (left then right) or "iff"."""

    op: str
    left: Leaf
    right: Leaf

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown K&K operator {self.op!r}; expected one of {list(BINARY_OPS)}")


Statement = Leaf | Not | Binary


def evaluate(statement: Statement, knights: Sequence[bool]) -> bool:
    """Whether `statement` is true when person i is a knight exactly when `knights[i]` is True."""
    if isinstance(statement, Leaf):
        return bool(knights[statement.person]) == statement.knight
    if isinstance(statement, Not):
        return not evaluate(statement.leaf, knights)
    if isinstance(statement, Binary):
        a = evaluate(statement.left, knights)
        b = evaluate(statement.right, knights)
        if statement.op == "and":
            return a and b
        if statement.op == "or":
            return a or b
        if statement.op == "implies":
            return (not a) or b
        return a == b
    raise TypeError(f"not a K&K statement: {statement!r} (type {type(statement).__name__})")


def truth_table(statement: Statement, n_people: int) -> int:
    """The statement's truth value over all 2**n assignments, as a bitmask.

    Bit `a` of the result is set when the statement is true under assignment number `a`, where
    person i is a knight in assignment `a` exactly when bit i of `a` is set. Bitwise operations on
    these masks evaluate a statement under every assignment at once, which keeps the solver fast
    enough to reject thousands of 8-person candidates per second.
    """
    full = (1 << (1 << n_people)) - 1
    if isinstance(statement, Leaf):
        mask = _knight_mask(statement.person, n_people)
        return mask if statement.knight else full & ~mask
    if isinstance(statement, Not):
        return full & ~truth_table(statement.leaf, n_people)
    if isinstance(statement, Binary):
        a = truth_table(statement.left, n_people)
        b = truth_table(statement.right, n_people)
        if statement.op == "and":
            return a & b
        if statement.op == "or":
            return a | b
        if statement.op == "implies":
            return (full & ~a) | b
        return full & ~(a ^ b)
    raise TypeError(f"not a K&K statement: {statement!r} (type {type(statement).__name__})")


@functools.cache
def _knight_mask(person: int, n_people: int) -> int:
    """Bitmask of the assignments (numbered as in `truth_table`) in which `person` is a knight."""
    mask = 0
    for a in range(1 << n_people):
        if a >> person & 1:
            mask |= 1 << a
    return mask


def solve(statements: Sequence[Statement]) -> list[tuple[bool, ...]]:
    """Every assignment consistent with the statements (speaker i said statements[i]), in a fixed order.

    Enumerates all 2**n assignments: person i's knighthood must equal the truth of statement i.
    A puzzle is well posed when exactly one assignment is returned.
    """
    n = len(statements)
    _check_people(statements)
    full = (1 << (1 << n)) - 1
    consistent = full
    for i, statement in enumerate(statements):
        # "i is a knight" and "statement i is true" must agree: the XNOR of their truth tables.
        consistent &= full & ~(_knight_mask(i, n) ^ truth_table(statement, n))
        if not consistent:
            return []
    return [tuple(bool(a >> i & 1) for i in range(n)) for a in range(1 << n) if consistent >> a & 1]


def solve_by_enumeration(statements: Sequence[Statement]) -> list[tuple[bool, ...]]:
    """The same answer as `solve`, computed the slow, obvious way (a cross-check for the fast one)."""
    _check_people(statements)
    n = len(statements)
    solutions = []
    for bits in itertools.product((False, True), repeat=n):
        knights = bits[::-1]  # product varies the last element fastest; reverse to match solve's order
        if all(knights[i] == evaluate(s, knights) for i, s in enumerate(statements)):
            solutions.append(tuple(knights))
    return solutions


def _check_people(statements: Sequence[Statement]) -> None:
    """Raise if a statement names a person outside 0..n-1 (n = number of statements)."""
    n = len(statements)
    for i, statement in enumerate(statements):
        for leaf in leaves(statement):
            if not 0 <= leaf.person < n:
                raise ValueError(
                    f"statement {i} ({to_json(statement)}) mentions person {leaf.person}, but the puzzle has "
                    f"only people 0..{n - 1}; every person mentioned must also speak"
                )


def leaves(statement: Statement) -> list[Leaf]:
    """The leaves of a statement, left to right."""
    if isinstance(statement, Leaf):
        return [statement]
    if isinstance(statement, Not):
        return [statement.leaf]
    return [statement.left, statement.right]


def canonical(statement: Statement) -> tuple:
    """A hashable key equal for statements that differ only in the order of a symmetric op's children."""
    if isinstance(statement, Leaf):
        return ("knight" if statement.knight else "knave", statement.person)
    if isinstance(statement, Not):
        return ("not", canonical(statement.leaf))
    children = [canonical(statement.left), canonical(statement.right)]
    if statement.op in _SYMMETRIC_OPS:
        children.sort()
    return (statement.op, *children)


def relabel(statement: Statement, new_index: Sequence[int]) -> Statement:
    """The statement with person i renamed new_index[i]."""
    if isinstance(statement, Leaf):
        return Leaf(new_index[statement.person], statement.knight)
    if isinstance(statement, Not):
        return Not(relabel(statement.leaf, new_index))
    return Binary(statement.op, relabel(statement.left, new_index), relabel(statement.right, new_index))


def _role_shape(statement: Statement, person: int) -> tuple:
    """What a person says, with everyone named only as "self" or "other": the same in every ordering."""
    if isinstance(statement, Leaf):
        return ("knight" if statement.knight else "knave", "self" if statement.person == person else "other")
    if isinstance(statement, Not):
        return ("not", _role_shape(statement.leaf, person))
    children = [_role_shape(statement.left, person), _role_shape(statement.right, person)]
    if statement.op in _SYMMETRIC_OPS:
        children.sort()
    return (statement.op, *children)


def puzzle_key(statements: Sequence[Statement]) -> tuple:
    """The dedupe key of a puzzle: equal for puzzles that differ only in names, in the order of a
    symmetric op's children, or in the order the people are introduced (and speak).

    The same two people told in the other order ("Ava says ...; Henry says ..." for "Henry says ...;
    Ava says ...") are one puzzle with one solution; keyed by speaker order alone, 2-person K&K has 556
    puzzles, of which 542 are such mirror pairs: 285 in all. The key is the smallest tuple of canonical
    statements over the orderings that sort people by an ordering-free description of each (what they
    say, seen as self / other, and how others speak of them); only ties are permuted, and any ordering
    of an equal puzzle sorts the same way, so equal puzzles get equal keys.
    """
    n = len(statements)
    spoken_of: list[list[tuple]] = [[] for _ in range(n)]
    for speaker, statement in enumerate(statements):
        for leaf in leaves(statement):
            if leaf.person != speaker:
                spoken_of[leaf.person].append((leaf.knight, _role_shape(statement, speaker)))
    invariant = [(_role_shape(s, i), tuple(sorted(spoken_of[i]))) for i, s in enumerate(statements)]
    groups: dict[tuple, list[int]] = {}
    for i in sorted(range(n), key=lambda i: invariant[i]):
        groups.setdefault(invariant[i], []).append(i)
    best: tuple | None = None
    for parts in itertools.product(*(itertools.permutations(g) for g in groups.values())):
        order = [i for part in parts for i in part]  # new position k holds old person order[k]
        new_index = [0] * n
        for k, old in enumerate(order):
            new_index[old] = k
        key = tuple(canonical(relabel(statements[old], new_index)) for old in order)
        if best is None or key < best:
            best = key
    assert best is not None
    return best


def to_json(statement: Statement) -> list:
    """The JSON form of a statement (see the module docstring)."""
    if isinstance(statement, Leaf):
        return ["knight" if statement.knight else "knave", statement.person]
    if isinstance(statement, Not):
        return ["not", to_json(statement.leaf)]
    if isinstance(statement, Binary):
        return [statement.op, to_json(statement.left), to_json(statement.right)]
    raise TypeError(f"not a K&K statement: {statement!r} (type {type(statement).__name__})")


def from_json(obj: Any) -> Statement:
    """Parse the JSON form of a statement back into a tree; ValueError naming the bad part otherwise."""
    expected = 'expected ["knight"|"knave", j], ["not", LEAF] or ["and"|"or"|"implies"|"iff", LEAF, LEAF]'
    if not isinstance(obj, (list, tuple)) or not obj or not isinstance(obj[0], str):
        raise ValueError(f"bad K&K statement {obj!r}: {expected}")
    tag = obj[0]
    if tag in ("knight", "knave"):
        if len(obj) != 2 or isinstance(obj[1], bool) or not isinstance(obj[1], int) or obj[1] < 0:
            raise ValueError(f"bad K&K leaf {obj!r}: expected [{tag!r}, person index >= 0]")
        return Leaf(person=obj[1], knight=tag == "knight")
    if tag == "not":
        if len(obj) != 2:
            raise ValueError(f"bad K&K statement {obj!r}: 'not' takes exactly one leaf")
        return Not(_leaf_from_json(obj[1], obj))
    if tag in BINARY_OPS:
        if len(obj) != 3:
            raise ValueError(f"bad K&K statement {obj!r}: {tag!r} takes exactly two leaves")
        return Binary(tag, _leaf_from_json(obj[1], obj), _leaf_from_json(obj[2], obj))
    raise ValueError(f"bad K&K statement {obj!r}: unknown tag {tag!r}; {expected}")


def _leaf_from_json(obj: Any, parent: Any) -> Leaf:
    """Parse a child that must be a leaf (statements have depth at most 2)."""
    child = from_json(obj)
    if not isinstance(child, Leaf):
        raise ValueError(f"bad K&K statement {parent!r}: its child {obj!r} must be a leaf (depth at most 2)")
    return child


@dataclass(frozen=True)
class Puzzle:
    """One K&K puzzle: who says what, the names used in the text, and its unique solution."""

    statements: tuple[Statement, ...]
    names: tuple[str, ...]
    knights: tuple[bool, ...]

    @property
    def n_people(self) -> int:
        return len(self.statements)


def format_solution(names: Sequence[str], knights: Sequence[bool]) -> str:
    """The expected answer text: "(1) Zoey is a knight\\n(2) Oliver is a knave", one line per person."""
    if len(names) != len(knights):
        raise ValueError(f"format_solution got {len(names)} names {list(names)} but {len(knights)} roles")
    return "\n".join(
        f"({k}) {name} is a {'knight' if knight else 'knave'}"
        for k, (name, knight) in enumerate(zip(names, knights, strict=True), start=1)
    )
