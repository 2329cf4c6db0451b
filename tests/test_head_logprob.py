"""lucidrl.algos.head_logprob: the LM head, log-softmax and label pick as one chunked autograd function,
against the eager path (head(hidden), then logprobs_from_logits / entropy_from_logits)."""

from __future__ import annotations

import pytest
import torch

from lucidrl.algos.head_logprob import head_log_probs
from lucidrl.algos.logprob import entropy_from_logits, logprobs_from_logits


def _both(head, h, y, g, temperature, chunk, autocast=False):
    """(log-probs, entropies, grad of h, grads of the head's parameters) of the fused and eager paths."""
    out = []
    for fused in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if fused:
                lp, ent = head_log_probs(
                    h, head, y, temperature=temperature, chunk_tokens=chunk, with_entropy=True
                )
            else:
                logits = head(h)
                lp = logprobs_from_logits(logits, y, temperature)
                ent = entropy_from_logits(logits.detach(), temperature)
        (lp * g).sum().backward()
        grads = [p.grad.clone() if p.grad is not None else None for p in head.parameters()]
        out.append((lp.detach(), ent, h.grad.clone(), grads))
        h.grad = None
        head.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 5, 1000])  # 5 does not divide the 37 tokens
def test_values_and_gradients_are_the_eager_ones_in_float64(temperature, bias, chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=bias).double()
    h = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    y, g = torch.randint(0, 300, (37,)), torch.randn(37, dtype=torch.float64)
    (lp, ent, gh, gw), (lp2, ent2, gh2, gw2) = _both(head, h, y, g, temperature, chunk)
    assert lp.dtype == torch.float64 and ent.dtype == torch.float64
    torch.testing.assert_close(lp, lp2, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ent2, rtol=0, atol=1e-12)
    torch.testing.assert_close(gh, gh2, rtol=0, atol=1e-12)
    for a, b in zip(gw, gw2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert ent.grad_fn is None  # the entropy is a metric: no gradient of its own


def test_under_bf16_autocast_it_computes_as_the_eager_head_does():
    """Products in bfloat16 (what autocast gives head(hidden)), the softmax in float32: the log-probs
    match the eager path's to float32 rounding, the gradients to bfloat16's (the logits' gradient is
    cast to bfloat16 for the products on both paths)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 500, bias=False)
    h = torch.randn(40, 64, requires_grad=True)
    y, g = torch.randint(0, 500, (40,)), torch.randn(40)
    (lp, ent, gh, (gw,)), (lp2, ent2, gh2, (gw2,)) = _both(head, h, y, g, 0.7, 16, autocast=True)
    assert lp.dtype == torch.float32 and gh.dtype == torch.float32 and gw.dtype == torch.float32
    torch.testing.assert_close(lp, lp2, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ent2, rtol=0, atol=1e-5)
    assert (gh - gh2).abs().max() <= 1e-2 * gh2.abs().max()
    assert (gw - gw2).abs().max() <= 1e-2 * gw2.abs().max()


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_still_do():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False).requires_grad_(False)
    h = torch.randn(9, 8, requires_grad=True)
    y = torch.randint(0, 50, (9,))
    lp, ent = head_log_probs(h, head, y, temperature=1.0, chunk_tokens=4, with_entropy=False)
    assert ent is None
    lp.sum().backward()
    assert head.weight.grad is None and h.grad is not None and h.grad.abs().sum() > 0
    expected = torch.log_softmax(head(h), -1).gather(-1, y[:, None]).squeeze(-1)
    torch.testing.assert_close(lp, expected.detach(), rtol=0, atol=1e-5)
