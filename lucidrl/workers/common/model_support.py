"""What a model lets lucidrl's decode loop and forwards do: its forward's arguments, whether every layer
is attention (a key-value cache can hold it), and whether its prompts may share a prefix."""

from __future__ import annotations

import inspect

import torch

from lucidrl.diagnostics.errors import UserError


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HuggingFace model inside a DistributedDataParallel wrapper or a peft model."""
    base = getattr(model, "module", model)
    return base.get_base_model() if hasattr(base, "get_base_model") else base


def _forward_params(model: torch.nn.Module):
    """The parameters of the HuggingFace forward: a peft model's (or a DDP wrapper's) own forward takes
    **kwargs and hands them to the model inside, which is the one that says what it accepts."""
    return inspect.signature(_base_model(model).forward).parameters


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns)."""
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def last_logits_only(model: torch.nn.Module) -> dict[str, int]:
    """Forward kwargs that skip the LM head on every position but the last (prompt forwards need only it)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}


class DecodeLoopUnsupported(UserError, ValueError):
    """A model lucidrl's decode loop cannot run (rollout.decode_loop=transformers can)."""


def non_attention_layers(model: torch.nn.Module) -> str | None:
    """What in `model` is not attention, or None: layer types other than attention (Qwen3-Next's
    linear attention), a recurrent model type, or state-space parameters (`A_log`: Mamba, Mamba-2,
    and hybrids such as Falcon-H1, Jamba, Bamba, whose configs list no layer types). A key-value cache
    cannot hold their state."""
    config = getattr(model, "config", None)
    kinds = set(getattr(config, "layer_types", None) or [])
    other = sorted(kinds - {"full_attention", "sliding_attention", "chunked_attention"})
    if other:
        return ", ".join(other)
    if getattr(config, "model_type", "") in ("mamba", "mamba2", "rwkv"):
        return config.model_type
    if any(name.endswith("A_log") for name, _ in model.named_parameters()):
        return "state-space layers"
    return None


def check_decode_loop_supported(model: torch.nn.Module) -> None:
    """Raise DecodeLoopUnsupported naming rollout.decode_loop=transformers for models whose layers are not all
    attention (state-space and hybrid models: Mamba, Qwen3-Next): the loop's caches hold keys and
    values only, and such models crashed inside transformers with an IndexError."""
    other = non_attention_layers(model)
    if other:
        raise DecodeLoopUnsupported(
            f"{type(model).__name__} has layers that are not attention ({other}), "
            "which lucidrl's decode loop cannot cache; set rollout.decode_loop=transformers"
        )


# model classes whose attention ignored shared_prefix_attention (decoded the plain way from then on)
_NO_SHARED_PREFIX: set[type] = set()


def mark_no_shared_prefix(model: torch.nn.Module) -> None:
    """`model`'s class ignored shared_prefix_attention: decode its kind the plain way from now on."""
    _NO_SHARED_PREFIX.add(type(model))


def _text_config(config):
    """The config that describes the decoder's layers: a multimodal model's text config (Gemma 3's
    sliding windows and rotary settings sit there), else the config itself."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _can_share_prefix(model: torch.nn.Module, span: int) -> bool:
    """Whether every layer's attention is plain softmax attention over all earlier tokens, through
    transformers' attention interface, for sequences of `span` tokens. Decided before decoding: a
    refusal found in the first step (which already sampled) would leave the RNG one draw on."""
    config = getattr(model, "config", None)
    if type(model) in _NO_SHARED_PREFIX or config is None or not hasattr(config, "_attn_implementation"):
        return False
    # its own attention code; a peft model's class says nothing of the model inside (LoRA on MPT's
    # ALiBi or GPT-Neo's local attention passed, and the prefill of a shared prompt changed their tokens)
    if getattr(type(_base_model(model)), "_supports_attention_backend", True) is False:
        return False
    config = _text_config(config)
    # only full attention: sliding, chunked (Llama 4) or linear-attention layers would be ignored
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return False
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < span:
        return False
    # Llama 4: chunked attention, and a query scale computed from the cache's length
    return not (
        getattr(config, "attention_chunk_size", None) or getattr(config, "attn_temperature_tuning", False)
    )


# rotary embeddings whose frequencies a forward picks from its longest position (Phi-3's long-RoPE
# switches factors past original_max_position_embeddings; "dynamic" NTK rescales): a prefill split
# into the shared prompt and the rest would rotate the shared keys with other factors
_LENGTH_DEPENDENT_ROPE = frozenset({"longrope", "dynamic"})


def _rope_types(config) -> set[str]:
    """The rotary embedding types of a (text) config: rope_parameters, or rope_scaling before
    transformers 5, either one dict or one per layer type."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    groups = [v for v in params.values() if isinstance(v, dict)] or [params]
    return {str(g.get("rope_type", g.get("type", "default"))) for g in groups}


def _can_prefill_shared_prompt(model: torch.nn.Module, span: int) -> bool:
    """Whether the prompts' shared leading tokens may be prefilled once (`_prefill`): the shared-prefix
    attention's conditions (every layer attends to all earlier tokens, counted by position, not
    column), and rotary frequencies that do not depend on the forward's length."""
    if not _can_share_prefix(model, span):
        return False
    return not (_rope_types(_text_config(model.config)) & _LENGTH_DEPENDENT_ROPE)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (`model.enable_gradient_checkpointing`): a training forward then keeps one hidden state per layer
    and token. Non-reentrant, so LoRA adapters and frozen embeddings need no input gradients."""
    base = _base_model(model)
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise UserError(
            f"{type(base).__name__} does not support gradient checkpointing in transformers; set "
            "model.enable_gradient_checkpointing=false"
        )
    from lucidrl.models.precision import recompute_contexts

    kwargs = {"use_reentrant": False, "context_fn": recompute_contexts}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.25; the old name warns there
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    base.__dict__["_lucidrl_checkpointing"] = True


def checkpointing_active(model: torch.nn.Module) -> bool:
    """Whether this forward recomputes its layers in the backward: transformers then drops the key-value
    cache inside each layer, so a forward that needs one (the shared-prompt path) must not run."""
    return (
        torch.is_grad_enabled()
        and model.training
        and bool(_base_model(model).__dict__.get("_lucidrl_checkpointing", False))
    )
