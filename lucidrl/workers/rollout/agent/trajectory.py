"""One sample's conversation as token segments, and a batch of them as the rollout's output.

Layout of one sample (docs/multi_turn.md draws it):

    prompts          [pad .. pad | prompt tokens (chat template, tools described)]
    responses        [turn 1 | tool reply | turn 2 | env reply | turn 3 | pad ..]
    response_mask    [1 ... 1 | 0 ...... 0 | 1 ... 1 | 0 ..... 0 | 1 ... 1 | 0 ..]   the loss: the model's tokens
    response_attention_mask  [1 ............................................... 1 | 0 ..]   every real token
    rollout_log_probs        the sampling log-prob of each model token, 0 in the gaps

Per-sample counters travel as `multi_turn:<name>` tensors (bs,), averaged into `multi_turn/...` metrics.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from lucidrl.batch import RESPONSE_ATTENTION, Batch
from lucidrl.workers.rollout.agent.tools import Tool

STAT_PREFIX = "multi_turn:"
# per-sample counts, each a multi_turn:<name> tensor in the batch
STATS = (
    "turns",  # assistant turns
    "tool_calls",  # calls the model wrote, well-formed or not
    "valid_calls",  # of those: parsed, of a tool the row has, with arguments its schema takes
    "invalid_calls",  # answered with what was wrong
    "tool_errors",  # valid calls that failed: the tool raised, or did not answer in time
    "unexecuted_calls",  # valid calls not run: past max_parallel_calls, or in the last allowed turn
    "truncated_replies",  # tool or environment replies cut to max_tool_response_tokens
    "off_template",  # 1: the tokens differ from what the template renders for the conversation (chat.py)
    "generated_tokens",  # the model's tokens (in the loss)
    "observation_tokens",  # the tools' and environment's tokens (not in the loss)
    "cut_max_turns",  # 1: the sample still called a tool, or the environment was not done, at max_turns
    "cut_max_response_length",  # 1: it ran out of data.max_response_length tokens
    "retokenized_differently",  # 1: tokenizing the whole conversation at once gives other tokens
    "env_reward",  # the sum of the environment's step rewards
)


@dataclass
class Trajectory:
    """A sample being generated: its prompt, the segments after it, the messages they render."""

    uid: str  # the prompt's (its n samples share it)
    sample: int  # which of them
    tools: dict[str, tuple[Tool, dict[str, Any]]]  # name -> (tool, the row's hidden arguments)
    schemas: list[dict[str, Any]]
    env: Any | None
    messages: list[dict[str, Any]]  # the conversation so far (a pre-filled assistant message excluded)
    prefill: str | None  # a pre-filled start of the first assistant turn
    prompt_ids: list[int]
    text: str  # the text of every token so far: what the model has seen and written
    prompt_messages: int  # the messages of `messages` that were the prompt (a few-shot example's too)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)
    turn_rewards: list[float] = field(default_factory=list)
    cut: str | None = None  # "max_turns" or "max_response_length"
    done: bool = False
    # the assistant turn just generated, waiting for its answers
    assistant: dict[str, Any] | None = None
    eos_text: str = ""

    def extend(self, ids: list[int], in_loss: bool, log_probs: list[float] | None = None) -> None:
        self.response_ids += ids
        self.loss_mask += [int(in_loss)] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)

    def end(self, cut: str | None = None) -> None:
        """The sample is over; its waiting assistant turn joins the conversation."""
        if self.assistant is not None:
            self.messages.append(self.assistant)
            self.assistant = None
        if cut and self.cut is None:
            self.cut = cut
        self.done = True

    def solution_text(self) -> str:
        """The assistant's turns after the prompt, joined: what a reward function reads as solution_str.
        An assistant message in the prompt (a worked example) is not the model's answer."""
        written = self.messages[self.prompt_messages :]
        return "\n".join(str(m.get("content") or "") for m in written if m.get("role") == "assistant")


def to_batch(trajectories: list[Trajectory], expanded: Batch, pad_id: int, with_log_probs: bool) -> Batch:
    """The rollout's output: re-rendered prompts (left-padded), responses with both masks, log-probs,
    the counters, and per sample its conversation, solution text and extra_info with the conversation."""
    device = expanded["prompts"].device if "prompts" in expanded else torch.device("cpu")
    bs = len(trajectories)
    width_p = max(len(t.prompt_ids) for t in trajectories)
    width_r = max(1, max(len(t.response_ids) for t in trajectories))
    prompts = torch.full((bs, width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((bs, width_p), dtype=torch.long)
    responses = torch.full((bs, width_r), pad_id, dtype=torch.long)
    loss = torch.zeros((bs, width_r), dtype=torch.long)
    attention = torch.zeros((bs, width_r), dtype=torch.long)
    log_probs = torch.zeros((bs, width_r), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        p, r = len(t.prompt_ids), len(t.response_ids)
        prompts[i, width_p - p :] = torch.tensor(t.prompt_ids, dtype=torch.long)
        prompt_mask[i, width_p - p :] = 1
        if r:
            responses[i, :r] = torch.tensor(t.response_ids, dtype=torch.long)
            loss[i, :r] = torch.tensor(t.loss_mask, dtype=torch.long)
            attention[i, :r] = 1
            log_probs[i, :r] = torch.tensor(t.log_probs, dtype=torch.float32)
    out = Batch(dict(expanded.tensors), dict(expanded.non_tensors), dict(expanded.meta))
    tensors = {
        "prompts": prompts,
        "prompt_mask": prompt_mask,
        "responses": responses,
        "response_mask": loss,
        RESPONSE_ATTENTION: attention,
    }
    if with_log_probs:
        tensors["rollout_log_probs"] = log_probs * loss
    for name in STATS:
        tensors[STAT_PREFIX + name] = torch.tensor([float(t.stats[name]) for t in trajectories])
    for key, value in tensors.items():
        out.set(key, value.to(device))
    infos = expanded["extra_info"] if "extra_info" in expanded else [{}] * bs
    out.set(
        "extra_info",
        [
            {
                **(info or {}),
                "conversation": t.messages,
                "prompt_messages": t.prompt_messages,
                "num_turns": t.stats["turns"],
                "tool_calls": t.stats["tool_calls"],
                "turn_rewards": list(t.turn_rewards),
                "cut": t.cut,
            }
            for info, t in zip(infos, trajectories, strict=True)
        ],
    )
    out.set("conversation", [t.messages for t in trajectories])
    out.set("solution_text", [t.solution_text() for t in trajectories])
    return out


def multi_turn_metrics(batch: Batch, prefix: str = "multi_turn") -> dict[str, float]:
    """`multi_turn/...` means of a rollout's counters; {} for a batch without them (single-turn).

    tool_call_rate: share of samples that wrote at least one call; valid_call_rate: valid calls over
    all calls written (absent when none was written); cut/*, off_template, retokenized_differently: share
    of samples.
    """
    if STAT_PREFIX + "turns" not in batch:
        return {}
    s = {name: batch[STAT_PREFIX + name].float() for name in STATS}
    out = {
        f"{prefix}/turns/mean": s["turns"].mean().item(),
        f"{prefix}/turns/max": s["turns"].max().item(),
        f"{prefix}/tool_call_rate": (s["tool_calls"] > 0).float().mean().item(),
        f"{prefix}/tool_calls/mean": s["tool_calls"].mean().item(),
        f"{prefix}/invalid_calls/mean": s["invalid_calls"].mean().item(),
        f"{prefix}/tool_errors/mean": s["tool_errors"].mean().item(),
        f"{prefix}/unexecuted_calls/mean": s["unexecuted_calls"].mean().item(),
        f"{prefix}/truncated_replies/mean": s["truncated_replies"].mean().item(),
        f"{prefix}/cut/max_turns": s["cut_max_turns"].mean().item(),
        f"{prefix}/cut/max_response_length": s["cut_max_response_length"].mean().item(),
        f"{prefix}/generated_tokens/mean": s["generated_tokens"].mean().item(),
        f"{prefix}/observation_tokens/mean": s["observation_tokens"].mean().item(),
        f"{prefix}/off_template": s["off_template"].mean().item(),
        f"{prefix}/retokenized_differently": s["retokenized_differently"].mean().item(),
        f"{prefix}/env_reward/mean": s["env_reward"].mean().item(),
    }
    calls = s["tool_calls"].sum().item()
    if calls > 0:
        out[f"{prefix}/valid_call_rate"] = s["valid_calls"].sum().item() / calls
    return {k: v for k, v in out.items() if not math.isnan(v)}
