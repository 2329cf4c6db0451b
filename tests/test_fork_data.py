"""Logic-RL's and TinyZero's parquet files train and evaluate as they are: their prompts carry their own chat
markup (or a "User: ... Assistant: <think>" template) and are fed as written, as those forks feed them.

The files are written in the forks' exact formats by tests/verl_formats.py (templates and columns
copied from their preprocessing and data files, with lucidrl's own puzzles).
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from verl_formats import write_logic_rl_kk, write_tinyzero_countdown

from lucidrl.data.dataset import DatasetError, load_prompts
from lucidrl.data.prompt_format import assistant_prefill, holds_chat_markup
from lucidrl.rewards.kk import people_count
from lucidrl.rewards.registry import default_compute_score


@pytest.mark.parametrize(("template", "prefix"), [("qwen-instruct", "<think>"), ("base", " <think>")])
def test_logic_rl_files_are_fed_as_written_with_their_pre_filled_think(
    template, prefix, tmp_path, tiny_tokenizer, caplog
):
    rows = write_logic_rl_kk(tmp_path / "kk.parquet", template=template)
    with caplog.at_level(logging.WARNING):
        samples, report = load_prompts([str(tmp_path / "kk.parquet")], tiny_tokenizer, max_prompt_length=4096)
    assert report.raw_prompts == len(rows) == len(samples) == 6
    notices = [r.message for r in caplog.records if "own chat markup" in r.message]
    assert len(notices) == 1 and "6 of 6 prompts" in notices[0]  # said once, counted
    for sample, row in zip(samples, rows, strict=True):
        text = row["prompt"][0]["content"]
        assert (
            sample.input_ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        )  # no template around it
        assert sample.assistant_prefix == prefix
        # the reward sees the pre-filled <think> before the response, as Logic-RL's does after the header
        answer = row["solution_text_format"]
        right = default_compute_score(
            "kk_logic", prefix + f" ok </think> <answer> {answer} </answer>", sample.ground_truth
        )
        assert right["score"] == 3.0
        assert people_count(sample.data_source, sample.ground_truth, sample.extra_info) == len(row["names"])
    assert [people_count(s.data_source, s.ground_truth, s.extra_info) for s in samples] == [3, 3, 5, 5, 7, 7]


@pytest.mark.parametrize(
    ("template", "prefix"),
    [
        ("base", " Let me solve this step by step.\n<think>"),
        ("qwen-instruct", "Let me solve this step by step.\n<think>"),
    ],
)
def test_tinyzero_countdown_files_are_fed_as_written(template, prefix, tmp_path, tiny_tokenizer):
    write_tinyzero_countdown(tmp_path / "cd.parquet", [(24, [4, 6, 1]), (10, [2, 5, 9])], template=template)
    samples, report = load_prompts([str(tmp_path / "cd.parquet")], tiny_tokenizer, max_prompt_length=4096)
    assert report.raw_prompts == 2 and [s.assistant_prefix for s in samples] == [prefix, prefix]
    score = default_compute_score(
        "countdown", prefix + " 4*6=24 </think>\n<answer>4*6*1</answer>", samples[0].ground_truth
    )
    assert score["score"] == 1.0


def test_prompt_format_chat_and_raw_are_forced_and_say_what_does_not_fit(tmp_path, tiny_tokenizer):
    write_logic_rl_kk(tmp_path / "kk.parquet", people=(3,), per_size=1)
    with pytest.raises(DatasetError, match=r"kk.parquet row 0: .*ending in '<think>'.*prompt_format=raw"):
        load_prompts(
            [str(tmp_path / "kk.parquet")], tiny_tokenizer, max_prompt_length=4096, prompt_format="chat"
        )
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "data_source": "openai/gsm8k",
                    "prompt": chat,
                    "reward_model": {"ground_truth": "4", "style": "rule"},
                }
            ]
        ),
        tmp_path / "chat.parquet",
    )
    with pytest.raises(
        DatasetError, match="prompt_format=raw feeds a prompt of one message.*holds 2 messages"
    ):
        load_prompts(
            [str(tmp_path / "chat.parquet")], tiny_tokenizer, max_prompt_length=4096, prompt_format="raw"
        )
    samples, report = load_prompts([str(tmp_path / "chat.parquet")], tiny_tokenizer, max_prompt_length=4096)
    assert report.raw_prompts == 0  # plain chat messages: rendered with the template
    expected = tiny_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert samples[0].input_ids == tiny_tokenizer(expected, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    ("text", "raw"),
    [
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", True),
        ("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", True),
        ("User: what is 2+2?\nAssistant: <think>", True),
        ("Human: hi\nAssistant:", True),
        ("User: hi\nAssistant: sure\nUser: and?", False),  # ends in the user's turn
        ("What is 2+2? The assistant said: four", False),
        ("Assistant: hello", False),  # no user turn
    ],
)
def test_what_counts_as_chat_markup(text, raw):
    assert holds_chat_markup([{"role": "user", "content": text}]) is raw


def test_assistant_prefill_is_what_follows_the_last_assistant_header():
    assert assistant_prefill("<|im_start|>assistant\nA<|im_end|><|im_start|>assistant\n<think>") == "<think>"
    assert assistant_prefill("User:q\nAssistant: <think>") == " <think>"
    assert assistant_prefill("no header") == ""


@pytest.mark.parametrize(
    ("side", "kept"), [("left", [6, 7, 8, 9]), ("right", [0, 1, 2, 3]), ("middle", [0, 1, 8, 9])]
)
def test_truncation_cuts_as_verl_does(side, kept):
    from lucidrl.data.dataset import truncate

    assert truncate(list(range(10)), 4, side) == kept


def test_overlong_prompts_are_cut_and_counted(kk_data, tiny_tokenizer, caplog):
    full, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=10**6)
    limit = min(len(s.input_ids) for s in full) - 1
    with caplog.at_level(logging.WARNING):
        cut, report = load_prompts(
            [kk_data["train"]], tiny_tokenizer, max_prompt_length=limit, truncation="left"
        )
    assert report.truncated == len(full) and all(len(s.input_ids) == limit for s in cut)
    assert cut[0].input_ids == full[0].input_ids[-limit:]
    assert any(f"cut {len(full)} of {len(full)} prompts" in r.message for r in caplog.records)
    with pytest.raises(DatasetError, match="data.truncation=left"):
        load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=limit)


def test_chat_template_kwargs_reach_the_template(tmp_path, tiny_model):
    from lucidrl.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model["path"]))
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}"
    )
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "data_source": "openai/gsm8k",
                    "prompt": [{"role": "user", "content": "2+2?"}],
                    "reward_model": {"ground_truth": "4"},
                }
            ]
        ),
        tmp_path / "q.parquet",
    )
    (plain,), _ = load_prompts([str(tmp_path / "q.parquet")], tok, max_prompt_length=100)
    (off,), _ = load_prompts(
        [str(tmp_path / "q.parquet")], tok, max_prompt_length=100, template_kwargs={"enable_thinking": False}
    )
    assert tok.decode(off.input_ids) == tok.decode(plain.input_ids) + " /no_think"


@pytest.mark.slow
def test_logic_rl_files_train_and_evaluate_with_the_per_people_table(
    tmp_path, tiny_model, monkeypatch, capsys
):
    """Logic-RL's files as they are, trained one step and validated, then `lucidrl eval`: accuracy per number
    of people is there although the rows carry no extra_info.n_people (read from the ground truth)."""
    from lucidrl.cli import main

    write_logic_rl_kk(tmp_path / "train.parquet", per_size=2, seed=1)
    write_logic_rl_kk(tmp_path / "test.parquet", per_size=1, seed=2)
    monkeypatch.chdir(tmp_path)
    argv = [
        "train",
        f"model.path={tiny_model['path']}",
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        f"data.val_files=[{tmp_path / 'test.parquet'}]",
        "data.train_batch_size=2",
        "data.max_prompt_length=1000",
        "data.max_response_length=8",
        "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size=4",
        "rollout.n=2",
        "trainer.total_training_steps=1",
        f"trainer.run_dir={tmp_path / 'run'}",
    ]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "6 fed as raw text (data.prompt_format)" in printed
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"val/kk_logic/acc/3_people", "val/kk_logic/acc/5_people", "val/kk_logic/acc/7_people"} <= set(
        last
    )
    out = tmp_path / "eval.json"
    assert main(["eval", str(tmp_path / "run" / "final"), "--data", str(tmp_path / "test.parquet"), "--k", "1",
                 "--max-new-tokens", "8", "--json", str(out)]) == 0  # fmt: skip
    entry = json.loads(out.read_text())["data_sources"]["kk_logic"]
    assert entry["n_prompts_by_people"] == {"3": 1, "5": 1, "7": 1}
    assert set(entry["greedy"]["acc_by_people"]) == {"3", "5", "7"}
