"""Interactive environments: the other side of a conversation, in the spirit of verl's interactions.

An environment is a class; each sample gets its own instance, so it may keep state between turns:

    class MyEnv:
        def reset(self, sample: dict) -> list[dict]:       # the conversation to start from
            ...
        def step(self, messages: list[dict]) -> tuple[str | dict, bool, float]:
            ...                                            # (reply, done, reward) after each answer

`sample` holds the row: `prompt` (its chat messages), `data_source`, `ground_truth`, `extra_info` and
`interaction_kwargs` (extra_info.interaction_kwargs without its `name`). `step` is called after every
assistant turn that calls no tool, with the whole conversation so far; the reply (text, or a message
dict) goes back to the model as a user message unless `done`. The rewards of the steps reach the reward
function as `extra_info["turn_rewards"]`. Steps of different samples run concurrently, in threads.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from lucidrl.workers.rollout.agent.tools import MultiTurnError, ToolConfigError, load_object


class Environment(Protocol):
    def reset(self, sample: dict[str, Any]) -> list[dict[str, Any]]: ...

    def step(self, messages: list[dict[str, Any]]) -> tuple[str | dict[str, Any], bool, float]: ...


class GuessNumber:
    """A number-guessing game: the model guesses, the game answers "higher", "lower" or "correct".

    The secret is the row's ground truth (an integer), within [low, high] from interaction_kwargs (1 and
    100 by default). A step's reward is 1.0 when the guess is right, else 0.0. The row's prompt states
    the game; a row without one gets a short statement of it.
    """

    def reset(self, sample: dict[str, Any]) -> list[dict[str, Any]]:
        kwargs = sample.get("interaction_kwargs") or {}
        try:
            self.secret = int(kwargs.get("secret", sample.get("ground_truth")))
        except (TypeError, ValueError):
            raise MultiTurnError(
                f"guess_number: the secret must be an integer (the row's reward_model.ground_truth or "
                f"interaction_kwargs.secret), got {sample.get('ground_truth')!r}"
            ) from None
        self.low, self.high = int(kwargs.get("low", 1)), int(kwargs.get("high", 100))
        if not self.low <= self.secret <= self.high:
            raise MultiTurnError(
                f"guess_number: the secret {self.secret} is outside [{self.low}, {self.high}] "
                "(interaction_kwargs.low and .high)"
            )
        prompt = [dict(m) for m in sample.get("prompt") or []]
        return prompt or [
            {
                "role": "user",
                "content": f"I am thinking of a whole number between {self.low} and {self.high}. Guess it: answer "
                "with one number. I will tell you if the secret is higher or lower.",
            }
        ]

    def step(self, messages: list[dict[str, Any]]) -> tuple[str, bool, float]:
        answer = str(messages[-1].get("content") or "")
        numbers = re.findall(r"-?\d+", answer)
        if not numbers:
            return f"Answer with one whole number between {self.low} and {self.high}.", False, 0.0
        guess = int(numbers[-1])
        if guess == self.secret:
            return f"Correct! The number is {self.secret}.", True, 1.0
        if not self.low <= guess <= self.high:
            return f"{guess} is outside {self.low}..{self.high}.", False, 0.0
        return ("Higher." if guess < self.secret else "Lower."), False, 0.0


ENVIRONMENTS: dict[str, type] = {"guess_number": GuessNumber}


def resolve_environment(spec: str, where: str) -> type:
    """The environment class named `spec`: a built-in name, `package.module:Class` or `file.py:Class`."""
    if spec in ENVIRONMENTS:
        return ENVIRONMENTS[spec]
    if ":" not in spec:
        raise ToolConfigError(
            f"{where}={spec!r} is not a built-in environment ({', '.join(ENVIRONMENTS)}) nor module:Class"
        )
    cls = load_object(spec, where)
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ToolConfigError(
            f"{where}={spec!r} is not an environment class (it needs reset(sample) -> messages and "
            f"step(messages) -> (reply, done, reward){'; missing ' + ', '.join(missing) if missing else ''})"
        )
    return cls
