"""Multi-turn rollouts: the model writes a turn, tools or an environment answer, the model goes on.

`MultiTurnRollout` wraps a rollout engine (hf, vllm, server: anything with `generate(Batch,
SamplingParams)` over token-id prompts) and calls it once per turn for every sample still going, on
the tokens so far. Between turns it parses the turns' tool calls, runs every call and environment
step of the batch at once in a pool of threads (a slow call holds up no other; the next turn waits for
the slowest of this one), and appends their replies' tokens, which stay out of the loss. The first
turn of a prompt's n samples is generated from the prompt once (the engine shares it); later turns
each continue their own conversation. The output is one batch in the layout of trajectory.py.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from lucidrl.batch import Batch
from lucidrl.workers.rollout.agent.chat import ChatFormat
from lucidrl.workers.rollout.agent.environments import resolve_environment
from lucidrl.workers.rollout.agent.parsers import ParsedTurn, get_tool_call_format
from lucidrl.workers.rollout.agent.sandbox import SandboxLimits
from lucidrl.workers.rollout.agent.toolbox import resolve_tools
from lucidrl.workers.rollout.agent.tools import MultiTurnError, Tool, ToolError, call_tool, row_tools
from lucidrl.workers.rollout.agent.trajectory import Trajectory, to_batch

log = logging.getLogger(__name__)

TRUNCATED = "\n...(truncated)"


class _DaemonPool:
    """Threads that run tool calls and environment steps. Daemon threads: a call that never returns
    (threads cannot be stopped) must not keep the process from exiting."""

    def __init__(self, workers: int):
        self._jobs: queue.Queue = queue.Queue()
        for i in range(workers):
            threading.Thread(target=self._work, name=f"lucidrl-tools-{i}", daemon=True).start()

    def _work(self) -> None:
        while True:
            future, fn, args = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 - handed to the waiting side
                    future.set_exception(e)

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future


class MultiTurnRollout:
    """Generates conversations with tools and environments over a token-level rollout engine."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        cfg: Any,
        *,
        eos_ids: list[int],
        max_prompt_length: int,
        max_response_length: int,
        model_where: str = "model.path",
    ):
        """cfg: config.schema.MultiTurnConfig."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.eos_ids = set(eos_ids)
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.pad_id = tokenizer.pad_token_id
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        py = cfg.python
        limits = SandboxLimits(py.timeout_s, py.cpu_s, py.memory_mb, py.max_output_bytes)
        self.tools = resolve_tools(list(cfg.tools), limits)
        self.format = get_tool_call_format(cfg.format)
        self.chat = ChatFormat(tokenizer, self.format, bool(self.tools), where=model_where)
        self.environments: dict[str, type] = {}
        self.default_env = (
            self._environment(cfg.environment, "rollout.multi_turn.environment") if cfg.environment else None
        )
        self.pool = _DaemonPool(cfg.max_workers)
        self.stuck_calls = 0  # calls past their timeout, their threads still running

    @staticmethod
    def _call_env(fn: Callable[..., Any], arg: Any, where: str, what: str) -> Any:
        try:
            return fn(arg)
        except MultiTurnError:
            raise
        except Exception as e:  # noqa: BLE001 - an environment's bug, reported with where it happened
            raise MultiTurnError(
                f"{where}: the environment's {what} raised {type(e).__name__}: {e}\n{traceback.format_exc()}"
            ) from e

    def _close(self, t: Trajectory, cut: str | None = None) -> None:
        """End a sample whose last turn ended with its end-of-turn token (counting a turn the template
        would render otherwise)."""
        if not self.chat.as_seen(t.messages, t.assistant, t.schemas, t.eos_text, t.text):
            t.stats["off_template"] = 1
        t.end(cut)

    def _environment(self, spec: str, where: str) -> type:
        if spec not in self.environments:
            self.environments[spec] = resolve_environment(spec, where)
        return self.environments[spec]

    # -- a batch ------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, batch: Batch, params: Any) -> Batch:
        """Each prompt's n conversations (interleaved), in the layout of trajectory.to_batch."""
        expanded = batch.repeat(params.n, interleave=True) if params.n > 1 else batch
        trajectories = [self._start(expanded, i, i % params.n) for i in range(len(expanded))]
        shared = self._groups_share_prompts(trajectories, params.n)
        for turn in range(self.cfg.max_turns):
            going = [t for t in trajectories if not t.done]
            if not going:
                break
            self._generate_turn(going, params, turn, share=shared and turn == 0)
            self._answer([t for t in going if not t.done], last=turn == self.cfg.max_turns - 1)
        for t in trajectories:
            self._finish(t)
        return to_batch(trajectories, expanded, self.pad_id, with_log_probs=params.do_sample)

    def _start(self, batch: Batch, i: int, sample: int) -> Trajectory:
        """Sample `sample` of the prompt at row `i` of the expanded batch: its tools, environment, prompt."""
        uid = batch["uid"][i] if "uid" in batch else str(i)
        info = (batch["extra_info"][i] if "extra_info" in batch else None) or {}
        source = batch["data_source"][i] if "data_source" in batch else "?"
        where = f"sample {i} (uid {uid}, data_source {source!r})"
        if "raw_prompt" not in batch:
            raise MultiTurnError(
                f"{where}: the batch has no raw_prompt (the chat messages) to start conversations from"
            )
        tools = row_tools(self.tools, info, where)
        schemas = [tool.schema for tool, _ in tools.values()]
        interaction = dict(info.get("interaction_kwargs") or {})
        env_name = interaction.pop("name", None)
        env_cls = (
            self._environment(env_name, f"{where}: extra_info.interaction_kwargs.name")
            if env_name
            else self.default_env
        )
        env = env_cls() if env_cls is not None else None
        messages = [dict(m) for m in batch["raw_prompt"][i]]
        if env is not None:
            row = {
                "prompt": messages,
                "data_source": source,
                "ground_truth": batch["ground_truth"][i] if "ground_truth" in batch else None,
                "extra_info": info,
                "interaction_kwargs": interaction,
            }
            messages = _checked_messages(self._call_env(env.reset, row, where, "reset"), where, "reset")
        messages = self.chat.opening(messages, schemas)
        prefill = None
        if messages and messages[-1].get("role") == "assistant":
            prefill = str(messages[-1].get("content") or "")
        text = self.chat.render(messages, schemas, generation=True)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_length:
            raise MultiTurnError(
                f"{where}: the prompt with its tools described is {len(ids)} tokens, longer than "
                f"data.max_prompt_length={self.max_prompt_length}; raise it, or shorten the tools' descriptions"
            )
        if prefill is not None:
            messages = messages[:-1]  # its text starts the first assistant turn
        return Trajectory(
            uid=str(uid),
            sample=sample,
            tools=tools,
            schemas=schemas,
            env=env,
            messages=messages,
            prefill=prefill,
            prompt_ids=ids,
            text=text,
            prompt_messages=len(messages),
        )

    @staticmethod
    def _groups_share_prompts(trajectories: list[Trajectory], n: int) -> bool:
        """Whether each prompt's n samples start from the same tokens (then the first turn is generated
        from one copy). They must: the training forward runs a group's prompt once for all its samples."""
        for start in range(0, len(trajectories), n):
            group = trajectories[start : start + n]
            if any(t.prompt_ids != group[0].prompt_ids for t in group):
                raise MultiTurnError(
                    f"the {n} samples of prompt uid {group[0].uid} start from different prompts (an environment's "
                    "reset drew them differently): GRPO compares samples of one prompt, and the training forward "
                    "runs a group's prompt once; make reset depend on the sample only (seed from its data)"
                )
        return n > 1

    # -- generation ---------------------------------------------------------------------------------

    def _generate_turn(self, going: list[Trajectory], params: Any, turn: int, share: bool) -> None:
        budgets = [self.max_response_length - len(t.response_ids) for t in going]
        for t, b in zip(going, budgets, strict=True):
            if b < 1:
                t.end("max_response_length")
        rows = [(t, b) for t, b in zip(going, budgets, strict=True) if b >= 1]
        if not rows:
            return
        max_new = max(b for _, b in rows)
        if share:  # the first turn: one copy of each prompt, n samples of it
            firsts = rows[:: params.n]
            contexts = [t.prompt_ids for t, _ in firsts]
            uids = [t.uid for t, _ in firsts]
            sub_params = replace(params, max_new_tokens=max_new)
        else:
            contexts = [t.prompt_ids + t.response_ids for t, _ in rows]
            # seeds (rollout.deterministic) per sample and turn, whatever else is still going
            uids = [f"{t.uid}/{t.sample}/turn{turn}" for t, _ in rows]
            sub_params = replace(params, n=1, max_new_tokens=max_new)
        out = self.engine.generate(_prompt_batch(contexts, uids, self.pad_id), sub_params)
        if len(out) != len(rows):
            raise RuntimeError(
                f"the rollout engine returned {len(out)} responses for {len(rows)} conversations"
            )
        mask = out["response_mask"].bool().cpu()
        responses = out["responses"].cpu()
        lps = out["rollout_log_probs"].float().cpu() if "rollout_log_probs" in out else None
        for r, (t, budget) in enumerate(rows):
            ids = responses[r][mask[r]].tolist()[:budget]
            logps = lps[r][mask[r]].tolist()[:budget] if lps is not None else None
            self._take_turn(t, ids, logps)

    def _take_turn(self, t: Trajectory, ids: list[int], log_probs: list[float] | None) -> None:
        t.stats["turns"] += 1
        t.stats["generated_tokens"] += len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        t.extend(ids, True, log_probs)
        ended = bool(ids) and ids[-1] in self.eos_ids
        # a special end-of-turn token is the template's business, not the message's content
        t.eos_text = ""
        if ended and ids[-1] in self.special_ids:
            t.eos_text = self.tokenizer.decode(ids[-1:], skip_special_tokens=False)
        content = text[: len(text) - len(t.eos_text)] if t.eos_text and text.endswith(t.eos_text) else text
        t.assistant = {"role": "assistant", "content": (t.prefill or "") + content}
        t.prefill = None
        t.text += text
        if not ended:  # the response budget ran out inside the turn
            if not self.chat.as_seen(t.messages, t.assistant, t.schemas, "", t.text):
                t.stats["off_template"] = 1
            t.end("max_response_length")

    # -- answers ------------------------------------------------------------------------------------

    def _answer(self, going: list[Trajectory], last: bool) -> None:
        """Parse each turn's calls; run all calls and environment steps of the batch concurrently; append
        each sample's replies, or end it."""
        plans = []
        for t in going:
            parsed = self._parse(t)
            t.stats["tool_calls"] += parsed.attempted
            t.stats["invalid_calls"] += len(parsed.errors)
            # one reply per call, in the order written (calls that could not be parsed first): its text,
            # or the future of its run
            replies: list[tuple[str, str | concurrent.futures.Future]] = [
                ("invalid_call", f"Error: {e}") for e in parsed.errors
            ]
            running = 0
            for call in parsed.calls:
                entry = t.tools.get(call.name)
                problem = (
                    f"there is no tool named {call.name!r}; the tools are {', '.join(t.tools) or 'none'}"
                    if entry is None
                    else entry[0].check_arguments(call.arguments)
                )
                if problem:
                    t.stats["invalid_calls"] += 1
                    replies.append((call.name, f"Error: {problem}"))
                    continue
                t.stats["valid_calls"] += 1
                if last or running >= self.cfg.max_parallel_calls:
                    t.stats["unexecuted_calls"] += 1
                    limit = f"at most {self.cfg.max_parallel_calls} tool calls per turn"
                    replies.append((call.name, f"Error: not run: {limit}"))
                    continue
                tool, bound = entry
                replies.append((call.name, self.pool.submit(_run_call, tool, call.arguments, bound)))
                running += 1
            if parsed.attempted:
                plans.append((t, replies))
            elif t.env is not None:
                conversation = [*t.messages, t.assistant]
                plans.append((t, self.pool.submit(_env_step, t.env, conversation)))
            else:
                self._close(t)  # an answer with no call and nobody to reply: the conversation is over
        deadline = time.monotonic() + self.cfg.tool_timeout_s
        for t, work in plans:
            if isinstance(work, concurrent.futures.Future):
                self._after_env(t, work, deadline, last)
            elif last:
                self._close(t, "max_turns")
            else:
                texts = [
                    (name, r if isinstance(r, str) else self._call_result(t, name, r, deadline))
                    for name, r in work
                ]
                self._reply(t, [self.chat.tool_message(name, self._clip(t, text)) for name, text in texts])

    def _parse(self, t: Trajectory) -> ParsedTurn:
        parsed = self.format.parse(str(t.assistant["content"]))
        if not isinstance(parsed, ParsedTurn):
            raise MultiTurnError(
                f"rollout.multi_turn.format={self.format.name!r} returned {type(parsed).__name__}, not a ParsedTurn "
                "(lucidrl.workers.rollout.agent.parsers)"
            )
        return parsed

    def _call_result(
        self, t: Trajectory, name: str, future: concurrent.futures.Future, deadline: float
    ) -> str:
        try:
            text, ok = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            self.stuck_calls += 1
            log.warning(
                "tool %s did not answer within rollout.multi_turn.tool_timeout_s=%s; answered with an error "
                "(its thread runs on: %d such calls so far)", name, self.cfg.tool_timeout_s, self.stuck_calls,
            )  # fmt: skip
            text, ok = f"Error: {name} did not answer within {self.cfg.tool_timeout_s:g} s", False
        if not ok:
            t.stats["tool_errors"] += 1
        return text

    def _after_env(
        self, t: Trajectory, future: concurrent.futures.Future, deadline: float, last: bool
    ) -> None:
        env_name = type(t.env).__name__
        try:
            reply, done, reward = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            raise MultiTurnError(
                f"environment {env_name}.step did not return within rollout.multi_turn.tool_timeout_s="
                f"{self.cfg.tool_timeout_s} (uid {t.uid})"
            ) from None
        except _EnvFailure as e:
            raise MultiTurnError(f"environment {env_name}.step raised for uid {t.uid}: {e}") from None
        t.turn_rewards.append(float(reward))
        t.stats["env_reward"] += float(reward)
        if done:
            self._close(t)
        elif last:
            self._close(t, "max_turns")
        else:
            message = {"role": "user", "content": reply} if isinstance(reply, str) else dict(reply)
            if "content" not in message or "role" not in message:
                raise MultiTurnError(
                    f"environment {env_name}.step returned {reply!r:.80} as its reply: give text or a message dict "
                    "with role and content"
                )
            message["content"] = self._clip(t, str(message["content"]))
            self._reply(t, [message])

    def _clip(self, t: Trajectory, content: str) -> str:
        """A reply cut to max_tool_response_tokens (counted)."""
        limit = self.cfg.max_tool_response_tokens
        ids = self.tokenizer(content, add_special_tokens=False)["input_ids"]
        if len(ids) <= limit:
            return content
        t.stats["truncated_replies"] += 1
        return self.tokenizer.decode(ids[:limit], skip_special_tokens=False) + TRUNCATED

    def _reply(self, t: Trajectory, messages: list[dict[str, Any]]) -> None:
        """Append the replies' tokens (out of the loss) and the template's next generation prompt."""
        text, as_seen = self.chat.continuation(
            t.messages, t.assistant, messages, t.schemas, t.eos_text, t.text
        )
        if not as_seen:
            t.stats["off_template"] = 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(t.response_ids) + len(ids) >= self.max_response_length:  # no room left for the model to answer
            t.end("max_response_length")
            return
        t.messages += [t.assistant, *messages]
        t.assistant = None
        t.extend(ids, False)
        t.text += text
        t.stats["observation_tokens"] += len(ids)

    def _finish(self, t: Trajectory) -> None:
        if not t.done:  # every turn went to tools or an unfinished environment
            t.end("max_turns")
        t.stats["cut_max_turns"] = int(t.cut == "max_turns")
        t.stats["cut_max_response_length"] = int(t.cut == "max_response_length")
        # verl's tokenization sanity check: the whole conversation tokenized at once
        full = self.tokenizer(
            self.chat.render(t.messages, t.schemas, generation=False), add_special_tokens=False
        )
        ours = t.prompt_ids + t.response_ids
        t.stats["retokenized_differently"] = int(full["input_ids"][: len(ours)] != ours)


class _EnvFailure(Exception):
    """An environment's step raised (carries its traceback as text, to the trainer's thread)."""


def _env_step(env: Any, messages: list[dict[str, Any]]) -> tuple[Any, bool, float]:
    try:
        reply, done, reward = env.step(messages)
    except Exception as e:  # noqa: BLE001 - reported with its traceback
        raise _EnvFailure(f"{type(e).__name__}: {e}\n{traceback.format_exc()}") from None
    return reply, bool(done), float(reward)


def _run_call(tool: Tool, arguments: dict[str, Any], bound: dict[str, Any]) -> tuple[str, bool]:
    """(the text the model reads, whether the call succeeded)."""
    try:
        return call_tool(tool, arguments, bound), True
    except ToolError as e:
        return f"Error: {e}", False
    except Exception as e:  # noqa: BLE001 - a failing tool answers the model, it does not end the run
        return f"Error: {tool.name} raised {type(e).__name__}: {e}", False


def _checked_messages(messages: Any, where: str, what: str) -> list[dict[str, Any]]:
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages)
    ):
        raise MultiTurnError(
            f"{where}: the environment's {what} returned {messages!r:.100}; it must return chat messages "
            "([{'role': ..., 'content': ...}, ...])"
        )
    return [dict(m) for m in messages]


def _prompt_batch(contexts: list[list[int]], uids: list[str], pad_id: int) -> Batch:
    """Left-padded token-id prompts, as an engine's generate takes them."""
    width = max(len(c) for c in contexts)
    prompts = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        prompts[i, width - len(c) :] = torch.tensor(c, dtype=torch.long)
        mask[i, width - len(c) :] = 1
    return Batch(tensors={"prompts": prompts, "prompt_mask": mask}, non_tensors={"uid": list(uids)})
