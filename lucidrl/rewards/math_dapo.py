"""DAPO's math rule (verl's `math_dapo`, which verl's default_compute_score uses for data_source `math`,
`math_dapo`, `math_dapo_reasoning` and `aime*`): the last "Answer: ..." line of the response, in
its last 300 characters, compared with the ground truth after the answer normalisation of Minerva
(Lewkowycz et al. 2022, appendix D); +1 when equal, -1 otherwise (no answer included), with `acc`.
With no "Answer:" line, the last `\\boxed{}` of the last 100 characters is read instead, as current
verl does; `strict_box_verify` (DAPO's strict mode) reads only that, compared exactly.
verl also returns the normalised prediction as "pred"; it is text, not a metric, so it is left out
here (`extract_answer` and `normalize_answer` give it).

The normalisation keeps what follows the last "=", drops spaces, articles, "\\$", unit words and
`\\text{}`, `\\textbf{}`, `\\overline{}` and `\\boxed{}` wrappers, writes `\\frac12` as `\\frac{1}{2}` and
`\\sqrt2` as `\\sqrt{2}`, and drops thousands separators in a plain number. It does no algebra:
`0.5` and `\\frac{1}{2}` differ, as they do in verl.
"""

from __future__ import annotations

import re
from typing import Any

from lucidrl.rewards.math import last_boxed

TAIL_CHARS = 300  # the answer is looked for in the response's end only, as in DAPO
BOX_TAIL_CHARS = 100  # a \\boxed{} answer in the last 100 of those, as verl's is_correct_strict_box
INVALID = "[INVALID]"  # the prediction when no "Answer:" line is found
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
_WRAPPERS = ("text", "textbf", "overline", "boxed")


def normalize_answer(answer: str) -> str:
    """Minerva's normalisation of a final answer (see the module docstring)."""
    text = answer.split("=")[-1]
    for written, normal in _REPLACE:
        text = text.replace(written, normal)
    for unit in _DROP:
        text = text.replace(unit, "")
    match = re.search(r"\$(.*?)\$", text)  # the math between the first pair of dollars
    if match:
        text = f"${match.group(1)}$"
    for name in _WRAPPERS:
        text = re.sub(r"\\" + name + r"\{(.*?)\}", r"\1", text)
    text = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", text)
    text = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_answer(solution_str: str) -> str:
    """The text after the last "Answer:" in the response's last TAIL_CHARS characters, or INVALID."""
    found = _ANSWER.findall(solution_str[-TAIL_CHARS:])
    return found[-1] if found else INVALID


def boxed_answer(solution_str: str) -> str | None:
    """The last \\boxed{} in the response's last BOX_TAIL_CHARS characters (of its last TAIL_CHARS), or None."""
    return last_boxed(solution_str[-TAIL_CHARS:][-BOX_TAIL_CHARS:])


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: Any = None, strict_box_verify: bool = False
) -> dict[str, float]:
    """{"score": 1.0 or -1.0, "acc": 1.0 or 0.0}.

    As verl's: the last "Answer:" line, and where there is none the last \\boxed{} in the last 100
    characters, each compared after normalisation. `strict_box_verify=True` (DAPO's strict mode; pass it
    through reward.custom_function.reward_kwargs to a function that calls this one) reads the boxed
    answer only, and compares it with the ground truth exactly as written, without normalisation.
    """
    truth = str(ground_truth)
    if strict_box_verify:
        right = boxed_answer(solution_str) == truth
    else:
        answer = extract_answer(solution_str)
        if answer != INVALID:
            right = normalize_answer(answer) == normalize_answer(truth)
        else:
            boxed = boxed_answer(solution_str)
            right = boxed is not None and normalize_answer(boxed) == normalize_answer(truth)
    return {"score": 1.0 if right else -1.0, "acc": float(right)}
