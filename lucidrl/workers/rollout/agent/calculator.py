"""The built-in `calculator` tool: arithmetic on exact numbers, parsed from an expression tree.

The expression is parsed with `ast` and only numbers, + - * / // % **, unary signs and parentheses
are evaluated; nothing is ever passed to `eval`, and names, calls, attributes and subscripts are
refused. Numbers are exact (integers and fractions: 1/3*3 is 1), so multi-digit products come out
right; a result that is not a whole number is written as a decimal. Powers and results are bounded
so that `9**9**9` answers with an error instead of taking the process's memory.
"""

from __future__ import annotations

import ast
from fractions import Fraction

from lucidrl.workers.rollout.agent.tools import ToolError

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 4096
MAX_RESULT_DIGITS = 4300  # Python's own limit for int -> str conversions
_MAX_BITS = int(MAX_RESULT_DIGITS * 3.33)  # bits of a number of that many decimal digits
DECIMALS = 10

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: lambda a, b: a % b,
}
_SYMBOLS = {ast.Pow: "**", ast.BitXor: "^", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>"}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(1234 * 56) - 789"
    """
    text = str(expression).strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise ToolError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is {len(text)} characters long; at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text.replace(",", ""), mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse {text!r} as arithmetic ({e.msg})") from None
    return format_number(_evaluate(tree.body))


def format_number(value: Fraction) -> str:
    """An integer as itself; otherwise a decimal rounded to DECIMALS places (trailing zeros dropped)."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    scaled = round(abs(value) * 10**DECIMALS)
    whole, frac = divmod(scaled, 10**DECIMALS)
    digits = str(frac).rjust(DECIMALS, "0").rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"{node.value!r} is not a number")
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ToolError(
                f"the operator {_SYMBOLS.get(type(node.op), type(node.op).__name__)} is not arithmetic here"
            )
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ToolError("division by zero")
        return _check_size(op(left, right))
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"the name {node.id!r}"
    elif isinstance(node, ast.Call):
        what = "a function call"
    raise ToolError(f"{what} is not allowed: only numbers, + - * / // % ** and parentheses")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ToolError("only whole-number exponents are supported")
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"the exponent {exponent} is larger than {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero")
    # refused before computing it: (10**4000)**4000 would take the memory the check protects
    if abs(exponent) * max(base.numerator.bit_length(), base.denominator.bit_length()) > _MAX_BITS * 2:
        raise ToolError(f"the result has more than {MAX_RESULT_DIGITS} digits")
    return base ** int(exponent)


def _check_size(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > _MAX_BITS:
        raise ToolError(f"the result has more than {MAX_RESULT_DIGITS} digits")
    return value
