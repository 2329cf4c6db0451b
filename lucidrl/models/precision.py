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
forward used. On the CPU that context also turns on `masked_gqa` (attention without copies of the
key/value heads).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

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


@contextlib.contextmanager
def compute_context(model: torch.nn.Module, dtype: torch.dtype | None, gqa: bool = True) -> Iterator[None]:
    """What every forward of a run computes under: `torch.autocast` to `dtype` on the device of the
    model's parameters (none for None) and, on the CPU with `gqa`, `masked_gqa`. The decoding loop
    passes gqa=False: its steps have one query per row, which transformers already runs without
    copies (it folds the query heads onto their key/value head)."""
    device = next(model.parameters()).device
    with contextlib.ExitStack() as stack:
        if dtype is not None:
            stack.enter_context(torch.autocast(device_type=device.type, dtype=dtype))
        if gqa and device.type == "cpu":
            stack.enter_context(masked_gqa())
        yield


# transformers' switch for SDPA's own grouped-query attention (enable_gqa) with a mask
FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


@contextlib.contextmanager
def masked_gqa() -> Iterator[None]:
    """Grouped-query attention with a padding mask runs on the key/value heads themselves.

    transformers' SDPA attention passes `enable_gqa` to PyTorch only without a mask (what CUDA's flash
    kernel needs); with one, as every batch of left-padded prompts has, it copies each key/value head
    once per query head sharing it (`repeat_kv`) first. PyTorch's CPU kernels take `enable_gqa` with a
    mask, so on the CPU lucidrl turns on transformers' own switch for it (TRANSFORMERS_SDPA_FORCE_GQA)
    around its forwards: the same numbers without the copies and their backward
    (benchmarks/step_vs_trl.py's lucidrl-repeat-kv kinds run without it). A value the user set is
    left alone. The switch is an environment variable, read at each attention call: a forward of
    another thread in the meantime may take either path, with the same result.
    """
    if FORCE_GQA in os.environ:
        yield
        return
    os.environ[FORCE_GQA] = "1"
    try:
        yield
    finally:
        os.environ.pop(FORCE_GQA, None)


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
