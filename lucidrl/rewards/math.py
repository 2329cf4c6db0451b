"""verl's MATH rule reward: 1.0 when the last \\boxed{...} equals the ground truth after the normalisation
of Hendrycks et al.'s MATH evaluation (the one verl's `math.compute_score` applies), else 0.0.

The normalisation makes equal what is written differently in LaTeX and nothing more: `\\dfrac12`,
`\\frac{1}{2}`, `1/2` and `0.5` agree, as do `\\left( 3, 4 \\right)` and `(3,4)`, `x = 5` and `5`,
`10\\text{ cm}` and `10`, `90^\\circ` and `90`. It does no algebra: `2\\sqrt{2}` and `\\sqrt{8}` differ.
"""

from __future__ import annotations

import re
from typing import Any

_BOXES = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}, or `\\boxed 5`) in `text`; None when there is
    none or its braces never close."""
    start = max(text.rfind(box) for box in _BOXES)
    if start < 0:
        return None
    rest = text[start:]
    name = next(box for box in _BOXES if rest.startswith(box))
    rest = rest[len(name) :]
    if rest.startswith(" "):  # `\boxed 5$`: up to the end of the math
        return rest[1:].split("$")[0].strip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return rest[1:i]
    return None


def _braced_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`: single-character arguments braced."""
    head, *parts = s.split("\\frac")
    out = head
    for part in parts:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, tail = part[0], part[1], part[2:]
        out += "{" + a + "}" + (b + tail if b == "{" else "{" + b + "}" + tail)
    return out


def _slash_to_frac(s: str) -> str:
    """`3/4` (two integers) -> `\\frac{3}{4}`, `-3/4` -> `-\\frac{3}{4}`."""
    m = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
    return f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}" if m else s


def normalize(answer: str) -> str:
    """An answer in the canonical spelling that MATH's evaluation compares."""
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    if "\\text{ " in s:  # a unit after the number: "10\text{ cm}"
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs.strip()) <= 2:  # "x = 5", "k=3": the value
        s = rhs
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _braced_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = re.sub(r"^\\frac\{-(\d+)\}\{(\d+)\}$", r"-\\frac{\1}{\2}", s)  # the sign outside, as in -3/4
    return _slash_to_frac(s)


def is_equiv(answer: str | None, truth: str | None) -> bool:
    if answer is None or truth is None:
        return False
    return normalize(answer) == normalize(truth)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the response's last \\boxed{} answer equals `ground_truth` (MATH's normalisation), else 0.0.

    `ground_truth` is the answer itself (verl's MATH parquet stores the boxed content of the reference
    solution), or a full solution holding a \\boxed{}.
    """
    if not isinstance(ground_truth, str | int | float):
        raise ValueError(
            f"MATH ground_truth must be the answer as text (e.g. '\\\\frac{{1}}{{2}}'), got "
            f"{type(ground_truth).__name__} {ground_truth!r}"
        )
    truth = str(ground_truth)
    truth = last_boxed(truth) if any(box in truth for box in _BOXES) else truth
    return 1.0 if is_equiv(last_boxed(solution_str), truth) else 0.0
