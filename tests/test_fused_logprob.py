"""actor.use_torch_compile: fused, compiled log-prob and entropy; same numbers and gradients as the eager
functions, and a compile failure that falls back to them with one warning instead of crashing."""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
import torch
from torch._inductor.exc import CppCompileError, InvalidCxxCompiler

from lucidrl.algos import fused_logprob
from lucidrl.algos.fused_logprob import CompiledOrEager, log_probs_and_entropy
from lucidrl.config.schema import ActorConfig, OptimConfig
from lucidrl.workers.training.actor import ActorWorker, per_token_log_probs
from tests.test_micro_batches import _rollout_with_varied_lengths


def _both(logits, labels, **kw):
    """(eager, compiled) results and input gradients of lp.sum() + 0.5 * entropy.sum()."""
    out = []
    for compiled in (False, True):
        x = logits.detach().clone().requires_grad_(True)
        lp, ent = log_probs_and_entropy(x, labels, compiled=compiled, with_entropy=True, **kw)
        (lp.sum() + 0.5 * ent.sum()).backward()
        out.append((lp.detach(), ent.detach(), x.grad))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_compiled_log_probs_entropy_and_gradients_equal_eager(entropy_grad):
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 300) * 4
    labels = torch.randint(0, 300, (3, 7))
    (lp, ent, grad), (lp_c, ent_c, grad_c) = _both(logits, labels, temperature=0.7, entropy_grad=entropy_grad)
    assert lp.dtype == lp_c.dtype == ent_c.dtype == torch.float32
    assert (lp - lp_c).abs().max() < 1e-5 and (ent - ent_c).abs().max() < 1e-4
    assert (grad - grad_c).abs().max() < 1e-5 * grad.abs().max()
    # entropy_grad=False: the entropy is a metric, its gradient is not in the input's
    only_lp = (
        torch.softmax(logits / 0.7, -1).neg().scatter_add(-1, labels[..., None], torch.ones(3, 7, 1)) / 0.7
    )
    assert torch.allclose(grad_c, only_lp, atol=1e-6) == (not entropy_grad)
    # bfloat16 logits are upcast inside the compiled loop
    bf = logits.bfloat16()
    a, _ = log_probs_and_entropy(bf, labels, temperature=1.0, with_entropy=False)
    b, _ = log_probs_and_entropy(bf, labels, temperature=1.0, with_entropy=False, compiled=True)
    assert b.dtype == torch.float32 and (a - b).abs().max() < 1e-4


@pytest.mark.parametrize("path", ["eager", "fallback"])
def test_bf16_logits_are_divided_by_the_temperature_in_float32(path):
    """As the rollout does (decode.py: logits.float() / T): a bf16 quotient logits / 0.7 rounds to 8 bits
    of mantissa, and moved log-probs by up to 0.13 nats against the rollout's at this size."""
    torch.manual_seed(0)
    bf = (torch.randn(4, 9, 2000) * 6).bfloat16()
    labels = torch.randint(0, 2000, (4, 9))
    ref = (bf.double() / 0.7).log_softmax(-1)
    ref_lp = ref.gather(-1, labels[..., None]).squeeze(-1)
    ref_ent = -(ref.exp() * ref).sum(-1)
    if path == "eager":
        lp, ent = log_probs_and_entropy(bf, labels, temperature=0.7, with_entropy=True)
    else:  # what a compile failure falls back to
        lp, ent = fused_logprob._eager_log_probs_and_entropy(bf, labels, 0.7)
        assert (fused_logprob._eager_log_probs(bf, labels, 0.7) - lp).abs().max() == 0
        assert (fused_logprob._eager_entropy(bf, labels, 0.7) - ent).abs().max() == 0
    assert lp.dtype == ent.dtype == torch.float32
    assert (lp.double() - ref_lp).abs().max() < 1e-4
    assert (ent.double() - ref_ent).abs().max() < 1e-3


@pytest.mark.slow
def test_the_actor_with_torch_compile_has_the_eager_log_probs_and_gradient(
    kk_data, tiny_model, tiny_tokenizer
):
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    mask = out["response_mask"].bool()
    with torch.no_grad():
        lp, _ = per_token_log_probs(model.eval(), out, 16, 1.0, False, True, True)
        lp_c, _ = per_token_log_probs(
            model.eval(), out, 16, 1.0, False, True, True, head_chunk_tokens=5, compiled=True
        )
    assert (lp - lp_c)[mask].abs().max() < 1e-5
    out.set("old_log_probs", lp * out["response_mask"])
    torch.manual_seed(1)
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])

    def gradient(compile_, chunk=0):
        cfg = ActorConfig(optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=16,
                          entropy_coeff=0.1, use_torch_compile=compile_, head_chunk_tokens=chunk)  # fmt: skip
        actor = ActorWorker(copy.deepcopy(model).train(), cfg, temperature=0.8, samples_per_prompt=4)
        actor._micro_step(out, 1.0, defaultdict(float))
        return {n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None}

    eager = gradient(False)
    size = max(g.abs().max().item() for g in eager.values())
    assert size > 1e-3
    for compiled in (gradient(True), gradient(True, chunk=5)):  # whole logits; checkpointed chunks
        assert eager.keys() == compiled.keys()
        assert max((eager[n] - compiled[n]).abs().max().item() for n in eager) < 1e-5 * max(1.0, size)


def _eager_twin(fn):
    calls = []

    def eager(*args):
        calls.append(1)
        return fn(*args)

    return eager, calls


def test_a_compile_failure_warns_once_and_runs_eagerly(monkeypatch):
    def broken_compile(fn, **kw):
        def run(*a):
            raise InvalidCxxCompiler()  # what inductor raises without a usable C++ compiler

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    eager, calls = _eager_twin(fused_logprob._fused_log_probs)
    f = CompiledOrEager(fused_logprob._fused_log_probs, eager, "the log-prob")
    logits, labels = torch.randn(4, 10), torch.randint(0, 10, (4,))
    with pytest.warns(
        RuntimeWarning,
        match=r"torch.compile of the log-prob failed \(InvalidCxxCompiler: No working C\+\+ compiler found.*\); running it eagerly",
    ):
        first = f(logits, labels, 1.0)
    assert torch.allclose(first, torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1))
    assert f.failure.startswith("InvalidCxxCompiler") and calls == [1]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        f(logits, labels, 1.0)
    assert calls == [1, 1]


def test_a_failing_compiled_backward_is_caught_before_training_uses_it(monkeypatch):
    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise CppCompileError(["g++", "kernel.cpp"], "backward codegen failed")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda x, *a: fn(NoBackward.apply(x), *a))
    eager, calls = _eager_twin(fused_logprob._fused_log_probs)
    f = CompiledOrEager(fused_logprob._fused_log_probs, eager, "the log-prob")
    logits = torch.randn(4, 10, requires_grad=True)
    with torch.no_grad():
        f(logits, torch.zeros(4, dtype=torch.long), 1.0)  # no gradient: the forward alone is used
    assert f.failure is None and calls == []
    with pytest.warns(RuntimeWarning, match="backward codegen failed"):
        lp = f(logits, torch.zeros(4, dtype=torch.long), 1.0)
    lp.sum().backward()  # the eager result trains
    assert logits.grad is not None and calls == [1]


def test_the_backward_is_checked_in_the_dtype_the_actor_trains_in(monkeypatch):
    """A bf16 actor's logits compile to a graph of their own: a float32 probe says nothing about it."""

    class NoBf16Backward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.bf16 = x.dtype == torch.bfloat16
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            if ctx.bf16:
                raise CppCompileError(["g++", "kernel.cpp"], "bf16 backward codegen failed")
            return g

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda x, *a: fn(NoBf16Backward.apply(x), *a))
    eager, calls = _eager_twin(fused_logprob._fused_log_probs)
    f = CompiledOrEager(fused_logprob._fused_log_probs, eager, "the log-prob")
    labels = torch.zeros(4, dtype=torch.long)
    f(torch.randn(4, 10, requires_grad=True), labels, 1.0).sum().backward()  # float32: compiled
    assert f.failure is None and calls == []
    logits = torch.randn(4, 10).bfloat16().requires_grad_(True)
    with pytest.warns(RuntimeWarning, match="bf16 backward codegen failed"):
        lp = f(logits, labels, 1.0)
    lp.sum().backward()  # the eager result trains; it used to raise here, mid-backward
    assert logits.grad is not None and calls == [1]


def test_bad_labels_are_the_inputs_fault_not_the_compilers():
    eager, calls = _eager_twin(fused_logprob._fused_log_probs)
    f = CompiledOrEager(fused_logprob._fused_log_probs, eager, "the log-prob")
    with pytest.raises(IndexError, match=r"token id 12 is outside the vocabulary of 10 logits"):
        f(torch.randn(2, 10), torch.tensor([3, 12]), 1.0)  # compiled, it would abort the process
    assert f.failure is None  # compiling is not given up over the caller's error


def test_compiled_log_probs_inside_a_checkpointed_chunk():
    """The chunked LM head recomputes each chunk in the backward pass; checkpoint's early stop of that
    recomputation is not a compile failure, and the first backward check runs there too."""
    from torch.utils.checkpoint import checkpoint

    fresh = CompiledOrEager(fused_logprob._fused_log_probs, fused_logprob._eager_log_probs, "the log-prob")
    head = torch.nn.Linear(16, 50)
    h = torch.randn(10, 16, requires_grad=True)
    y = torch.randint(0, 50, (10,))
    checkpoint(lambda hc: fresh(head(hc), y, 1.0), h, use_reentrant=False).sum().backward()
    assert fresh.failure is None and fresh.backward_checked
    expected = torch.autograd.grad(torch.log_softmax(head(h), -1).gather(-1, y[:, None]).sum(), h)[0]
    assert (h.grad - expected).abs().max() < 1e-5
