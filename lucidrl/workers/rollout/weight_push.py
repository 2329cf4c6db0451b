"""The actor's weights as a rollout engine takes them: plain HuggingFace names, full tensors, one at a time.

What a push must cover, whatever the actor is:
- FSDP2 shards: each parameter is all-gathered when the iterator reaches it (a collective every rank
  runs in the same order, to the end), so no rank holds a second full copy of the weights.
- LoRA (peft): each adapted layer's weight is sent merged (`base + B @ A * scale`, peft's own delta),
  under the base model's name; the adapters themselves never leave the actor.
- Tied embeddings: the head's weight is sent under `lm_head.weight` as well. An engine that keeps its
  own packed copy of the head (vLLM's CPU backend repacks it after loading) would otherwise keep the
  start weights for it: greedy tokens then disagree with the actor's after the first update.

Also the probe of the weight-sync check: a few fixed token ids and the actor's log-probs of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from lucidrl.diagnostics.errors import UserError
from lucidrl.workers.common.distributed import reshard, unwrap

PEFT_PREFIX = "base_model.model."


class WeightSyncError(UserError, RuntimeError):
    """The rollout engine does not compute with the actor's weights after a push; names the parameters."""


def _merged_lora_weight(module: torch.nn.Module, base: torch.Tensor) -> torch.Tensor:
    """`base` plus every active adapter's delta (peft's get_delta_weight: scale, fan-in/fan-out, DoRA
    are its business); `module` is a peft LoraLayer."""
    weight = base
    for adapter in getattr(module, "active_adapters", []):
        if adapter in getattr(module, "lora_A", {}):
            weight = weight + module.get_delta_weight(adapter).to(base.dtype)
    return weight


def _full(param: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (all-gathered: a collective), or the tensor itself."""
    if dtype is not None and param.is_floating_point():
        param = param.to(dtype)
    if hasattr(param, "full_tensor"):
        param = param.full_tensor()
    return param


@torch.no_grad()
def rollout_weights(
    model: torch.nn.Module, dtype: torch.dtype | None = None, *, tied_copies: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) of every parameter of the plain model the actor computes, one at a time.

    `dtype` casts floating tensors before the gather (half the bytes with bf16). `tied_copies` also
    yields a tied weight under each of its names (`lm_head.weight` beside `model.embed_tokens.weight`);
    False yields it once, as named_parameters() does. Names are those of the model without peft's
    wrapper, so an engine loading a HF checkpoint maps them as it maps the checkpoint's. (LoRA actors
    are never FSDP2-sharded: the config refuses it, so adapters are whole tensors here.)
    """
    root = unwrap(model)
    reshard(root)
    modules = dict(root.named_modules())
    for name, param in root.named_parameters(remove_duplicate=not tied_copies):
        if ".lora_" in name:
            continue  # adapter weights: merged into their layer's weight below
        tensor = _full(param, dtype)
        owner, _, leaf = name.rpartition(".")
        if owner.endswith(".base_layer"):  # a layer peft adapted: its base weight, merged
            layer = owner[: -len(".base_layer")]
            if leaf == "weight":
                tensor = _merged_lora_weight(modules[layer], tensor)
            name = f"{layer}.{leaf}"
        if name.startswith(PEFT_PREFIX):
            name = name[len(PEFT_PREFIX) :]
        yield name, tensor


def default_sync_atol(float32: bool) -> float:
    """rollout.weight_sync_atol when unset: 1e-3 in float32; 0.1 in bfloat16, where the engine's kernels
    round differently from the actor's autocast."""
    return 1e-3 if float32 else 0.1


def probe_ids(vocab_size: int, length: int = 24, seed: int = 0) -> list[int]:
    """Fixed token ids for the weight-sync check: random ids of the vocabulary (the same every push)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=g).tolist()


@torch.no_grad()
def probe_log_probs(
    model: torch.nn.Module, ids: list[int], compute_dtype: torch.dtype | None
) -> torch.Tensor:
    """(len(ids) - 1,) log-probs the actor gives each probe token after the ones before it, at
    temperature 1 (a forward of every rank when sharded: all ranks call this together)."""
    module = unwrap(model)
    device = next(module.parameters()).device
    x = torch.tensor([ids], device=device)
    was_training = module.training
    module.eval()  # no dropout in either side of the comparison
    try:
        with torch.autocast(device.type, dtype=compute_dtype, enabled=compute_dtype is not None):
            logits = module(input_ids=x).logits[0, :-1].float()
    finally:
        module.train(was_training)
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].cpu()


def check_rollout_weights(
    model: torch.nn.Module,
    engine: Any,
    *,
    vocab_size: int,
    compute_dtype: torch.dtype | None,
    atol: float,
    rank: int = 0,
    world_size: int = 1,
) -> str:
    """After a push: the engine's log-probs of a few fixed tokens against the actor's `model` (every rank
    together when sharded: the forward and the gathers are collectives). A gap above `atol` raises
    WeightSyncError naming the parameters the engine does not hold (engine.compare_weights)."""
    ids = probe_ids(vocab_size)
    mine = probe_log_probs(model, ids, compute_dtype)
    reshard(unwrap(model))
    # on the actor's device: NCCL reduces no CPU tensor
    device = next(unwrap(model).parameters()).device
    gap = torch.tensor((mine - engine.probe_log_probs(ids)).abs().max().item(), device=device)
    if world_size > 1:
        torch.distributed.all_reduce(gap, op=torch.distributed.ReduceOp.MAX)
    if gap.item() <= atol:
        return f"weight sync checked: max log-prob gap {gap.item():.2e} <= {atol:g}"
    mismatches, skipped = engine.compare_weights(rollout_weights(model, compute_dtype, tied_copies=True))
    where = (
        f"{len(mismatches)} pushed parameter(s) differ from what the engine holds: {'; '.join(mismatches[:5])}"
        if mismatches
        else "every pushed parameter the check could read back matches the engine's copy, so the gap is in "
        "what the engine computes with them (a layer it did not reload, or another architecture)"
    )
    not_read = f"; {len(skipped)} not compared (first: {skipped[:3]})" if skipped else ""
    raise WeightSyncError(
        f"rank {rank}: after the weight push the rollout engine's log-probs of {len(ids)} probe tokens differ "
        f"from the actor's by up to {gap.item():.3g} (rollout.weight_sync_atol={atol:g}): {where}{not_read}. "
        "It would sample from another policy than the one being trained; report it with the model's "
        "config.json, or use rollout.name=hf"
    )
