"""The rule reward of `lucidrl data word-problems`: exact, in the answer format the row asked for.

A row's `extra_info["format"]` names the format its prompt asked for (rows without one are GSM8K's):

- `answer_is`: the number in the last "The answer is N" (case aside, an optional colon, `$` or `**`)
  equals the answer → 1.0, else 0.0;
- `gsm8k`: the number after the last "####" (spaces, `$` or `**` between them aside) equals the
  answer → 1.0, else 0.0. Numbers compare as numbers ("10.0" is 10; "1,000" is 1000), unlike verl's
  GSM8K rule (lucidrl.rewards.gsm8k), which compares text.

Besides the score it reports `format_ok`: whether the response gives a number in the asked format at
all, so a run and `lucidrl eval` show the format being learnt apart from the arithmetic.

`STOP_AFTER_ANSWER` is the `rollout.stop_regex` for the `answer_is` format: the response ends once it
has stated a whole number after "answer is", so what the reward reads is the first answer given.
"""

from __future__ import annotations

import re
from typing import Any

from lucidrl.diagnostics.errors import UserError

_NUMBER = r"(-?\d[\d,]*(?:\.\d+)?)"
PATTERNS = {
    "answer_is": re.compile(r"answer is:?\s*\**\s*\$?\s*" + _NUMBER, re.IGNORECASE),
    "gsm8k": re.compile(r"####\s*\**\s*\$?\s*" + _NUMBER),
}
# the answer_is pattern, and a character after the number that shows it is whole: not a digit, comma or
# point, or a point that no digit follows ("42." stops at what comes after the point; "4.2" and "1,000"
# are not cut inside)
STOP_AFTER_ANSWER = "(?i)" + PATTERNS["answer_is"].pattern + r"(?=[^\d,.]|\.[^\d])"


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """{"score": 1.0 or 0.0, "acc": the same, "format_ok": 1.0 when a number is there in the asked format}."""
    info = extra_info if isinstance(extra_info, dict) else {}
    fmt = info.get("format") or "gsm8k"
    if fmt not in PATTERNS:
        raise UserError(
            f"word_problems reward: extra_info.format {fmt!r} is not a format it reads; "
            "the rows of `lucidrl data word-problems` say 'answer_is' or 'gsm8k'"
        )
    found = PATTERNS[fmt].findall(solution_str)
    right = bool(found) and float(found[-1].replace(",", "")) == float(ground_truth)
    return {"score": float(right), "acc": float(right), "format_ok": float(bool(found))}
