"""Reading tool calls out of an assistant turn's text: a registry of formats (rollout.multi_turn.format).

A parser turns the turn's text into the calls it makes and the calls it tried to make but wrote
wrongly (each malformed call is answered to the model with what is wrong, and counted). Each format
also says how to ask for it in a system prompt, for chat templates that do not render `tools`.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn: the
  format of Qwen2.5/Qwen3, Hermes and SmolLM3 templates, and verl's and vLLM's `hermes` parser.
- `json`: the whole turn is one JSON object `{"name": ..., "arguments"|"parameters": {...}}` or a
  list of them (Llama 3's JSON tool calling, verl's `llama3_json` without the `<|python_tag|>`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lucidrl.workers.rollout.agent.tools import ToolConfigError, load_object


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """The calls an assistant turn makes, and one message per call it wrote wrongly."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def attempted(self) -> int:
        return len(self.calls) + len(self.errors)


@dataclass(frozen=True)
class ToolCallFormat:
    """A parser and the instructions that ask a model for its format (None: only a template can)."""

    name: str
    parse: Callable[[str], ParsedTurn]
    instructions: Callable[[list[dict[str, Any]]], str] | None = None


def _call_from_json(obj: Any, what: str) -> ToolCall | str:
    """A ToolCall from a decoded object, or the reason it is none."""
    if not isinstance(obj, dict):
        return f'{what} is not a JSON object with "name" and "arguments"'
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f'{what} has no "name" string'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(
        args, str
    ):  # some models write the arguments as a JSON string, as OpenAI's API returns them
        try:
            args = json.loads(args)
        except ValueError:
            return f'{what}: "arguments" is a string that is not JSON'
    if not isinstance(args, dict):
        return f'{what}: "arguments" must be a JSON object, got {json.dumps(args)[:60]}'
    return ToolCall(name, args)


def _json_error(e: ValueError) -> str:
    return getattr(e, "msg", str(e)) + (f" at character {e.pos}" if hasattr(e, "pos") else "")


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> ParsedTurn:
    out = ParsedTurn()
    for i, body in enumerate(_HERMES.findall(text), start=1):
        what = f"tool call {i}"
        try:
            obj = json.loads(body.strip())
        except ValueError as e:
            out.errors.append(f"{what} is not valid JSON ({_json_error(e)}): {body.strip()[:80]!r}")
            continue
        call = _call_from_json(obj, what)
        (out.errors if isinstance(call, str) else out.calls).append(call)
    closed = len(_HERMES.findall(text))
    unclosed = text.count("<tool_call>") - closed
    if unclosed > 0:
        out.errors += ["a <tool_call> without its closing </tool_call>"] * unclosed
    return out


def hermes_instructions(schemas: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        "You can call tools. Their descriptions, as JSON schemas, are inside <tools></tools>:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "To call a tool, write a JSON object with its name and arguments inside <tool_call></tool_call>, "
        'for example:\n<tool_call>\n{"name": "tool_name", "arguments": {"arg": "value"}}\n</tool_call>\n'
        "Then stop: the result comes back in the next message."
    )


def parse_json(text: str) -> ParsedTurn:
    out = ParsedTurn()
    body = text.strip()
    if not body.startswith(("{", "[")):
        return out  # prose: the answer, no call
    try:
        obj = json.loads(body)
    except ValueError as e:
        out.errors.append(f"the turn starts like a JSON tool call but is not valid JSON ({_json_error(e)})")
        return out
    for i, item in enumerate(obj if isinstance(obj, list) else [obj], start=1):
        call = _call_from_json(item, f"tool call {i}")
        (out.errors if isinstance(call, str) else out.calls).append(call)
    return out


def json_instructions(schemas: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        f"You can call these tools (JSON schemas):\n{listing}\n\n"
        'To call one, answer with only a JSON object: {"name": "tool_name", "arguments": {"arg": "value"}}. '
        "The result comes back in the next message. Answer in words when you need no tool."
    )


FORMATS: dict[str, ToolCallFormat] = {
    "hermes": ToolCallFormat("hermes", parse_hermes, hermes_instructions),
    "json": ToolCallFormat("json", parse_json, json_instructions),
}


def register_tool_call_format(name: str, instructions: Callable[[list[dict[str, Any]]], str] | None = None):
    """Decorator registering `parse(text) -> ParsedTurn` as rollout.multi_turn.format=`name`."""

    def decorator(fn: Callable[[str], ParsedTurn]) -> Callable[[str], ParsedTurn]:
        if name in FORMATS and FORMATS[name].parse is not fn:
            raise ValueError(f"a tool-call format named {name!r} is already registered")
        FORMATS[name] = ToolCallFormat(name, fn, instructions)
        return fn

    return decorator


def get_tool_call_format(spec: str, key: str = "rollout.multi_turn.format") -> ToolCallFormat:
    """A registered format by name, or `module:function` (a parser; its `instructions` attribute, if
    any, asks for the format in a system prompt)."""
    if spec in FORMATS:
        return FORMATS[spec]
    if ":" not in spec:
        raise ToolConfigError(
            f"{key}={spec!r} is not a tool-call format ({', '.join(FORMATS)}) nor module:function"
        )
    fn = load_object(spec, key)
    if not callable(fn):
        raise ToolConfigError(f"{key}={spec!r} is not a function parse(text) -> ParsedTurn")
    return ToolCallFormat(spec, fn, getattr(fn, "instructions", None))
