"""A rollout's stop rule (`rollout.stop_regex`): a response ends with the token after which its text
first matches a regular expression, as SGLang's `stop_regex` ends a request.

The rule is checked on the decoded text of the response so far (special tokens included) after every
token; the token that completes a match is kept and everything after it is padding, out of the response
mask, never scored or trained on. Every engine applies the same rule: lucidrl's decode loop and
transformers' `generate` stop such rows early, vLLM and an HTTP server generate to their end and the
rule cuts after. The tokens before the cut are the same either way (later tokens cannot change earlier
ones); only the time spent on the discarded ones differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
from transformers import StoppingCriteria

from lucidrl.config.validation import check_stop_regex

# the per-row flag an engine's output carries: whether the rule ended the response (not an eos, not the
# length limit); step metrics report its mean as response_length/stop_rule_ratio
STOPPED_FIELD = "stopped_by_rule"


class StopRule:
    """The rule for one pattern and tokenizer: which rows have matched, and where a finished row is cut."""

    def __init__(self, pattern: str, tokenizer, eos_ids: Sequence[int]):
        self.pattern = pattern
        self.regex = check_stop_regex(pattern, "rollout.stop_regex")
        self.tokenizer = tokenizer
        self.eos_ids = set(int(i) for i in eos_ids)

    def matched(self, rows: Sequence[Sequence[int]]) -> list[bool]:
        """Whether each row's text (its tokens so far) holds a match."""
        texts = self.tokenizer.batch_decode([list(r) for r in rows])
        return [self.regex.search(text) is not None for text in texts]

    def stop_length(self, ids: Sequence[int]) -> int | None:
        """How many of `ids` the rule keeps: the length of the shortest prefix whose text matches; None when
        no prefix does. Prefixes are checked in order, so a pattern that stops matching when more text
        follows (an anchor at the end, a lookahead) cuts where an engine stopping early would."""
        ids = list(ids)
        prefixes = self.tokenizer.batch_decode([ids[:end] for end in range(1, len(ids) + 1)])
        for length, text in enumerate(prefixes, 1):
            if self.regex.search(text) is not None:
                return length
        return None

    def cut(self, responses: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded responses (bs, R) and their mask (1 over each row's tokens, from the left): the
        mask with every token after each row's stop zeroed, and whether the rule ended each row (bs,) — a
        row whose kept text ends in an eos ended by itself."""
        lengths = mask.sum(-1).tolist()
        rows = responses.tolist()
        keep = list(lengths)
        stopped = [False] * len(rows)
        for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
            at = self.stop_length(row[:n]) if n else None
            if at is not None:
                keep[i] = at
                stopped[i] = row[at - 1] not in self.eos_ids
        cols = torch.arange(mask.shape[1], device=mask.device)
        kept = (cols[None, :] < torch.tensor(keep, device=mask.device)[:, None]).to(mask.dtype)
        return mask * kept, torch.tensor(stopped, dtype=torch.bool, device=mask.device)


@lru_cache(maxsize=8)
def _rule(pattern: str, tokenizer, eos_ids: tuple[int, ...]) -> StopRule:
    return StopRule(pattern, tokenizer, eos_ids)


def stop_rule(pattern: str | None, tokenizer, eos_ids: Sequence[int]) -> StopRule | None:
    """The rule for `pattern` (None: no rule), built once per pattern, tokenizer and eos ids."""
    return None if pattern is None else _rule(pattern, tokenizer, tuple(eos_ids))


class StopRuleCriteria(StoppingCriteria):
    """The rule as transformers' stopping criterion: rows whose response (after `prompt_width` columns)
    has matched stop; generate pads them from there, and StopRule.cut drops what it padded."""

    def __init__(self, rule: StopRule, prompt_width: int):
        self.rule = rule
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.BoolTensor:
        done = self.rule.matched(input_ids[:, self.prompt_width :].tolist())
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
