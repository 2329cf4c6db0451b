"""Mixed precision: bfloat16 compute over float32 weights (`model.compute_dtype=bfloat16`).

The weights, their gradients and the optimizer state stay float32 (the "master weights"); matrix
products run in bfloat16 under `torch.autocast`, and what autocast keeps in float32 (softmax,
log-softmax, norms, losses) stays there. Every forward of a run goes through the same context
(rollout decoding, the old-log-prob, reference and value passes, the updates), so on one rank the
rollout and the update compute with one precision. With several FSDP2 ranks the training models also
gather their parameters in bfloat16 (MixedPrecisionPolicy), so the residual stream is bfloat16 there
while the rollout's copy keeps float32 weights: the two differ a little more (3.9e-3 against 1.9e-3
from float32 on the tiny model), and the rollout's log-probs are never the old ones either way (those
come from the actor's own forward: the update's when it is on-policy, else the old-log-prob pass).
Backward passes run outside it, as PyTorch recommends: autograd replays each op in the dtype its
forward used.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

from lucidrl.models.loading import DTYPES


def autocast_dtype(dtype: str, compute_dtype: str | None) -> torch.dtype | None:
    """The dtype to autocast to for weights of `dtype` computing in `compute_dtype`; None: no autocast.

    `model.compute_dtype=None` computes in the weights' dtype. The loader refuses float32 compute over
    bfloat16 weights (their precision is already gone).
    """
    if compute_dtype is None or compute_dtype == dtype:
        return None
    if (dtype, compute_dtype) != ("float32", "bfloat16"):
        raise ValueError(
            f"model.compute_dtype={compute_dtype!r} over model.dtype={dtype!r} weights is not a mixed precision "
            "lucidrl runs: use model.dtype=float32 model.compute_dtype=bfloat16, or leave compute_dtype unset"
        )
    return DTYPES[compute_dtype]


def compute_context(model: torch.nn.Module, dtype: torch.dtype | None) -> AbstractContextManager:
    """`torch.autocast` to `dtype` on the device of the model's parameters, or a no-op for None."""
    if dtype is None:
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    return torch.autocast(device_type=device.type, dtype=dtype)


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); None where it cannot be told.

    Without them oneDNN emulates bfloat16 matmuls, measured ~19x slower than float32 on the project's
    AVX2 machines (benchmarks/mixed_precision.py).
    """
    try:
        text = open(cpuinfo).read()
    except OSError:
        return None
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None
    )
    if flags is None:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags
