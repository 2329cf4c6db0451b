"""`lucidrl eval`: greedy and sampled accuracy per number of people, on the tiny fixtures."""

from __future__ import annotations

import json
import math
from collections import Counter

import pyarrow.parquet as pq
import pytest

from lucidrl.cli import main
from lucidrl.data.dataset import DatasetError
from lucidrl.trainer.evaluation import EvaluationError, _summarise, evaluate


def _people(path: str) -> Counter:
    return Counter(row["extra_info"]["n_people"] for row in pq.read_table(path).to_pylist())


@pytest.fixture(scope="module")
def result(kk_data, tiny_model):
    return evaluate(
        tiny_model["path"], [kk_data["val"]], k=2, temperature=1.0, max_new_tokens=12, batch_size=8, seed=0
    )


def test_counts_keys_and_ranges(result, kk_data):
    people = _people(kk_data["val"])
    assert result["n_prompts"] == sum(people.values()) == 8 and result["k"] == 2
    assert list(result["data_sources"]) == ["kk_logic"]
    entry = result["data_sources"]["kk_logic"]
    assert entry["n_prompts"] == 8 and entry["n_prompts_by_people"] == dict(sorted(people.items()))
    for mode, n in (("greedy", 1), ("sampled", 2)):
        stats = entry[mode]
        assert stats["n_samples"] == 8 * n
        assert list(stats["acc_by_people"]) == sorted(people)
        for value in [
            stats["acc"],
            stats[f"pass_at_{n}"],
            stats["format_ok"],
            *stats["acc_by_people"].values(),
        ]:
            assert 0.0 <= value <= 1.0
        assert 1 <= stats["response_length"] <= 12
        assert -3.0 <= stats["score"] <= 3.0
    assert set(result["seconds"]) == {"greedy", "sampled"}


@pytest.mark.slow
def test_same_seed_same_numbers_and_limit_keeps_the_first_rows(result, kk_data, tiny_model):
    again = evaluate(
        tiny_model["path"], [kk_data["val"]], k=2, max_new_tokens=12, batch_size=3, seed=0, limit=3
    )
    entry = again["data_sources"]["kk_logic"]
    assert again["n_prompts"] == 3 and entry["n_prompts_by_people"] == {2: 2, 3: 1}
    assert entry["greedy"]["n_samples"] == 3 and entry["sampled"]["n_samples"] == 6
    # greedy decoding is deterministic: another k and sampling seed leave it unchanged
    other = evaluate(
        tiny_model["path"], [kk_data["val"]], k=1, max_new_tokens=12, batch_size=3, seed=5, limit=3
    )
    assert other["data_sources"]["kk_logic"]["greedy"] == entry["greedy"]


def test_summary_arithmetic():
    # 2 prompts x 3 samples: prompt 0 (2 people) right once, prompt 1 (3 people) never.
    per_sample = {
        "prompt": [0, 0, 0, 1, 1, 1],
        "data_source": ["kk_logic"] * 6,
        "n_people": [2, 2, 2, 3, 3, 3],
        "score": [3.0, -0.5, -0.5, -1.0, -3.0, -3.0],
        "acc": [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        "format_ok": [1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
        "trace_ok": [1.0, 0.0, math.nan, 0.0, math.nan, math.nan],  # NaN: not a trace
        "length": [10.0, 12.0, 14.0, 20.0, 30.0, 40.0],
        "truncated": [0.0, 0.0, 0.0, 0.0, 1.0, 1.0],
    }
    stats = _summarise(per_sample, list(range(6)), 3)
    assert stats["acc"] == pytest.approx(1 / 6)
    assert stats["acc_by_people"] == {2: pytest.approx(1 / 3), 3: 0.0}
    assert stats["pass_at_3"] == 0.5 and stats["format_ok"] == pytest.approx(4 / 6)
    assert stats["score"] == pytest.approx(-5 / 6) and stats["response_length"] == 21.0
    assert stats["trace_ok"] == pytest.approx(1 / 3)  # over the 3 traced samples only
    assert stats["truncated"] == pytest.approx(2 / 6)
    no_format = dict(per_sample, format_ok=[math.nan] * 6)
    assert _summarise(no_format, [0, 1, 2], 3)["format_ok"] is None
    assert _summarise(per_sample, [4, 5], 3)["trace_ok"] is None


@pytest.mark.slow
def test_cli_prints_the_table_and_writes_json(kk_data, tiny_model, tmp_path, capsys):
    out = tmp_path / "eval" / "result.json"
    argv = ["eval", tiny_model["path"], "--data", kk_data["val"], "--k", "2", "--max-new-tokens", "8"]
    assert main([*argv, "--limit", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for text in ("greedy", "sampled@2", "2 people", "3 people", "overall", "format", "length"):
        assert text in printed
    saved = json.loads(out.read_text())
    assert saved["n_prompts"] == 4 and saved["max_new_tokens"] == 8
    assert saved["data_sources"]["kk_logic"]["n_prompts_by_people"] == {"2": 2, "3": 2}


def test_bf16_compute_decodes_under_autocast_as_a_bf16_run_validates(
    kk_data, tiny_model, monkeypatch, capsys
):
    import torch

    import lucidrl.models as models

    seen: list[torch.dtype] = []
    load = models.load_model

    def load_watched(path, *args, **kwargs):
        model = load(path, *args, **kwargs)
        head = model.get_output_embeddings()
        head.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
        assert head.weight.dtype == torch.float32  # autocast over float32 weights, not bf16 weights
        return model

    monkeypatch.setattr(models, "load_model", load_watched)
    args = dict(k=1, max_new_tokens=4, batch_size=8, limit=2, sampled=False)
    plain = evaluate(tiny_model["path"], [kk_data["val"]], **args)
    assert plain["compute_dtype"] == "float32" and set(seen) == {torch.float32}
    seen.clear()
    bf16 = evaluate(tiny_model["path"], [kk_data["val"]], compute_dtype="bfloat16", **args)
    assert bf16["compute_dtype"] == "bfloat16" and set(seen) == {torch.bfloat16}
    argv = ["eval", tiny_model["path"], "--data", kk_data["val"], "--limit", "2", "--max-new-tokens", "4"]
    assert main([*argv, "--k", "1", "--compute-dtype", "bfloat16"]) == 0
    assert "bfloat16 compute" in " ".join(capsys.readouterr().out.split())  # the table says how it decoded
    assert main([*argv, "--compute-dtype", "float16"]) == 2
    assert "--compute-dtype='float16'" in capsys.readouterr().err


def test_names_with_square_brackets_print_as_they_are(result):
    """rich read a model path's "[red]" as markup (the table named another model) and "[/x]" raised
    MarkupError after the whole evaluation, before --json was written."""
    import io

    from rich.console import Console

    from lucidrl.trainer.evaluation import results_table

    for name in ("runs/[red]/final", "runs/[/x]/final"):
        console = Console(file=io.StringIO(), width=200)
        console.print(results_table({**result, "model": name}, "kk_logic"))
        assert name in console.file.getvalue()


def test_missing_model_bad_flags_and_overlong_prompts_are_clean_errors(kk_data, tiny_model, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "no-model"), "--data", kk_data["val"]]) == 2
    err = capsys.readouterr().err
    assert "no-model" in err and "does not exist" in err
    assert main(["eval", tiny_model["path"], "--data", kk_data["val"], "--k", "0"]) == 2
    assert "--k=0" in capsys.readouterr().err
    assert main(["eval", tiny_model["path"], "--data", str(tmp_path / "none.parquet")]) == 2
    assert "none.parquet' does not exist" in capsys.readouterr().err
    with pytest.raises(EvaluationError, match="--temperature=0"):
        evaluate(tiny_model["path"], [kk_data["val"]], temperature=0)
    with pytest.raises(DatasetError, match=r"val.parquet:0: the prompt is \d+ tokens.*--max-new-tokens=1000"):
        evaluate(tiny_model["path"], [kk_data["val"]], max_new_tokens=1000)


def test_a_source_without_an_acc_metric_keeps_its_score_as_accuracy_in_a_mixed_chunk(monkeypatch):
    import torch

    import lucidrl.trainer.evaluation as ev
    from lucidrl.workers.rollout.engine import SamplingParams

    class Rollout:
        eos_ids = [9]

        def generate(self, chunk, params):
            batch = {
                "data_source": [s["data_source"] for s in chunk],
                "extra_info": [{} for _ in chunk],
                "ground_truth": [None for _ in chunk],
                "responses": torch.tensor([[4, 5, 9], [4, 5, 6]]),
                "response_mask": torch.ones(len(chunk), 3, dtype=torch.long),
            }
            return type("B", (dict,), {"__len__": lambda self: len(chunk)})(batch)

    class Reward:  # K&K returns "acc"; the GSM8K row gets NaN there, as the manager fills other keys
        score_is_accuracy = True  # built-in rules

        def score(self, batch):
            return {"token_level_scores": torch.tensor([[0.0, 0.0, -0.5], [0.0, 0.0, 1.0]])}, {
                "acc": [0.0, math.nan]
            }

    monkeypatch.setattr(ev, "collate", lambda chunk, pad: chunk)
    samples = [{"data_source": "kk_logic"}, {"data_source": "openai/gsm8k"}]
    rows = ev._generate_and_score(
        Rollout(), Reward(), samples, SamplingParams(n=1), pad_token_id=0, batch_size=2
    )
    assert rows["acc"] == [0.0, 1.0]
    # the second response used its 3 tokens without an eos: cut off
    assert rows["truncated"] == [0.0, 1.0]


@pytest.mark.slow
def test_responses_cut_at_max_new_tokens_are_counted_and_warned_about(kk_data, tiny_model, tmp_path, capsys):
    """A 3-person trace runs to ~400 tokens: at eval's default 256 it was scored as a format failure
    with nothing saying why (found in review)."""
    import torch

    from lucidrl.data.dataset import collate, load_prompts
    from lucidrl.models import load_model, load_tokenizer
    from lucidrl.trainer.evaluation import truncation_warnings
    from lucidrl.workers.rollout.engine import SamplingParams
    from lucidrl.workers.rollout.hf_engine import HFRollout

    result = evaluate(tiny_model["path"], [kk_data["val"]], k=1, max_new_tokens=6, seed=0, sampled=False)
    assert set(result["data_sources"]["kk_logic"]) == {"n_prompts", "n_prompts_by_people", "greedy"}
    # the share is the greedy responses with no eos in their 6 tokens, counted here from the tokens
    tok, model = load_tokenizer(tiny_model["path"]), load_model(tiny_model["path"])
    rollout = HFRollout(model, tok, micro_batch_size=64)
    samples, _ = load_prompts([kk_data["val"]], tok, max_prompt_length=10**9)
    out = rollout.generate(
        collate(samples, tok.pad_token_id), SamplingParams(n=1, do_sample=False, max_new_tokens=6)
    )
    ended = torch.isin(out["responses"], torch.tensor(rollout.eos_ids)).any(-1)
    share = result["data_sources"]["kk_logic"]["greedy"]["truncated"]
    assert share == pytest.approx(1 - ended.float().mean().item()) and share > 0
    assert truncation_warnings(result) == [
        f"kk_logic: {share:.0%} of the greedy responses reached --max-new-tokens=6 without an eos and were "
        "scored cut off (a reasoning trace cut before its </answer> fails the format rule); raise "
        "--max-new-tokens to score them whole"
    ]
    assert (
        main(["eval", tiny_model["path"], "--data", kk_data["val"], "--k", "1", "--max-new-tokens", "6"]) == 0
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert "cut" in printed and "reached --max-new-tokens=6 without an eos" in printed


def test_a_custom_reward_function_and_prompt_column_are_used(kk_data, tiny_model, tmp_path):
    """eval always scored with the built-in rule of each row's data_source and read the 'prompt' column:
    a model trained with reward.custom_function or data.prompt_key could not be evaluated as trained."""
    table = pq.read_table(kk_data["val"])
    renamed = table.rename_columns(["question" if c == "prompt" else c for c in table.column_names])
    pq.write_table(renamed, tmp_path / "q.parquet")
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def always(data_source, solution_str, ground_truth, extra_info):\n"
        "    return {'score': 0.5, 'acc': 1.0}\n"
        "def no_acc(data_source, solution_str, ground_truth, extra_info):\n"
        "    return {'score': 0.1, 'pred': 'none'}\n"
    )
    with pytest.raises(DatasetError, match="set --prompt-key to the prompt column"):
        evaluate(tiny_model["path"], [str(tmp_path / "q.parquet")], k=1, max_new_tokens=2, limit=2)

    def with_reward(name):
        return evaluate(
            tiny_model["path"],
            [str(tmp_path / "q.parquet")],
            k=1,
            max_new_tokens=2,
            limit=2,
            prompt_key="question",
            reward_function=f"{reward}:{name}",
        )

    out = with_reward("always")
    entry = out["data_sources"]["kk_logic"]
    assert entry["greedy"]["acc"] == entry["sampled"]["acc"] == 1.0 and entry["greedy"]["score"] == 0.5
    assert out["reward"] == f"{reward}:always"
    argv = ["eval", tiny_model["path"], "--data", str(tmp_path / "q.parquet"), "--prompt-key", "question"]
    argv += ["--reward", f"{reward}:always", "--k", "1", "--max-new-tokens", "2", "--limit", "2"]
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["reward"] == f"{reward}:always" and saved["data_sources"]["kk_logic"]["greedy"]["acc"] == 1.0
    # a custom score is not an accuracy (a format bonus here); its text extra is no metric
    plain = with_reward("no_acc")["data_sources"]["kk_logic"]["greedy"]
    assert plain["acc"] is None and plain["pass_at_1"] is None and plain["score"] == pytest.approx(0.1)
    builtin = evaluate(tiny_model["path"], [kk_data["val"]], k=1, max_new_tokens=2, limit=2)
    assert builtin["data_sources"]["kk_logic"]["greedy"]["acc"] == 0.0  # 2 tokens: never a right answer
