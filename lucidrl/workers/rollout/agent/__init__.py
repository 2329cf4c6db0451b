"""Multi-turn rollouts with tools and environments (rollout.multi_turn; docs/multi_turn.md)."""

from lucidrl.workers.rollout.agent.environments import ENVIRONMENTS, Environment, GuessNumber
from lucidrl.workers.rollout.agent.parsers import FORMATS, ParsedTurn, ToolCall, register_tool_call_format
from lucidrl.workers.rollout.agent.rollout import MultiTurnRollout
from lucidrl.workers.rollout.agent.sandbox import SandboxLimits, SandboxResult, run_python
from lucidrl.workers.rollout.agent.toolbox import BUILTIN_TOOLS, resolve_tools
from lucidrl.workers.rollout.agent.tools import MultiTurnError, Tool, ToolConfigError, ToolError
from lucidrl.workers.rollout.agent.trajectory import STAT_PREFIX, Trajectory, multi_turn_metrics

__all__ = [
    "BUILTIN_TOOLS",
    "ENVIRONMENTS",
    "Environment",
    "FORMATS",
    "GuessNumber",
    "MultiTurnError",
    "MultiTurnRollout",
    "ParsedTurn",
    "STAT_PREFIX",
    "SandboxLimits",
    "SandboxResult",
    "Tool",
    "ToolCall",
    "ToolConfigError",
    "ToolError",
    "Trajectory",
    "multi_turn_metrics",
    "register_tool_call_format",
    "resolve_tools",
    "run_python",
]
