"""The memory plan: each phase's peak estimated from the model's config.json, dtypes, batch and lengths
before anything loads (memory_choices.py chooses the `auto` settings from these estimates).

A run's memory is mostly arithmetic on numbers the config already holds: the weights, gradients and
AdamW moments scale with the parameter count; the update keeps activations per layer and token for its
backward (one hidden state per layer and token under activation checkpointing); the log-prob passes
and the update form (tokens, vocabulary) logits unless the LM head runs in chunks; the rollout holds a
key-value cache per layer and token.

Estimates are checked against measured peaks (tests/test_memory_plan.py, benchmarks/scale_ladder.py);
docs/memory.md says what each term is and what the plan does not know.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

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
            parts = ", ".join(f"{k} {gib(v)}" for k, v in sorted(p.parts.items(), key=lambda kv: -kv[1]) if v)
            out.append(f"{p.name}: {gib(p.total)} ({parts})")
        room = "unknown" if self.available is None else f"{gib(self.budget)} of {gib(self.available)}"
        out.append(f"peak {gib(self.peak.total)} in {self.peak.name}; usable {room} ({self.where})")
        out += [f"{k}={_value(v)}: {why}" for k, (v, why) in self.choices.items()]
        return out


def gib(n: int | None) -> str:
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
class RunNumbers:
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


def update_bytes(r: RunNumbers, rows: int, checkpointing: bool, chunk: int) -> dict[str, int]:
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


def _state(r: RunNumbers, shard: int = 1) -> dict[str, int]:
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


def _finish(r: RunNumbers, parts: dict[str, int]) -> dict[str, int]:
    """A phase's parts plus the allocator's slack on them and, on the CPU, the process itself."""
    parts["allocator slack"] = int(ALLOCATOR_SLACK * sum(parts.values()))
    if r.cpu:
        parts["process"] = CPU_PROCESS_BYTES
    return parts


def _layer_bytes_per_token(r: RunNumbers) -> int:
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


def _logit_bytes(r: RunNumbers, tokens: int, chunk: int) -> int:
    """The LM head's logits for `tokens` response tokens at once, or `chunk` of them at a time: the
    head's output (bfloat16 under bf16 compute) and two float32 tensors of the vocabulary's size, the
    log-softmax and its input (in the update the fused head forms the gradient in the first's place)."""
    per_token = r.shape.vocab * ((2 if r.bf16_compute else 0) + 4 + 4)
    return per_token * (min(tokens, chunk) if chunk else tokens)


def log_prob_bytes(r: RunNumbers, rows: int, chunk: int) -> dict[str, int]:
    """A no-grad log-prob pass: the weights, one layer's transients for a micro-batch, the logits."""
    s, tokens = r.shape, rows * (r.prompt + r.response)
    c = 2 if r.bf16_compute else 4
    parts = _state(r)
    parts["activations"] = tokens * (4 * 4 * s.hidden + c * 3 * s.intermediate)
    parts["logits"] = _logit_bytes(r, rows * r.response, chunk)
    return _finish(r, parts)


def rollout_bytes(r: RunNumbers, rows: int) -> dict[str, int]:
    """hf generation of `rows` rows: the key-value cache of prompt and response, the prefill's
    transients, the sampling's float32 logits."""
    s = r.shape
    c = 2 if r.bf16_compute else 4
    kv = rows * (r.prompt + r.response) * s.layers * 2 * s.kv_heads * s.head_dim * c
    prefill = rows * r.prompt * (4 * 4 * s.hidden + c * 3 * s.intermediate)
    parts = _state(r)
    parts.update({"kv cache": kv, "prefill": prefill, "logits": rows * s.vocab * 4 * 3})
    return _finish(r, parts)
