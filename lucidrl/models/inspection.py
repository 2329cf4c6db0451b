"""Check a model folder against its own config without loading the weights (`lucidrl doctor`).

The architecture is built on the meta device (no memory), and the names and shapes it expects are
compared with the safetensors headers in the folder: a checkpoint saved from another architecture, a
truncated shard or a resized embedding shows up in seconds, even for a model too big for this machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lucidrl.models.loading import ModelLoadError, check_model_folder, read_weight_shapes

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class ModelInspection:
    architecture: str
    num_parameters: int
    embedding_rows: int
    max_positions: int | None
    weight_files: list[str]
    checked_tensors: int  # tensors whose name and shape were compared; 0 when the weights are not safetensors
    converted: bool = (
        False  # transformers renames or fuses this architecture's tensors on load: names not compared
    )
    missing: list[str] = field(default_factory=list)  # the architecture expects them, no file has them
    unexpected: list[str] = field(default_factory=list)  # in the files, not in the architecture
    mismatched: list[str] = field(default_factory=list)  # "name: file (a, b) vs model (c, d)"

    def size_gib(self, dtype: str) -> float:
        return self.num_parameters * _BYTES[dtype] / 2**30


def inspect_model_folder(path: str, *, config_key: str = "model.path", trust_remote_code: bool = False):
    """Build `path`'s architecture on the meta device and compare it with the weight files' headers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = check_model_folder(path, config_key)
    try:
        config = AutoConfig.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=trust_remote_code
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception as exc:  # an unknown model_type, a config error, remote code refused...
        raise ModelLoadError(
            f"{config_key}={path!r}: transformers cannot build the architecture in its config.json "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); check config.json's model_type and "
            "the transformers version, or set model.trust_remote_code=true for a model that ships its own code"
        ) from exc
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    out = ModelInspection(
        architecture=type(model).__name__,
        num_parameters=sum(p.numel() for p in model.parameters()),
        embedding_rows=model.get_input_embeddings().weight.shape[0],
        max_positions=getattr(config, "max_position_embeddings", None),
        weight_files=[],
        checked_tensors=0,
    )
    found = read_weight_shapes(folder, config_key)
    if found is None:
        out.weight_files = sorted(p.name for p in folder.glob("*.bin"))
        if not out.weight_files:
            raise ModelLoadError(
                f"{config_key}={path!r} has a config.json but no weight files (*.safetensors or *.bin); copy "
                "the weights into the folder, or save the model again with save_pretrained"
            )
        return out
    out.weight_files, shapes = found
    if _converts_on_load(model):
        out.converted = True
        return out
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""
    if prefix and shapes and not any(k.startswith(prefix) for k in shapes):
        shapes = {prefix + k: v for k, v in shapes.items()}  # saved from the bare backbone: HF adds it back
    tied = [k for k in expected if k not in shapes and _is_tied(model, k)]
    out.missing = sorted(k for k in expected if k not in shapes and k not in tied)
    out.unexpected = sorted(k for k in shapes if k not in expected)
    out.mismatched = sorted(
        f"{k}: file {shapes[k]} vs model {expected[k]}"
        for k in expected
        if k in shapes and shapes[k] != expected[k]
    )
    out.checked_tensors = sum(1 for k in expected if k in shapes)
    return out


def _converts_on_load(model: Any) -> bool:
    """Whether transformers maps this architecture's saved tensors onto others when loading (MoE experts
    fused into one tensor, renamed keys): the file's names then differ from the module's by design."""
    try:
        from transformers.conversion_mapping import extract_weight_conversions_for_model
    except ImportError:  # an older transformers: no conversions
        return False
    return bool(extract_weight_conversions_for_model(model))


def _is_tied(model: Any, key: str) -> bool:
    """Whether `key` is the output embedding of a model that ties it to the input embedding."""
    out = model.get_output_embeddings()
    return bool(
        getattr(model.config, "tie_word_embeddings", False)
        and out is not None
        and out.weight is model.get_input_embeddings().weight
        and key.endswith("weight")
        and any(key == f"{name}.weight" for name, mod in model.named_modules() if mod is out)
    )
