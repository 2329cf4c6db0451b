import pytest
import torch

from lucidrl.batch import Batch
from lucidrl.rewards.custom import CustomFunctionError
from lucidrl.rewards.manager import RewardFunctionError, RuleRewardManager


def _batch(tok, texts, gts, data_source="kk_logic"):
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, ids)) + 2
    responses = torch.full((len(ids), width), tok.pad_token_id)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    n = len(texts)
    return Batch(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": [data_source] * n,
            "ground_truth": gts,
            "extra_info": [{"index": i} for i in range(n)],
            "assistant_prefix": ["<think>"] * n,
        },
    )


GT = {
    "solution_text_format": "(1) Zoey is a knight\n(2) Oliver is a knave",
    "names": ["Zoey", "Oliver"],
    "knights": [True, False],
}


def test_kk_scores_land_on_the_last_response_token(tiny_tokenizer):
    right = " reasoning </think> <answer> (1) Zoey is a knight\n(2) Oliver is a knave </answer>"
    wrong = " reasoning </think> <answer> (1) Zoey is a knave\n(2) Oliver is a knave </answer>"
    batch = _batch(tiny_tokenizer, [right, wrong, "garbage"], [GT, GT, GT])
    out, extras = RuleRewardManager(tiny_tokenizer).score(batch)
    scores = out["token_level_scores"]
    last = batch["response_mask"].sum(-1) - 1
    assert scores.sum(-1).tolist() == [3.0, -0.5, -3.0]
    assert [scores[i, last[i]].item() for i in range(3)] == [3.0, -0.5, -3.0]
    assert extras["acc"] == [1.0, 0.0, 0.0]
    assert out["response_text"][0].startswith("<think> reasoning")


def test_custom_function_from_config(tmp_path, tiny_tokenizer):
    f = tmp_path / "my_reward.py"
    f.write_text(
        "def score_len(data_source, solution_str, ground_truth, extra_info):\n"
        "    return {'score': float(len(solution_str)), 'is_long': float(len(solution_str) > 10)}\n"
        "def broken(data_source, solution_str, ground_truth, extra_info):\n"
        "    raise KeyError('missing_field')\n"
    )
    batch = _batch(tiny_tokenizer, ["abc", "abcdefghijklmnop"], ["x", "y"], data_source="my_task")
    out, extras = RuleRewardManager.from_config(tiny_tokenizer, str(f), "score_len").score(batch)
    assert out["token_level_scores"].sum(-1).tolist() == [len("<think>abc"), len("<think>abcdefghijklmnop")]
    assert extras["is_long"] == [0.0, 1.0]
    with pytest.raises(
        RewardFunctionError,
        match=r"(?s)raised KeyError: 'missing_field'.*data_source='my_task', sample 0.*my_reward.py\", line 4",
    ):
        RuleRewardManager.from_config(tiny_tokenizer, str(f), "broken").score(batch)
    with pytest.raises(CustomFunctionError, match="nope"):
        RuleRewardManager.from_config(tiny_tokenizer, str(f), "nope")


def test_custom_functions_are_called_by_keyword_as_verl_calls_them(tmp_path, tiny_tokenizer):
    """A function written for verl with its parameters in another order scored 0.0 silently (called by
    position, solution_str got the data_source); one with other names is refused when loaded."""
    f = tmp_path / "verl_style.py"
    f.write_text(
        "def reordered(solution_str, ground_truth, data_source=None, extra_info=None):\n"
        "    return float(ground_truth in solution_str and data_source == 'my_task')\n"
        "def keyword_only(*, data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(ground_truth in solution_str)\n"
        "def other_names(ds, text, gt, info):\n"
        "    return 1.0\n"
    )
    batch = _batch(tiny_tokenizer, ["so x", "no"], ["x", "y"], data_source="my_task")
    for name in ("reordered", "keyword_only"):
        out, _ = RuleRewardManager.from_config(tiny_tokenizer, str(f), name).score(batch)
        assert out["token_level_scores"].sum(-1).tolist() == [1.0, 0.0], name
    with pytest.raises(CustomFunctionError, match=r"other_names\(ds, text, gt, info\) cannot be called as"):
        RuleRewardManager.from_config(tiny_tokenizer, str(f), "other_names")


def test_text_extras_are_left_out_of_the_metrics_and_said_once(tmp_path, tiny_tokenizer, caplog):
    """verl's math_dapo returns {"score", "acc", "pred": "<parsed answer>"}: a function returning it
    stopped the run (RewardOutputError); the text is no metric, so it is left out, with one warning."""
    f = tmp_path / "dapo_like.py"
    f.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 1.0, 'acc': True, 'pred': solution_str[-3:]}\n"
    )
    manager = RuleRewardManager.from_config(tiny_tokenizer, str(f), "compute_score")
    assert manager.score_is_accuracy is False and RuleRewardManager(tiny_tokenizer).score_is_accuracy
    batch = _batch(tiny_tokenizer, ["abc", "defg"], ["x", "y"], data_source="my_task")
    with caplog.at_level("WARNING"):
        out, extras = manager.score(batch)
        manager.score(batch)
    assert extras == {"acc": [1.0, 1.0]} and out["token_level_scores"].sum(-1).tolist() == [1.0, 1.0]
    warned = [r.getMessage() for r in caplog.records if "'pred'" in r.getMessage()]
    assert len(warned) == 1 and "not a metric" in warned[0]


def test_unknown_data_source_is_an_error(tiny_tokenizer):
    batch = _batch(tiny_tokenizer, ["x"], ["1"], data_source="kk_logik")
    with pytest.raises(Exception, match="kk_logik.*kk_logic"):
        RuleRewardManager(tiny_tokenizer).score(batch)
