"""A rollout's stop rule (`rollout.stop_regex`): a response ends with the token after which its text
first matches a regular expression, as SGLang's `stop_regex` ends a request.

The rule is checked on the decoded text of the response so far (special tokens included) after every
token; the token that completes a match is kept and everything after it is padding, out of the response
mask, never scored or trained on. Every engine applies the same rule: lucidrl's decode loop and
transformers' `generate` stop such rows early, vLLM and an HTTP server generate to their end and the
rule cuts after. The tokens before the cut are the same either way (later tokens cannot change earlier
ones); only the time spent on the discarded ones differs.

A row's text is kept as it grows (`IncrementalText`): each token decodes only the tokens since the text
last ended in a whole character, as vLLM's and transformers' streaming detokenizers do. The pattern is
searched only from the leftmost place where a match may still begin (`search_plan`), in ordinary text a
few characters back. So a check costs the same at any response length, except: a pattern that can span
any text (`<think>.*</think>`) is searched from where such a span began, once it has; one with a
backreference is searched over the whole text; and a tokenizer whose decoded text may change in more
than its last few tokens (any decoder but the byte-level one of GPT-2, Qwen and SmolLM, or a cleanup of
spaces) decodes the whole row after every token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import NamedTuple

import torch
from transformers import StoppingCriteria

from lucidrl.config.rollout_checks import check_stop_regex

# the per-row flag an engine's output carries: whether the rule ended the response (not an eos, not the
# length limit); step metrics report its mean as response_length/stop_rule_ratio
STOPPED_FIELD = "stopped_by_rule"

# what a lossy UTF-8 decode writes for bytes that are not (yet) a whole character
REPLACEMENT = "\ufffd"


class IncrementalText:
    """A row's decoded text (`tokenizer.decode(ids)`) kept up to date as tokens are appended, decoding
    only the tokens of the last settled piece and those after it: for tokenizers whose text is their
    tokens' bytes, joined and decoded as UTF-8 (`decode_piecewise` gives their decode)."""

    __slots__ = (
        "_decode", "_ids", "_pieces", "_joined", "_joined_count", "settled", "pending", "_prefix", "_read",
        "_prefix_text",
    )  # fmt: skip

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._pieces: list[str] = []  # the settled text, as it settled
        self._joined = ""  # the first _joined_count pieces, joined when the whole text is asked for
        self._joined_count = 0
        self.settled = 0  # the length of the settled text: the part of the text no later token changes
        self.pending = ""  # the rest: the text of an unfinished character, which later tokens may finish
        # ids[_prefix:_read] decode to the last settled piece: the next decode starts there, so that a
        # token's text is read in the context of the token before it
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""

    def append(self, token: int) -> None:
        self._ids.append(token)
        window = self._decode(self._ids[self._prefix :])
        if not window.startswith(self._prefix_text):
            raise RuntimeError(
                f"decoding tokens {self._ids[self._prefix :]} changed the text of the ones before "
                f"({self._prefix_text!r} became {window!r}): this tokenizer cannot be decoded token by token"
            )
        piece = window[len(self._prefix_text) :]
        # a text ending in U+FFFD may be an unfinished multi-byte character that the next token completes
        # (an emoji split over two byte-level tokens): it waits until the text ends in a whole character
        if piece and not piece.endswith(REPLACEMENT):
            self._pieces.append(piece)
            self.settled += len(piece)
            self.pending = ""
            self._prefix, self._read, self._prefix_text = self._read, len(self._ids), piece
        else:
            self.pending = piece

    @property
    def text(self) -> str:
        """The decoded text of all the tokens appended."""
        if self._joined_count < len(self._pieces):
            self._joined += "".join(self._pieces[self._joined_count :])
            self._joined_count = len(self._pieces)
        return self._joined + self.pending

    def tail(self, start: int) -> str:
        """`text[start:]`, read from the last pieces only."""
        if start <= 0:
            return self.text
        need = self.settled - start
        if need <= 0:
            return self.pending[-need:]
        parts = [self.pending]
        i, got = len(self._pieces), 0
        while got < need:
            i -= 1
            parts.append(self._pieces[i])
            got += len(self._pieces[i])
        return "".join(reversed(parts))[got - need :]


class WholeText:
    """A row's decoded text decoded whole after every token: for tokenizers whose text may change in
    more than the last few tokens."""

    __slots__ = ("_decode", "_ids", "text")

    settled = 0  # no part of the text is known to be final

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self.text = ""

    def append(self, token: int) -> None:
        self._ids.append(token)
        self.text = self._decode(self._ids)

    def tail(self, start: int) -> str:
        return self.text[max(start, 0) :]


def decode_piecewise(tokenizer) -> Callable[[list[int]], str] | None:
    """The decode that `IncrementalText` can grow a row's text with, equal to `tokenizer.decode(ids)` on
    every row: the tokenizers library's own decode, for a tokenizer whose transformers decode is that
    alone and whose decoder is byte-level; None for any other tokenizer."""
    try:
        from tokenizers import decoders
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: decode whole rows
        return None
    cls = type(tokenizer)
    if not (
        isinstance(tokenizer, TokenizersBackend)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is TokenizersBackend._decode
        and isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel)
    ):
        return None
    backend = tokenizer.backend_tokenizer

    def decode(ids: list[int]) -> str:
        return backend.decode(ids, skip_special_tokens=False)

    # transformers may clean up spaces before punctuation after the tokenizers library decodes (" ." to
    # "."), which depends on the text on both sides of a token; whether it does for this tokenizer
    # depends on its config and the transformers version, so a text it would clean up tells
    probe = backend.encode("a . b , c ! d ? e 's f n't g 'm h 've i 're j ' k", add_special_tokens=False).ids
    return decode if tokenizer.decode(probe) == decode(probe) else None


class SearchPlan(NamedTuple):
    """How to search a growing text for a pattern from near its end only (`search_plan`)."""

    live: re.Pattern[str]  # the leftmost start in a settled text where a match might still begin
    behind: int  # how many characters before an attempt's start it may read


def search_plan(regex: re.Pattern[str]) -> SearchPlan | None:
    """For a text that only grows and has held no match so far, where a match could still begin: an
    attempt at a start is dead once the text from there is neither a prefix of a match nor a match
    followed by more text, since no text appended can make it match. `live` finds the leftmost start
    that is not dead by that test on a pattern with its lookarounds, anchors and word boundaries left out
    and its atomic groups and possessive repeats as plain ones, which matches more: a start it finds dead
    is dead. None for a pattern this cannot rewrite (a backreference): that is searched whole."""
    try:
        from re import _compiler as compiler  # Python 3.11 and later
        from re import _constants as c
        from re import _parser as parser
    except ImportError:  # Python 3.10
        import sre_compile as compiler
        import sre_constants as c
        import sre_parse as parser

    units = (c.LITERAL, c.NOT_LITERAL, c.ANY, c.IN)
    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None))
    atomic = getattr(c, "ATOMIC_GROUP", None)

    class Unsupported(Exception):
        pass

    def sub(items: list) -> object:
        return parser.SubPattern(state, items)

    def group(items: list, add_flags: int = 0, del_flags: int = 0) -> tuple:
        return (c.SUBPATTERN, (None, add_flags, del_flags, sub(items)))  # no capture: no group numbers

    def branch(*alternatives: list) -> tuple:
        return (c.BRANCH, (None, [sub(items) for items in alternatives]))

    def relaxed(items) -> list:
        """The items as a pattern that matches at least what they match."""
        out = []
        for op, av in items:
            if op in units:
                out.append((op, av))
            elif op is c.AT or op in (c.ASSERT, c.ASSERT_NOT):
                continue
            elif op is c.BRANCH:
                out.append(branch(*(relaxed(alternative) for alternative in av[1])))
            elif op is c.SUBPATTERN:
                out.append(group(relaxed(av[3]), av[1], av[2]))
            elif op is atomic:
                out.append(group(relaxed(av)))
            elif op in repeats:
                lo, hi, item = av
                inner = relaxed(item)
                if inner and hi:
                    out.append((c.MAX_REPEAT, (lo, hi, sub(inner))))
            elif op is c.GROUPREF_EXISTS:
                out.append(branch(relaxed(av[1]), relaxed(av[2]) if av[2] is not None else []))
            else:  # a backreference, or an operator this code does not know
                raise Unsupported
        return out

    def prefixes(items) -> list:
        """A pattern matching at least every prefix of what the items match (empty text included)."""
        items = list(items)
        if not items:
            return []
        (op, av), rest = items[0], items[1:]
        if op is c.AT or op in (c.ASSERT, c.ASSERT_NOT):
            return prefixes(rest)  # reads no text: left out
        whole = relaxed([(op, av)])
        # `shorter`: the prefixes of the first item that are not all of it (None: there are none). For one
        # character, and repeats of one, they share no text with `whole`: each text has one way through,
        # not several for the engine to try (`\s*\s?` for `\s*`)
        if op in units:
            shorter = []
        elif op in repeats and len(av[2]) == 1 and av[2][0][0] in units:
            lo, hi, item = av
            shorter = None if lo == 0 else [] if lo == 1 else [(c.MAX_REPEAT, (0, lo - 1, item))]
        elif op is c.BRANCH:
            shorter = [branch(*(prefixes(alternative) for alternative in av[1]))]
        elif op is c.SUBPATTERN:
            shorter = [group(prefixes(av[3]), av[1], av[2])]
        elif op is atomic:
            shorter = prefixes(av)
        elif op in repeats:
            # a prefix of up to hi repeats is fewer than hi whole ones and a prefix of one more
            lo, hi, item = av
            inner = relaxed(item)
            shorter = []
            if inner and hi not in (0, 1):
                shorter.append((c.MAX_REPEAT, (0, hi if hi == c.MAXREPEAT else hi - 1, sub(inner))))
            shorter += prefixes(item) if hi else []
        elif op is c.GROUPREF_EXISTS:
            shorter = [branch(prefixes(av[1]), prefixes(av[2]) if av[2] is not None else [])]
        else:
            raise Unsupported
        # a prefix of the first item, or all of it and a prefix of the rest
        then = whole + prefixes(rest)
        return then if shorter is None else [branch(shorter, then)]

    def behind(items) -> int:
        """How many characters before where the items start matching their lookbehinds may read."""
        most = 0
        for op, av in items:
            if op in (c.ASSERT, c.ASSERT_NOT):
                direction, item = av
                most += behind(item) + (item.getwidth()[1] if direction == -1 else 0)
            elif op is c.BRANCH:
                most += max(behind(alternative) for alternative in av[1])
            elif op is c.SUBPATTERN:
                most += behind(av[3])
            elif op is atomic:
                most += behind(av)
            elif op in repeats:
                most += behind(av[2])
            elif op is c.GROUPREF_EXISTS:
                most += max(behind(av[1]), behind(av[2]) if av[2] is not None else 0)
        return most

    try:
        parsed = parser.parse(regex.pattern)  # as check_stop_regex compiles it: no flags
        state = parsed.state
        everything = (c.IN, [(c.CATEGORY, c.CATEGORY_SPACE), (c.CATEGORY, c.CATEGORY_NOT_SPACE)])
        live = prefixes([*parsed, (c.MAX_REPEAT, (0, c.MAXREPEAT, sub([everything])))])
        # +1: an anchor or \b where an attempt starts reads the character before it
        return SearchPlan(compiler.compile(sub([*live, (c.AT, c.AT_END_STRING)])), behind(parsed) + 1)
    except Exception:  # Unsupported, or the parser of a Python version this was not written for
        return None


class StopRule:
    """The rule for one pattern and tokenizer: which rows have matched, and where a finished row is cut."""

    def __init__(self, pattern: str, tokenizer, eos_ids: Sequence[int]):
        self.pattern = pattern
        self.regex = check_stop_regex(pattern, "rollout.stop_regex")
        self.tokenizer = tokenizer
        self.eos_ids = set(int(i) for i in eos_ids)
        self.plan = search_plan(self.regex)
        self._piecewise = decode_piecewise(tokenizer)

    def row_text(self) -> IncrementalText | WholeText:
        """An empty row's text, to append a row's tokens to."""
        if self._piecewise is not None:
            return IncrementalText(self._piecewise)
        return WholeText(self.tokenizer.decode)

    def scanner(self) -> StopScanner:
        """A check of rows that grow one token at a time (one per generate call)."""
        return StopScanner(self)

    def stop_length(self, ids: Sequence[int]) -> int | None:
        """How many of `ids` the rule keeps: the length of the shortest prefix whose text matches; None when
        no prefix does. Prefixes are checked in order, so a pattern that stops matching when more text
        follows (an anchor at the end, a lookahead) cuts where an engine stopping early would."""
        row = _RowScan(self)
        for length, token in enumerate(ids, 1):
            if row.push(int(token)):
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


class _RowScan:
    """One row's text and whether it has matched yet."""

    __slots__ = ("rule", "text", "matched", "live")

    def __init__(self, rule: StopRule):
        self.rule = rule
        self.text = rule.row_text()
        self.matched = False
        self.live = 0  # where in the text the leftmost match that may still come can start

    def push(self, token: int) -> bool:
        """Append `token`; whether the row's text has matched (a row ends at its first match, so tokens
        pushed after it are not read)."""
        if self.matched:
            return True
        text = self.text
        text.append(token)
        plan = self.rule.plan
        if plan is None:
            self.matched = self.rule.regex.search(text.text) is not None
            return self.matched
        # no match can start before `live` (see search_plan); `search(chunk, pos)` still lets an attempt
        # look behind pos (a lookbehind, \b, ^) as in the whole text, so the chunk keeps enough before it
        start = max(self.live - plan.behind, 0)
        chunk = text.tail(start)
        self.matched = self.rule.regex.search(chunk, self.live - start) is not None
        if not self.matched:
            # the pending text may still change: only the settled text decides which starts are dead
            found = plan.live.search(chunk[: text.settled - start], self.live - start)
            if found is not None:
                self.live = start + found.start()
        return self.matched


class StopScanner:
    """The rule's running check of one generate call's rows: rows (numbered by the caller) are only ever
    appended to, one token at a time, and each push says which of the pushed rows have matched."""

    def __init__(self, rule: StopRule):
        self.rule = rule
        self._rows: dict[int, _RowScan] = {}

    def push(self, rows: Sequence[int], tokens: Sequence[int]) -> list[bool]:
        """Append `tokens[j]` to row `rows[j]`; whether each of those rows' text has matched."""
        out = []
        for row, token in zip(rows, tokens, strict=True):
            scan = self._rows.get(row)
            if scan is None:
                scan = self._rows[row] = _RowScan(self.rule)
            out.append(scan.push(token))
        return out


@lru_cache(maxsize=8)
def _rule(pattern: str, tokenizer, eos_ids: tuple[int, ...]) -> StopRule:
    return StopRule(pattern, tokenizer, eos_ids)


def stop_rule(pattern: str | None, tokenizer, eos_ids: Sequence[int]) -> StopRule | None:
    """The rule for `pattern` (None: no rule), built once per pattern, tokenizer and eos ids."""
    return None if pattern is None else _rule(pattern, tokenizer, tuple(eos_ids))


class StopRuleCriteria(StoppingCriteria):
    """The rule as transformers' stopping criterion, one per generate call: rows whose response (after
    `prompt_width` columns) has matched stop; generate pads them from there, and StopRule.cut drops what
    it padded. A row that has emitted an eos is done too, and its padding is not read."""

    def __init__(self, rule: StopRule, prompt_width: int):
        self.rule = rule
        self.prompt_width = prompt_width
        self._scanner: StopScanner | None = None
        self._read = prompt_width  # the columns of input_ids read so far
        self._done: list[bool] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.BoolTensor:
        width = input_ids.shape[1]
        if self._scanner is None or width <= self._read or len(self._done) != input_ids.shape[0]:
            # the first call, or the criterion given to another generate call: its rows start anew
            self._scanner = self.rule.scanner()
            self._read = self.prompt_width
            self._done = [False] * input_ids.shape[0]
        # generate hands over the whole sequences each call: only the columns added since the last one
        # are new (one, unless an assistant model proposed several)
        for column in input_ids[:, self._read :].t().tolist():
            rows = [i for i, done in enumerate(self._done) if not done]
            hits = self._scanner.push(rows, [column[i] for i in rows])
            for i, hit in zip(rows, hits, strict=True):
                self._done[i] = hit or column[i] in self.rule.eos_ids
        self._read = width
        return torch.tensor(self._done, dtype=torch.bool, device=input_ids.device)
