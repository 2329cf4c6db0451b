"""DAPO's math rule as verl 0.9.1 has it (verl's `math_dapo`, which verl's default_compute_score uses for
data_source `math`, `math_dapo`, `math_dapo_reasoning` and `aime*`): the last "Answer: ..." line of the
response's last 300 characters, compared with the ground truth after the answer normalisation of Minerva
(Lewkowycz et al. 2022, appendix D). Where there is no "Answer:" line, the last `\\boxed{}` of the last
100 of those characters, compared with the ground truth exactly, as written (verl's strict box; verl
0.9.0 and older scored such a response -1 without looking at the box). +1 when equal, -1 otherwise
(neither an "Answer:" line nor a whole box included), with `acc`. verl also returns the prediction as
"pred"; it is text, not a metric, so it is left out here (`extract_answer`, `normalize_answer` and
`boxed_answer` give it).

The normalisation keeps what follows the last "=", drops spaces, articles, "\\$", unit words and
`\\text{}`, `\\textbf{}`, `\\overline{}` and `\\boxed{}` wrappers, writes `\\frac12` as `\\frac{1}{2}` and
`\\sqrt2` as `\\sqrt{2}`, and drops thousands separators in a plain number. It does no algebra:
`0.5` and `\\frac{1}{2}` differ, as they do in verl.

`strict_box_verify=True` (DAPO's strict mode; verl's keyword) reads only the last `\\boxed{}` of the last
100 characters and compares it exactly, "Answer:" lines or not. `boxed_fallback=True` (off by default; a
documented difference from verl) compares the fallback box after Minerva's normalisation instead of
exactly, so `\\boxed{\\frac12}` matches `\\frac{1}{2}`.
"""

from __future__ import annotations

import re
from typing import Any

TAIL_CHARS = 300  # the answer is looked for in the response's end only, as in DAPO
BOX_TAIL_CHARS = 100  # a \\boxed{} answer in the last 100 of those, as verl's is_correct_strict_box
INVALID = "[INVALID]"  # the prediction when no "Answer:" line is found (then the box is read, if any)
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# (written, normalised) pairs, applied in order
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# unit words and spacing commands that an answer may carry and the ground truth does not
_DROP = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots",
)  # fmt: skip
# each applied to every match, in this order; the box is greedy, so a box holding braces keeps them all
# (a lazy one turned \boxed{\frac{1}{2}} into \frac{1{2}})
_SUBS = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),  # the math between a line's first pair of dollars
    (re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),
    (re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),
    (re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),
)


def normalize_answer(answer: str) -> str:
    """Minerva's normalisation of a final answer (see the module docstring)."""
    text = answer.split("=")[-1]
    for written, normal in _REPLACE:
        text = text.replace(written, normal)
    for unit in _DROP:
        text = text.replace(unit, "")
    for pattern, replacement in _SUBS:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_answer(solution_str: str) -> str:
    """The text after the last "Answer:" in the response's last TAIL_CHARS characters, or INVALID."""
    found = _ANSWER.findall(solution_str[-TAIL_CHARS:])
    return found[-1] if found else INVALID


def boxed_answer(solution_str: str) -> str | None:
    """The content of the last \\boxed{} in the response's last BOX_TAIL_CHARS characters (of its last
    TAIL_CHARS), braces balanced, or None."""
    text = solution_str[-TAIL_CHARS:][-BOX_TAIL_CHARS:]
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if text[i] == "}" and depth == 0:
            return text[start + len("\\boxed{") : i]
    return None


def check_ground_truth(ground_truth: Any) -> str:
    if not isinstance(ground_truth, str):
        raise ValueError(
            f"math_dapo ground_truth must be the answer as text, as verl's files hold it, got "
            f"{type(ground_truth).__name__} {ground_truth!r} (verl's normalisation fails on it)"
        )
    return ground_truth


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    strict_box_verify: bool = False,
    boxed_fallback: bool = False,
) -> dict[str, float]:
    """{"score": 1.0 or -1.0, "acc": 1.0 or 0.0}, as verl's (see the module docstring for the options)."""
    truth = check_ground_truth(ground_truth)
    if strict_box_verify:
        right = boxed_answer(solution_str) == truth
    else:
        predicted = normalize_answer(extract_answer(solution_str))
        right = predicted == normalize_answer(truth)
        # verl 0.9.1: only a prediction that is still the INVALID marker after normalising (no "Answer:"
        # line) falls back on the box; a box cut off by the 100 characters (None) leaves it wrong
        boxed = boxed_answer(solution_str) if predicted == INVALID else None
        if boxed is not None:
            right = normalize_answer(boxed) == normalize_answer(truth) if boxed_fallback else boxed == truth
    return {"score": 1.0 if right else -1.0, "acc": float(right)}
