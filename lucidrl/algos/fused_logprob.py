"""Log-probs and entropy of response tokens, compiled into one fused pass over the vocabulary.

Eagerly, `logprobs_from_logits` + `entropy_from_logits` walk a (tokens, V) logits tensor about six
times and materialise a softmax of the same size; `torch.compile` turns the same formulas into loops
that read the logits three times and write nothing of size V (the float32 upcast and the temperature
happen inside the loop too): several times faster at a 150k vocabulary, forward and backward
(benchmarks/head_chunks.py measures it in the actor). Numbers agree to float32 rounding: at that vocabulary log-probs within
~1e-5 and entropies within ~3e-4 of a float64 reference, eager and compiled alike.

`actor.use_torch_compile=true` (verl's key) selects it. Where compiling fails (no C++ toolchain for
inductor, an unsupported op) lucidrl warns once, says why, and runs the eager functions: same results,
slower. Errors of the inputs stay errors: a token id outside the vocabulary is refused before the
compiled call (whose gather would abort the process), anything else propagates as raised.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from lucidrl.algos.logprob import entropy_from_logits, logprobs_from_logits


def _fused_log_probs(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    x = logits.float() / temperature
    return x.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def _fused_log_probs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.float() / temperature
    lse = torch.logsumexp(x, dim=-1)
    entropy = lse - (torch.softmax(x, dim=-1) * x).sum(dim=-1)
    return x.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse, entropy


def _fused_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    x = logits.float() / temperature
    return torch.logsumexp(x, dim=-1) - (torch.softmax(x, dim=-1) * x).sum(dim=-1)


def _eager_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    return entropy_from_logits(logits, temperature)


def _eager_log_probs(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    return logprobs_from_logits(logits, labels, temperature)


def _eager_log_probs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return logprobs_from_logits(logits, labels, temperature), entropy_from_logits(logits, temperature)


def _compile_failures() -> tuple[type[BaseException], ...]:
    """What dynamo and inductor raise when they cannot trace, lower or build a function."""
    from torch._dynamo.exc import TorchDynamoException
    from torch._inductor import exc as inductor

    names = ("CppCompileError", "InvalidCxxCompiler", "OperatorIssue", "CppWrapperCodegenError",
             "SubgraphLoweringException")  # fmt: skip
    return (TorchDynamoException, *(getattr(inductor, n) for n in names if hasattr(inductor, n)))


_COMPILE_FAILURES = _compile_failures()


class CompiledOrEager:
    """`torch.compile(fn)`, or `eager` from the first compile failure on (one warning naming it).

    The backward pass is checked on a small tensor before the compiled function is first used with
    gradients, once per logits dtype (a bf16 actor's logits compile to another graph than float32's):
    an inductor failure there would otherwise surface in the middle of `backward()`, where nothing can
    fall back.
    """

    def __init__(self, fn: Callable, eager: Callable, what: str):
        self.fn, self.eager, self.what = fn, eager, what
        self.compiled: Callable | None = None
        self.failure: str | None = None  # why compiling failed; None while it works
        self.backward_checked: set[torch.dtype] = set()  # logits dtypes whose backward compiled

    def _give_up(self, err: BaseException) -> None:
        self.failure = f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"
        warnings.warn(
            f"torch.compile of {self.what} failed ({self.failure}); running it eagerly from now on (same "
            "numbers, slower). Set actor.use_torch_compile=false to skip the attempt",
            RuntimeWarning,
            stacklevel=3,
        )

    def _check_backward(self, device: torch.device, dtype: torch.dtype) -> None:
        # identity hooks on top of any active ones: inside a non-reentrant checkpoint (the chunked LM
        # head) the probe's own backward must not unpack through the checkpoint's recomputation
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            # where and in what dtype the real call will run
            x = torch.randn(2, 8, device=device, dtype=dtype, requires_grad=True)
            out = self.compiled(x, torch.tensor([1, 5], device=device), 1.0)
            sum(o.sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
        self.backward_checked.add(dtype)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, temperature: float):
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= logits.shape[-1]):
            # the compiled gather checks its indices with an abort of the whole process: say it here
            bad = labels[(labels < 0) | (labels >= logits.shape[-1])][0].item()
            raise IndexError(
                f"{self.what}: token id {bad} is outside the vocabulary of {logits.shape[-1]} logits; the "
                "tokenizer and the model disagree (check model.tokenizer_path against model.path)"
            )
        if self.failure is None:
            try:
                if self.compiled is None:
                    self.compiled = torch.compile(self.fn, dynamic=True)
                if (
                    torch.is_grad_enabled()
                    and logits.requires_grad
                    and logits.dtype not in self.backward_checked
                ):
                    self._check_backward(logits.device, logits.dtype)
                return self.compiled(logits, labels, temperature)
            except _COMPILE_FAILURES as err:  # anything else (checkpoint's early stop too) propagates
                result = self.eager(logits, labels, temperature)  # raises if the inputs are at fault
                self._give_up(err)
                return result
        return self.eager(logits, labels, temperature)


compiled_log_probs = CompiledOrEager(_fused_log_probs, _eager_log_probs, "the log-prob")
compiled_entropy = CompiledOrEager(_fused_entropy, _eager_entropy, "the entropy")
compiled_log_probs_and_entropy = CompiledOrEager(
    _fused_log_probs_and_entropy, _eager_log_probs_and_entropy, "the log-prob and entropy"
)


def log_probs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = True,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature)[label] (..., ) and, if asked, the entropy, in float32.

    `entropy_grad=False`: the entropy is a metric, kept out of autograd. `compiled`: the fused
    torch.compile'd kernels above (falling back to eager where they cannot be built).
    """
    if not compiled:
        lp = logprobs_from_logits(logits, labels, temperature)
        if not with_entropy:
            return lp, None
        if entropy_grad:
            return lp, entropy_from_logits(logits, temperature)
        with torch.no_grad():
            return lp, entropy_from_logits(logits.detach(), temperature)
    if not with_entropy:
        return compiled_log_probs(logits, labels, temperature), None
    if entropy_grad:
        return compiled_log_probs_and_entropy(logits, labels, temperature)
    lp = compiled_log_probs(logits, labels, temperature)
    with torch.no_grad():
        return lp, compiled_entropy(logits.detach(), labels, temperature)
