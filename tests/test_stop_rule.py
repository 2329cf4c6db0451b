"""rollout.stop_regex: a response ends with the token after which its text first matches, in every engine."""

from __future__ import annotations

import pytest
import torch

from lucidrl.config import config_from_dict
from lucidrl.config.errors import ConfigError
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model
from lucidrl.workers.rollout_hf import HFRollout, SamplingParams, batch_from_token_lists
from lucidrl.workers.stop_rule import STOPPED_FIELD, StopRule

# a capitalised word, a space and a lower-case word: in about half of the tiny model's sampled rows
TWO_WORDS = r"[A-Z][a-z]+ [a-z]+ "


def _prompts(kk_data, tok, k=3):
    samples, _ = load_prompts([kk_data["train"]], tok, max_prompt_length=2048)
    return collate(samples[:k], tok.pad_token_id)


def _by_hand(rule: StopRule, out) -> tuple[list[list[int]], list[bool]]:
    """Each row's tokens as the rule keeps them, and whether it stopped, found by decoding prefixes here."""
    kept, stopped = [], []
    for row, mask in zip(out["responses"].tolist(), out["response_mask"].tolist(), strict=True):
        row = row[: sum(mask)]
        at = next(
            (k for k in range(1, len(row) + 1) if rule.regex.search(rule.tokenizer.decode(row[:k]))), None
        )
        kept.append(row if at is None else row[:at])
        stopped.append(at is not None and row[at - 1] not in rule.eos_ids)
    return kept, stopped


def _rows(out) -> list[list[int]]:
    return [r[: int(m.sum())] for r, m in zip(out["responses"].tolist(), out["response_mask"], strict=True)]


def test_stop_length_is_the_shortest_matching_prefix(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok.encode("Emily is a knight. The answer is 42. The answer is 42.", add_special_tokens=False)
    rule = StopRule(r"answer is \d+\.", tok, [tok.eos_token_id])
    at = rule.stop_length(ids)
    assert tok.decode(ids[:at]).endswith("answer is 42.")
    assert not rule.regex.search(tok.decode(ids[: at - 1]))
    assert rule.stop_length(tok.encode("no number here", add_special_tokens=False)) is None
    # a pattern that stops matching as text follows (the whole text ends in "."), cuts at its first
    # match, where an engine stopping early would have stopped
    digit_last = StopRule(r"\d$", tok, [tok.eos_token_id])
    assert digit_last.regex.search(tok.decode(ids)) is None
    text = tok.decode(ids[: digit_last.stop_length(ids)])
    assert text[-1].isdigit() and text.count("answer is") == 1


def test_cut_zeroes_the_mask_after_the_stop_and_an_eos_ending_is_not_a_stop(tiny_tokenizer):
    tok = tiny_tokenizer
    eos = tok.eos_token_id
    rule = StopRule(r"knight\.", tok, [eos])
    a = tok.encode("Emily is a knight. Noah is", add_special_tokens=False)
    b = tok.encode("Emily is a knight", add_special_tokens=False) + [eos]
    width = max(len(a), len(b)) + 2
    responses = torch.full((2, width), tok.pad_token_id)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, row in enumerate((a, b)):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    cut, stopped = rule.cut(responses, mask)
    keep = rule.stop_length(a)
    assert keep < len(a) and cut[0].tolist() == [1] * keep + [0] * (width - keep)
    assert torch.equal(cut[1], mask[1])  # no match before its eos: untouched
    assert stopped.tolist() == [True, False]


@pytest.mark.parametrize(
    "pattern, says",
    [("answer is (\\d+", "not a Python regular expression"), ("\\d*", "matches the empty text")],
)
def test_config_refuses_a_pattern_that_cannot_stop_anything_sensibly(pattern, says):
    with pytest.raises(ConfigError, match=says) as e:
        config_from_dict({"rollout": {"stop_regex": pattern}}, source="test")
    assert "rollout.stop_regex" in str(e.value) and repr(pattern) in str(e.value)


def test_config_refuses_a_stop_rule_with_multi_turn():
    with pytest.raises(ConfigError, match="multi_turn"):
        config_from_dict(
            {"rollout": {"stop_regex": "done", "multi_turn": {"enable": True, "tools": ["calculator"]}}},
            source="test",
        )


def test_lucidrl_loop_stops_rows_where_the_rule_cuts_a_free_run(kk_data, tiny_model, tiny_tokenizer):
    """Sampled: a row's draws are fixed by the row and the step, so with the rule each row holds exactly
    the free run's tokens up to its first match, with the same log-probs, and padding after."""
    model = load_model(tiny_model["path"])
    batch = _prompts(kk_data, tiny_tokenizer)
    rollout = HFRollout(model, tiny_tokenizer)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24)
    torch.manual_seed(0)
    free = rollout.generate(batch, params)
    torch.manual_seed(0)
    ruled = rollout.generate(batch, SamplingParams(**{**params.__dict__, "stop_regex": TWO_WORDS}))
    rule = StopRule(TWO_WORDS, tiny_tokenizer, rollout.eos_ids)
    kept, stopped = _by_hand(rule, free)
    assert _rows(ruled) == kept and ruled[STOPPED_FIELD].tolist() == stopped
    assert 0 < sum(stopped) < len(stopped)  # the test means something: some rows stop, some do not
    mask = ruled["response_mask"].bool()
    width = ruled["responses"].shape[1]
    # equal up to float rounding: with rows stopped, the batch compacts at other steps
    torch.testing.assert_close(ruled["rollout_log_probs"][mask], free["rollout_log_probs"][:, :width][mask])
    assert torch.all(ruled["rollout_log_probs"][~mask] == 0)
    assert torch.all(ruled["responses"][~mask] == tiny_tokenizer.pad_token_id)


@pytest.mark.parametrize("loop", ["lucidrl", "transformers"])
def test_both_decode_loops_cut_greedy_rows_alike(kk_data, tiny_model, tiny_tokenizer, loop):
    """transformers' generate stops a matched row and pads it (pad is not eos here): the cut drops that."""
    model = load_model(tiny_model["path"])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # moved off its greedy fixed point (every token <think>): rows that differ
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    batch = _prompts(kk_data, tiny_tokenizer, k=4)
    rollout = HFRollout(model, tiny_tokenizer, decode_loop=loop)
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=24)
    free = rollout.generate(batch, params)
    names = "Aurora|Oliver|Noah"  # in three of the four greedy rows
    ruled = rollout.generate(batch, SamplingParams(**{**params.__dict__, "stop_regex": names}))
    kept, stopped = _by_hand(StopRule(names, tiny_tokenizer, rollout.eos_ids), free)
    assert _rows(ruled) == kept and ruled[STOPPED_FIELD].tolist() == stopped
    assert 0 < sum(stopped) < len(stopped)


def test_token_lists_from_an_engine_are_cut_by_the_rule(kk_data, tiny_tokenizer):
    """The vllm and server engines' path: whole responses in, cut by the rule, log-probs after it zeroed."""
    tok = tiny_tokenizer
    batch = _prompts(kk_data, tok, k=1)
    texts = ["Emily is a knight. Noah is a knave.", "Noah lies", "Emily is a knight."]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    ids[1].append(tok.eos_token_id)
    logps = [[-0.5] * len(x) for x in ids]
    params = SamplingParams(n=3, max_new_tokens=32, stop_regex=r"knight\.")
    out = batch_from_token_lists(batch, params, ids, logps, tok.pad_token_id, [tok.eos_token_id], tok)
    rule = StopRule(r"knight\.", tok, [tok.eos_token_id])
    first = rule.stop_length(ids[0])
    assert _rows(out) == [ids[0][:first], ids[1], ids[2]]
    assert out[STOPPED_FIELD].tolist() == [True, False, True]
    assert out["rollout_log_probs"].sum().item() == pytest.approx(-0.5 * int(out["response_mask"].sum()))
    with pytest.raises(ValueError, match="needs the tokenizer"):
        batch_from_token_lists(batch, params, ids, logps, tok.pad_token_id, [tok.eos_token_id])


def test_a_run_with_a_stop_rule_reports_the_share_it_ended(tmp_path, kk_data, tiny_model):
    """Through `lucidrl train`: the rule ends training rollouts, and the step reports the share it ended."""
    import json

    from helpers import write_train_config

    from lucidrl.cli import main

    config = write_train_config(
        tmp_path, kk_data, tiny_model, trainer={"total_training_steps": 1}, rollout={"temperature": 1.0}
    )
    assert main(["train", str(config), f"rollout.stop_regex={TWO_WORDS}"]) == 0
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 0 < records[1]["response_length/stop_rule_ratio"] < 1
    assert "response_length/stop_rule_ratio" not in records[0]  # validation only: no training batch


def test_training_and_validation_sampling_both_carry_the_rule():
    from lucidrl.trainer.setup import train_sampling, val_sampling

    cfg = config_from_dict({"rollout": {"stop_regex": TWO_WORDS}}, source="test")
    assert train_sampling(cfg).stop_regex == val_sampling(cfg).stop_regex == TWO_WORDS


def test_eval_applies_the_rule_and_refuses_a_bad_pattern(kk_data, tiny_model, capsys):
    from lucidrl.cli import main
    from lucidrl.trainer.evaluation import evaluate

    kw = dict(k=4, temperature=1.0, max_new_tokens=16, batch_size=16, seed=0)
    free = evaluate(tiny_model["path"], [kk_data["val"]], **kw)
    ruled = evaluate(tiny_model["path"], [kk_data["val"]], stop_regex=TWO_WORDS, **kw)
    assert ruled["stop_regex"] == TWO_WORDS
    a, b = free["data_sources"]["kk_logic"]["sampled"], ruled["data_sources"]["kk_logic"]["sampled"]
    # the same samples, cut: shorter, and the rows the rule ended are not counted as cut at the limit
    assert b["response_length"] < a["response_length"] and b["truncated"] < a["truncated"]
    code = main(["eval", tiny_model["path"], "--data", kk_data["val"], "--stop-regex", "(unclosed"])
    assert code != 0 and "--stop-regex='(unclosed'" in capsys.readouterr().err
