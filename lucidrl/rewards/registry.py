"""Choosing a rule reward by a row's `data_source` (verl's `default_compute_score`), plus user registration.

Each built-in rule scores as the project it comes from does on the same text (tests/test_reward_parity.py
runs verl's, TinyZero's and Logic-RL's functions beside them): GSM8K, MATH and DAPO's math as verl's,
Countdown as TinyZero's, Knights & Knaves as Logic-RL's. docs/migration.md lists the options that
differ, each off by default.

A reward function registered here takes `(solution_str, ground_truth, extra_info=None)` and returns a
float or a dict holding "score" and extra metrics. Add one with the decorator:

    @register_reward("my_task")
    def my_score(solution_str, ground_truth, extra_info=None): ...
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from lucidrl.diagnostics.errors import UserError
from lucidrl.rewards import arithmetic, countdown, gsm8k, guess_number, kk, math, math_dapo, word_problems

F = TypeVar("F", bound=Callable[..., Any])


class UnknownDataSourceError(UserError, ValueError):
    """No reward function is registered for a row's data_source (the message lists the known ones)."""


class GroundTruthError(UserError, ValueError):
    """A row's reward_model.ground_truth that its data_source's built-in rule cannot score."""


REWARD_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **dict.fromkeys(kk.KK_SOURCES, kk.compute_score),
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    # verl's MATH sources
    "lighteval/MATH": math.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math.compute_score,
    "HuggingFaceH4/MATH-500": math.compute_score,
    # verl's DAPO sources (and aime*): the last "Answer:" line, +-1; not the boxed rule above
    "math": math_dapo.compute_score,
    "math_dapo": math_dapo.compute_score,
    "math_dapo_reasoning": math_dapo.compute_score,
    "countdown": countdown.compute_score,  # TinyZero's
    "word_problems": word_problems.compute_score,  # lucidrl data word-problems
    "arithmetic": arithmetic.compute_score,  # lucidrl data arithmetic (the calculator example)
    "guess_number": guess_number.compute_score,  # the guess_number environment's game
}


def known_data_sources() -> list[str]:
    """Sorted data_source values that have a reward function."""
    return sorted(REWARD_FUNCTIONS)


def _lookup(data_source: str) -> Callable[..., Any] | None:
    fn = REWARD_FUNCTIONS.get(data_source)
    if fn is None and str(data_source).startswith("aime"):  # verl's prefix rule: aime2024, aime2025, ...
        return math_dapo.compute_score
    if fn is None and "countdown" in str(data_source):  # TinyZero's rule: any source naming it
        return countdown.compute_score
    return fn


def _what_to_do(data_source: str) -> str:
    """For a data_source without a reward function: the close match, the known ones, how to add one."""
    known = known_data_sources()
    close = difflib.get_close_matches(str(data_source), known, n=1, cutoff=0.5)
    hint = f"Did you mean {close[0]!r}? " if close else ""
    return (
        f"{hint}Known data sources: {known}. For your own task, set reward.custom_function.path (a .py file) "
        f"and reward.custom_function.name (the function in it), or decorate a function with "
        f"@register_reward({data_source!r})."
    )


def get_reward_function(data_source: str) -> Callable[..., Any]:
    """The reward function for `data_source`; UnknownDataSourceError naming the close match otherwise."""
    fn = _lookup(data_source)
    if fn is not None:
        return fn
    # One string argument only: an exception with a richer __init__ cannot be unpickled across processes.
    raise UnknownDataSourceError(
        f"no reward function for data_source {data_source!r}. {_what_to_do(data_source)}"
    )


def check_data_sources(rows: Iterable[tuple[str, str]], what: str) -> None:
    """UnknownDataSourceError unless every row's data_source has a reward function; `rows` are
    (data_source, where) pairs ("FILE row I"), `what` the config key of their files.

    Run before the first step, on every row: a data_source found only when its row is scored ended a
    run at the step that drew it, or (in a validation file) after all the training steps."""
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    for data_source, where in rows:
        first.setdefault(data_source, where)
        counts[data_source] = counts.get(data_source, 0) + 1
    unknown = [ds for ds in first if _lookup(ds) is None]
    if not unknown:
        return
    listed = "; ".join(f"{ds!r} ({counts[ds]} rows, the first {first[ds]})" for ds in unknown)
    raise UnknownDataSourceError(
        f"{what}: no reward function for data_source {listed}. {_what_to_do(unknown[0])} "
        "(Every row is checked before the first step: nothing was trained.)"
    )


def _finite_number(ground_truth: Any) -> float:
    value = float(ground_truth)  # a TypeError or ValueError for None, a list, "abc"
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"the ground truth must be a finite number, got {ground_truth!r}")
    return value


def _whole_number(ground_truth: Any) -> int:
    value = _finite_number(ground_truth)
    if not value.is_integer():
        raise ValueError(f"the ground truth must be a whole number, got {ground_truth!r}")
    return int(value)


def _answer_text(ground_truth: Any) -> str:
    if ground_truth is None or isinstance(ground_truth, float) and ground_truth != ground_truth:
        raise ValueError(f"the ground truth must be the answer, got {ground_truth!r}")
    if isinstance(ground_truth, (list, dict, tuple)):
        raise ValueError(f"the ground truth must be the answer as text or a number, got {ground_truth!r}")
    return str(ground_truth)


# how each built-in rule reads a ground truth: a ValueError or TypeError where it would fail or score
# nonsense, found for every row when the data loads (check_ground_truths) instead of at the first sample
GROUND_TRUTH_CHECKS: dict[Callable[..., Any], Callable[[Any], Any]] = {
    kk.compute_score: kk.parse_ground_truth,
    gsm8k.compute_score: gsm8k.check_ground_truth,
    math.compute_score: math.check_ground_truth,
    math_dapo.compute_score: math_dapo.check_ground_truth,
    countdown.compute_score: countdown.check_ground_truth,
    word_problems.compute_score: _finite_number,
    arithmetic.compute_score: _answer_text,
    guess_number.compute_score: _whole_number,
}


def check_ground_truths(rows: Iterable[tuple[str, Any, str]], what: str) -> None:
    """GroundTruthError unless every row's ground truth is one its data_source's built-in rule can score;
    `rows` are (data_source, ground_truth, where) triples, `what` the config key of their files.

    Run before the first step, on every row, as check_data_sources is: a None, NaN or wrong-shaped ground
    truth was found only when its sample was scored. Rows of a data_source without a rule, or of a
    function registered by the user, are not checked here."""
    bad: dict[str, tuple[str, Any, str]] = {}
    counts: dict[str, int] = {}
    for data_source, ground_truth, where in rows:
        fn = _lookup(data_source)
        check = GROUND_TRUTH_CHECKS.get(fn) if fn is not None else None
        if check is None:
            continue
        try:
            check(ground_truth)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            bad.setdefault(data_source, (where, ground_truth, str(exc).strip().splitlines()[0][:300]))
            counts[data_source] = counts.get(data_source, 0) + 1
    if not bad:
        return
    listed = "; ".join(
        f"data_source {ds!r}: {counts[ds]} rows, the first {where} with ground_truth {str(gt)[:80]!r} ({why})"
        for ds, (where, gt, why) in bad.items()
    )
    raise GroundTruthError(
        f"{what}: reward_model.ground_truth that the built-in rule cannot score: {listed}. Write the ground "
        "truth as the rule reads it (docs/rewards.md), drop those rows, or score them with a function of your own "
        "(reward.custom_function.path). (Every row is checked before the first step: nothing was trained.)"
    )


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float | dict[str, float]:
    """Score one response with the rule reward registered for its row's `data_source`."""
    return get_reward_function(data_source)(solution_str, ground_truth, extra_info)


def register_reward(data_source: str) -> Callable[[F], F]:
    """Decorator registering `fn(solution_str, ground_truth, extra_info=None)` as the reward for `data_source`."""
    if not isinstance(data_source, str) or not data_source:
        raise ValueError(f"register_reward needs a non-empty data_source string, got {data_source!r}")

    def decorator(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@register_reward({data_source!r}) decorates {fn!r}, which is not callable")
        existing = REWARD_FUNCTIONS.get(data_source)
        # Re-registering the same function (a module re-import) is harmless; another one would silently
        # change how every row of that data_source is scored.
        if existing is not None and _qualname(existing) != _qualname(fn):
            raise ValueError(
                f"data_source {data_source!r} already has the reward {_qualname(existing)}; cannot also "
                f"register {_qualname(fn)} — use another data_source name in your rows"
            )
        REWARD_FUNCTIONS[data_source] = fn
        return fn

    return decorator


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
