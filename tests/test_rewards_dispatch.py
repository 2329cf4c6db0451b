"""Reward dispatch by data_source, the GSM8K rule, custom reward files and reward-output checks."""

from __future__ import annotations

import math
import pickle

import pytest

from lucidrl.rewards import (
    CustomFunctionError,
    RewardOutputError,
    UnknownDataSourceError,
    default_compute_score,
    load_custom_function,
    normalize_reward_output,
    register_reward,
)
from lucidrl.rewards.registry import REWARD_FUNCTIONS

KK_GT = {"names": ["Zoey", "Oliver"], "knights": [True, False]}
KK_RIGHT = "<think> x </think> <answer> (1) Zoey is a knight\n(2) Oliver is a knave </answer>"


# ---- dispatch ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["kk_logic", "kk"])
def test_kk_sources_use_the_logic_rl_rule(source):
    assert default_compute_score(source, KK_RIGHT, KK_GT) == {"score": 3.0, "acc": 1.0, "format_ok": 1.0}


@pytest.mark.parametrize("source", ["openai/gsm8k", "gsm8k"])
def test_gsm8k_sources_use_verls_last_hash_answer(source):
    """verl's rule exactly (tests/test_reward_parity.py runs verl's function beside it): the last "#### N" of
    the last 300 characters, its commas dropped, compared with the ground truth as text."""
    score = default_compute_score(source, "48/2 = 24 ... #### 24", "24")
    assert score == 1.0 and isinstance(score, float)
    assert default_compute_score(source, "#### 5\nno wait\n#### 7", "7") == 1.0
    assert default_compute_score(source, "#### 5\nno wait\n#### 7", "5") == 0.0
    assert default_compute_score(source, "#### 1,234", "1234") == 1.0
    for written in ("#### $1,234", "####1234", "#### 1234.00", "#### 01234", "#### 1234."):
        assert default_compute_score(source, written, "1234") == 0.0, written  # verl: 0
    assert default_compute_score(source, "#### 42" + " " * 400, "42") == 0.0  # outside the last 300
    assert default_compute_score(source, "the answer is 24", "24") == 0.0
    assert default_compute_score(source, "#### 25", "24") == 0.0
    with pytest.raises(ValueError, match="ground_truth must be the answer as text"):
        default_compute_score(source, "#### -3", -3)  # verl compares text with an int: always 0


def test_gsm8k_lenient_reads_every_spelling_of_the_number():
    from lucidrl.rewards.gsm8k import compute_score

    for written in ("#### $1,234", "####1234", "#### 1234.00", "#### 1234.", "#### $ 1234"):
        assert compute_score(written, "1234", lenient=True) == 1.0, written
    assert compute_score("#### 42" + " " * 400, "42", lenient=True) == 1.0
    assert compute_score("#### -3", -3, lenient=True) == 1.0
    # "####" then a run of spaces: the old pattern took 8 s on this (quadratic), now milliseconds
    assert compute_score("#### " + " " * 20000 + "x", "5", lenient=True) == 0.0


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("48/2 = 24, so\nAnswer: 24", "24", 1.0),
        ("Answer: $\\frac{1}{2}$", "\\frac12", 1.0),  # \frac12 written out
        ("Answer: 5 dollars", "5", 1.0),  # unit words dropped
        ("Answer: x = 3", "3", 1.0),  # after the last "="
        ("Answer: 1,000", "1000", 1.0),  # a thousands separator in a plain number
        ("answer:  \\boxed{7}", "7", 1.0),  # any case; a box around the answer
        (
            "Answer: \\boxed{\\frac{1}{2}}",
            "\\frac{1}{2}",
            1.0,
        ),  # a box holding braces (a lazy match broke it)
        ("Answer: 3\nno wait\nAnswer: 41", "41", 1.0),  # the last one
        ("Answer: 41", "42", -1.0),
        ("Answer: 0.5", "\\frac{1}{2}", -1.0),  # no algebra, as in verl
        ("the answer is 42", "42", -1.0),  # no "Answer:" line, no box
        ("so the answer is \\boxed{42}", "42", 1.0),  # verl 0.9.1: no "Answer:" line, the last box
        ("so the answer is \\boxed{\\frac12}", "\\frac{1}{2}", -1.0),  # that box compared as written
        ("Answer: 41, or \\boxed{42}", "42", -1.0),
        ("Answer: 42" + " " * 400, "42", -1.0),  # outside the last 300 characters
    ],
)
def test_verls_dapo_math_sources_use_the_answer_line_rule(response, truth, score):
    """verl scores data_source math, math_dapo, math_dapo_reasoning and aime* with DAPO's rule; lucidrl
    read 'math' as the boxed MATH rule (0/1 on \\boxed{}), so 'Answer: 42' scored 0."""
    for source in ("math", "math_dapo", "math_dapo_reasoning", "aime2024"):
        assert default_compute_score(source, response, truth) == {"score": score, "acc": float(score > 0)}


def test_dapos_strict_box_verify_and_the_boxed_fallback_option():
    from lucidrl.rewards.math_dapo import compute_score

    # boxed_fallback (off by default): the fallback box (no "Answer:" line) compared after normalising
    assert (
        compute_score("so the answer is \\boxed{\\frac12}", "\\frac{1}{2}", boxed_fallback=True)["acc"] == 1.0
    )
    assert compute_score("so the answer is \\boxed{\\frac12}", "\\frac{1}{2}")["acc"] == 0.0  # as written
    assert compute_score("\\boxed{42}" + " " * 120, "42", boxed_fallback=True)["acc"] == 0.0
    assert compute_score("Answer: 41\n\\boxed{42}", "42", boxed_fallback=True)["acc"] == 0.0  # the line wins

    assert compute_score("so \\boxed{42}", "42", strict_box_verify=True)["acc"] == 1.0
    assert compute_score("Answer: 42", "42", strict_box_verify=True)["acc"] == 0.0  # no box
    assert compute_score("so \\boxed{\\frac12}", "\\frac{1}{2}", strict_box_verify=True)["score"] == -1.0
    assert compute_score("Answer: \\boxed{\\frac12}", "\\frac{1}{2}")["score"] == 1.0  # normalised otherwise


def test_reward_kwargs_reach_the_custom_function_and_bad_ones_are_refused(tmp_path):
    """verl's custom_reward_function.reward_kwargs: the way to DAPO's strict_box_verify, for one."""
    from lucidrl.config import load_config
    from lucidrl.rewards.manager import RuleRewardManager

    path = tmp_path / "strict.py"
    path.write_text(
        "from lucidrl.rewards.math_dapo import compute_score as dapo\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, strict_box_verify=False):\n"
        "    return dapo(solution_str, ground_truth, extra_info, strict_box_verify=strict_box_verify)\n"
    )
    cfg = load_config(
        None,
        [
            f"reward.custom_function.path={path}",
            "reward.custom_function.reward_kwargs.strict_box_verify=true",
        ],
    )
    fn_cfg = cfg.reward.custom_function
    assert fn_cfg.reward_kwargs == {"strict_box_verify": True}
    manager = RuleRewardManager.from_config(None, fn_cfg.path, fn_cfg.name, fn_cfg.reward_kwargs)
    call = {"data_source": "math", "ground_truth": "\\frac{1}{2}", "extra_info": None}
    assert manager.compute_score(solution_str="so \\boxed{\\frac12}", **call)["acc"] == 0.0  # strict
    assert (
        load_custom_function(str(path), "compute_score")(solution_str="Answer: \\boxed{\\frac12}", **call)[
            "acc"
        ]
        == 1.0
    )
    with pytest.raises(
        CustomFunctionError, match="does not take reward.custom_function.reward_kwargs=.'strictt'"
    ):
        load_custom_function(str(path), "compute_score", {"strictt": True})
    with pytest.raises(CustomFunctionError, match="sets ground_truth, which every call passes itself"):
        load_custom_function(str(path), "compute_score", {"ground_truth": "1"})
    with pytest.raises(
        CustomFunctionError, match="reward_kwargs=.* is set but reward.custom_function.path is not"
    ):
        RuleRewardManager.from_config(None, None, "compute_score", {"strict_box_verify": True})


def test_unknown_data_source_lists_known_ones_and_suggests_the_close_one():
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score("kk-logic", KK_RIGHT, KK_GT)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "'kk-logic'" in message and "Did you mean 'kk_logic'?" in message
    for known in ("kk_logic", "kk", "openai/gsm8k", "gsm8k"):
        assert repr(known) in message
    assert "reward.custom_function.path" in message and "reward.custom_function.name" in message
    # Crosses process boundaries intact (Ray/multiprocessing pickle exceptions).
    assert str(pickle.loads(pickle.dumps(info.value))) == message


def test_unknown_data_source_without_a_close_match_has_no_guess():
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score("totally/different", "", "")
    assert "Did you mean" not in str(info.value)


def test_register_reward_adds_a_data_source_and_refuses_a_silent_replacement():
    try:

        @register_reward("test/echo_len")
        def echo_len(solution_str, ground_truth, extra_info=None):
            return float(len(solution_str))

        assert default_compute_score("test/echo_len", "abcd", None) == 4.0
        register_reward("test/echo_len")(echo_len)  # the same function again: harmless

        def other(solution_str, ground_truth, extra_info=None):
            return 0.0

        with pytest.raises(ValueError, match="already has the reward"):
            register_reward("test/echo_len")(other)
        assert default_compute_score("test/echo_len", "abcd", None) == 4.0
    finally:
        REWARD_FUNCTIONS.pop("test/echo_len", None)
    with pytest.raises(ValueError, match="non-empty"):
        register_reward("")


# ---- custom reward files ----------------------------------------------------------------------------

CUSTOM_SOURCE = """
from dataclasses import dataclass

THRESHOLD = 3


@dataclass
class Verdict:
    score: float


def _private_helper(text):
    return len(text)


def helper(text):
    return text.strip()


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    verdict = Verdict(1.0 if helper(solution_str) == ground_truth else 0.0)
    return {"score": verdict.score, "length": float(_private_helper(solution_str))}
"""


@pytest.fixture
def custom_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM_SOURCE)
    return path


def test_load_custom_function_returns_the_named_function(custom_file):
    fn = load_custom_function(str(custom_file), "compute_score")
    assert fn("mine", " 42 ", "42", None) == {"score": 1.0, "length": 4.0}
    assert fn("mine", "41", "42") == {"score": 0.0, "length": 2.0}


def test_missing_file_names_the_path_and_the_config_key(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(CustomFunctionError) as info:
        load_custom_function(str(missing), "compute_score")
    assert str(missing) in str(info.value) and "reward.custom_function.path" in str(info.value)
    with pytest.raises(CustomFunctionError, match="is a directory"):
        load_custom_function(str(tmp_path), "compute_score")


def test_missing_function_lists_the_public_callables(custom_file):
    with pytest.raises(CustomFunctionError) as info:
        load_custom_function(str(custom_file), "compute_scores")
    message = str(info.value)
    assert "'compute_scores'" in message and "reward.custom_function.name" in message
    assert "['Verdict', 'compute_score', 'helper']" in message
    assert "_private_helper" not in message


def test_non_callable_name_is_rejected(custom_file):
    with pytest.raises(
        CustomFunctionError, match="'THRESHOLD' in .* is not callable \\(it is 3, of type int\\)"
    ):
        load_custom_function(str(custom_file), "THRESHOLD")


def test_non_python_file_and_broken_module_are_reported(tmp_path):
    text_file = tmp_path / "reward.txt"
    text_file.write_text("def compute_score(*a): return 1.0\n")
    with pytest.raises(CustomFunctionError, match="not a .py file"):
        load_custom_function(str(text_file), "compute_score")
    broken = tmp_path / "broken.py"
    broken.write_text("import definitely_not_a_module_xyz\n")
    with pytest.raises(CustomFunctionError, match="ModuleNotFoundError") as info:
        load_custom_function(str(broken), "compute_score")
    assert str(broken) in str(info.value)


# ---- reward outputs ---------------------------------------------------------------------------------


class _Scalar:
    """Stands in for a numpy scalar or a 0-d tensor: numeric through __float__ only."""

    def __init__(self, value, dtype="float32"):
        self.value, self.dtype = value, dtype

    def __float__(self):
        return float(self.value)


def test_numbers_and_score_dicts_are_accepted():
    assert normalize_reward_output(0.5, data_source="d", index=0) == (0.5, {})
    assert normalize_reward_output(-2, data_source="d", index=0) == (-2.0, {})
    assert normalize_reward_output(_Scalar(0.25), data_source="d", index=0) == (0.25, {})
    score, extras = normalize_reward_output(
        {"score": 3, "acc": 1, "format_ok": True}, data_source="d", index=0
    )
    assert (score, extras) == (3.0, {"acc": 1.0, "format_ok": 1.0})
    assert all(type(v) is float for v in extras.values()) and type(score) is float


def test_zero_dim_torch_tensor_is_accepted():
    torch = pytest.importorskip("torch")
    assert normalize_reward_output(torch.tensor(0.75), data_source="d", index=0) == (0.75, {})
    assert normalize_reward_output(torch.tensor(True), data_source="d", index=0) == (1.0, {})
    with pytest.raises(RewardOutputError, match="cannot be turned into one float"):
        normalize_reward_output(torch.tensor([1.0, 2.0]), data_source="d", index=0)
    with pytest.raises(RewardOutputError, match="not one boolean"):
        normalize_reward_output(torch.tensor([True, False]), data_source="d", index=0)


def test_booleans_and_numpy_scalars_are_scores_as_in_verl():
    """verl takes a function returning `pred == gt` (a bool, or numpy's bool_ when the answers are arrays)."""
    np = pytest.importorskip("numpy")
    assert normalize_reward_output(True, data_source="d", index=0) == (1.0, {})
    assert normalize_reward_output(False, data_source="d", index=0) == (0.0, {})
    assert normalize_reward_output(np.bool_(True), data_source="d", index=0) == (1.0, {})
    assert normalize_reward_output(np.float32(0.5), data_source="d", index=0) == (0.5, {})
    assert normalize_reward_output(np.int64(-1), data_source="d", index=0) == (-1.0, {})
    assert normalize_reward_output({"score": np.bool_(False), "acc": True}, data_source="d", index=0) == (
        0.0,
        {"acc": 1.0},
    )
    out = normalize_reward_output(np.float64(0.25), data_source="d", index=0)
    assert type(out[0]) is float


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (float("nan"), "is nan"),
        (float("-inf"), "is -inf"),
        ("1.0", "is a str"),
        (None, "is a NoneType"),
        ([1.0], "is a list"),
        ({"acc": 1.0}, "no 'score' key (keys: ['acc'])"),
        ({"score": "1"}, "'score' is a str"),
        ({"score": math.nan}, "'score' is nan"),
        ({"score": 1.0, "pred": "72"}, "extra metric 'pred' is a str"),
        ({"score": 1.0, 3: 1.0}, "key 3 is not a string"),
    ],
)
def test_unusable_outputs_name_the_source_the_sample_and_the_value(value, fragment):
    with pytest.raises(RewardOutputError) as info:
        normalize_reward_output(value, data_source="my/task", index=17)
    message = str(info.value)
    assert fragment in message
    assert "'my/task'" in message and "sample 17" in message
    assert repr(value)[:40] in message
    assert "Expected a finite float" in message
    assert isinstance(info.value, ValueError)


def test_long_values_are_truncated_in_the_message():
    with pytest.raises(RewardOutputError) as info:
        normalize_reward_output(["x" * 50] * 100, data_source="d", index=0)
    assert len(str(info.value)) < 600 and "..." in str(info.value)
