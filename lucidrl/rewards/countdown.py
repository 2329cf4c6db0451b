"""TinyZero's Countdown rule reward: reach the target with each given number exactly once.

The last <answer>...</answer> of the response must hold an arithmetic expression over the given numbers
(each used exactly once) with + - * / and parentheses. 1.0 when it equals the target, 0.1 when it is
there but wrong (other numbers, another value, division by zero, something that is not such an
expression), 0.0 when there is no <answer> at all.

The expression is parsed with `ast` and evaluated on exact fractions, node by node; nothing is passed
to `eval`, so a response cannot run code, and `(1/3)*3` equals 1.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from numbers import Integral
from typing import Any

FORMAT_SCORE = 0.1
_OPS = {
    ast.Add: Fraction.__add__,
    ast.Sub: Fraction.__sub__,
    ast.Mult: Fraction.__mul__,
    ast.Div: Fraction.__truediv__,
}
# what a model may write for the four operations
_SPELLINGS = str.maketrans({"×": "*", "÷": "/", "−": "-"})


class NotAnExpression(ValueError):
    """The answer is not an arithmetic expression of integers with + - * / and parentheses."""


def extract_answer(solution_str: str) -> str | None:
    """The text of the last <answer>...</answer>, stripped; None when there is none."""
    end = solution_str.rfind("</answer>")  # from the end: a regex rescans after every unclosed tag
    start = solution_str.rfind("<answer>", 0, end) if end >= 0 else -1
    if start < 0:
        return None
    end = solution_str.find("</answer>", start)  # its own closing tag: a stray later one is not the answer's
    return solution_str[start + len("<answer>") : end].strip()


def _value(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _value(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left, used), _value(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise NotAnExpression("division by zero")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _value(node.operand, used)
        return -value if isinstance(node.op, ast.USub) else value
    raise NotAnExpression(f"{type(node).__name__} is not allowed")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of `expression` and the integers it uses; NotAnExpression for anything else."""
    text = expression.translate(_SPELLINGS)  # no "=": TinyZero's rule wants the expression alone
    if not re.fullmatch(r"[\d\s+\-*/().]*", text) or not text.strip():
        raise NotAnExpression(f"{expression!r} holds characters other than digits, + - * / and parentheses")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise NotAnExpression(f"{expression!r} does not parse: {exc.msg}") from exc
    used: list[int] = []
    return _value(tree, used), used


def check_ground_truth(ground_truth: Any) -> tuple[int, list[int]]:
    """(target, numbers) from a row's ground truth, or a ValueError naming what is wrong with it."""
    if not isinstance(ground_truth, dict) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(
            f"countdown ground_truth must be {{'target': int, 'numbers': [int, ...]}} (TinyZero's layout), "
            f"got {ground_truth!r}"
        )
    numbers = list(ground_truth["numbers"])
    if not numbers or not all(isinstance(n, Integral) and not isinstance(n, bool) for n in numbers):
        raise ValueError(
            f"countdown ground_truth numbers must be a non-empty list of integers, got {numbers!r}"
        )
    target = ground_truth["target"]
    whole = isinstance(target, Integral) or (isinstance(target, float) and target.is_integer())
    if isinstance(target, bool) or not whole:  # int(24.7) was 24: a wrong answer scored as right
        raise ValueError(f"countdown ground_truth target must be a whole number, got {target!r}")
    return int(target), [int(n) for n in numbers]


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """score: 1.0 for an expression over exactly the given numbers that equals the target, 0.1 for
    another expression in <answer>, 0.0 without one; acc: reached the target; format_ok: an <answer>."""
    target, numbers = check_ground_truth(ground_truth)
    answer = extract_answer(solution_str)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "format_ok": 0.0}
    try:
        value, used = evaluate(answer)
        right = Counter(used) == Counter(numbers) and value == target
    except (NotAnExpression, ZeroDivisionError, RecursionError, MemoryError):
        right = False
    return {"score": 1.0 if right else FORMAT_SCORE, "acc": float(right), "format_ok": 1.0}
