"""The built-in tools by name, and the configured tools (rollout.multi_turn.tools) resolved to Tools."""

from __future__ import annotations

from collections.abc import Callable

from lucidrl.workers.rollout.agent.calculator import calculator
from lucidrl.workers.rollout.agent.sandbox import SandboxLimits, python_tool
from lucidrl.workers.rollout.agent.tools import Tool, ToolConfigError, load_object, tool_from_function

# each is built from the python tool's limits (rollout.multi_turn.python)
BUILTIN_TOOLS: dict[str, Callable[[SandboxLimits], Tool]] = {
    "calculator": lambda limits: tool_from_function(calculator, "the built-in calculator"),
    "python": python_tool,
}


def resolve_tools(
    specs: list[str], limits: SandboxLimits, key: str = "rollout.multi_turn.tools"
) -> dict[str, Tool]:
    """The configured tools by the name the model calls them: built-in names, `module:function` (or a
    Tool object), `path/file.py:function`."""
    tools: dict[str, Tool] = {}
    for i, spec in enumerate(specs):
        where = f"{key}[{i}]"
        if spec in BUILTIN_TOOLS:
            tool = BUILTIN_TOOLS[spec](limits)
        elif ":" in spec:
            obj = load_object(spec, where)
            tool = obj if isinstance(obj, Tool) else tool_from_function(obj, f"{where}={spec!r}")
        else:
            raise ToolConfigError(
                f"{where}={spec!r} is not a built-in tool ({', '.join(BUILTIN_TOOLS)}) nor module:function"
            )
        if tool.name in tools:
            raise ToolConfigError(f"{where}={spec!r}: a tool named {tool.name!r} is already configured")
        tools[tool.name] = tool
    return tools
