"""The memory plan: each phase's peak estimated from the model's config.json, dtypes, batch and lengths
before anything loads, `auto` settings chosen to fit, and fixed ones that cannot fit refused.

A run's memory is mostly arithmetic on numbers the config already holds: the weights, gradients and
AdamW moments scale with the parameter count; the update keeps activations per layer and token for its
backward (one hidden state per layer and token under activation checkpointing); the log-prob passes
and the update form (tokens, vocabulary) logits unless the LM head runs in chunks; the rollout holds a
key-value cache per layer and token. What the plan decides when its key is `auto`:

- `actor.head_chunk_tokens`: the chunked LM head wherever the vocabulary is large enough for the logits
  to matter (benchmarks/head_chunks.py measured it no slower there), on one rank;
- `actor.ppo_micro_batch_size` / `actor.log_prob_micro_batch_size`: the largest divisor of the
  mini-batch's samples within a token target, smaller where the phase would not fit;
- `model.enable_gradient_checkpointing`: on only where no micro-batch of at least MIN_UPDATE_TOKENS
  fits without it.

Estimates are checked against measured peaks (tests/test_memory_plan.py, benchmarks/scale_ladder.py);
docs/memory.md says what each term is and what the plan does not know.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from lucidrl.config.errors import ConfigError

GIB = 1024**3

# the process itself on a CPU: Python, torch, transformers and lucidrl imported, before any model
CPU_PROCESS_BYTES = int(0.45 * GIB)
# the allocator's share on top of what a phase holds (holes between buffers of changing sizes)
ALLOCATOR_SLACK = 0.10
# measured peak / counted bytes of a decoder layer's saved activations (benchmarks/memory_plan.py)
LAYER_CALIBRATION = 1.35
# of the memory found, what the plan lets a run use (the rest: the allocator's slack, other processes)
USABLE_SHARE = 0.85
# token targets of one micro-batch when its key is auto (rows x (prompt + response) tokens), on the CPU
# and on a GPU (verl's ppo_max_token_len_per_gpu default); the log-prob passes take twice as many
UPDATE_TOKENS = {"cpu": 4096, "cuda": 16384}
# the smallest update micro-batch (in tokens) the plan takes before it turns activation checkpointing on
MIN_UPDATE_TOKENS = 512
# the vocabulary from which the auto LM head runs in chunks; the chunk: the largest power of two up to
# AUTO_CHUNK_TOKENS whose (chunk, vocabulary) float32 logits stay within CHUNK_ENTRIES entries
CHUNK_FROM_VOCAB = 16384
AUTO_CHUNK_TOKENS = 1024
CHUNK_ENTRIES = 64 * 2**20
# logits transforms in config.json that the chunked head would skip (workers/training/forward.py checks them too)
_LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
    "lm_head_multiplier",
)


@dataclass(frozen=True)
class ModelShape:
    """What the plan reads from a decoder's config.json."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    logit_transform: bool = False
    qkv_bias: bool = False  # Qwen2's q/k/v projections have biases

    @property
    def layer_params(self) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return attention + bias + 3 * self.hidden * self.intermediate + 2 * self.hidden  # and its two norms

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * self.layer_params + self.hidden  # and the final norm

    def lora_params(self, rank: int) -> int:
        """Adapter parameters of rank `rank` on every linear layer of every decoder layer (all-linear)."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        per_layer = rank * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
        return self.layers * per_layer

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        t = config.get("text_config", config)
        hidden, layers, vocab = int(t["hidden_size"]), int(t["num_hidden_layers"]), int(t["vocab_size"])
        heads = int(t.get("num_attention_heads") or 1)
        return cls(
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=int(t.get("num_key_value_heads") or heads),
            head_dim=int(t.get("head_dim") or hidden // heads),
            intermediate=int(t.get("intermediate_size") or 4 * hidden),
            vocab=vocab,
            tied=bool(t.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
            logit_transform=any(t.get(k) not in (None, 1, 1.0) for k in _LOGIT_TRANSFORMS),
            qkv_bias=bool(t.get("attention_bias", t.get("model_type") == "qwen2")),
        )

    @classmethod
    def from_path(cls, path: str) -> ModelShape | None:
        """The shape of the model folder's config.json; None when it is missing or not a decoder's."""
        try:
            with open(os.path.join(path, "config.json")) as f:
                return cls.from_config(json.load(f))
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclass
class Phase:
    """One phase's estimated peak and what it is made of (bytes)."""

    name: str
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass
class MemoryPlan:
    """Per-phase peaks, what was chosen for the auto keys (and why), and the memory found."""

    device: str
    available: int | None  # bytes found (host RAM available, or the GPU's), None when unknown
    where: str  # where `available` came from
    phases: list[Phase] = field(default_factory=list)
    choices: dict[str, tuple[Any, str]] = field(default_factory=dict)  # key -> (value, why)

    @property
    def budget(self) -> int | None:
        return None if self.available is None else int(self.available * USABLE_SHARE)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    def lines(self) -> list[str]:
        """The plan in words: one line per phase with its biggest parts, then the choices."""
        out = []
        for p in self.phases:
            parts = ", ".join(
                f"{k} {_gib(v)}" for k, v in sorted(p.parts.items(), key=lambda kv: -kv[1]) if v
            )
            out.append(f"{p.name}: {_gib(p.total)} ({parts})")
        room = "unknown" if self.available is None else f"{_gib(self.budget)} of {_gib(self.available)}"
        out.append(f"peak {_gib(self.peak.total)} in {self.peak.name}; usable {room} ({self.where})")
        out += [f"{k}={_value(v)}: {why}" for k, (v, why) in self.choices.items()]
        return out


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f} GiB"


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def available_memory(device: str, budget_gib: float | None = None) -> tuple[int | None, str]:
    """Bytes a run on `device` may use and where the figure came from: trainer.memory_budget_gib when
    set, else the host's MemAvailable (CPU) or the GPU's total memory (CUDA); (None, why) when unknown."""
    if budget_gib is not None:
        return int(budget_gib * GIB), "trainer.memory_budget_gib"
    if device.startswith("cuda"):
        try:
            import torch

            if torch.cuda.is_available():
                index = int(device.split(":")[1]) if ":" in device else 0
                return torch.cuda.get_device_properties(index).total_memory, f"the memory of {device}"
        except Exception:  # no driver here: the ranks may be on another host
            pass
        return None, "no GPU visible in this process"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    return None, "/proc/meminfo unreadable"


@dataclass(frozen=True)
class _Run:
    """The numbers of one run that the estimate reads."""

    shape: ModelShape
    cpu: bool
    weight_bytes: int  # per parameter: 4 float32, 2 bfloat16
    bf16_compute: bool  # bf16 autocast over float32 weights
    lora_rank: int
    reference: bool  # a frozen reference copy of the weights
    prompt: int  # tokens
    response: int
    mini_samples: int  # samples per mini-batch on one rank
    rollout_rows: int  # rows one generate call decodes together
    val_rows: int
    world_size: int
    eager_attention: bool
    n: int  # samples per prompt
    share_prompt: bool  # actor.share_prompt_forward with n > 1


def _update_bytes(r: _Run, rows: int, checkpointing: bool, chunk: int) -> dict[str, int]:
    """The update phase's peak: state plus one micro-batch's forward and backward."""
    s = r.shape
    if r.share_prompt and not checkpointing:  # each prompt runs once for its group's samples
        tokens = -(-rows // r.n) * r.prompt + rows * r.response
    else:  # under checkpointing the forward runs every sample whole (workers/training/forward.py)
        tokens = rows * (r.prompt + r.response)
    params = s.params
    parts = _state(r, shard=r.world_size)
    if r.bf16_compute:
        # a bf16 copy of each matrix for the forward's backward: autocast's cache of the trained weights,
        # or (LoRA) the casts of the frozen ones that each linear layer saves to pass the gradient on
        parts["bf16 weight copies"] = (params - s.vocab * s.hidden * (0 if s.tied else 1)) * 2
    layer = _layer_bytes_per_token(r)
    if checkpointing:  # each layer's input (and rotary tables) kept; one layer recomputed with its gradients
        parts["activations"] = tokens * (s.layers * (4 * s.hidden + 8 * s.head_dim) + 2 * layer)
    else:
        parts["activations"] = tokens * s.layers * layer
    parts["logits"] = _logit_bytes(r, rows * r.response, chunk)
    return _finish(r, parts)


def _state(r: _Run, shard: int = 1) -> dict[str, int]:
    """What every phase holds: the weights, the float32 gradients and AdamW moments of the trained
    parameters (kept between updates), a reference copy with a KL term; FSDP2's share of them in the
    update (the log-prob passes and the rollout are counted whole)."""
    params = r.shape.params
    trainable = r.shape.lora_params(r.lora_rank) if r.lora_rank else params
    parts = {
        "weights": params * r.weight_bytes // shard,
        "gradients": trainable * 4 // shard,
        "optimizer": trainable * 8 // shard,
    }
    if r.reference:
        parts["reference"] = params * r.weight_bytes // shard
    return parts


def _finish(r: _Run, parts: dict[str, int]) -> dict[str, int]:
    """A phase's parts plus the allocator's slack on them and, on the CPU, the process itself."""
    parts["allocator slack"] = int(ALLOCATOR_SLACK * sum(parts.values()))
    if r.cpu:
        parts["process"] = CPU_PROCESS_BYTES
    return parts


def _layer_bytes_per_token(r: _Run) -> int:
    """Bytes one decoder layer's training forward keeps per token for its backward.

    What autograd saves in a Llama/Qwen2 layer: the two RMSNorms' float32 inputs and outputs, the linear
    layers' inputs in the compute dtype (q/k/v, o, gate/up, down), the rotary and attention tensors
    (float32 attention on CPUs without AMX), the gated MLP's three intermediate-size tensors; times
    LAYER_CALIBRATION, the ratio of the measured peak to this count (benchmarks/memory_plan.py)."""
    s = r.shape
    c = 2 if r.bf16_compute else 4  # the compute dtype's bytes
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    norms = 2 * 8 * s.hidden
    linear_inputs = c * (3 * s.hidden + q + 2 * s.hidden + s.intermediate)
    attention = c * (2 * q + 3 * kv) + 4 * q + 4 * s.heads  # rotary q/k, q/k/v, out, log-sum-exp
    mlp = c * 3 * s.intermediate
    layer = norms + linear_inputs + attention + mlp
    if r.eager_attention:  # the (heads, length) probabilities per token and their dropout
        layer += 2 * 4 * s.heads * (r.prompt + r.response)
    return int(LAYER_CALIBRATION * layer)


def _logit_bytes(r: _Run, tokens: int, chunk: int) -> int:
    """The LM head's logits for `tokens` response tokens at once, or `chunk` of them at a time: the
    head's output (bfloat16 under bf16 compute) and two float32 tensors of the vocabulary's size, the
    log-softmax and its input (in the update the fused head forms the gradient in the first's place)."""
    per_token = r.shape.vocab * ((2 if r.bf16_compute else 0) + 4 + 4)
    return per_token * (min(tokens, chunk) if chunk else tokens)


def _log_prob_bytes(r: _Run, rows: int, chunk: int) -> dict[str, int]:
    """A no-grad log-prob pass: the weights, one layer's transients for a micro-batch, the logits."""
    s, tokens = r.shape, rows * (r.prompt + r.response)
    c = 2 if r.bf16_compute else 4
    parts = _state(r)
    parts["activations"] = tokens * (4 * 4 * s.hidden + c * 3 * s.intermediate)
    parts["logits"] = _logit_bytes(r, rows * r.response, chunk)
    return _finish(r, parts)


def _rollout_bytes(r: _Run, rows: int) -> dict[str, int]:
    """hf generation of `rows` rows: the key-value cache of prompt and response, the prefill's
    transients, the sampling's float32 logits."""
    s = r.shape
    c = 2 if r.bf16_compute else 4
    kv = rows * (r.prompt + r.response) * s.layers * 2 * s.kv_heads * s.head_dim * c
    prefill = rows * r.prompt * (4 * 4 * s.hidden + c * 3 * s.intermediate)
    parts = _state(r)
    parts.update({"kv cache": kv, "prefill": prefill, "logits": rows * s.vocab * 4 * 3})
    return _finish(r, parts)


def _divisors_desc(n: int, at_most: int) -> list[int]:
    return [d for d in range(min(n, max(at_most, 1)), 0, -1) if n % d == 0]


def _run_numbers(cfg: Any, shape: ModelShape) -> _Run:
    from lucidrl.config.placement import plan_groups

    world = max((p.world_size for p in plan_groups(cfg) if "actor" in p.roles), default=1)
    d, a, r, m = cfg.data, cfg.actor, cfg.rollout, cfg.model
    reference = bool(a.use_kl_loss or cfg.algorithm.use_kl_in_reward)
    val_rows = (d.val_batch_size or 64) * cfg.rollout.val_kwargs.n if d.val_files else 0
    return _Run(
        shape=shape,
        cpu=not str(cfg.trainer.device).startswith("cuda"),
        weight_bytes=2 if m.dtype == "bfloat16" else 4,
        bf16_compute=m.compute_dtype == "bfloat16" and m.dtype == "float32",
        lora_rank=m.lora_rank,
        reference=reference,
        prompt=d.max_prompt_length,
        response=d.max_response_length,
        mini_samples=max(a.ppo_mini_batch_size * r.n // world, 1),
        rollout_rows=min(r.micro_batch_size, d.train_batch_size * r.n),
        val_rows=min(r.micro_batch_size, val_rows),
        world_size=world,
        eager_attention=m.attn_implementation == "eager",
        n=r.n,
        share_prompt=a.share_prompt_forward and r.n > 1,
    )


def plan_memory(cfg: Any, shape: ModelShape | None = None) -> MemoryPlan | None:
    """The memory plan of an RL config (config.schema.LucidConfig), its auto keys resolved in place; None
    when the model's config.json cannot be read (the auto keys then take their plain defaults).

    Raises ConfigError when settings the user fixed need more memory than the machine has, naming the
    phase, the numbers and the keys that would make it fit."""
    shape = shape or ModelShape.from_path(cfg.model.path)
    if shape is None:
        _plain_defaults(cfg)
        return None
    run = _run_numbers(cfg, shape)
    available, where = available_memory(str(cfg.trainer.device), cfg.trainer.memory_budget_gib)
    v = cfg.rollout.vllm
    if available and not run.cpu and cfg.rollout.name == "vllm" and not v.enable_sleep_mode:
        # a colocated vLLM engine keeps its share of the GPU through the update
        available = int(available * (1 - v.gpu_memory_utilization))
        where += f", less rollout.vllm.gpu_memory_utilization={v.gpu_memory_utilization}"
    plan = MemoryPlan(device=str(cfg.trainer.device), available=available, where=where)
    budget = plan.budget
    a, m = cfg.actor, cfg.model
    width = run.prompt + run.response
    target = UPDATE_TOKENS["cpu" if run.cpu else "cuda"]

    # the LM head: chunks where the vocabulary is large, on one rank and without logit transforms
    if a.head_chunk_tokens == "auto":
        if run.world_size > 1 or shape.logit_transform or shape.vocab < CHUNK_FROM_VOCAB:
            why = (
                "several ranks" if run.world_size > 1
                else "the model's logits are not just its LM head's" if shape.logit_transform
                else f"a vocabulary of {shape.vocab} (< {CHUNK_FROM_VOCAB}): its logits are small"
            )  # fmt: skip
            a.head_chunk_tokens = 0
        else:
            chunk = AUTO_CHUNK_TOKENS
            while chunk > 64 and chunk * shape.vocab > CHUNK_ENTRIES:
                chunk //= 2
            a.head_chunk_tokens = chunk
            why = f"a vocabulary of {shape.vocab}: no (tokens, vocabulary) logits, {chunk} tokens at a time"
        plan.choices["actor.head_chunk_tokens"] = (a.head_chunk_tokens, why)
    chunk = a.head_chunk_tokens

    # the update: micro-batch and checkpointing
    fits = (lambda n: True) if budget is None else (lambda n: n <= budget)  # noqa: E731
    mb_auto, ckpt_auto = a.ppo_micro_batch_size == "auto", m.enable_gradient_checkpointing == "auto"
    if a.use_dynamic_bsz:  # verl's token budget decides the micro-batches
        rows_options = [max(a.ppo_max_token_len_per_gpu // width, 1)]
    elif mb_auto:
        rows_options = _divisors_desc(run.mini_samples, max(target // width, 1))
    else:
        rows_options = [a.ppo_micro_batch_size]
    ckpt_options = [False, True] if ckpt_auto else [m.enable_gradient_checkpointing]
    chosen = None
    for ckpt in ckpt_options:  # without checkpointing, down to MIN_UPDATE_TOKENS; then with it
        for rows in rows_options:
            small = rows * width < MIN_UPDATE_TOKENS and rows != rows_options[0]
            if ckpt is False and ckpt_auto and small:
                break
            if fits(sum(_update_bytes(run, rows, ckpt, chunk).values())):
                chosen = (rows, ckpt)
                break
        if chosen:
            break
    if chosen is None and ckpt_auto and mb_auto:  # below MIN_UPDATE_TOKENS without checkpointing
        for rows in rows_options:
            if fits(sum(_update_bytes(run, rows, True, chunk).values())):
                chosen = (rows, True)
                break
    if chosen is None:
        rows, ckpt = rows_options[-1], ckpt_options[-1]
        need = _update_bytes(run, rows, ckpt, chunk)
        raise ConfigError(_refusal("the update", need, plan, cfg, run))
    rows, ckpt = chosen
    if mb_auto and not a.use_dynamic_bsz:
        a.ppo_micro_batch_size = rows
        plan.choices["actor.ppo_micro_batch_size"] = (
            rows, f"{rows} samples of up to {width} tokens: the largest divisor of the mini-batch's "
            f"{run.mini_samples} samples within {target} tokens that fits",
        )  # fmt: skip
    elif a.ppo_micro_batch_size == "auto":
        a.ppo_micro_batch_size = 8  # unused with use_dynamic_bsz
    if ckpt_auto:
        m.enable_gradient_checkpointing = ckpt
        plan.choices["model.enable_gradient_checkpointing"] = (
            ckpt, "needed to fit the update" if ckpt else "the update fits without it",
        )  # fmt: skip
    plan.phases.append(Phase(f"update ({rows} x {width} tokens)", _update_bytes(run, rows, ckpt, chunk)))

    # the log-prob passes
    if a.log_prob_micro_batch_size == "auto":
        options = _divisors_desc(run.mini_samples, max(2 * target // width, 1)) or [1]
        lp_rows = next(
            (n for n in options if fits(sum(_log_prob_bytes(run, n, chunk).values()))), options[-1]
        )
        a.log_prob_micro_batch_size = lp_rows
        plan.choices["actor.log_prob_micro_batch_size"] = (
            lp_rows, f"the largest divisor of {run.mini_samples} samples within {2 * target} tokens that fits",
        )  # fmt: skip
    lp_rows = a.log_prob_max_token_len_per_gpu // width if a.use_dynamic_bsz else a.log_prob_micro_batch_size
    plan.phases.append(
        Phase(f"log-prob pass ({lp_rows} x {width} tokens)", _log_prob_bytes(run, lp_rows, chunk))
    )

    # generation (hf: lucidrl's or transformers' loop; vLLM and servers hold their own memory)
    if cfg.rollout.name == "hf":
        rows = max(run.rollout_rows, run.val_rows)
        plan.phases.append(Phase(f"rollout ({rows} rows x {width} tokens)", _rollout_bytes(run, rows)))
    for phase in plan.phases:
        if budget is not None and phase.total > budget:
            raise ConfigError(_refusal(phase.name.split(" (")[0], phase.parts, plan, cfg, run))
    return plan


def _plain_defaults(cfg: Any) -> None:
    """The auto keys' values when there is no plan (no readable config.json)."""
    cfg.actor = plain_actor(cfg.actor, cfg.actor.ppo_mini_batch_size * cfg.rollout.n)
    if cfg.model.enable_gradient_checkpointing == "auto":
        cfg.model.enable_gradient_checkpointing = False


def plain_actor(actor: Any, mini_samples: int = 8) -> Any:
    """An ActorConfig with any auto key that no plan resolved (a config built in code, or a model
    without a readable config.json) at its plain value: whole-head logits, micro-batches of 8 samples
    (at most the mini-batch's) and 16 for the log-prob passes."""
    from dataclasses import replace

    changes: dict[str, int] = {}
    if actor.head_chunk_tokens == "auto":
        changes["head_chunk_tokens"] = 0
    if actor.ppo_micro_batch_size == "auto":
        changes["ppo_micro_batch_size"] = min(8, max(mini_samples, 1))
    if actor.log_prob_micro_batch_size == "auto":
        changes["log_prob_micro_batch_size"] = 16
    return replace(actor, **changes) if changes else actor


def _refusal(phase: str, parts: dict[str, int], plan: MemoryPlan, cfg: Any, run: _Run) -> str:
    biggest = ", ".join(f"{k} {_gib(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    fixes = []
    if (
        isinstance(cfg.actor.ppo_micro_batch_size, int)
        and cfg.actor.ppo_micro_batch_size > 1
        and phase == "the update"
    ):
        fixes.append("actor.ppo_micro_batch_size=auto (or smaller)")
    if cfg.model.enable_gradient_checkpointing is False:
        fixes.append("model.enable_gradient_checkpointing=auto")
    if not cfg.model.lora_rank:
        fixes.append("model.lora_rank=16 (LoRA: no full gradients or optimizer state)")
    if cfg.rollout.micro_batch_size > 1 and phase == "rollout":
        fixes.append("a smaller rollout.micro_batch_size")
    fixes.append("shorter data.max_prompt_length / data.max_response_length")
    return (
        f"memory plan: {phase} needs about {_gib(sum(parts.values()))} ({biggest}), but {_gib(plan.budget)} "
        f"are usable here ({USABLE_SHARE:.0%} of {_gib(plan.available)}, {plan.where}); to fit, try "
        + "; ".join(fixes)
        + ". `lucidrl doctor CONFIG` prints the whole plan (docs/memory.md)"
    )
