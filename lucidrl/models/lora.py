"""LoRA through peft: adapters on the actor, the base weights frozen; merged into a plain model to save.

`model.lora_rank=r` wraps the actor in a peft model right after the reference is copied from the same
base weights, so the reference (and its KL) is the base model. Only the adapters train, so AdamW holds
state for them alone, and a checkpoint stores them as peft does (`adapter_config.json`,
`adapter_model.safetensors`); the final model and `lucidrl export` merge them into the base weights.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Any

import torch

ADAPTER = "adapter"  # the adapter folder inside a role's checkpoint folder, or inside final/


def is_lora(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def quiet_peft():
    """Silence the FutureWarning peft causes by reading transformers' deprecated `is_gradient_checkpointing`
    alias when it wraps a model: printed on every LoRA run, and no lucidrl setting can change it."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


def apply_lora(model: torch.nn.Module, m: Any) -> torch.nn.Module:
    """`model` with LoRA adapters of rank m.lora_rank on m.target_modules; m: config.schema.ModelConfig."""
    from peft import LoraConfig, get_peft_model

    from lucidrl.config import ConfigError

    targets = list(m.target_modules)  # "all-linear" alone or not at all: the config loader checks it
    tied = getattr(model.config, "tie_word_embeddings", False)
    shared = [t for t in targets if t in ("lm_head", "embed_tokens")]
    if tied and shared:
        raise ConfigError(
            f"model.target_modules={targets}: {shared} share one weight (tie_word_embeddings=true); merging an "
            "adapter on one changes the other too, so the saved model would differ from the trained one. "
            "Leave them out (all-linear does)"
        )
    config = LoraConfig(
        r=m.lora_rank,
        lora_alpha=m.lora_alpha,
        lora_dropout=m.lora_dropout,
        target_modules="all-linear" if targets == ["all-linear"] else list(targets),
        task_type="CAUSAL_LM",
    )
    try:
        with quiet_peft():
            wrapped = get_peft_model(model, config)
    except ValueError as e:
        if "not found" not in str(e):  # peft: "Target modules {...} not found in the base model"
            raise
        raise ConfigError(f"model.target_modules={targets}: {e}") from e
    if targets != ["all-linear"]:
        # peft raises only when no name matches: one that matches nothing beside others is dropped
        names = wrapped.targeted_module_names
        unmatched = [
            t for t in targets if not any(n == t or n.endswith("." + t) for n in names)
        ]  # peft's rule
        adapted = {n.rsplit(".", 1)[-1] for n in names}
        if unmatched:
            raise ConfigError(
                f"model.target_modules={targets}: {unmatched} match no module of the model (adapted: "
                f"{sorted(adapted)}); fix or remove them"
            )
    return wrapped


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain HuggingFace model with the adapters added into the base weights (`model` is left as it is)."""
    return copy.deepcopy(model).merge_and_unload()


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put saved adapter weights into `model`; an adapter weight the file lacks is an error."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing:
        raise ValueError(f"the saved adapter lacks {len(missing)} LoRA weights (first: {missing[:2]})")
