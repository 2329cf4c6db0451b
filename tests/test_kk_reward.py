"""Logic-RL's K&K reward: every branch of the format and answer rule, and both ground-truth forms."""

from __future__ import annotations

import pytest

from lucidrl.data.kk import SYSTEM_PROMPT, generate_dataset
from lucidrl.rewards.kk import compute_score

GT = {
    "solution_text_format": "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Ethan is a knight",
    "names": ["Zoey", "Oliver", "Ethan"],
    "knights": [True, False, True],
}
RIGHT = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Ethan is a knight"


def respond(answer: str, think: str = "Zoey and Ethan agree, Oliver lies.") -> str:
    return f"<think> {think} </think>\n<answer> {answer} </answer>"


def test_correct_answer_scores_3():
    assert compute_score(respond(RIGHT), GT) == {"score": 3.0, "acc": 1.0, "format_ok": 1.0}


def test_answer_is_case_insensitive_and_may_be_phrased_freely():
    answer = "ZOEY IS A KNIGHT, oliver is a knave, and Ethan  is a\nknight."
    assert compute_score(respond(answer), GT)["score"] == 3.0


def test_one_wrong_role_scores_minus_half():
    wrong = RIGHT.replace("Oliver is a knave", "Oliver is a knight")
    assert compute_score(respond(wrong), GT) == {"score": -0.5, "acc": 0.0, "format_ok": 1.0}


def test_more_knight_words_than_people_is_unparseable():
    # All three roles are right, but a fourth "knight" makes the count 4 != 3.
    answer = RIGHT + "\nZoey is the only honest knight besides Ethan"
    assert compute_score(respond(answer), GT) == {"score": -1.0, "acc": 0.0, "format_ok": 1.0}


def test_a_missing_name_is_unparseable():
    answer = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Evan is a knight"
    assert compute_score(respond(answer), GT)["score"] == -1.0
    # \b keeps "Amia" from counting as "Mia".
    gt = {"names": ["Mia", "Leo"], "knights": [True, False]}
    assert compute_score(respond("Amia is a knight, Leo is a knave"), gt)["score"] == -1.0
    assert compute_score(respond("Mia is a knight, Leo is a knave"), gt)["score"] == 3.0


def test_empty_answer_with_good_format_scores_minus_one():
    assert compute_score("<think> hmm </think><answer>  </answer>", GT) == {
        "score": -1.0,
        "acc": 0.0,
        "format_ok": 1.0,
    }


@pytest.mark.parametrize(
    "response",
    [
        f"<think> ok <answer> {RIGHT} </answer>",  # missing </think>
        f"ok </think> <answer> {RIGHT} </answer>",  # missing <think>
        f"<think> ok </think> {RIGHT}",  # no answer tags
        f"<think> ok </think> <answer> {RIGHT} </answer> <answer> {RIGHT} </answer>",  # answer twice
        f"<think> <think> ok </think> <answer> {RIGHT} </answer>",  # <think> twice
        f"<answer> {RIGHT} </answer> <think> ok </think>",  # answer before think
        f"<think> ok </think> </answer> {RIGHT} <answer>",  # answer tags reversed
        RIGHT,
    ],
)
def test_broken_format_scores_minus_3_even_with_the_right_roles(response):
    assert compute_score(response, GT) == {"score": -3.0, "acc": 0.0, "format_ok": 0.0}


def test_only_the_assistant_part_of_a_transcript_is_scored():
    # The system prompt itself holds <think> and <answer> tags; they must not count.
    prompt = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nA puzzle<|im_end|>\n"
    transcript = prompt + "<|im_start|>assistant\n" + respond(RIGHT)
    assert compute_score(transcript, GT)["score"] == 3.0
    assert compute_score(f"{SYSTEM_PROMPT}\nUser: puzzle\nAssistant: {respond(RIGHT)}", GT)["score"] == 3.0
    # Without a header the whole string is scored, so the prompt's tags break the format.
    assert compute_score(SYSTEM_PROMPT + respond(RIGHT), GT)["score"] == -3.0


def test_a_header_the_model_writes_does_not_cut_its_own_response():
    # the trainer passes the assistant's turn (pre-filled "<think>" + response): scored whole, as
    # Logic-RL scores everything after the prompt's header
    hidden = f"<think><answer>x</answer> Assistant: <think> r </think><answer>{RIGHT}</answer>"
    assert compute_score(hidden, GT)["score"] == -3.0  # two <think>, two <answer>: the format fails
    inside = f"<think> r Assistant: </think> <answer> {RIGHT} </answer>"
    assert compute_score(inside, GT)["score"] == 3.0


def test_plain_string_ground_truth():
    assert compute_score(respond(RIGHT), GT["solution_text_format"])["score"] == 3.0
    wrong = RIGHT.replace("Ethan is a knight", "Ethan is a knave")
    assert compute_score(respond(wrong), GT["solution_text_format"])["score"] == -0.5
    assert compute_score(respond(RIGHT), {"solution_text_format": GT["solution_text_format"]})["score"] == 3.0


@pytest.mark.parametrize(
    ("ground_truth", "fragment"),
    [
        (42, "type int"),
        (None, "type NoneType"),
        (["Zoey", "Oliver"], "type list"),
        ({"answer": "x"}, "keys ['answer']"),
        ({"names": ["Zoey"], "knights": [True, False]}, "1 names"),
        ({"names": ["Zoey"], "knights": ["true"]}, "booleans"),
        ("(1) 42 is a mystery", "not of the form"),  # no name, no role: Logic-RL skips it
        ("", "names nobody"),
    ],
)
def test_bad_ground_truth_is_rejected_with_the_expected_form(ground_truth, fragment):
    with pytest.raises(ValueError, match="K&K ground truth") as info:
        compute_score(respond(RIGHT), ground_truth)
    assert fragment in str(info.value)


def test_generated_rows_score_3_for_their_solution_and_minus_half_for_a_flip():
    train, _ = generate_dataset((2, 6), n_train=25, n_val=0, seed=5)
    for row in train:
        gt = row["reward_model"]["ground_truth"]
        response = (
            row["prompt"][2]["content"]
            + " thinking </think> <answer> "
            + gt["solution_text_format"]
            + " </answer>"
        )
        assert compute_score(response, gt)["score"] == 3.0
        flipped = {**gt, "knights": [not gt["knights"][0], *gt["knights"][1:]]}
        assert compute_score(response, flipped)["score"] == -0.5
