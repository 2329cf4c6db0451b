"""SDPA attention in float32 under bf16 compute on CPUs without AMX (precision.float32_attention):
where it is on, the CPU attention kernels get float32 in the forward and the backward, the output
keeps autocast's dtype, log-probs and gradients are those of bf16 compute with a more precise
attention, and nothing changes outside lucidrl's compute context."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lucidrl.diagnostics.errors import UsageError
from lucidrl.models.precision import FLOAT32_ATTENTION, compute_context, float32_attention_wanted
from lucidrl.workers.training.forward import response_log_probs
from tests.test_masked_gqa import _log_probs_and_grads
from tests.test_micro_batches import _rollout_with_varied_lengths

CPU = torch.device("cpu")


class AttentionKernels(TorchDispatchMode):
    """The input dtypes of every CPU flash-attention kernel call (after autocast has cast them)."""

    def __init__(self):
        super().__init__()
        self.dtypes: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "scaled_dot_product" in name:
            self.dtypes.append(("backward" if "backward" in name else "forward", args[0].dtype))
        return func(*args, **(kwargs or {}))


def _forward_backward(model, batch, share_prompt):
    model.zero_grad(set_to_none=True)
    kernels = AttentionKernels()
    with kernels:
        with compute_context(model, torch.bfloat16):
            lp, _ = response_log_probs(
                model, batch, temperature=1.0, with_entropy=False, share_prompt=share_prompt
            )
        (lp * batch["response_mask"]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), grads, kernels.dtypes


@pytest.mark.slow
@pytest.mark.parametrize("share_prompt", [False, True])
def test_bf16_training_forwards_attend_in_float32_where_switched_on(
    kk_data, tiny_model, tiny_tokenizer, monkeypatch, share_prompt
):
    model, batch = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    monkeypatch.setenv(FLOAT32_ATTENTION, "1")
    lp32, grads32, kernels32 = _forward_backward(model, batch, share_prompt)
    monkeypatch.setenv(FLOAT32_ATTENTION, "0")
    lp16, grads16, kernels16 = _forward_backward(model, batch, share_prompt)

    calls = model.config.num_hidden_layers * (2 if share_prompt else 1)
    assert sorted(kernels32) == sorted([("forward", torch.float32), ("backward", torch.float32)] * calls)
    assert sorted(kernels16) == sorted([("forward", torch.bfloat16), ("backward", torch.bfloat16)] * calls)
    # both are bf16 compute of the same model, as near float32 compute as each other (the
    # projections' bf16 rounding dominates on this model), and not the same numbers
    lp_ref, grads_ref = _log_probs_and_grads(model, batch, share_prompt)  # float32 compute
    mask = batch["response_mask"].bool()
    err32 = (lp32 - lp_ref)[mask].abs().mean()
    err16 = (lp16 - lp_ref)[mask].abs().mean()
    assert err32 < 2e-3 and err16 < 2e-3 and err32 < 1.5 * err16
    assert not torch.equal(lp32, lp16)
    assert grads32.keys() == grads16.keys() == grads_ref.keys()
    for name, g in grads32.items():
        assert torch.allclose(g, grads_ref[name], rtol=0.1, atol=0.02 * grads_ref[name].abs().max()), name


@pytest.mark.slow
def test_float32_attention_is_only_inside_lucidrls_context(kk_data, tiny_model, tiny_tokenizer, monkeypatch):
    """transformers' sdpa entry is lucidrl's after the first use, but outside compute_context (a
    user's own autocast) it computes exactly what transformers' own does."""
    model, batch = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    monkeypatch.setenv(FLOAT32_ATTENTION, "1")
    _forward_backward(model, batch, False)  # registers lucidrl's function
    kernels = AttentionKernels()
    with kernels, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        response_log_probs(model, batch, temperature=1.0, with_entropy=False, share_prompt=False)
    assert kernels.dtypes and {d for _, d in kernels.dtypes} == {torch.bfloat16}


def test_the_default_follows_amx_and_the_switch_is_validated(monkeypatch):
    monkeypatch.delenv(FLOAT32_ATTENTION, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert float32_attention_wanted(CPU, torch.bfloat16)
    assert not float32_attention_wanted(CPU, torch.float32)  # no autocast: nothing to change
    assert not float32_attention_wanted(torch.device("meta"), torch.bfloat16)  # CPU only
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert not float32_attention_wanted(CPU, torch.bfloat16)  # AMX: the bf16 kernel stays
    monkeypatch.setenv(FLOAT32_ATTENTION, "1")
    assert float32_attention_wanted(CPU, torch.bfloat16)  # the user's value wins
    monkeypatch.setenv(FLOAT32_ATTENTION, "yes")
    with pytest.raises(UsageError, match=r"LUCIDRL_CPU_FLOAT32_ATTENTION='yes'.*set it to 1"):
        float32_attention_wanted(CPU, torch.bfloat16)


def test_the_attention_function_returns_autocasts_dtype_inside_and_transformers_numbers_outside(tiny_model):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from lucidrl.models import load_model
    from lucidrl.models.precision import _sdpa_in_float32, float32_attention

    attn = load_model(tiny_model["path"]).model.layers[0].self_attn
    heads, kv, d = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    torch.manual_seed(0)
    q, k, v = torch.randn(2, heads, 5, d), torch.randn(2, kv, 5, d), torch.randn(2, kv, 5, d)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    bias = torch.zeros(2, 1, 5, 5, dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))  # a float mask
    with float32_attention():  # registers lucidrl's function over transformers' "sdpa"
        pass
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with float32_attention():
            out, _ = _sdpa_in_float32(attn, q, k, v, bias, scaling=d**-0.5)
        plain, _ = _sdpa_in_float32(attn, q, k, v, mask, scaling=d**-0.5)
        own, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=d**-0.5)
    assert out.dtype == plain.dtype == torch.bfloat16  # what autocast's SDPA returns
    assert torch.equal(plain, own)  # outside the context: transformers' own, unchanged
    with torch.autocast("cpu", enabled=False):
        exact, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=d**-0.5)
    assert torch.equal(out, exact.to(torch.bfloat16))  # inside: float32 attention, rounded once
