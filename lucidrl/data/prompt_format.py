"""A row's prompt as the model's input text: chat messages through the chat template, or raw text as written.

verl's own files hold chat messages, which lucidrl renders with the tokenizer's chat template. The
files of verl's TinyZero and Logic-RL forks hold one user message that already carries the whole
template, ChatML markup and system prompt included (Logic-RL's K&K files end in
`<|im_start|>assistant\\n<think>`), or a base-model "User: ... Assistant: <think>" text (TinyZero's
countdown): those forks feed that text as it is, and so does lucidrl (`data.prompt_format`, auto by
default). The text after the prompt's last assistant header is the assistant's pre-filled start, kept
as the sample's `assistant_prefix` so the reward sees the whole assistant turn, as their rewards do
(they read the transcript after that header).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lucidrl.diagnostics.errors import UserError


class DatasetError(UserError, ValueError):
    """A data file or row that cannot be turned into a training prompt."""


# the assistant header each chat format opens the model's turn with
_ASSISTANT_HEADERS = (
    "<|im_start|>assistant\n",  # ChatML: Qwen, SmolLM, Logic-RL's files
    "<|im_start|>assistant",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",  # Llama 3
    "<start_of_turn>model\n",  # Gemma
    "<|assistant|>\n",  # Phi-3, Zephyr
    "<｜Assistant｜>",  # DeepSeek
    "[/INST]",  # Mistral, Llama 2
)
# markup that only a rendered chat holds
_MARKUP = ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>", "<|user|>", "<｜User｜>", "[INST]")
# a base-model template's turns, each at the start of a line ("User: ...\nAssistant: <think>")
_BASE_TURN = re.compile(r"(?m)^(User|Human|Assistant)[ \t]*:")


@dataclass
class RenderedPrompt:
    """A row's prompt as input text, with the assistant's pre-filled start and the messages as written."""

    text: str
    prefix: str  # the assistant turn's pre-filled start ("" when none)
    messages: list[dict[str, Any]]
    raw: bool  # fed as written (no chat template)


def holds_chat_markup(messages: list[dict[str, Any]]) -> bool:
    """Whether a prompt is one user message carrying a whole chat of its own: a chat format's markup
    (<|im_start|>, Llama 3's headers, ...) or a base-model "User: ... Assistant:" template ending in the
    assistant's turn."""
    if (
        len(messages) != 1
        or messages[0].get("role") != "user"
        or not isinstance(messages[0].get("content"), str)
    ):
        return False
    text = messages[0]["content"]
    if any(mark in text for mark in _MARKUP):
        return True
    turns = _BASE_TURN.findall(text)
    return bool(turns) and turns[-1] == "Assistant" and any(t in ("User", "Human") for t in turns)


def assistant_prefill(text: str) -> str:
    """The text after a raw prompt's last assistant header: the assistant turn's pre-filled start."""
    end = -1
    for header in _ASSISTANT_HEADERS:
        at = text.rfind(header)
        if at >= 0:
            end = max(end, at + len(header))
    for m in _BASE_TURN.finditer(text):
        if m.group(1) == "Assistant":
            end = max(end, m.end())
    return text[end:] if end >= 0 else ""


def check_messages(value: Any, where: str, prompt_key: str) -> list[dict[str, Any]]:
    """A row's prompt column as chat messages (a string is one user message); DatasetError for anything else."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, (list, tuple)) or not value:
        raise DatasetError(
            f"{where}: column '{prompt_key}' must hold chat messages "
            f"([{{'role': 'user', 'content': ...}}, ...]) or a string, got {str(value)[:80]!r}"
        )
    for m in value:
        # a key only other rows have reaches this row as None (parquet fills it in): a role of None is none
        if not isinstance(m, dict) or not m.get("role") or m.get("content") is None:
            raise DatasetError(
                f"{where}: message {str(m)[:80]!r} in column '{prompt_key}' needs a 'role' and a 'content' "
                "that are not None"
            )
    # every field the data gives goes to the chat template (name, tool_calls, reasoning_content, ...), as
    # verl and TRL pass the messages; None fields are what parquet fills in for a key only other rows have
    return [{k: v for k, v in m.items() if v is not None} for m in value]


def _refuse_template_in_chat(messages: list[dict[str, Any]], where: str, prompt_key: str) -> None:
    """A user message ending in '<think>' rendered as chat: the model would answer after the template's own
    assistant header and the reward (which reads the response and any assistant pre-fill) would never see
    that <think>, so every K&K answer would score -3."""
    last = messages[-1]
    if (
        last["role"] == "user"
        and isinstance(last["content"], str)
        and last["content"].rstrip().endswith("<think>")
    ):
        raise DatasetError(
            f"{where}: the last message in column '{prompt_key}' is a user message ending in '<think>' (a "
            "raw-prompt file pre-fills it so), rendered with the chat template (data.prompt_format=chat). Feed "
            "it as written with data.prompt_format=raw (or auto), or write the pre-fill as an assistant message "
            "that the model continues: the user message without the trailing '<think>', then "
            "{'role': 'assistant', 'content': '<think>'} (what `lucidrl data kk` writes)"
        )


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
) -> tuple[str, str]:
    """The prompt text for `messages` through the chat template, and the pre-filled assistant text (or "")."""
    kwargs = dict(template_kwargs or {})
    if messages and messages[-1].get("role") == "assistant":
        text = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True, **kwargs)
        return text, messages[-1].get("content") or ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs), ""


def render_prompt(
    tokenizer: Any,
    value: Any,
    where: str,
    *,
    prompt_key: str = "prompt",
    prompt_format: str = "auto",
    template_kwargs: dict[str, Any] | None = None,
) -> RenderedPrompt:
    """A row's prompt column as input text: raw (data.prompt_format=raw, or auto and it holds its own chat
    markup) or through the chat template."""
    messages = check_messages(value, where, prompt_key)
    raw = prompt_format == "raw" or (prompt_format == "auto" and holds_chat_markup(messages))
    if not raw:
        _refuse_template_in_chat(messages, where, prompt_key)
        text, prefix = render_chat(tokenizer, messages, template_kwargs)
        return RenderedPrompt(text, prefix, messages, raw=False)
    if len(messages) != 1 or not isinstance(messages[0]["content"], str):
        raise DatasetError(
            f"{where}: data.prompt_format=raw feeds a prompt of one message as written, but column "
            f"'{prompt_key}' holds {len(messages)} messages; use data.prompt_format=chat (or auto) for chats"
        )
    text = messages[0]["content"]
    return RenderedPrompt(text, assistant_prefill(text), messages, raw=True)
