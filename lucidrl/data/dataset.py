"""Parquet prompts in verl's schema → chat template (or raw text) → token ids, and batches of them.

Each row needs `data_source`, the prompt column (chat messages) and `reward_model.ground_truth`;
`extra_info` is optional. A prompt whose last message is from the assistant (Logic-RL pre-fills
"<think>") is rendered with `continue_final_message`, and that pre-filled text is kept as the
sample's `assistant_prefix` so the reward sees the whole assistant turn. A prompt that carries its own
chat markup (the files of verl's TinyZero and Logic-RL forks) is fed as written (prompt_format.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from lucidrl.batch import Batch
from lucidrl.data.prompt_format import DatasetError, render_prompt

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("data_source", "reward_model")


@dataclass
class PromptSample:
    """One tokenized prompt with what the reward function needs."""

    input_ids: list[int]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any]
    assistant_prefix: str
    source: str  # "file:row", for error messages
    messages: list[dict[str, str]] = field(default_factory=list)  # the chat as written, for re-rendering
    raw: bool = False  # fed as written, its own chat markup included (data.prompt_format)


def row_of(sample: PromptSample) -> str:
    """Where a sample came from, as errors name it: "FILE row I"."""
    file, _, row = sample.source.rpartition(":")
    return f"{file} row {row}"


@dataclass
class FilterReport:
    """What loading dropped, so a run can say it (never silently)."""

    total_rows: int = 0
    overlong_filtered: int = 0
    truncated: int = 0  # overlong prompts cut to data.max_prompt_length (data.truncation)
    raw_prompts: int = 0  # prompts fed as written, their own chat markup included (data.prompt_format)
    longest_prompt: int = 0


def check_chat_template(tokenizer: Any, what: str) -> None:
    """DatasetError unless `tokenizer` has a chat template: every prompt is rendered with it (a string
    prompt too, as one user message). Without, transformers fails at the first row with a ValueError
    that names neither the tokenizer's folder nor the setting."""
    if getattr(tokenizer, "chat_template", None):
        return
    where = getattr(tokenizer, "name_or_path", "") or "?"
    raise DatasetError(
        f"{what}: the tokenizer from '{where}' (model.tokenizer_path, else model.path) has no chat template, "
        "and lucidrl renders every prompt with it; use the tokenizer of a chat or instruct model "
        "(model.tokenizer_path), or give this one a template: tokenizer.chat_template = '...' then "
        "tokenizer.save_pretrained(FOLDER) (`lucidrl model tiny` writes one)"
    )


def read_table(file: str, what: str) -> Any:
    """One parquet file of `what` (a config key) as a pyarrow Table; DatasetError naming the file when it is
    missing, unreadable or holds no rows."""
    path = Path(file)
    if path.is_dir():
        inside = sorted(str(p) for p in path.rglob("*.parquet"))
        listed = (
            f"; it holds {len(inside)} parquet file(s): {what}=[{', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''}]"
            if inside
            else " (it holds no .parquet file)"
        )
        raise DatasetError(
            f"{what}: '{file}' is a directory, not a parquet file; give the parquet file(s) in it{listed}"
        )
    if not path.is_file():
        raise DatasetError(f"{what}: file '{file}' does not exist")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise DatasetError(f"{what}: '{file}' is not a readable parquet file: {e}") from e
    if table.num_rows == 0:
        raise DatasetError(
            f"{what}: '{file}' holds no rows (columns: {', '.join(table.column_names) or 'none'}); "
            "write the data again, or leave the file out of the list"
        )
    return table


def table_rows(table: Any, file: str, what: str) -> list[dict[str, Any]]:
    """A table's rows as dicts; DatasetError naming the row, the column and the byte for a string that is
    not UTF-8 (parquet's strings must be, but a writer can store any bytes as one), where pyarrow raises
    a UnicodeDecodeError that names neither."""
    try:
        return table.to_pylist()
    except UnicodeDecodeError:
        pass
    for column in table.column_names:
        for i in range(table.num_rows):
            try:
                table.column(column).slice(i, 1).to_pylist()
            except UnicodeDecodeError as exc:
                raise DatasetError(
                    f"{what}: '{file}' row {i}, column '{column}', holds bytes that are not UTF-8 text ({exc.reason} "
                    f"at byte {exc.start}: {exc.object[max(0, exc.start - 20) : exc.start + 4]!r}); the file was "
                    "written from text in another encoding (latin-1, cp1252, ...): decode it with that encoding and "
                    "write the file again, or drop the row"
                ) from None
    raise AssertionError("unreachable: a UnicodeDecodeError in no column")  # pragma: no cover


REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that were not text in its encoding


def check_text(value: Any, where: str, prompt_key: str) -> None:
    """DatasetError for prompt text the model would be trained on as something other than what was meant:
    bytes (a binary column: the chat template renders "b'...'"), or U+FFFD, the mark of bytes that were not
    UTF-8 when the text was decoded (errors="replace"): the original characters are lost."""
    if isinstance(value, bytes):
        raise DatasetError(
            f"{where}: column '{prompt_key}' holds bytes ({value[:40]!r}), not text: write the prompts as strings "
            "(decoded with their encoding), or the chat template renders them as b'...'"
        )
    if isinstance(value, str):
        at = value.find(REPLACEMENT)
        if at >= 0:
            raise DatasetError(
                f"{where}: column '{prompt_key}' holds the replacement character U+FFFD at character {at} "
                f"({value[max(0, at - 30) : at + 10]!r}): bytes that were not valid UTF-8 were replaced when the "
                "text was decoded, and the characters they stood for are lost; decode the source with its real "
                "encoding and write the file again, or drop the row"
            )
        return
    if isinstance(value, dict):
        for v in value.values():
            check_text(v, where, prompt_key)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_text(v, where, prompt_key)


def load_prompts(
    files: list[str],
    tokenizer: Any,
    *,
    max_prompt_length: int,
    prompt_key: str = "prompt",
    filter_overlong: bool = False,
    truncation: str = "error",
    prompt_format: str = "auto",
    template_kwargs: dict[str, Any] | None = None,
    what: str = "data.train_files",
    prompt_key_option: str = "data.prompt_key",
) -> tuple[list[PromptSample], FilterReport]:
    """Read and tokenize every row of `files` (data.prompt_format: chat template or raw text); overlong
    prompts are filtered, cut (data.truncation) or an error, and counted."""
    if not files:
        raise DatasetError(
            f"{what} is empty; give at least one parquet file (e.g. `lucidrl data kk --out DIR`)"
        )
    check_chat_template(tokenizer, what)
    samples: list[PromptSample] = []
    report = FilterReport()
    overlong_per_file: dict[str, int] = {}
    for file in files:
        table = read_table(file, what)
        for col in (prompt_key, *REQUIRED_COLUMNS):
            if col not in table.column_names:
                raise DatasetError(
                    f"{what}: '{file}' has no column '{col}' (it has: {', '.join(table.column_names)}); "
                    f"rows need data_source, {prompt_key} (chat messages) and reward_model.ground_truth"
                    + (f" — or set {prompt_key_option} to the prompt column" if col == prompt_key else "")
                )
        rows = table_rows(table, file, what)
        for i, row in enumerate(rows):
            where = f"{file} row {i}"
            report.total_rows += 1
            check_text(row[prompt_key], where, prompt_key)
            prompt = render_prompt(
                tokenizer,
                row[prompt_key],
                where,
                prompt_key=prompt_key,
                prompt_format=prompt_format,
                template_kwargs=template_kwargs,
            )
            report.raw_prompts += prompt.raw
            rm = row["reward_model"]
            if not isinstance(rm, dict) or "ground_truth" not in rm:
                raise DatasetError(
                    f"{where}: 'reward_model' must be a mapping with 'ground_truth', got {str(rm)[:80]!r}"
                )
            # verl's forks tokenize a raw prompt without special tokens too (tokenize_and_postprocess_data)
            ids = tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
            report.longest_prompt = max(report.longest_prompt, len(ids))
            if len(ids) > max_prompt_length:
                if filter_overlong:
                    report.overlong_filtered += 1
                    overlong_per_file[file] = overlong_per_file.get(file, 0) + 1
                    continue
                if truncation == "error":
                    raise DatasetError(
                        f"{where}: prompt is {len(ids)} tokens, longer than data.max_prompt_length={max_prompt_length}; "
                        "raise data.max_prompt_length, set data.filter_overlong_prompts=true to drop such rows "
                        "(counted), or data.truncation=left|right|middle to cut them (counted)"
                    )
                ids = truncate(ids, max_prompt_length, truncation)
                report.truncated += 1
            extra = row.get("extra_info") or {}
            samples.append(
                PromptSample(
                    input_ids=ids,
                    data_source=str(row["data_source"]),
                    ground_truth=rm["ground_truth"],
                    extra_info=dict(extra) if isinstance(extra, dict) else {"value": extra},
                    assistant_prefix=prompt.prefix,
                    source=f"{file}:{i}",
                    messages=prompt.messages,
                    raw=prompt.raw,
                )
            )
    if report.overlong_filtered:
        log.warning(
            "%s: dropped %d of %d prompts longer than data.max_prompt_length (data.filter_overlong_prompts=true)",
            what,
            report.overlong_filtered,
            report.total_rows,
        )
    if report.truncated:
        log.warning(
            "%s: cut %d of %d prompts longer than data.max_prompt_length to %d tokens (data.truncation=%s)",
            what,
            report.truncated,
            report.total_rows,
            max_prompt_length,
            truncation,
        )
    if report.raw_prompts and prompt_format == "auto":
        log.warning(
            "%s: %d of %d prompts are one user message carrying its own chat markup (ChatML, or a "
            "'User: ... Assistant:' template): fed as written, without the chat template, as verl's TinyZero "
            "and Logic-RL forks feed them (data.prompt_format=auto; chat renders them with the template)",
            what,
            report.raw_prompts,
            report.total_rows,
        )
    if not samples:
        per_file = ", ".join(f"'{f}' {n} rows" for f, n in overlong_per_file.items())
        raise DatasetError(
            f"{what}: all {report.total_rows} prompts are longer than data.max_prompt_length={max_prompt_length} "
            f"tokens (the longest {report.longest_prompt}) and data.filter_overlong_prompts=true dropped them "
            f"({per_file}); raise data.max_prompt_length to at least {report.longest_prompt}, or give shorter prompts"
        )
    return samples, report


def truncate(ids: list[int], length: int, side: str) -> list[int]:
    """`ids` cut to `length` tokens as verl's data.truncation does: keep the end (left), the start (right),
    or the first and last halves (middle)."""
    if side == "left":
        return ids[-length:]
    if side == "right":
        return ids[:length]
    if side == "middle":
        head = length // 2
        return ids[:head] + ids[len(ids) - (length - head) :]
    raise ValueError(f"data.truncation={side!r} is not error, left, right or middle")


def collate(samples: list[PromptSample], pad_token_id: int, uid_offset: int = 0) -> Batch:
    """Left-pad prompts into `prompts (bs, P)` and `prompt_mask (bs, P)`, with per-sample objects."""
    width = max(len(s.input_ids) for s in samples)
    prompts = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        prompts[i, width - n :] = torch.tensor(s.input_ids, dtype=torch.long)
        mask[i, width - n :] = 1
    return Batch(
        tensors={"prompts": prompts, "prompt_mask": mask},
        non_tensors={
            "data_source": [s.data_source for s in samples],
            "ground_truth": [s.ground_truth for s in samples],
            "extra_info": [s.extra_info for s in samples],
            "assistant_prefix": [s.assistant_prefix for s in samples],
            "raw_prompt": [s.messages for s in samples],
            "prompt_is_raw": [s.raw for s in samples],
            "uid": [f"p{uid_offset + i}" for i in range(len(samples))],
        },
    )


class PromptLoader:
    """Shuffled prompt batches for `epochs` epochs; an incomplete last batch is dropped (and counted)."""

    def __init__(
        self, samples: list[PromptSample], batch_size: int, pad_token_id: int, *, shuffle: bool, seed: int
    ):
        if batch_size > len(samples):
            raise DatasetError(
                f"data.train_batch_size={batch_size} is larger than the {len(samples)} training prompts; "
                f"lower it or add data"
            )
        self.samples = samples
        self.batch_size = batch_size
        self.pad_token_id = pad_token_id
        self.shuffle = shuffle
        self.seed = seed

    @property
    def steps_per_epoch(self) -> int:
        return len(self.samples) // self.batch_size

    @property
    def dropped_per_epoch(self) -> int:
        return len(self.samples) % self.batch_size

    def order(self, epoch: int) -> list[int]:
        """The sample indices in the order `epoch` draws them (its last incomplete batch included)."""
        if not self.shuffle:
            return list(range(len(self.samples)))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.samples), generator=g).tolist()

    def drawn(self, batches: int) -> list[PromptSample]:
        """The samples of the first `batches` batches, in the order they were drawn (across epochs)."""
        out: list[PromptSample] = []
        epoch = 0
        while batches > 0:
            take = min(batches, self.steps_per_epoch)
            out.extend(self.samples[i] for i in self.order(epoch)[: take * self.batch_size])
            batches -= take
            epoch += 1
        return out

    def epoch(self, epoch: int) -> Iterator[Batch]:
        order = self.order(epoch)
        for b in range(self.steps_per_epoch):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            offset = (epoch * self.steps_per_epoch + b) * self.batch_size
            yield collate([self.samples[i] for i in idx], self.pad_token_id, uid_offset=offset)
