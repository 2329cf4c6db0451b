"""The number-guessing game's reward (the guess_number environment): 1.0 when the secret was guessed.

With the conversation (a multi-turn run puts it in extra_info), the game is won when an assistant turn's
last number is the secret; `turns` counts the guesses. Without it, the response's last number is the
one guess. Extra metrics: `acc` (won) and `guesses`.
"""

from __future__ import annotations

import re
from typing import Any


def _last_number(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    secret = int(ground_truth)
    conversation = (extra_info or {}).get("conversation")
    turns = [m.get("content") or "" for m in conversation or [] if m.get("role") == "assistant"]
    guesses = [_last_number(t) for t in turns] if conversation else [_last_number(solution_str)]
    won = secret in guesses
    return {"score": float(won), "acc": float(won), "guesses": float(len(guesses))}
