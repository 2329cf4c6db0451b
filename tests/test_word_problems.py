"""One-step word problems (lucidrl/data/word_problems.py) and their GSM8K-style reward."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from lucidrl.cli import main
from lucidrl.data.word_problems import (
    DATA_SOURCE,
    INSTRUCTIONS,
    OPERATIONS,
    TEMPLATES,
    cores,
    generate_problems,
    write_word_problems_parquet,
)
from lucidrl.rewards.registry import default_compute_score
from lucidrl.rewards.word_problems import compute_score


def test_problems_are_deterministic_per_seed_and_their_answers_right():
    first = generate_problems(300, seed=3)
    assert first == generate_problems(300, seed=3)
    assert first != generate_problems(300, seed=4)
    assert len({p.question for p in first}) == 300
    assert {p.op for p in first} == set(OPERATIONS)
    assert len({p.template for p in first}) == len(TEMPLATES)  # every template is used
    for p in first:
        assert p.answer == {"add": p.a + p.b, "sub": p.a - p.b, "mul": p.a * p.b}[p.op] > 0
        # both numbers are in the text, as numbers (not inside another one)
        numbers = [int(x) for x in re.findall(r"\d+", p.question)]
        assert sorted(numbers) == sorted([p.a, p.b]), p.question
        assert TEMPLATES[p.template][0] == p.op


def test_only_the_asked_operations_and_no_excluded_core():
    val = generate_problems(50, seed=0, ops=("sub",), distinct_cores=True)
    assert {p.op for p in val} == {"sub"} and len({p.core for p in val}) == 50
    train = generate_problems(400, seed=1, ops=("sub",), exclude={p.core for p in val})
    assert not {p.core for p in train} & {p.core for p in val}


def test_impossible_requests_are_refused():
    with pytest.raises(ValueError, match="only 64 exist"):
        generate_problems(65, ops=("mul",), distinct_cores=True)
    assert len(cores(("mul",))) == 64
    with pytest.raises(ValueError, match="choose among add, sub, mul"):
        generate_problems(3, ops=("div",))


def _example_core(response: str) -> tuple[str, int, int]:
    """(op, a, b) of a worked answer "a + b = c\n#### c"."""
    a, sign, b = re.match(r"(\d+) ([+*-]) (\d+) = ", response).groups()
    return ({"+": "add", "-": "sub", "*": "mul"}[sign], int(a), int(b))


def test_by_default_the_prompt_is_the_problem_alone_asking_for_the_answer_is(tmp_path):
    info = write_word_problems_parquet(tmp_path, n_train=5, n_val=5, seed=0)
    for r in pq.read_table(info["train"]).to_pylist():
        assert len(r["prompt"]) == 1 and r["prompt"][0]["content"].endswith(INSTRUCTIONS["answer_is"])
        assert r["extra_info"]["format"] == "answer_is"
        assert r["response"].endswith(f"The answer is {r['reward_model']['ground_truth']}.")
        assert default_compute_score(r["data_source"], r["response"], r["reward_model"]["ground_truth"],
                                     r["extra_info"])["score"] == 1.0  # fmt: skip
    with pytest.raises(ValueError, match="--shots 2"):
        write_word_problems_parquet(tmp_path, n_train=5, n_val=5, shots=2)
    with pytest.raises(ValueError, match="--format 'boxed'"):
        write_word_problems_parquet(tmp_path, n_train=5, n_val=5, fmt="boxed")


def test_parquet_splits_are_disjoint_and_load_as_prompts(tmp_path, tiny_tokenizer):
    from lucidrl.data.dataset import load_prompts

    info = write_word_problems_parquet(tmp_path, n_train=500, n_val=60, seed=0, shots=1, fmt="gsm8k")
    train, val = pq.read_table(info["train"]).to_pylist(), pq.read_table(info["val"]).to_pylist()
    assert (len(train), len(val)) == (500, 60)
    core = lambda r: (r["extra_info"]["op"], r["extra_info"]["a"], r["extra_info"]["b"])  # noqa: E731
    assert len({core(r) for r in val}) == 60
    assert not {core(r) for r in train} & {core(r) for r in val}
    again = write_word_problems_parquet(
        tmp_path / "again", n_train=500, n_val=60, seed=0, shots=1, fmt="gsm8k"
    )
    assert pq.read_table(again["train"]).to_pylist() == train
    # a larger train split keeps val as it was
    more = write_word_problems_parquet(tmp_path / "more", n_train=900, n_val=60, seed=0, shots=1, fmt="gsm8k")
    assert pq.read_table(more["val"]).to_pylist() == val

    row = val[0]
    assert row["data_source"] == DATA_SOURCE and row["ability"] == "math"
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]  # a worked example first
    assert all(m["content"].endswith(INSTRUCTIONS["gsm8k"]) for m in row["prompt"] if m["role"] == "user")
    assert row["extra_info"]["split"] == "val"
    # the worked examples show no val problem's numbers, in either split, and never the row's own
    val_cores = {core(r) for r in val}
    for r in train + val:
        shown = _example_core(r["prompt"][1]["content"])
        assert shown not in val_cores and shown != core(r)
        assert (
            compute_score(r["prompt"][1]["content"], r["prompt"][1]["content"].split("#### ")[1])["score"]
            == 1
        )
    assert len({r["prompt"][1]["content"] for r in train}) > 8  # the examples vary
    # the worked response scores 1 with the reward registered for the rows' data_source
    for r in train[:50] + val:
        truth = r["reward_model"]["ground_truth"]
        assert default_compute_score(r["data_source"], r["response"], truth, r["extra_info"])["score"] == 1.0
    samples, _ = load_prompts([str(info["val"])], tiny_tokenizer, max_prompt_length=10**6)
    assert len(samples) == 60 and samples[0].ground_truth == row["reward_model"]["ground_truth"]


@pytest.mark.parametrize(
    ("response", "score", "format_ok"),
    [
        ("Sam has 4 + 6 = 10 apples.\n#### 10", 1.0, 1.0),
        ("#### 10.", 1.0, 1.0),
        ("####10", 1.0, 1.0),
        ("**#### 10**", 1.0, 1.0),
        ("#### 10 apples", 1.0, 1.0),
        ("#### 10.0", 1.0, 1.0),
        ("#### $10", 1.0, 1.0),
        ("#### 9\nNo wait: #### 10", 1.0, 1.0),  # the last one counts
        ("#### 10\nNo wait: #### 9", 0.0, 1.0),
        ("#### 9", 0.0, 1.0),
        ("#### -10", 0.0, 1.0),
        ("#### 100", 0.0, 1.0),
        ("The answer is 10.", 0.0, 0.0),  # right number, not in the asked format
        ("4 + 6 = 10", 0.0, 0.0),
        ("#### ten", 0.0, 0.0),
        ("####", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_reward_is_exact_on_the_last_hash_answer(response, score, format_ok):
    assert compute_score(response, "10") == {"score": score, "acc": score, "format_ok": format_ok}


def test_reward_reads_thousands_separators():
    assert compute_score("#### 1,000", "1000")["score"] == 1.0


ANSWER_IS = {"format": "answer_is"}


@pytest.mark.parametrize(
    ("response", "score", "format_ok"),
    [
        ("4 + 6 = 10\nThe answer is 10.", 1.0, 1.0),
        ("the answer is: 10", 1.0, 1.0),
        ("The answer is **10**.", 1.0, 1.0),
        ("The answer is $10.", 1.0, 1.0),
        ("The answer is 10.0", 1.0, 1.0),
        ("The answer is 9. No wait, the answer is 10.", 1.0, 1.0),  # the last one counts
        ("The answer is 10. No wait, the answer is 9.", 0.0, 1.0),
        ("The answer is 100.", 0.0, 1.0),
        ("The answer is -10.", 0.0, 1.0),
        ("The answer is N.", 0.0, 0.0),  # the instruction echoed
        ("4 + 6 = 10", 0.0, 0.0),  # right number, not in the asked format
        ("#### 10", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_answer_is_reward_is_exact_on_the_last_answer(response, score, format_ok):
    assert compute_score(response, "10", ANSWER_IS) == {"score": score, "acc": score, "format_ok": format_ok}


def test_an_unknown_format_is_refused_by_name():
    from lucidrl.diagnostics.errors import UserError

    with pytest.raises(UserError, match="extra_info.format 'boxed'"):
        compute_score("The answer is 10.", "10", {"format": "boxed"})


def test_cli_writes_the_files_and_refuses_unknown_operations(tmp_path, capsys):
    assert main(["data", "word-problems", "--train", "40", "--val", "10", "--out", str(tmp_path / "d")]) == 0
    assert "40 train and 10 val" in capsys.readouterr().out
    row = pq.read_table(tmp_path / "d" / "val.parquet").to_pylist()[0]
    assert row["extra_info"]["format"] == "answer_is" and len(row["prompt"]) == 1
    args = ["--format", "gsm8k", "--shots", "1", "--train", "40", "--val", "10", "--out", str(tmp_path / "g")]
    assert main(["data", "word-problems", *args]) == 0
    row = pq.read_table(tmp_path / "g" / "val.parquet").to_pylist()[0]
    assert row["extra_info"]["format"] == "gsm8k" and len(row["prompt"]) == 3
    assert pq.read_table(tmp_path / "d" / "train.parquet").num_rows == 40
    assert main(["data", "word-problems", "--ops", "add,div", "--out", str(tmp_path / "e")]) == 2
    assert "--ops 'add,div'" in capsys.readouterr().err
    assert main(["data", "word-problems", "--ops", "mul", "--val", "100", "--out", str(tmp_path / "f")]) == 2
    assert "only 64 exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, stops_after",
    [
        ("Lena has 29. The answer is 29. The answer is 29.", "The answer is 29. "),
        ("So the answer is: **1,000** crayons", "The answer is: **1,000*"),
        ("The answer is 4.25 kg.", "The answer is 4.25 "),
        ("The answer is 42", None),  # not yet known to be whole: nothing after the number
        ("The answer is 42.", None),
        ("I think 42. Maybe 43.", None),
    ],
)
def test_the_stop_rule_ends_a_response_once_its_whole_answer_is_stated(text, stops_after):
    """STOP_AFTER_ANSWER on a text growing character by character, as the rollout checks it per token: the
    shortest matching prefix, and what the reward reads there is the first answer given."""
    from lucidrl.rewards.word_problems import STOP_AFTER_ANSWER

    rule = re.compile(STOP_AFTER_ANSWER)
    first = next((k for k in range(1, len(text) + 1) if rule.search(text[:k])), None)
    if stops_after is None:
        assert first is None
        return
    kept = text[:first]
    assert kept.lower().endswith(stops_after.lower())
    answer = stops_after.split("is")[-1].strip(" :*.").replace(",", "")
    assert compute_score(kept, answer, {"format": "answer_is"})["score"] == 1.0


def test_the_defaults_and_the_largest_val_that_fits_write_files(tmp_path, capsys):
    """`--val` defaulted to 200, more distinct one-digit products than exist: the bare command failed."""
    assert main(["data", "word-problems", "--out", str(tmp_path / "d")]) == 0
    assert "2000 train and 150 val" in capsys.readouterr().out
    assert main(["data", "word-problems", "--val", "179", "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["data", "word-problems", "--val", "180", "--out", str(tmp_path / "x")]) == 2
    assert "mul" in capsys.readouterr().err
