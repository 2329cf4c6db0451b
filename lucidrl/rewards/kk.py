"""Logic-RL's rule reward for Knights & Knaves: +1/-1 for the tag format, +2/-1.5/-2 for the answer.

Totals are 3 (format ok, all roles right), -0.5 (format ok, a role wrong), -1 (format ok, answer not
parseable) and -3 (format broken or no answer). The rule is kept exactly as Logic-RL wrote it
(arXiv 2502.14768) so that scores compare with theirs, with one difference: a response with no
"Assistant:" / "<|im_start|>assistant" header is scored as a whole (Logic-RL gave it -2 for the
answer), because lucidrl passes the response alone, starting with the pre-filled "<think>".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

FORMAT_REWARD = 1.0
ANSWER_CORRECT = 2.0
ANSWER_WRONG = -1.5
ANSWER_UNPARSEABLE = -2.0

# the data_source values K&K rows carry (Logic-RL's files: kk_logic)
KK_SOURCES = ("kk_logic", "kk")
_HEADERS = ("Assistant:", "<|im_start|>assistant")
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# a trace's first row header: every person's name and role, at least two (puzzles have 2 to 8 people),
# then a colon ("Carter K Hazel K:"); one pair alone matched "Step N: ..." and "Case K: ...", and
# free-form reasoning counted as a wrong trace
_TRACE_START = re.compile(r"\w+ [KN] (?:\w+ [KN] )*\w+ [KN]:")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Logic-RL's reading of a ground-truth line: its first word of letters is the name, the first "knight" or
# "knave" after it the role ("(1) Zoey is a knight")
_SOLUTION_LINE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)
_GROUND_TRUTH_FORM = (
    'a dict {"names": [...], "knights": [true, false, ...]} (optionally with "solution_text_format"), '
    'or a string of lines "(1) Zoey is a knight\\n(2) Oliver is a knave"'
)


def assistant_text(solution_str: str) -> str:
    """The assistant's part of a transcript: after the first "Assistant:" or "<|im_start|>assistant", else all.

    Text that already starts with "<think>" is the assistant's turn (what the trainer passes: the
    pre-filled "<think>" and the response) and is kept whole, as Logic-RL keeps everything after the
    prompt's own header: a header the model writes itself must not cut its response.
    """
    if solution_str.lstrip().startswith("<think>"):
        return solution_str
    for header in _HEADERS:
        if header in solution_str:
            return solution_str.split(header, 1)[1]
    return solution_str


def format_ok(text: str) -> bool:
    """Whether <think>, </think>, <answer>, </answer> each appear exactly once, in that order."""
    if any(text.count(tag) != 1 for tag in _TAGS):
        return False
    positions = [text.find(tag) for tag in _TAGS]
    return positions == sorted(positions)


def extract_answer(text: str) -> str | None:
    """The stripped text inside the last <answer>...</answer>, or None when there is none."""
    matches = _ANSWER.findall(text)
    return matches[-1].strip() if matches else None


def parse_answer(answer: str, names: list[str]) -> dict[str, bool] | None:
    """Each name's claimed role (True = knight) from an answer, or None when it cannot be read.

    Unreadable means: the number of "knight"/"knave" substrings differs from the number of people, or
    some name has no "NAME is a knight|knave".
    """
    lowered = answer.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    roles: dict[str, bool] = {}
    for name in names:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+(knight|knave)\b", answer, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match.group(1).lower() == "knight"
    return roles


def parse_ground_truth(ground_truth: Any) -> dict[str, bool]:
    """The true role of each name (True = knight), in puzzle order, from either accepted ground-truth form."""
    if isinstance(ground_truth, str):
        return _parse_solution_text(ground_truth)
    if isinstance(ground_truth, Mapping):
        if ground_truth.get("names") is not None and ground_truth.get("knights") is not None:
            names, knights = ground_truth["names"], ground_truth["knights"]
            if isinstance(names, str) or isinstance(knights, str):
                raise ValueError(
                    f"K&K ground truth has names={names!r}, knights={knights!r}; both must be lists. "
                    f"Expected {_GROUND_TRUTH_FORM}"
                )
            names, knights = list(names), list(knights)
            if len(names) != len(knights) or not names:
                raise ValueError(
                    f"K&K ground truth has {len(names)} names {names} but {len(knights)} roles {knights}; "
                    f"they must pair up one to one. Expected {_GROUND_TRUTH_FORM}"
                )
            if any(isinstance(k, str) for k in knights):
                raise ValueError(f"K&K ground truth knights={knights!r} must be booleans, not strings")
            return {str(name): bool(knight) for name, knight in zip(names, knights, strict=True)}
        if isinstance(ground_truth.get("solution_text_format"), str):
            return _parse_solution_text(ground_truth["solution_text_format"])
        raise ValueError(
            f"K&K ground truth dict has keys {sorted(ground_truth)}; expected {_GROUND_TRUTH_FORM}"
        )
    raise ValueError(
        f"K&K ground truth of type {type(ground_truth).__name__} ({_short(ground_truth)}) is not supported; "
        f"expected {_GROUND_TRUTH_FORM}"
    )


def people_count(data_source: str, ground_truth: Any, extra_info: Any) -> int | None:
    """A K&K row's number of people: extra_info["n_people"] (what `lucidrl data kk` writes), else the names in
    its ground truth (Logic-RL's files carry none in extra_info); None for other rows or an unreadable one."""
    if isinstance(extra_info, Mapping) and extra_info.get("n_people") is not None:
        return int(extra_info["n_people"])
    if data_source not in KK_SOURCES:
        return None
    try:
        return len(parse_ground_truth(ground_truth))
    except ValueError:  # the reward says what is wrong with it, when it scores the row
        return None


def _parse_solution_text(text: str) -> dict[str, bool]:
    """Roles from "(1) Zoey is a knight\\n(2) Oliver is a knave" lines; blank lines are skipped."""
    roles: dict[str, bool] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _SOLUTION_LINE.search(line)
        if match is None:  # Logic-RL skips such a line (and then expects one person fewer): an error here
            raise ValueError(
                f"K&K ground truth line {line!r} is not of the form '(k) NAME is a knight|knave'; "
                f"expected {_GROUND_TRUTH_FORM}"
            )
        roles[match.group(1)] = match.group(2).lower() == "knight"
    if not roles:
        raise ValueError(f"K&K ground truth {text!r} names nobody; expected {_GROUND_TRUTH_FORM}")
    return roles


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _think_text(text: str) -> str:
    """What follows the first <think>, up to </think> (or to the end when it never closes)."""
    body = text.split("<think>", 1)[1] if "<think>" in text else text
    return body.split("</think>", 1)[0]


def trace_ok(text: str, names: list[str], extra_info: Any) -> float | None:
    """1.0 when the reasoning is exactly the puzzle's truth-table trace (`lucidrl data kk --trace`), 0.0
    when it is a trace with any step wrong, None when it is no trace at all or the row has no
    statements (extra_info["statements"], as `lucidrl data kk` writes them).

    A diagnostic, never part of the score: it tells a right answer reached by a right derivation from
    a lucky one (a 2-person answer is right by chance one time in four). A trace starts with the first
    person's name and role ("Henry K Ava K: ...", with any name: one the puzzle lacks makes a wrong
    trace); free-form reasoning gets None (compute_score then
    leaves the metric out, which batch means skip), so the mean covers trace-writing responses only.
    """
    if not isinstance(extra_info, Mapping) or extra_info.get("statements") is None:
        return None
    think = " ".join(_think_text(text).split())
    # a trace starts with a row header, "NAME K|N ..." (any name: a trace that starts with a name the
    # puzzle does not have is a wrong trace, not free-form reasoning)
    if not _TRACE_START.match(think):
        return None
    from lucidrl.data.kk.logic import from_json
    from lucidrl.data.kk.trace import build_trace

    raw = extra_info["statements"]
    try:
        statements = [from_json(x) for x in (json.loads(raw) if isinstance(raw, str) else raw)]
        expected, _ = build_trace(statements, names)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise ValueError(
            f"K&K extra_info.statements={_short(raw)} does not describe a puzzle of {names}: {e}. Write rows "
            "with `lucidrl data kk`, or leave the key out (the trace_ok metric is then skipped)"
        ) from e
    return 1.0 if think == " ".join(expected.split()) else 0.0


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """Score one K&K response with Logic-RL's rule: {"score": total, "acc": 0/1, "format_ok": 0/1}, and
    "trace_ok": 0/1 when the reasoning is a truth-table trace.

    `solution_str` is the response (starting with the pre-filled "<think>") or a whole transcript;
    `ground_truth` is the row's reward_model.ground_truth (see `parse_ground_truth`). `extra_info`
    only feeds the `trace_ok` diagnostic (see there); the score never depends on it.
    """
    truth = parse_ground_truth(ground_truth)
    text = assistant_text(solution_str)
    formatted = format_ok(text)
    answer = extract_answer(text)
    correct = False
    if formatted and answer:
        predicted = parse_answer(answer, list(truth))
        if predicted is None:
            answer_score = ANSWER_UNPARSEABLE
        elif predicted == truth:
            answer_score, correct = ANSWER_CORRECT, True
        else:
            answer_score = ANSWER_WRONG
    else:
        answer_score = ANSWER_UNPARSEABLE
    format_score = FORMAT_REWARD if formatted else -FORMAT_REWARD
    out = {
        "score": format_score + answer_score,
        "acc": 1.0 if correct else 0.0,
        "format_ok": 1.0 if formatted else 0.0,
    }
    traced = trace_ok(text, list(truth), extra_info)
    if traced is not None:
        out["trace_ok"] = traced
    return out
