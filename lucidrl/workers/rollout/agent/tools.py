"""Tools the model may call in a multi-turn rollout: Python functions with OpenAI-style JSON schemas.

A tool is a function and its schema, `{"type": "function", "function": {"name", "description",
"parameters"}}`, the shape chat templates take as `tools=` and the model is shown. The schema comes
from the function's `tool_schema` attribute, or is built from its signature and its Google-style
docstring ("Args:" lines). Keyword-only parameters (after `*`) are not shown to the model: a data row
fills them through `extra_info.tools_kwargs` (verl's shape), e.g. the ground truth a checking tool needs.

A call is checked against the schema before it runs (unknown tool, missing or unexpected argument,
wrong type: answered to the model as an error and counted as an invalid call). A tool that cannot do
what was asked raises ToolError; its message is the model's answer.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin, get_type_hints

from lucidrl.diagnostics.errors import UserError


class ToolError(Exception):
    """Raised by a tool for a call it cannot serve; the message is what the model reads."""


class MultiTurnError(UserError, ValueError):
    """A multi-turn rollout's input that cannot be used: a tool, format or environment, a data row's
    tools_kwargs or interaction_kwargs, a chat template (the message says which and what to do)."""


class ToolConfigError(MultiTurnError):
    """rollout.multi_turn.tools (or a row's tools_kwargs) names a tool that cannot be used as written."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call, and the JSON schema it is shown."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    hidden: frozenset[str] = field(default_factory=frozenset)  # keyword-only: filled by rows, not the model

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}

    def check_arguments(self, arguments: Any) -> str | None:
        """What is wrong with `arguments` for this tool's schema (top-level properties), or None."""
        if not isinstance(arguments, dict):
            return f"the arguments must be a JSON object, got {json.dumps(arguments)[:80]}"
        params = self.parameters
        props: dict[str, Any] = params.get("properties") or {}
        missing = [k for k in params.get("required") or [] if k not in arguments]
        if missing:
            return f"missing required argument(s) {', '.join(missing)} for {self.name}"
        if params.get("additionalProperties", False) is not True:
            extra = [k for k in arguments if k not in props]
            if extra:
                return (
                    f"unexpected argument(s) {', '.join(extra)} for {self.name}; it takes "
                    f"{', '.join(props) or 'no arguments'}"
                )
        for key, value in arguments.items():
            problem = _type_problem(value, props.get(key) or {})
            if problem:
                return f"argument {key!r} of {self.name}: {problem}"
        return None


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _type_problem(value: Any, spec: Mapping[str, Any]) -> str | None:
    kinds = spec.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    known = [k for k in kinds if k in _JSON_TYPES]
    if known and not any(_JSON_TYPES[k](value) for k in known):
        return f"expected {' or '.join(known)}, got {json.dumps(value)[:60]}"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {spec['enum']}, got {json.dumps(value)[:60]}"
    return None


_PY_TO_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(hint: Any) -> dict[str, Any]:
    """The JSON-schema type of a parameter annotation (str, int, float, bool, list[...], dict, X | None)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        return _json_type(options[0]) if len(options) == 1 else {}
    base = origin or hint
    return {"type": _PY_TO_JSON[base]} if base in _PY_TO_JSON else {}


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:")
    description = head.strip().split("\n\n")[0].replace("\n", " ")
    args: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        m = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", line)
        if m:
            current = m.group(1)
            args[current] = m.group(2).strip()
        elif current and line.strip() and not re.match(r"^\S", line):
            args[current] += " " + line.strip()
        elif line.strip() and re.match(r"^\S", line):  # Returns:, Raises: ...
            current = None
    return description, args


def schema_from_function(
    fn: Callable[..., Any], name: str | None = None
) -> tuple[dict[str, Any], frozenset[str]]:
    """The OpenAI-style schema of `fn` (its `tool_schema` attribute, or built from signature and
    docstring) and the keyword-only parameters it hides from the model."""
    sig = inspect.signature(fn)
    hidden = frozenset(p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY)
    explicit = getattr(fn, "tool_schema", None)
    if explicit is not None:
        schema = dict(explicit)
        if "function" not in schema:  # the bare {"name", "description", "parameters"} form
            schema = {"type": "function", "function": schema}
        return schema, hidden
    try:
        hints = get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to none
        hints = {}
    description, docs = _docstring_parts(fn.__doc__ or "")
    props: dict[str, Any] = {}
    required = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            continue
        prop = _json_type(hints.get(p.name, Any))
        if p.name in docs:
            prop["description"] = docs[p.name]
        props[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    params = {"type": "object", "properties": props, "required": required}
    fn_name = name or getattr(fn, "__name__", "tool")
    return {
        "type": "function",
        "function": {"name": fn_name, "description": description, "parameters": params},
    }, hidden


def tool_from_function(fn: Callable[..., Any], where: str, name: str | None = None) -> Tool:
    """A Tool of a function; ToolConfigError naming `where` (the config entry) when it cannot be one."""
    if not callable(fn):
        raise ToolConfigError(f"{where} is {fn!r:.80}, not a function; point it at a function or a Tool")
    try:
        schema, hidden = schema_from_function(fn, name)
    except (TypeError, ValueError) as e:
        raise ToolConfigError(f"{where}: cannot build the tool's JSON schema from {fn!r:.80} ({e})") from e
    spec = schema.get("function") or {}
    tool_name = spec.get("name")
    if not isinstance(tool_name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", tool_name):
        raise ToolConfigError(
            f"{where}: the tool's name {tool_name!r} must be 1-64 letters, digits, '_', '.' or '-' (the model "
            "writes it in its calls)"
        )
    params = spec.get("parameters")
    if params is not None and (not isinstance(params, dict) or params.get("type") != "object"):
        raise ToolConfigError(
            f"{where}: the schema's parameters must be a JSON-schema object ({{'type': 'object', "
            f"'properties': ...}}), got {json.dumps(params)[:120]}"
        )
    return Tool(tool_name, fn, schema, hidden)


def load_object(spec: str, where: str) -> Any:
    """The object named by `package.module:attribute` or `path/to/file.py:attribute`."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ToolConfigError(f"{where}={spec!r} is neither a built-in name nor module:attribute")
    if module_name.endswith(".py"):
        from lucidrl.rewards.custom import CustomFunctionError, _import_file

        try:
            module = _import_file(module_name)
        except CustomFunctionError as e:
            raise ToolConfigError(f"{where}={spec!r}: {e}") from e
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ToolConfigError(
                f"{where}={spec!r}: cannot import {module_name!r} ({e}); is it on PYTHONPATH, or give a .py path"
            ) from e
    if not hasattr(module, attr):
        raise ToolConfigError(f"{where}={spec!r}: {module_name} defines no {attr!r}")
    return getattr(module, attr)


# verl's tools_kwargs entry per tool: create/execute kwargs become the call's hidden arguments
_ROW_KWARG_KINDS = ("create_kwargs", "execute_kwargs")
_UNSUPPORTED_KINDS = ("calc_reward_kwargs", "release_kwargs")


def row_tools(
    tools: dict[str, Tool], extra_info: Mapping[str, Any] | None, where: str
) -> dict[str, tuple[Tool, dict]]:
    """The tools a data row may call, with the hidden keyword arguments it binds to each.

    A row without `extra_info.tools_kwargs` gets every configured tool. One with it (verl's shape:
    `{tool_name: {"create_kwargs": {...}, "execute_kwargs": {...}}}`) gets the tools it names.
    """
    kwargs_by_tool = (extra_info or {}).get("tools_kwargs")
    if not kwargs_by_tool:
        return {name: (tool, {}) for name, tool in tools.items()}
    if not isinstance(kwargs_by_tool, Mapping):
        raise ToolConfigError(
            f"{where}: extra_info.tools_kwargs must map tool names to kwargs, got {kwargs_by_tool!r:.80}"
        )
    out: dict[str, tuple[Tool, dict]] = {}
    for name, entry in kwargs_by_tool.items():
        if entry is None:  # parquet fills a tool another row names with None: not this row's
            continue
        if name not in tools:
            raise ToolConfigError(
                f"{where}: extra_info.tools_kwargs names the tool {name!r}, which rollout.multi_turn.tools does "
                f"not configure (it has {', '.join(tools) or 'none'}); add it there, or drop it from the row"
            )
        if not isinstance(entry, Mapping):
            raise ToolConfigError(
                f"{where}: extra_info.tools_kwargs.{name} must be a mapping, got {entry!r:.80}"
            )
        bound: dict[str, Any] = {}
        for kind, value in entry.items():
            if kind in _ROW_KWARG_KINDS:
                bound.update(value or {})
            elif kind in _UNSUPPORTED_KINDS and value:
                raise ToolConfigError(
                    f"{where}: extra_info.tools_kwargs.{name}.{kind} is set, but a lucidrl tool is a function, "
                    "with no reward or release step; score in the reward function (it gets the conversation in "
                    f"extra_info) and drop {kind}"
                )
            elif kind not in _UNSUPPORTED_KINDS:
                raise ToolConfigError(
                    f"{where}: extra_info.tools_kwargs.{name} has {kind!r}; lucidrl reads create_kwargs and "
                    "execute_kwargs (both become keyword-only arguments of the tool function)"
                )
        tool = tools[name]
        unknown = sorted(set(bound) - tool.hidden)
        if unknown:
            raise ToolConfigError(
                f"{where}: extra_info.tools_kwargs.{name} passes {', '.join(unknown)}, which {name}'s function "
                f"does not take as keyword-only parameters (it has {', '.join(sorted(tool.hidden)) or 'none'}); "
                "declare them after `*` in its signature"
            )
        out[name] = (tool, bound)
    return out


def call_tool(tool: Tool, arguments: dict[str, Any], bound: dict[str, Any]) -> str:
    """Run one checked call; its value as the text the model reads (ToolError and others propagate)."""
    value = tool.function(**arguments, **bound)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
