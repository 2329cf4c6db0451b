"""Shared-prefix ("cascade") attention: n samples decoding over one copy of their prompt's cache.

With n > 1 samples per prompt the prompt's keys and values are not copied n times: decoding attends
to them through `shared_prefix_attention`, registered with transformers' attention interface under
SHARED_PREFIX_ATTENTION. The n samples' queries meet their prompt's keys in one matrix product per
group, the samples' own tokens are attended to per row, and the two parts are merged by their
log-sum-exp, which is exactly softmax attention over prompt + response. Decoding reads each prompt's
cache once per step instead of n times. Which models may use it: model_support.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

SHARED_PREFIX_ATTENTION = "lucidrl_shared_prefix"


class SharedPrefixUnsupported(RuntimeError):
    """The model's attention cannot decode over a shared prefix (it is then decoded the plain way)."""


@dataclass
class SharedPrefix:
    """Each prompt's keys and values once, for decoding its n samples (see the module docstring)."""

    keys_t: list[torch.Tensor]  # per layer, (bs, kv_heads, head_dim, P) float32, transposed for the matmul
    values: list[torch.Tensor]  # per layer, (bs, kv_heads, P, head_dim) float32
    mask: torch.Tensor  # (bs, P) bool: real prompt positions (False on left padding)
    n: int
    slots: torch.Tensor  # (rows,) each active row's index among bs * n (its prompt: slot // n)
    span: int = 0  # prompt width + max_new_tokens: a sliding window at least this wide restricts nothing
    layers_called: set[int] = field(default_factory=set)
    _biases: dict[int, torch.Tensor] = field(default_factory=dict)

    def bias(self, kv_heads: int) -> torch.Tensor:
        """(bs * kv_heads, 1, P) float32: 0 on real prompt positions, -inf on left padding.

        The matmul adds it to the scores itself (baddbmm), faster than a matmul, a scaling and a
        masked_fill (benchmarks/decode_cpu.py). Built once per generation (per kv-head count, which a model may vary by layer).
        """
        if kv_heads not in self._biases:
            bias = torch.zeros(self.mask.shape, dtype=torch.float32, device=self.mask.device)
            bias = bias.masked_fill(~self.mask, float("-inf"))
            self._biases[kv_heads] = (
                bias[:, None, None, :].expand(-1, kv_heads, 1, -1).reshape(-1, 1, self.mask.shape[-1])
            )
        return self._biases[kv_heads]


# keyword arguments of an attention call that do not change what it computes (sliding_window and
# softcap are checked on their own)
_PLAIN_ATTENTION_KWARGS = frozenset(
    {
        "shared_prefix", "position_ids", "use_cache", "cache_position", "output_attentions", "past_key_value",
        "past_key_values", "is_causal", "sliding_window", "softcap", "layer_idx", "position_embeddings",
    }
)  # fmt: skip


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Softmax attention of decoding rows over their prompt (shared per group) and their own tokens.

    query (rows, heads, 1, d); key / value (rows, kv_heads, t, d): the rows' own tokens so far, all
    attended to. The prompt part is one (n * heads / kv_heads, P) score matrix per prompt and kv
    head; the two parts are merged with their maxima and normalisers, as flash attention merges
    blocks. Returns (rows, 1, heads, d) like transformers' sdpa attention.
    """
    prefix = kwargs.get("shared_prefix")
    if not isinstance(prefix, SharedPrefix) or query.shape[2] != 1:
        raise SharedPrefixUnsupported("shared-prefix attention needs decode steps (one query) and the prefix")
    window = kwargs.get("sliding_window")
    if (window is not None and window < prefix.span) or kwargs.get("softcap") is not None or dropout:
        raise SharedPrefixUnsupported("sliding-window, soft-capped or dropout attention")
    # anything else the layer passes changes the attention (sinks, s_aux, position biases) unless it
    # is one of the arguments every attention function gets: an unknown one is refused, not ignored
    unknown = sorted(
        k
        for k, v in kwargs.items()
        if v is not None and k not in _PLAIN_ATTENTION_KWARGS and not k.startswith(("output_", "return_"))
    )
    if unknown:
        raise SharedPrefixUnsupported(
            f"its attention takes {', '.join(unknown)}, which shared-prefix attention does not apply"
        )
    layer = module.layer_idx
    prefix.layers_called.add(layer)
    k_t, v_p = prefix.keys_t[layer], prefix.values[layer]
    bs, kv_heads, d, _ = k_t.shape
    rows, heads = query.shape[:2]
    g, n = heads // kv_heads, prefix.n
    scale = scaling if scaling is not None else d**-0.5
    # scores and their merge in float32 whatever the model's dtype, and outside autocast (which would
    # run the matmuls in bf16 again); the scale goes on the (rows, heads, d) queries, not the scores
    no_autocast = (
        torch.autocast(query.device.type, enabled=False)
        if torch.amp.is_autocast_available(query.device.type)
        else contextlib.nullcontext()
    )
    with no_autocast:
        q = query[:, :, 0, :].float() * scale
        key, value = key.float(), value.float()
        # prompt part: all n rows of a prompt against its keys at once; rows that ended contribute zeros
        q_all = q.new_zeros((bs * n, heads, d))
        q_all[prefix.slots] = q
        q_all = q_all.view(bs, n, kv_heads, g, d).transpose(1, 2).reshape(bs * kv_heads, n * g, d)
        s_p = torch.baddbmm(prefix.bias(kv_heads), q_all, k_t.view(bs * kv_heads, d, -1)).view(
            bs, kv_heads, n * g, -1
        )
        m_p = s_p.amax(-1, keepdim=True)  # every prompt has a real position: finite
        e_p = torch.exp(s_p - m_p)
        l_p, o_p = e_p.sum(-1, keepdim=True), torch.matmul(e_p, v_p)

        def per_row(x: torch.Tensor) -> torch.Tensor:  # (bs, kv_heads, n * g, c) -> (rows, heads, c)
            x = x.view(bs, kv_heads, n, g, -1).transpose(1, 2).reshape(bs * n, heads, -1)
            return x[prefix.slots]

        o_p, m_p, l_p = per_row(o_p), per_row(m_p), per_row(l_p)
        # own part: each row's query against its own generated tokens
        s_r = torch.matmul(q.reshape(rows, kv_heads, g, d), key.transpose(-1, -2))
        m_r = s_r.amax(-1, keepdim=True)
        e_r = torch.exp(s_r - m_r)
        l_r = e_r.sum(-1, keepdim=True).reshape(rows, heads, 1)
        o_r = torch.matmul(e_r, value).reshape(rows, heads, d)
        m_r = m_r.reshape(rows, heads, 1)
        m = torch.maximum(m_p, m_r)
        a_p, a_r = torch.exp(m_p - m), torch.exp(m_r - m)
        out = (o_p * a_p + o_r * a_r) / (l_p * a_p + l_r * a_r)
    return out[:, None].to(query.dtype), None


AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str):
    """Run `model` with another registered attention function, restoring its own afterwards."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before
