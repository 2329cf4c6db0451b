"""The rollout-engine contract: what the policy worker asks of every engine, whichever `rollout.name`.

An engine (hf_engine.HFRollout, vllm_engine.VLLMRollout, server_engine.ServerRollout) is built with
`from_config` and then only used through this contract:

- `generate(batch, params)`: each prompt n times (interleaved), with `responses`, `response_mask` and,
  when sampling, `rollout_log_probs` (the log-prob of each token under the distribution it was drawn
  from, at `params.temperature`).
- `sync_from(actor, rank=, world_size=)`: after an update (and once before the first generation), the
  engine computes with the actor's weights. The only path by which weights reach an engine, in
  training and in the tests alike; every rank of a sharded actor calls it together (it gathers).
- `abort()`: ask a generation running in another thread to stop at its next token; rows it cut short
  come back marked in `ABORTED_FIELD` with the tokens made so far. Engines that cannot (`can_abort`
  False) say so when asked, before anything is cut.
- `eos_ids`: the ids that end a response (the model's generation config's and the tokenizer's).
- `full_model()`: an unsharded module with the actor's weights, when the engine keeps one in this
  process (the hf engine); None for engines whose weights live elsewhere.
- `runs_actor_module` (class): the engine generates with the actor's own module (one rank) or a copy of
  it (several ranks), so it is built after the actor; the others start first, before the actor takes
  the GPU's memory (vLLM refuses to start when less than its share is free).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from lucidrl.batch import Batch

# per-row bool of a generation cut short by `abort()`: the response holds the tokens made before it
ABORTED_FIELD = "aborted"

# rollout.name -> (module, class) of the engine; imported only when chosen (vLLM is an optional extra)
ENGINES = {
    "hf": ("lucidrl.workers.rollout.hf_engine", "HFRollout"),
    "vllm": ("lucidrl.workers.rollout.vllm_engine", "VLLMRollout"),
    "server": ("lucidrl.workers.rollout.server_engine", "ServerRollout"),
}


@dataclass
class SamplingParams:
    """How to sample: `do_sample=False` is greedy decoding (temperature, top_p, top_k unused)."""

    n: int = 1
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    max_new_tokens: int = 256
    # set: each prompt's n samples are generated in their own call from an RNG seeded by (seed, uid),
    # so the samples do not depend on batching or on how prompts are spread over data-parallel ranks
    seed: int | None = None
    # set: a response ends with the token after which its text first matches this regular expression
    # (rollout.stop_regex; stop_rule.py), in every engine
    stop_regex: str | None = None


class AbortUnsupported(RuntimeError):
    """`abort()` on an engine that cannot cut a running generation short; names the engine."""


@runtime_checkable
class RolloutEngine(Protocol):
    """What every rollout engine provides (module docstring)."""

    name: ClassVar[str]
    runs_actor_module: ClassVar[bool]
    can_abort: ClassVar[bool]
    eos_ids: list[int]

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        device: str,
        rank: int,
        world_size: int,
        compute_dtype: torch.dtype | None,
    ) -> RolloutEngine: ...

    def generate(self, batch: Batch, params: SamplingParams) -> Batch: ...

    def sync_from(self, actor: torch.nn.Module, *, rank: int = 0, world_size: int = 1) -> str: ...

    def abort(self) -> None: ...

    def full_model(self) -> torch.nn.Module | None: ...


def engine_class(name: str) -> type[RolloutEngine]:
    """The engine class of `rollout.name`."""
    if name not in ENGINES:
        raise ValueError(f"rollout.name={name!r} is not an engine: use {', '.join(ENGINES)}")
    module, cls = ENGINES[name]
    return getattr(importlib.import_module(module), cls)


def eos_token_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """The ids that end a response: the generation config's eos ids plus the tokenizer's."""
    gen = getattr(model, "generation_config", None)
    eos = gen.eos_token_id if gen is not None else None
    eos_ids = list(eos) if isinstance(eos, list) else ([eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    if not eos_ids:
        raise ValueError(
            "the tokenizer and the model's generation_config define no eos token; generation could not stop"
        )
    return eos_ids
