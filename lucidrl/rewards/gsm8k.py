"""verl's GSM8K rule reward: 1.0 when the last "#### <number>" of the response's end equals the ground truth.

As verl's `gsm8k.compute_score` (strict method): only the last 300 characters are read; the answer is
the last "#### " (one space) followed by digits, "-", "." and ","; its commas are dropped and the
text compared with the ground truth as written ("42" and "42.00" differ, so do "#### 42." and 42).
No "####" answer scores 0.0.

`lenient=True` (off by default; a documented difference from verl) reads the whole response,
allows spaces and a "$" after "####", drops a sentence's final "." and compares numbers by value.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

TAIL_CHARS = 300  # verl reads the response's last 300 characters only
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
# one optional "$" between the spaces: "\s*\$?\s*" let the two runs of spaces trade characters, and a
# a backtracking pattern scanned "####" followed by many spaces in quadratic time; this one is linear
_LENIENT = re.compile(r"####\s*(?:\$\s*)?(-?[0-9.,$]+)")


def extract_answer(solution_str: str, lenient: bool = False) -> str | None:
    """The number after the last "#### " (verl's: in the last 300 characters, commas dropped), or None."""
    if lenient:
        matches = _LENIENT.findall(solution_str)
        return _normalize(matches[-1]) if matches else None
    matches = _STRICT.findall(solution_str[-TAIL_CHARS:])
    return matches[-1].replace(",", "") if matches else None


def _normalize(text: str) -> str:
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


def check_ground_truth(ground_truth: Any) -> str:
    """The ground truth as the text verl compares with; a ValueError for one verl could never match."""
    if not isinstance(ground_truth, str):
        raise ValueError(
            f"GSM8K ground_truth must be the answer as text, as verl's files hold it ('72'), got "
            f"{type(ground_truth).__name__} {ground_truth!r}: verl compares text with it and scores every answer "
            "0; write it as a string (or call gsm8k.compute_score with lenient=True, which compares numbers)"
        )
    return ground_truth


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: Any = None, lenient: bool = False
) -> float:
    """1.0 when the response's final "#### <number>" equals `ground_truth`, else 0.0 (see the module docstring)."""
    if lenient:
        answer = extract_answer(solution_str, lenient=True)
        if answer is None:
            return 0.0
        truth = _normalize(str(ground_truth))
        if answer == truth:
            return 1.0
        try:
            return 1.0 if Decimal(answer) == Decimal(truth) else 0.0
        except InvalidOperation:
            return 0.0
    truth = check_ground_truth(ground_truth)
    answer = extract_answer(solution_str)
    return 1.0 if answer is not None and answer == truth else 0.0
