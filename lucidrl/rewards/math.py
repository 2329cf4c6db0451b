"""verl's MATH rule reward: 1.0 when the last \\boxed{...} equals the ground truth after the normalisation
of Hendrycks et al.'s MATH evaluation (verl's `math_reward.compute_score`, itself from lm-evaluation-harness),
else 0.0. Every rule below is verl's, quirks included, so that the scores are the same:

- the answer is the last `\\boxed{...}` (braces balanced), or, when the response holds a `\\boxed `
  anywhere, what follows the last `\\boxed ` up to a `$`; an `\\fbox{}` or an unclosed box scores 0;
- both sides lose newlines, `\\!`, `\\left`, `\\right`, degree signs, `\\$`, `\\%`, a unit after
  "\\text{ ", spaces, and a "k =" in front; `tfrac`/`dfrac` become `frac`, `\\frac12` and `\\sqrt3` get
  braces, `0.5` and `a/b` (integers) become `\\frac{..}{..}`, ".5" gains its 0;
- where that normalisation fails on a side (an unbalanced `\\frac` at the end, two "\\text{ "), the two
  are compared as written.

It does no algebra: `2\\sqrt{2}` and `\\sqrt{8}` differ, as do `\\frac{1}{2}` and `1/2.0`.
"""

from __future__ import annotations

from typing import Any


class _NotNormalised(Exception):
    """verl's normalisation raises on this text; it then compares the texts as written."""


def last_boxed(text: str) -> str | None:
    """The last boxed answer of `text` with its `\\boxed` wrapper, as verl's `last_boxed_only_string` finds it."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def unbox(boxed: str) -> str | None:
    """The content of `\\boxed{...}` or `\\boxed ...`; None for any other wrapper (verl's assertion fails)."""
    if "\\boxed " in boxed:
        return boxed[len("\\boxed ") :] if boxed.startswith("\\boxed ") else None
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{") : -1]
    return None


def _fix_sqrt(s: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}`; an argument-less `\\sqrt` at the end is not normalisable."""
    head, *parts = s.split("\\sqrt")
    out = head
    for part in parts:
        if not part:
            raise _NotNormalised
        out += "\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
    return out


def _fix_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; a `\\frac` with under two characters after
    it leaves the whole string as it was (and one with none cannot be normalised)."""
    head, *parts = s.split("\\frac")
    out = head
    for part in parts:
        if not part:
            raise _NotNormalised
        out += "\\frac"
        if part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return s
        a, b, rest = part[0], part[1], part[2:]
        out += "{" + a + "}" + (b + rest if b == "{" else "{" + b + "}" + rest)
    return out


def _fix_slash(s: str) -> str:
    """`3/4` (two integers written plainly) -> `\\frac{3}{4}`."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def normalize(answer: str) -> str:
    """An answer in the canonical spelling that MATH's evaluation compares (_NotNormalised where verl's raises)."""
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:  # a unit after the value: "10\text{ cm}"
        pieces = s.split("\\text{ ")
        if len(pieces) != 2:
            raise _NotNormalised
        s = pieces[0]
    s = s.replace("\\\\%", "").replace("\\%", "")  # "\\%" survives the "\\" -> "\" above after a third "\"
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    lhs, *rhs = s.split("=")
    if len(rhs) == 1 and len(lhs) <= 2:  # "k = 3": the value
        s = rhs[0]
    s = _fix_sqrt(s) if "\\sqrt" in s else s
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def is_equiv(answer: str | None, truth: str | None) -> bool:
    """verl's equivalence: the normalised texts are equal (the texts as written where one does not normalise)."""
    if answer is None or truth is None:
        return answer is None and truth is None
    try:
        return normalize(answer) == normalize(truth)
    except _NotNormalised:
        return answer == truth


def check_ground_truth(ground_truth: Any) -> str:
    if not isinstance(ground_truth, str):
        raise ValueError(
            f"MATH ground_truth must be the answer as text (e.g. '\\\\frac{{1}}{{2}}'), as verl's files hold it, got "
            f"{type(ground_truth).__name__} {ground_truth!r}: verl compares it as text and would score every answer 0"
        )
    return ground_truth


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the response's last boxed answer equals `ground_truth` (the answer itself, as verl's MATH files
    hold it) after MATH's normalisation, else 0.0."""
    truth = check_ground_truth(ground_truth)
    boxed = last_boxed(solution_str)
    answer = unbox(boxed) if boxed is not None else None
    return 1.0 if answer is not None and is_equiv(answer, truth) else 0.0
