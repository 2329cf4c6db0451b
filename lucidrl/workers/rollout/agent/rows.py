"""Checks of a data set's rows for a multi-turn run, at loading, where a bad row's file and row are known."""

from __future__ import annotations

from typing import Any

from lucidrl.workers.rollout.agent.chat import ChatFormat
from lucidrl.workers.rollout.agent.environments import resolve_environment
from lucidrl.workers.rollout.agent.parsers import get_tool_call_format
from lucidrl.workers.rollout.agent.sandbox import SandboxLimits
from lucidrl.workers.rollout.agent.toolbox import resolve_tools
from lucidrl.workers.rollout.agent.tools import MultiTurnError, row_tools


def check_rows(samples: list[Any], tokenizer: Any, cfg: Any, max_prompt_length: int) -> None:
    """Every row's tools (extra_info.tools_kwargs) and environment (extra_info.interaction_kwargs.name)
    exist, and its prompt with its tools described fits data.max_prompt_length (rows whose environment
    writes the prompt are measured when it does). `samples`: data.dataset.PromptSample; cfg:
    config.schema.MultiTurnConfig."""
    py = cfg.python
    tools = resolve_tools(
        list(cfg.tools), SandboxLimits(py.timeout_s, py.cpu_s, py.memory_mb, py.max_output_bytes)
    )
    chat = ChatFormat(tokenizer, get_tool_call_format(cfg.format), bool(tools))
    if cfg.environment:
        resolve_environment(cfg.environment, "rollout.multi_turn.environment")
    for s in samples:
        where = s.source
        schemas = [tool.schema for tool, _ in row_tools(tools, s.extra_info, where).values()]
        name = (s.extra_info.get("interaction_kwargs") or {}).get("name")
        if name:
            resolve_environment(name, f"{where}: extra_info.interaction_kwargs.name")
        if name or cfg.environment:
            continue
        text = chat.render(chat.opening(s.messages, schemas), schemas, generation=True)
        length = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if length > max_prompt_length:
            raise MultiTurnError(
                f"{where}: the prompt with its tools described is {length} tokens, longer than data.max_prompt_length="
                f"{max_prompt_length}; raise it (the tool descriptions add {length - len(s.input_ids)} tokens), or "
                "shorten the tools' descriptions"
            )
