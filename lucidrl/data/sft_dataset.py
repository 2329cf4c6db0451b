"""Parquet (prompt, response) rows → token ids with labels on the response tokens only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lucidrl.data.dataset import check_chat_template, read_table
from lucidrl.data.prompt_format import DatasetError, check_messages, render_chat

IGNORE = -100  # label of a token that carries no loss (prompt, padding)


@dataclass
class SFTSample:
    input_ids: list[int]
    n_prompt: int  # the first n_prompt tokens carry no loss


def load_sft_rows(
    files: list[str], tokenizer, *, max_length: int, prompt_key: str, response_key: str, what: str
) -> list[SFTSample]:
    """Tokenize prompt (chat template) and response (+ eos) of every row; rows longer than max_length are
    an error naming how many, the longest and where (verl's default, data.truncation=error)."""
    if not files:
        raise DatasetError(
            f"{what} is empty; give at least one parquet file with prompt and response columns"
        )
    if tokenizer.eos_token_id is None:
        raise DatasetError(
            "the tokenizer has no eos token; SFT responses must end with one so the model learns to stop"
        )
    check_chat_template(tokenizer, what)
    samples = []
    too_long: list[tuple[int, str]] = []  # (tokens, where)
    rows = 0
    for file in files:
        table = read_table(file, what)
        for col in (prompt_key, response_key):
            if col not in table.column_names:
                raise DatasetError(
                    f"{what}: '{file}' has no column '{col}' (it has: {', '.join(table.column_names)}); "
                    f"set data.prompt_key / data.response_key, or write the data with `lucidrl data kk`"
                )
        prompts = table.column(prompt_key).to_pylist()
        responses = table.column(response_key).to_pylist()
        for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            where = f"{file} row {i}"
            if not isinstance(response, str) or not response:
                raise DatasetError(
                    f"{where}: column '{response_key}' must be a non-empty string, got {response!r}"
                )
            text, _ = render_chat(tokenizer, check_messages(prompt, where, prompt_key))
            p_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            r_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
            if not r_ids or r_ids[-1] != tokenizer.eos_token_id:  # one eos, also where the text has it (TRL)
                r_ids = r_ids + [tokenizer.eos_token_id]
            if len(p_ids) + len(r_ids) > max_length:
                too_long.append((len(p_ids) + len(r_ids), where))
                continue
            samples.append(SFTSample(p_ids + r_ids, len(p_ids)))
            rows += 1
    if too_long:  # every row checked first: the error says how many and how long, not only the first
        rows += len(too_long)
        longest, at = max(too_long)
        first = ", ".join(f"{w} ({n})" for n, w in too_long[:3])
        raise DatasetError(
            f"{what}: {len(too_long)} of {rows} rows are longer than data.max_length={max_length} tokens "
            f"(prompt + response + eos), the longest {longest} tokens ({at}); first: {first}. Raise "
            f"data.max_length to {longest}, or shorten or leave out those rows (none is truncated or "
            "dropped silently)"
        )
    return samples


def collate_sft(samples: list[SFTSample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels (IGNORE on prompt and padding)."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(samples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        labels[i, s.n_prompt : n] = ids[i, s.n_prompt : n]
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_micro_batches(
    rows: list[SFTSample], size: int, *, length_sorted: bool, max_tokens: int | None = None
) -> list[list[SFTSample]]:
    """A step's rows cut into the pieces that go through one forward/backward; every row once.

    Each piece is padded to its own longest row, so with `length_sorted` (rows ordered by length,
    ties in batch order) similar lengths share a piece and little is spent on padding: with K&K
    traces of 2 and 3 people, a random batch of 32 is about half padding. The step's loss is summed
    over every response token and divided by the batch's count, so the gradient does not depend on
    how the rows are cut. `max_tokens` (data.use_dynamic_bsz, verl's SFT name) cuts by padded tokens
    (rows x longest row) instead of `size` rows; a row longer than the budget raises DatasetError.
    """
    order = sorted(rows, key=lambda r: len(r.input_ids)) if length_sorted else list(rows)
    if max_tokens is None:
        return [order[i : i + size] for i in range(0, len(order), size)]
    pieces: list[list[SFTSample]] = []
    current: list[SFTSample] = []
    width = 0  # the current piece's longest row
    for row in order:
        if len(row.input_ids) > max_tokens:
            raise DatasetError(
                f"an SFT row is {len(row.input_ids)} tokens, more than data.max_token_len_per_gpu="
                f"{max_tokens}; raise it to at least data.max_length"
            )
        if current and max(width, len(row.input_ids)) * (len(current) + 1) > max_tokens:
            pieces.append(current)
            current, width = [], 0
        current.append(row)
        width = max(width, len(row.input_ids))
    if current:
        pieces.append(current)
    return pieces


def sft_batches(
    samples: list[SFTSample], batch_size: int, *, shuffle: bool, seed: int
) -> Iterator[list[SFTSample]]:
    """Endless batches: reshuffled each epoch, an incomplete last batch dropped."""
    if batch_size > len(samples):
        raise DatasetError(f"data.batch_size={batch_size} is larger than the {len(samples)} training rows")
    epoch = 0
    while True:
        order = list(range(len(samples)))
        if shuffle:
            order = torch.randperm(
                len(samples), generator=torch.Generator().manual_seed(seed + epoch)
            ).tolist()
        for b in range(len(samples) // batch_size):
            yield [samples[i] for i in order[b * batch_size : (b + 1) * batch_size]]
        epoch += 1
