"""Optimizer, warm-up schedule and gradient clipping shared by actor, critic and SFT."""

from __future__ import annotations

import math

import torch

from lucidrl.config.schema import OptimConfig
from lucidrl.diagnostics.errors import UserError


class NonFiniteLossError(UserError, FloatingPointError):
    """Every optimizer step of an update had a non-finite gradient norm: training cannot go on."""


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters, with a linear warm-up over `cfg.warmup_steps` then constant.

    On the CPU, PyTorch's fused AdamW kernel (one pass over each parameter instead of the multi-tensor
    path's several: `benchmarks/adamw_fused.py` compares them); the same update up to float rounding.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        weight_decay=cfg.weight_decay,
        fused=_fusable(params) or None,
    )
    warmup = cfg.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    )
    return optimizer, scheduler


def _fusable(params: list[torch.nn.Parameter]) -> bool:
    """Whether the fused AdamW kernel takes these: plain CPU tensors (not FSDP2's DTensors) of a float
    dtype it implements."""
    from torch.distributed.tensor import DTensor

    return bool(params) and all(
        p.device.type == "cpu" and not isinstance(p.data, DTensor)
        and p.dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64)
        for p in params
    )  # fmt: skip


def clip_grad(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm and return it (the full norm also when FSDP2 shards the grads)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
        norm = norm.full_tensor()
    return float(norm)


def step_if_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> float | None:
    """Clip and take the optimizer step; returns the gradient norm, or None when it is NaN/inf: then the
    gradients are dropped and no step is taken (never train on a non-finite gradient; the caller counts it)."""
    norm = clip_grad(model, max_norm)
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    return norm
