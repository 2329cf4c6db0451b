"""TinyZero's Countdown rule reward: reach the target with each given number exactly once.

As TinyZero's `countdown.compute_score`, rule for rule: the answer is the last <answer>...</answer> on
the response's last line; the numbers are every run of digits in it, which must be the given numbers
exactly (in any order); the expression may hold digits, + - * / ( ) . and spaces only, and is
evaluated with Python's arithmetic (floats for "/", `**` and `//` included); within 1e-5 of the
target scores 1.0, anything else in <answer> 0.1, no <answer> on the last line 0.0.

The expression is evaluated from its syntax tree, never by `eval`, so a response cannot run code; a
power whose result would be astronomically large (TinyZero's `eval` would compute it for minutes) is
a wrong answer.

`solution_str` is the assistant's turn, what lucidrl passes (the pre-filled start plus the response):
TinyZero's reward reads the decoded prompt and response after the prompt's "Assistant:" (or
"<|im_start|>assistant") header, which is the same text.

`lenient=True` (off by default; a documented difference from TinyZero) reads the last <answer>
anywhere in the response, not only on its last line, and takes "×", "÷" and "−" for * / -.
"""

from __future__ import annotations

import ast
import operator
import re
from numbers import Integral
from typing import Any

FORMAT_SCORE = 0.1
_ANSWER = re.compile(r"<answer>(.*?)</answer>")
_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_SPELLINGS = str.maketrans({"×": "*", "÷": "/", "−": "-"})
MAX_EXPONENT = 64  # a larger power of a number other than 0, 1 and -1 is far from any target


class NotAnExpression(ValueError):
    """The answer is not an arithmetic expression TinyZero's rule would evaluate."""


def extract_answer(solution_str: str, lenient: bool = False) -> str | None:
    """The stripped text of the last <answer>...</answer> on the last line (anywhere with `lenient`), or None."""
    if lenient:
        end = solution_str.rfind("</answer>")
        start = solution_str.rfind("<answer>", 0, end) if end >= 0 else -1
        if start < 0:
            return None
        return solution_str[start + len("<answer>") : solution_str.find("</answer>", start)].strip()
    found = _ANSWER.findall(solution_str.split("\n")[-1])
    return found[-1].strip() if found else None


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(left) not in (0, 1) and abs(right) > MAX_EXPONENT:
            raise NotAnExpression("a power too large to be a countdown target")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    raise NotAnExpression(f"{type(node).__name__} is not arithmetic")


def evaluate(expression: str) -> Any:
    """The value of `expression` as Python computes it; NotAnExpression where TinyZero's evaluation fails."""
    if not _ALLOWED.match(expression):
        raise NotAnExpression(f"{expression!r} holds characters other than digits, + - * / . and parentheses")
    try:
        return _value(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ArithmeticError, TypeError, ValueError, RecursionError, MemoryError) as exc:
        raise NotAnExpression(f"{expression!r} does not evaluate: {exc}") from exc


def numbers_used(expression: str) -> list[int]:
    """Every run of digits in `expression`, as TinyZero counts the numbers (so "1.5" uses 1 and 5)."""
    return [int(n) for n in re.findall(r"\d+", expression)]


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


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: Any = None, lenient: bool = False
) -> dict[str, float]:
    """score: 1.0 for an expression over exactly the given numbers within 1e-5 of the target, 0.1 for
    another <answer>, 0.0 without one; acc: reached the target; format_ok: an <answer> was read."""
    target, numbers = check_ground_truth(ground_truth)
    answer = extract_answer(solution_str, lenient)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "format_ok": 0.0}
    expression = answer.translate(_SPELLINGS) if lenient else answer
    right = False
    if sorted(numbers_used(expression)) == sorted(numbers):
        try:
            right = abs(evaluate(expression) - target) < 1e-5
        except (NotAnExpression, TypeError, OverflowError):
            right = False
    return {"score": 1.0 if right else FORMAT_SCORE, "acc": float(right), "format_ok": 1.0}
