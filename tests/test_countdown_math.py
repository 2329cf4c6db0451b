"""The rule rewards verl and TinyZero users expect beyond K&K and GSM8K: MATH (\\boxed, normalised) and
Countdown (an expression over the given numbers), and the Countdown puzzle generator."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from lucidrl.cli import main
from lucidrl.data.countdown import generate_puzzles, response_text, solutions
from lucidrl.data.dataset import load_prompts
from lucidrl.rewards import countdown, math
from lucidrl.rewards.registry import default_compute_score


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("so \\boxed{\\dfrac12}.", "\\frac{1}{2}", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{1/2}", "\\frac12", 1.0),
        ("\\boxed{-3/4}", "\\frac{-3}{4}", 1.0),  # verl: a/b of integers, the sign inside
        ("\\boxed{-3/4}", "-\\frac{3}{4}", 0.0),
        ("\\boxed{.5}", "0.5", 1.0),
        ("\\boxed{\\left( 3, 4 \\right)}", "(3,4)", 1.0),
        ("\\boxed{x = 5}", "5", 1.0),
        ("\\boxed{10\\text{ cm}}", "10", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{50\\%}", "50", 1.0),
        ("\\boxed{50%}", "50", 0.0),  # verl drops "\%" only
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", 1.0),  # nested braces inside the box
        ("\\boxed 5$", "5", 1.0),
        ("\\fbox{7}", "7", 0.0),  # verl finds the \fbox and then cannot unwrap it
        ("first \\boxed{3}, then \\boxed{4}", "4", 1.0),  # the last box is the answer
        ("first \\boxed{4}, then \\boxed{3}", "4", 0.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 0.0),  # no algebra: equal values written differently
        ("\\boxed{3", "3", 0.0),  # a box that never closes
        ("the answer is 5", "5", 0.0),
        ("\\boxed{\\frac}", "\\frac", 1.0),  # not normalisable: compared as written
    ],
)
def test_math_reward_is_verls_last_box_rule(response, truth, score):
    assert default_compute_score("lighteval/MATH", response, truth) == score


def test_math_reward_names_a_ground_truth_it_cannot_read():
    with pytest.raises(ValueError, match="MATH ground_truth must be the answer as text"):
        math.compute_score("\\boxed{1}", {"answer": "1"})


GT = {"target": 24, "numbers": [4, 6, 1]}


@pytest.mark.parametrize(
    "response, score, acc",
    [
        ("<think>4*6=24</think> <answer>4 * 6 * 1</answer>", 1.0, 1.0),
        ("<answer> (4 * 6) / 1 </answer>", 1.0, 1.0),
        ("<answer>1</answer> then <answer>4*6*1</answer>", 1.0, 1.0),  # the last answer counts
        ("<answer>4*6*1</answer></answer>", 1.0, 1.0),
        ("<think>\nsteps\n</think>\n<answer>4*6*1</answer>", 1.0, 1.0),
        ("<answer>4*6*1</answer>\nthat is all", 0.0, 0.0),  # TinyZero reads the last line only
        ("<answer>4 × 6 ÷ 1</answer>", 0.1, 0.0),  # TinyZero: characters it does not evaluate
        ("<answer>4*6</answer>", 0.1, 0.0),  # a number left out
        ("<answer>4*6*1*1</answer>", 0.1, 0.0),  # a number used twice
        ("<answer>4+6+1</answer>", 0.1, 0.0),  # another value
        ("<answer>4*6*1 = 24</answer>", 0.1, 0.0),  # TinyZero's rule: the expression alone
        ("<answer>4/(1-1)*6</answer>", 0.1, 0.0),
        ("<answer>1.0*24</answer>", 0.1, 0.0),  # numbers 1, 0, 24
        ("<answer>__import__('os').system('true')</answer>", 0.1, 0.0),  # never evaluated as Python
        ("4 * 6 * 1", 0.0, 0.0),  # no <answer>
    ],
)
def test_countdown_reward_is_tinyzeros(response, score, acc):
    out = default_compute_score("countdown", response, GT)
    assert (out["score"], out["acc"]) == (score, acc)


def test_countdown_powers_floats_and_the_lenient_option():
    # TinyZero evaluates with Python's arithmetic: ** and // count, "/" is a float within 1e-5
    assert (
        countdown.compute_score("<answer>2**3*3</answer>", {"target": 24, "numbers": [2, 3, 3]})["acc"] == 1.0
    )
    assert (
        countdown.compute_score("<answer>1/49*49</answer>", {"target": 1, "numbers": [1, 49, 49]})["acc"]
        == 1.0
    )
    # a power TinyZero's eval would grind on is a wrong answer here, at once
    assert countdown.compute_score("<answer>9**99999999</answer>", {"target": 9, "numbers": [9, 99999999]})[
        "score"
    ] == pytest.approx(0.1)
    lenient = {"target": 24, "numbers": [4, 6, 1]}
    assert countdown.compute_score("<answer>4 × 6 ÷ 1</answer>", lenient, lenient=True)["acc"] == 1.0
    assert countdown.compute_score("<answer>4*6*1</answer>\nthat is all", lenient, lenient=True)["acc"] == 1.0


def test_countdown_names_a_bad_ground_truth():
    for target in (24.7, "24", True):
        with pytest.raises(ValueError, match="target must be a whole number"):
            countdown.compute_score("<answer>3*8*1</answer>", {"target": target, "numbers": [3, 8, 1]})
    assert (
        countdown.compute_score("<answer>3*8*1</answer>", {"target": 24.0, "numbers": [3, 8, 1]})["acc"]
        == 1.0
    )
    with pytest.raises(ValueError, match="countdown ground_truth must be"):
        countdown.compute_score("<answer>1</answer>", 24)
    with pytest.raises(ValueError, match="must be a non-empty list of integers"):
        countdown.compute_score("<answer>1</answer>", {"target": 1, "numbers": [1.5]})


def test_every_generated_puzzle_is_solved_by_its_own_response_and_distinct():
    puzzles = generate_puzzles(60, numbers=(3, 4), seed=3)
    assert {len(p["numbers"]) for p in puzzles} == {3, 4}
    keys = {(tuple(sorted(p["numbers"])), p["target"]) for p in puzzles}
    assert len(keys) == 60
    for p in puzzles:
        assert 1 <= p["target"] <= 100 and all(1 <= n <= 99 for n in p["numbers"])
        gt = {"target": p["target"], "numbers": p["numbers"]}
        assert countdown.compute_score(response_text(p), gt)["score"] == 1.0, p
    # the solver finds what is reachable, and only that
    reach = solutions([2, 3])
    assert sorted(reach) == [-1, 1, 5, 6]  # 2+3, 2*3, 3-2, 2-3 (2/3, 3/2 are not integers)
    assert solutions([5, 5])[1][1] == "5 / 5"


def test_data_countdown_writes_parquet_the_trainer_loads_and_scores(tmp_path, tiny_tokenizer, capsys):
    out = tmp_path / "cd"
    assert (
        main(["data", "countdown", "--train", "12", "--val", "4", "--numbers", "3", "--out", str(out)]) == 0
    )
    assert "wrote 12 train and 4 val Countdown puzzles" in capsys.readouterr().out
    train = pq.read_table(out / "train.parquet").to_pylist()
    val = pq.read_table(out / "val.parquet").to_pylist()
    assert len(train) == 12 and len(val) == 4
    assert not {
        (
            tuple(sorted(r["reward_model"]["ground_truth"]["numbers"])),
            r["reward_model"]["ground_truth"]["target"],
        )
        for r in train
    } & {
        (
            tuple(sorted(r["reward_model"]["ground_truth"]["numbers"])),
            r["reward_model"]["ground_truth"]["target"],
        )
        for r in val
    }
    samples, _ = load_prompts([str(out / "train.parquet")], tiny_tokenizer, max_prompt_length=4096)
    for sample, row in zip(samples, train, strict=True):
        assert sample.data_source == "countdown"
        assert default_compute_score(sample.data_source, row["response"], sample.ground_truth)["acc"] == 1.0
    assert main(["data", "countdown", "--numbers", "5", "--out", str(tmp_path / "x")]) == 2
    assert "expected a range within 2-4" in capsys.readouterr().err
    assert main(["data", "countdown", "--numbers", "three", "--out", str(tmp_path / "x")]) == 2
    assert "--numbers 'three' is not understood" in capsys.readouterr().err
