"""lucidrl's built-in rewards score as verl's on the same text: verl's reward_score functions (and TinyZero's
countdown, Logic-RL's K&K) run beside lucidrl's on crafted answers, at least 50 per source.

The references are copies in tests/fixtures/verl_reward_score/ (unchanged, each naming its repository
and commit). verl, TinyZero and Logic-RL score the decoded prompt and response; lucidrl the assistant's
turn (its pre-filled start and the response): for countdown and K&K the references get the prompt
text of the forks' own templates (tests/verl_formats.py) plus the response, lucidrl the text after
that prompt's assistant header plus the response. Documented differences are checked last.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest
from verl_formats import logic_rl_prompt, tinyzero_prompt

from lucidrl.data.prompt_format import assistant_prefill
from lucidrl.rewards.registry import default_compute_score

FIXTURE = Path(__file__).parent / "fixtures" / "verl_reward_score"


@pytest.fixture(scope="module")
def verl():
    """verl's reward_score package (its __init__ imports one decorator from verl, stubbed here)."""
    stubs = {name: types.ModuleType(name) for name in ("verl", "verl.utils", "verl.utils.import_utils")}
    stubs["verl.utils.import_utils"].deprecated = lambda *a, **k: lambda fn: fn
    saved = {name: sys.modules.get(name) for name in [*stubs, "verl_reward_score"]}
    sys.modules.update(stubs)
    spec = importlib.util.spec_from_file_location(
        "verl_reward_score", FIXTURE / "__init__.py", submodule_search_locations=[str(FIXTURE)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["verl_reward_score"] = package
    spec.loader.exec_module(package)
    yield types.SimpleNamespace(
        default_compute_score=package.default_compute_score,
        countdown=importlib.import_module("verl_reward_score.countdown"),
        math_dapo=importlib.import_module("verl_reward_score.math_dapo"),
        kk=importlib.import_module("verl_reward_score.kk"),
    )
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    for name in [n for n in sys.modules if n.startswith("verl_reward_score.")]:
        sys.modules.pop(name)


def _score(value) -> float:
    return float(value["score"] if isinstance(value, dict) else value)


# ---- GSM8K: (response, ground truth) ------------------------------------------------------------------
_GSM8K_WRITTEN = [
    "#### 42", "####42", "#### $42", "#### 42.00", "#### 042", "#### 42.", "#### 4,2", "#### 42,",
    "##### 42", "#### +42", "####  42", "#### 42 dollars", "#### 42!", "#### 4 2", "#### -42", "# 42",
    "### 42", "#### 42e3", "#### .42", "#### 4.2.0", "\\boxed{42}", "The answer is 42", "", "####",
    "#### -", "#### ...", "#### 42\n\n", "#### 41\n#### 42", "#### 42\n#### 41", "#### 42" + " x" * 200,
    "#### 42" + "\n" * 299, "#### 42" + "\n" * 300, "so 6*7 = 42\n#### 42", "#### 42 #### 43",
    "####\t42", "#### ４２", "#### 42\u00a0", "#### 4242", "#### 42.0.", "####-42",
]  # fmt: skip
GSM8K_CASES = [(w, "42") for w in _GSM8K_WRITTEN] + [
    ("#### 1,234", "1234"), ("#### 1,234", "1,234"), ("#### 3.5", "3.5"), ("#### .5", "0.5"),
    ("#### -42", "-42"), ("#### 42,000", "42000"), ("#### 0", "0"), ("#### 00", "0"),
    ("#### 7", "7 "), ("#### 7", " 7"), ("#### 1.5", "1.50"), ("#### 18", "18.0"),
]  # fmt: skip


@pytest.mark.parametrize("source", ["openai/gsm8k"])
def test_gsm8k_equals_verl(verl, source):
    assert len(GSM8K_CASES) >= 50
    differ = [
        (r, gt, _score(verl.default_compute_score(source, r, gt)), default_compute_score(source, r, gt))
        for r, gt in GSM8K_CASES
        if _score(verl.default_compute_score(source, r, gt)) != default_compute_score(source, r, gt)
    ]
    assert not differ


# ---- MATH ----------------------------------------------------------------------------------------------
MATH_CASES = [
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("\\boxed{\\dfrac{1}{2}}", "\\frac12"), ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{1/2}", "\\frac{1}{2}"), ("\\boxed{-3/4}", "-\\frac{3}{4}"), ("\\boxed{-3/4}", "\\frac{-3}{4}"),
    ("\\fbox{7}", "7"), ("\\boxed 5$", "5"), ("\\boxed{5} and \\boxed 6", "5"), ("\\boxed{5} and \\boxed 6", "6"),
    ("\\boxed{x=5}", "5"), ("\\boxed{ab=5}", "5"), ("\\boxed{x = y = 3}", "3"), ("\\boxed{k = 3}", "3"),
    ("\\boxed{10\\text{ cm}}", "10"), ("\\boxed{10\\text{ cm}\\text{ m}}", "10"), ("\\boxed{50\\%}", "50"),
    ("\\boxed{50%}", "50"), ("\\boxed{\\$5}", "5"), ("\\boxed{$5$}", "5"), ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{90^{\\circ}}", "90"), ("\\boxed{\\sqrt3}", "\\sqrt{3}"), ("\\boxed{\\sqrt}", "\\sqrt"),
    ("\\boxed{\\frac}", "\\frac"), ("\\boxed{\\frac1}", "\\frac1"), ("\\boxed{\\frac1}", "\\frac{1}"),
    ("\\boxed{.5}", "0.5"), ("\\boxed{\\left(1,2\\right)}", "(1,2)"), ("\\boxed{ 3 }", "3"), ("\\boxed{3", "3"),
    ("no box 3", "3"), ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"), ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{03/4}", "\\frac{3}{4}"), ("\\boxed{\\tfrac{3}{4}}", "\\frac34"), ("\\boxed{\\\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxedx{5}", "5"), ("$\\boxed{5}$.", "5"), ("\\boxed{5}\\boxed{6}", "6"), ("\\boxed{\\text{(A)}}", "\\text{(A)}"),
    ("\\boxed{A}", "\\text{(A)}"), ("\\boxed{\\!5}", "5"), ("\\boxed{5\n}", "5"), ("\\boxed{1,000}", "1000"),
    ("\\boxed{\\frac{a}{b}}", "a/b"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\dfrac12}", "0.5"),
    ("\\boxed{\\\\\\%5}", "5"), ("\\boxed{\\infty}", "\\infty"), ("\\boxed{-\\infty}", "\\infty"),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"), ("\\boxed{\\$1,000}", "1000"), ("\\boxed{3.}", "3"),
    ("\\boxed{x}", "x"), ("\\boxed{\\text{ cm}}", ""), ("\\boxed{}", ""), ("The answer: \\boxed{7}.", "7"),
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}"), ("\\boxed{\\sqrt{x}}", "\\sqrtx"), ("\\boxed{1/0}", "\\frac{1}{0}"),
    ("\\boxed{a/b/c}", "a/b/c"), ("\\boxed{-1/-2}", "\\frac{-1}{-2}"), ("\\boxed{\\left[ 0, 1 \\right)}", "[0,1)"),
]  # fmt: skip


@pytest.mark.parametrize(
    "source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_math_equals_verl(verl, source, capsys):
    assert len(MATH_CASES) >= 50
    differ = [
        (r, gt)
        for r, gt in MATH_CASES
        if _score(verl.default_compute_score(source, r, gt)) != default_compute_score(source, r, gt)
    ]
    assert not differ


# ---- DAPO's math ---------------------------------------------------------------------------------------
DAPO_CASES = [
    ("Answer: 42", "42"), ("answer:42", "42"), ("ANSWER : 42", "42"), ("Answer: $42$", "42"),
    ("Answer: \\boxed{42}", "42"), ("Answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("Answer: \\frac12", "\\frac{1}{2}"),
    ("Answer: 0.5", "\\frac{1}{2}"), ("Answer: 1,000", "1000"), ("Answer: 1,000.5", "1000.5"),
    ("Answer: 5 dollars", "5"), ("Answer: x = 5", "5"), ("Answer: a 5", "5"), ("Answer: \\text{Monday}", "Monday"),
    ("Answer: \\textbf{5}", "5"), ("Answer: \\overline{5}", "5"), ("Answer: 90^\\circ", "90"),
    ("Answer: \\sqrt2", "\\sqrt{2}"), ("Answer: 42\nAnswer: 43", "43"), ("Answer: 42\nAnswer: 43", "42"),
    ("Answer: 42" + " " * 400, "42"), ("the answer is 42", "42"), ("\\boxed{42}", "42"), ("Answer: 42.", "42"),
    ("Answer: $42$.", "42"), ("Answer: $$42$$", "42"), ("Answer: $4$ and $2$", "4"), ("Answer: 10 cm", "10"),
    ("Answer: 10cm", "10"), ("Answer: \\$10", "10"), ("Answer: 3\\text{ and }4", "3,4"), ("Answer: 3, 4", "3,4"),
    ("Answer: \\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"), ("Answer: \\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}"),
    ("Answer:", "42"), ("Answer: ", ""), ("Answer: [INVALID]", "[INVALID]"), ("no answer", "[INVALID]"),
    ("Answer: 42", "$42$"), ("Answer: 42", "\\boxed{42}"), ("Answer: 42", "x = 42"), ("Answer: 42", "42\n"),
    ("Answer: 2\\;000", "2000"), ("Answer: 5 \\text{ units}", "5"), ("Answer: \\mbox{five}", "five"),
    ("Answer: 1{,}000", "1000"), ("Answer: 12 inches", "12"), ("Answer: 7^{\\circ}", "7"),
    ("Answer: \\boxed{3} \\boxed{4}", "3} \\boxed{4"), ("Answer: \\textbf{a}\\textbf{b}", "ab"),
    ("Answer: \\frac ab", "\\frac{a}{b}"), ("Answer: $a$ $b$", "a"), ("Answer: −5", "-5"),
]  # fmt: skip


# verl 0.9.1's fallback: no "Answer:" line, so the last whole \boxed{} of the last 100 characters (of the
# last 300), compared with the ground truth as written; an "Answer:" line, even a wrong one, wins
DAPO_FALLBACK_CASES = [
    ("so \\boxed{42}", "42"), ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("\\boxed{\\frac12}", "\\frac{1}{2}"),
    ("\\boxed{ 42 }", "42"), ("\\boxed{42}", "42.0"), ("\\boxed{42}" + " " * 120, "42"), ("\\boxed{42}" + "x" * 95, "42"),
    ("Answer: 41\n\\boxed{42}", "42"), ("\\boxed{41} then \\boxed{42}", "42"), ("\\boxed{42} then \\boxed{41}", "42"),
    ("\\boxed{42", "42"), ("the answer is \\boxed{42}.", "42"), ("\\boxed{\\text{Monday}}", "Monday"),
    ("\\boxed{\\text{Monday}}", "\\text{Monday}"), ("x" * 250 + "\\boxed{7}", "7"), ("\\boxed{7}" + "y" * 295, "7"),
    ("ANSWER \\boxed{7}", "7"), ("Answer:\n\\boxed{7}", "7"), ("\\boxed{[INVALID]}", "[INVALID]"),
    ("Answer: [INVALID]\n\\boxed{5}", "5"), ("\\fbox{5}", "5"), ("$\\boxed{5}$", "5"), ("\\boxed{5}", "$5$"),
    ("\\boxed{\\boxed{5}}", "\\boxed{5}"), ("\\boxed{}", ""), ("\\boxed{1,000}", "1000"),
]  # fmt: skip


def verl_091_math_dapo(dapo, solution: str, truth: str) -> dict:
    """verl 0.9.1's math_dapo.compute_score, from the fixture's (0.9.0's) functions: 0.9.1's `verify` keeps
    Minerva's verdict unless its prediction is the INVALID marker (no "Answer:" line), and then takes the
    strict box's where the last 100 of the 300 characters hold a whole box (verl-project/verl bf48903d9)."""
    tail = solution[-300:]
    correct, pred = dapo.is_correct_minerva(tail, truth)
    if pred == "[INVALID]":
        box_score, box = dapo.is_correct_strict_box(tail, truth)
        if box is not None:
            correct = box_score == 1
    return {"score": 1.0 if correct else -1.0, "acc": float(correct)}


@pytest.mark.parametrize("source", ["math_dapo", "math", "aime2024"])
def test_math_dapo_equals_verl_091(verl, source):
    cases = DAPO_CASES + DAPO_FALLBACK_CASES
    assert len(DAPO_CASES) >= 50 and len(cases) == 79
    differ = []
    for r, gt in cases:
        theirs, ours = verl_091_math_dapo(verl.math_dapo, r, gt), default_compute_score(source, r, gt)
        if theirs != ours:
            differ.append((r, gt, theirs, ours))
    assert not differ
    # the fallback's verdicts are not all one way, and 0.9.0 (the fixture as it is) differs exactly there
    verdicts = [default_compute_score(source, r, gt)["score"] for r, gt in DAPO_FALLBACK_CASES]
    assert verdicts.count(1.0) >= 8 and verdicts.count(-1.0) >= 8
    changed = [
        (r, gt)
        for r, gt in cases
        if verl.default_compute_score(source, r, gt)["score"] != default_compute_score(source, r, gt)["score"]
    ]
    assert changed == [
        (r, gt)
        for r, gt in cases
        if verl.math_dapo.is_correct_minerva(r[-300:], gt)[1] == "[INVALID]"
        and verl.math_dapo.is_correct_strict_box(r[-300:], gt)[0] == 1
        and not verl.math_dapo.is_correct_minerva(r[-300:], gt)[0]
    ]
    assert ("\\boxed{42}", "42") in changed and ("so \\boxed{42}", "42") in changed


# ---- TinyZero's countdown ------------------------------------------------------------------------------
_COUNTDOWN_RESPONSES = [
    "4*6*1</think>\n<answer>4*6*1</answer>", " </think> <answer>4 * 6 * 1</answer>", "</think><answer>(4*6)/1</answer>",
    "</think><answer>4*6/1</answer>", "</think><answer>4*6</answer>", "</think><answer>4*6*1*1</answer>",
    "</think><answer>4+6+1</answer>", "</think><answer>4*6*1 = 24</answer>", "</think><answer>4/(1-1)*6</answer>",
    "</think><answer>1.0*24</answer>", "</think><answer>__import__('os')</answer>", "4 * 6 * 1",
    "</think><answer>4*6*1</answer>\n", "</think><answer>4*6*1</answer>\nDone.", "</think>\n<answer>\n4*6*1\n</answer>",
    "</think><answer>1</answer> <answer>4*6*1</answer>", "</think><answer>4*6*1</answer> <answer>1</answer>",
    "</think><answer>4*6*1</answer></answer>", "</think><answer></answer>", "</think><answer>   </answer>",
    "</think><answer>()</answer>", "</think><answer>4 × 6 ÷ 1</answer>", "</think><answer>04*6*1</answer>",
    "</think><answer>4*06*1</answer>", "</think><answer>6*4*1</answer>", "</think><answer>1*(6*4)</answer>",
    "</think><answer>4**1*6</answer>", "</think><answer>(4+6)*1</answer>", "</think><answer>4*6//1</answer>",
    "</think><answer>4*6-1+1</answer>", "</think><answer>-(-4)*6*1</answer>", "</think><answer>+4*6*1</answer>",
    "</think><answer>4*6*1.</answer>", "</think><answer>4.0*6*1</answer>", "</think><answer>4*6*1)</answer>",
    "</think><answer>4 6 1</answer>", "</think><answer>4*6*1<answer>", "<answer>4*6*1</answer>",
    "</think><ANSWER>4*6*1</ANSWER>", "</think><answer>4*6*1 </answer>", "</think><answer>24</answer>",
    "</think><answer>4*(6*1)</answer>", "</think><answer>(4*(6))*((1))</answer>", "</think><answer>4*6/1*1</answer>",
    "</think><answer>1/0</answer>", "</think><answer>4*6*1\t</answer>", "</think> answer: 4*6*1",
    "</think><answer>4*6*1</answer>Assistant: <answer>1</answer>", "</think><answer>4%6*1</answer>",
    "</think><answer>4*6^1</answer>", "</think><answer>(1+6/4)*4*6</answer>", "</think><answer>4*6*1" + "0" * 5 + "</answer>",
]  # fmt: skip
COUNTDOWN_GT = {"target": 24, "numbers": [4, 6, 1]}


@pytest.mark.parametrize("template", ["base", "qwen-instruct"])
def test_countdown_equals_tinyzero(verl, template):
    assert len(_COUNTDOWN_RESPONSES) >= 50
    prompt = tinyzero_prompt([4, 6, 1], 24, template)
    prefix = assistant_prefill(prompt)
    differ = []
    for response in _COUNTDOWN_RESPONSES:
        theirs = _score(
            verl.countdown.compute_score(solution_str=prompt + response, ground_truth=COUNTDOWN_GT)
        )
        ours = default_compute_score("countdown", prefix + response, COUNTDOWN_GT)["score"]
        if theirs != pytest.approx(ours):
            differ.append((response, theirs, ours))
    assert not differ
    # other targets and numbers: fractions, powers, a float within 1e-5
    for response, gt in [
        ("</think><answer>1/49*49</answer>", {"target": 1, "numbers": [1, 49, 49]}),
        ("</think><answer>2**3*3</answer>", {"target": 24, "numbers": [2, 3, 3]}),
        ("</think><answer>(1/3)*3*5</answer>", {"target": 5, "numbers": [1, 3, 3, 5]}),
        ("</think><answer>7//2*8</answer>", {"target": 24, "numbers": [7, 2, 8]}),
    ]:
        theirs = _score(verl.countdown.compute_score(solution_str=prompt + response, ground_truth=gt))
        assert default_compute_score("countdown", prefix + response, gt)["score"] == pytest.approx(theirs)


# ---- Logic-RL's Knights & Knaves ----------------------------------------------------------------------
KK_QUIZ = (
    "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves "
    "always lie. You meet 3 inhabitants: Amelia, Penelope, and Evelyn. Amelia said that Evelyn is not a knight. "
    'Penelope was heard saying, "Penelope is a knight or Evelyn is a knave". Evelyn was heard saying, "Penelope '
    'is a knight if and only if Penelope is a knave". So who is a knight and who is a knave?'
)
KK_GT = {
    "solution_text_format": "(1) Amelia is a knight\n(2) Penelope is a knight\n(3) Evelyn is a knave",
    "statements": "(('not', ('telling-truth', 2)), ('or', ('telling-truth', 1), ('lying', 2)), "
    "('<=>', ('telling-truth', 1), ('lying', 1)))",
}
_RIGHT = "(1) Amelia is a knight\n(2) Penelope is a knight\n(3) Evelyn is a knave"
_ANSWERS = [
    _RIGHT, "(1) Amelia is a knave\n(2) Penelope is a knight\n(3) Evelyn is a knave",
    "Amelia is a knight, Penelope is a knight, and Evelyn is a knave.", "Amelia is a KNIGHT\nPenelope is a Knight\nEvelyn is a knave",
    "(1) Amelia is a knight\n(2) Penelope is a knight", "(1) Amelia is a knight\n(2) Penelope is a knight\n(3) Evelyn is a knave (not a knight)",
    "(3) Evelyn is a knave\n(1) Amelia is a knight\n(2) Penelope is a knight", "Amelia: knight, Penelope: knight, Evelyn: knave",
    "(1) Amelia is  a knight\n(2) Penelope is\na knight\n(3) Evelyn is a knave", "(1) Amelias is a knight\n(2) Penelope is a knight\n(3) Evelyn is a knave",
    "", "   ", "(1) Amelia is a knights\n(2) Penelope is a knight\n(3) Evelyn is a knave",
    "(1) amelia is a knight\n(2) penelope is a knight\n(3) evelyn is a knave", "knight knight knave",
]  # fmt: skip
_THINKS = [
    "reasoning </think>\n<answer> {a} </answer>", "</think><answer>{a}</answer>",
    "Assume Amelia is a knight... </think> <answer>\n{a}\n</answer> done", "no close tag <answer> {a} </answer>",
    "x </think> <answer> {a} </answer> <answer> {a} </answer>", "x </think> {a}",
    "x </think> <answer> {a} </answer> </think>", "<think> again </think> <answer> {a} </answer>",
]  # fmt: skip
KK_RESPONSES = [t.format(a=a) for t in _THINKS for a in _ANSWERS[:7]] + [
    "</think><answer>" + a + "</answer>" for a in _ANSWERS[7:]
]


@pytest.mark.parametrize("template", ["qwen-instruct", "base"])
def test_kk_equals_logic_rl(verl, template, capsys):
    assert len(KK_RESPONSES) >= 50
    prompt = logic_rl_prompt(KK_QUIZ, template)
    prefix = assistant_prefill(prompt)
    differ = []
    for response in KK_RESPONSES:
        theirs = _score(verl.kk.compute_score(prompt + response, KK_GT))
        ours = default_compute_score("kk_logic", prefix + response, KK_GT)["score"]
        if theirs != ours:
            differ.append((response, theirs, ours))
    assert not differ
    scores = {default_compute_score("kk_logic", prefix + r, KK_GT)["score"] for r in KK_RESPONSES}
    assert scores == {3.0, -0.5, -1.0, -3.0}  # every outcome of Logic-RL's rule is among the cases


# ---- documented differences (docs/migration.md) ---------------------------------------------------------
def test_documented_differences(verl):
    """Each off by default, or an error where verl would score a data mistake as a wrong answer."""
    from lucidrl.rewards import countdown, gsm8k, math_dapo

    # a ground truth that is not text: verl compares text with it and scores every answer 0
    assert verl.default_compute_score("openai/gsm8k", "#### 42", 42) == 0
    with pytest.raises(ValueError, match="as text"):
        default_compute_score("openai/gsm8k", "#### 42", 42)
    assert verl.default_compute_score("lighteval/MATH", "\\boxed{42}", 42) == 0
    with pytest.raises(ValueError, match="as text"):
        default_compute_score("lighteval/MATH", "\\boxed{42}", 42)
    # options, off by default
    assert gsm8k.compute_score("#### $42.00", "42", lenient=True) == 1.0
    assert math_dapo.compute_score("\\boxed{42}", "42", boxed_fallback=True)["acc"] == 1.0
    assert countdown.compute_score("<answer>4*6*1</answer>\nok", COUNTDOWN_GT, lenient=True)["acc"] == 1.0
