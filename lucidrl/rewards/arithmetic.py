"""The arithmetic task's reward: 1.0 when the final answer equals the ground truth, else 0.0.

The final answer is the number of the last "answer is N" in the response (the form the questions ask
for), else its last number. In a multi-turn run the response is the assistant's turns only (a tool's
output is not the model's answer). Extra metrics: `acc` (the score) and `format` (1.0 when the
answer was written as asked).
"""

from __future__ import annotations

import re
from typing import Any

_ANSWER = re.compile(r"answer is[:\s]*\$?\s*(-?[\d,]*\d)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*")


def final_answer(text: str) -> tuple[int | None, bool]:
    """(the answer, whether it was written as "The answer is N")."""
    asked = _ANSWER.findall(text)
    if asked:
        return int(asked[-1].replace(",", "")), True
    numbers = [n for n in _NUMBER.findall(text) if n.strip(",")]
    if not numbers:
        return None, False
    try:
        return int(numbers[-1].replace(",", "").rstrip(",")), False
    except ValueError:
        return None, False


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    answer, formatted = final_answer(solution_str)
    correct = answer is not None and str(answer) == str(ground_truth).strip()
    return {"score": float(correct), "acc": float(correct), "format": float(formatted)}
