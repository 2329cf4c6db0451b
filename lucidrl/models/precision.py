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
key/value heads) and, under bf16 compute on CPUs without AMX, `float32_attention` (transformers' SDPA
attention in float32: PyTorch's CPU flash kernel is slower in bfloat16 than in float32 there).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

import torch

from lucidrl.diagnostics.errors import UsageError
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
            if float32_attention_wanted(device, dtype):
                stack.enter_context(float32_attention())
        if gqa and device.type == "cpu":
            stack.enter_context(masked_gqa())
        yield


# 1: transformers' SDPA attention in float32 under CPU autocast, 0: in the autocast dtype; unset: float32
# on CPUs without AMX (benchmarks/step_vs_trl.py's lucidrl-bf16-attn-bf16 kind sets 0)
FLOAT32_ATTENTION = "LUCIDRL_CPU_FLOAT32_ATTENTION"


def float32_attention_wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether forwards autocast to `dtype` on `device` run SDPA attention in float32 (float32_attention).

    On the CPU in bfloat16, without AMX (AVX-512 BF16 only, or AVX2, where bfloat16 is emulated):
    PyTorch's CPU flash-attention kernel runs faster in float32 than in bfloat16 there (its bfloat16
    path packs for AMX tiles), and the rollout's log-probs come closer to the update's (decoding attends
    in float32); benchmarks/step_vs_trl.py measures it (docs/performance.md). On AMX CPUs the bfloat16
    kernel is kept.
    """
    if device.type != "cpu" or dtype != torch.bfloat16:
        return False
    value = os.environ.get(FLOAT32_ATTENTION)
    if value is not None:
        if value not in ("0", "1"):
            raise UsageError(
                f"{FLOAT32_ATTENTION}={value!r}: set it to 1 (SDPA attention in float32 under CPU autocast), "
                "0 (in the autocast dtype), or unset it (float32 on CPUs without AMX)"
            )
        return value == "1"
    return cpu_has_amx() is False


_FLOAT32_ATTENTION_ON: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "lucidrl_float32_attention", default=False
)
_SDPA_BEFORE: list = []  # transformers' own "sdpa" attention function, once ours is registered over it


def _sdpa_in_float32(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' "sdpa" attention, in float32 inside float32_attention under CPU autocast; the
    output in the autocast dtype, as autocast's own SDPA returns it. Anywhere else: transformers' own."""
    sdpa = _SDPA_BEFORE[0]
    if not (_FLOAT32_ATTENTION_ON.get() and query.device.type == "cpu" and torch.is_autocast_enabled("cpu")):
        return sdpa(module, query, key, value, attention_mask, *args, **kwargs)
    low = torch.get_autocast_dtype("cpu")

    def up(x):  # every floating tensor: a float mask, a position bias (Inkling's, bf16 from a Linear)
        return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa(
            module, up(query), up(key), up(value), up(attention_mask),
            *(up(a) for a in args), **{k: up(v) for k, v in kwargs.items()},
        )  # fmt: skip
    return out.to(low), weights


@contextlib.contextmanager
def float32_attention() -> Iterator[None]:
    """Forwards inside run transformers' SDPA attention in float32 under CPU autocast (see
    float32_attention_wanted); the projections and MLPs stay in the autocast dtype, and autograd
    replays the attention in float32. lucidrl's function is registered over transformers' "sdpa" the
    first time and hands every call outside this context to transformers' own unchanged. Models with
    attention code of their own (not transformers' attention interface) are not affected."""
    if not _SDPA_BEFORE:
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        _SDPA_BEFORE.append(ALL_ATTENTION_FUNCTIONS._global_mapping["sdpa"])
        AttentionInterface.register("sdpa", _sdpa_in_float32)
    token = _FLOAT32_ATTENTION_ON.set(True)
    try:
        yield
    finally:
        _FLOAT32_ATTENTION_ON.reset(token)


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

    Without them oneDNN emulates bfloat16 matmuls, many times slower than float32
    (benchmarks/mixed_precision.py measures it).
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


def cpu_has_amx() -> bool | None:
    """Whether this CPU has AMX tiles (PyTorch's own check); None where this PyTorch cannot tell."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private: where it is gone, tell nothing
    return None if amx is None else bool(amx())


def recompute_contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """torch.utils.checkpoint's `context_fn` for activation checkpointing: the recompute in the backward
    runs under the attention switches the forward ran under (float32_attention, masked_gqa), which
    checkpoint cannot see (autocast itself it restores); otherwise the recomputed attention differs in
    dtype or shape from the forward's and checkpoint refuses it."""
    f32 = _FLOAT32_ATTENTION_ON.get()
    gqa = os.environ.get(FORCE_GQA)

    @contextlib.contextmanager
    def as_in_forward() -> Iterator[None]:
        token = _FLOAT32_ATTENTION_ON.set(f32)
        before = os.environ.get(FORCE_GQA)
        _set_env(FORCE_GQA, gqa)
        try:
            yield
        finally:
            _set_env(FORCE_GQA, before)
            _FLOAT32_ATTENTION_ON.reset(token)

    return contextlib.nullcontext(), as_in_forward()


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
