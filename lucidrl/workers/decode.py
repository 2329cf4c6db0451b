"""lucidrl's own decoding loop: each prompt prefilled once for its n samples, finished rows dropped.

`transformers.generate` prefills every copy of a prompt (n times the work for GRPO's groups) and
keeps computing rows that already ended. This loop prefills the unique prompts once (and the leading
tokens they all share, such as a system prompt, once for the batch: `_prefill`), samples with
temperature / top-k / top-p, records the log-prob of each sampled token under the
temperature-scaled distribution (what the actor's forward computes), and compacts the batch as rows
reach an eos. Tokens after a row's eos are the pad id; log-probs there are 0.

With n > 1 the prompt's keys and values are not copied n times either: decoding attends to them
through shared-prefix ("cascade") attention (`shared_prefix_attention`). The n samples' queries
meet their prompt's keys in one matrix product per group, the samples' own tokens are attended to
per row, and the two parts are merged by their log-sum-exp, which is exactly softmax attention over
prompt + response. Decoding reads each prompt's cache once per step instead of n times; attention
over the repeated cache was 45% of decode time (64 prompts x 8 samples, 240-token prompts).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from lucidrl.diagnostics.errors import UserError
from lucidrl.models.precision import masked_gqa
from lucidrl.workers.train_state import process_rng_state, set_process_rng_state

# drop finished rows from the cache once this share of the active rows has ended
COMPACT_FRACTION = 0.25
# prefill a batch's shared leading prompt tokens once when there are at least this many (_prefill)
MIN_COMMON_PREFIX = 16


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the smallest set with probability >= top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already cover top_p (the first token always stays)
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class ReservedLayer(DynamicLayer):
    """A KV cache layer that reserves room for the whole generation up front.

    DynamicLayer grows by torch.cat, copying the whole cache at every decoded token: 58% of decode
    time in a profile of 128 rows x 128 tokens on the tiny model. This layer writes each new token
    into preallocated buffers and hands attention a view of the filled part.

    With `dtype` the buffers hold that dtype whatever the keys and values come in as (each new token
    is converted once, when written): shared-prefix attention reads the rows' own cache in float32
    at every step, and under bf16 autocast the values arrive in bfloat16, so it converted the whole
    cache per step and layer (0.54 s of a 10.8 s generation of 64 prompts x 8 samples x 128 tokens).
    """

    def __init__(self, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.capacity = capacity
        self.dtype = dtype
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.device = key_states.device
            shape = (*key_states.shape[:2], max(self.capacity, key_states.shape[-2]), key_states.shape[-1])
            self._k = torch.empty(shape, dtype=self.dtype or key_states.dtype, device=self.device)
            self._v = torch.empty(shape, dtype=self.dtype or value_states.dtype, device=self.device)
            self.is_initialized = True
        new = key_states.shape[-2]
        if self.length + new > self._k.shape[-2]:  # out of room: grow (never expected, but stay correct)
            grow = self.length + new - self._k.shape[-2] + 64
            self._k = torch.cat(
                [self._k, self._k.new_empty((*self._k.shape[:2], grow, self._k.shape[-1]))], -2
            )
            self._v = torch.cat(
                [self._v, self._v.new_empty((*self._v.shape[:2], grow, self._v.shape[-1]))], -2
            )
        self._k[:, :, self.length : self.length + new] = key_states
        self._v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]


def reserved_cache(capacity: int, dtype: torch.dtype | None = None) -> Cache:
    """A cache whose layers hold `capacity` positions without reallocating (in `dtype`, if given)."""
    return Cache(layer_class_to_replicate=functools.partial(ReservedLayer, capacity, dtype))


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HuggingFace model inside a DistributedDataParallel wrapper or a peft model."""
    base = getattr(model, "module", model)
    return base.get_base_model() if hasattr(base, "get_base_model") else base


def _forward_params(model: torch.nn.Module):
    """The parameters of the HuggingFace forward: a peft model's (or a DDP wrapper's) own forward takes
    **kwargs and hands them to the model inside, which is the one that says what it accepts."""
    return inspect.signature(_base_model(model).forward).parameters


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns)."""
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def last_logits_only(model: torch.nn.Module) -> dict[str, int]:
    """Forward kwargs that skip the LM head on every position but the last (prompt forwards need only it)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}


def sample_tokens(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of (rows, V) probabilities, by inverse CDF: one uniform draw per row.

    `torch.multinomial` draws an exponential per vocabulary entry: 14 ms for 512 rows of 832 tokens
    here, against 0.5 ms. A token of probability 0 (filtered by top-k / top-p) is never drawn: its
    interval of the CDF is empty. Each token's interval is exact up to float32 rounding of the
    running sum (~1e-7 in probability).
    """
    cdf = probs.cumsum(-1)
    u = torch.rand((probs.shape[0], 1), dtype=cdf.dtype, device=probs.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    # rounding can put u at the very top of the CDF (odds ~2^-24): the likeliest token then
    empty = probs.gather(-1, tokens[:, None]).squeeze(-1) == 0
    return torch.where(empty, probs.argmax(-1), tokens) if bool(empty.any()) else tokens


SHARED_PREFIX_ATTENTION = "lucidrl_shared_prefix"


class DecodeLoopUnsupported(UserError, ValueError):
    """A model lucidrl's decode loop cannot run (rollout.decode_loop=transformers can)."""


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

        The matmul adds it to the scores itself (baddbmm): in a profile of 512 samples the score
        computation took 0.90 s this way against 1.26 s for a matmul, a scaling and a masked_fill.
        Built once per generation (per kv-head count, which a model may vary by layer).
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


# model classes whose attention ignored shared_prefix_attention (decoded the plain way from then on)
_NO_SHARED_PREFIX: set[type] = set()


def _text_config(config):
    """The config that describes the decoder's layers: a multimodal model's text config (Gemma 3's
    sliding windows and rotary settings sit there), else the config itself."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _can_share_prefix(model: torch.nn.Module, span: int) -> bool:
    """Whether every layer's attention is plain softmax attention over all earlier tokens, through
    transformers' attention interface, for sequences of `span` tokens. Decided before decoding: a
    refusal found in the first step (which already sampled) would leave the RNG one draw on."""
    config = getattr(model, "config", None)
    if type(model) in _NO_SHARED_PREFIX or config is None or not hasattr(config, "_attn_implementation"):
        return False
    # its own attention code; a peft model's class says nothing of the model inside (LoRA on MPT's
    # ALiBi or GPT-Neo's local attention passed, and the prefill of a shared prompt changed their tokens)
    if getattr(type(_base_model(model)), "_supports_attention_backend", True) is False:
        return False
    config = _text_config(config)
    # only full attention: sliding, chunked (Llama 4) or linear-attention layers would be ignored
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return False
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < span:
        return False
    # Llama 4: chunked attention, and a query scale computed from the cache's length
    return not (
        getattr(config, "attention_chunk_size", None) or getattr(config, "attn_temperature_tuning", False)
    )


# rotary embeddings whose frequencies a forward picks from its longest position (Phi-3's long-RoPE
# switches factors past original_max_position_embeddings; "dynamic" NTK rescales): a prefill split
# into the shared prompt and the rest would rotate the shared keys with other factors
_LENGTH_DEPENDENT_ROPE = frozenset({"longrope", "dynamic"})


def _rope_types(config) -> set[str]:
    """The rotary embedding types of a (text) config: rope_parameters, or rope_scaling before
    transformers 5, either one dict or one per layer type."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    groups = [v for v in params.values() if isinstance(v, dict)] or [params]
    return {str(g.get("rope_type", g.get("type", "default"))) for g in groups}


def _can_prefill_shared_prompt(model: torch.nn.Module, span: int) -> bool:
    """Whether the prompts' shared leading tokens may be prefilled once (`_prefill`): the shared-prefix
    attention's conditions (every layer attends to all earlier tokens, counted by position, not
    column), and rotary frequencies that do not depend on the forward's length."""
    if not _can_share_prefix(model, span):
        return False
    return not (_rope_types(_text_config(model.config)) & _LENGTH_DEPENDENT_ROPE)


def non_attention_layers(model: torch.nn.Module) -> str | None:
    """What in `model` is not attention, or None: layer types other than attention (Qwen3-Next's
    linear attention), a recurrent model type, or state-space parameters (`A_log`: Mamba, Mamba-2,
    and hybrids such as Falcon-H1, Jamba, Bamba, whose configs list no layer types). A key-value cache
    cannot hold their state."""
    config = getattr(model, "config", None)
    kinds = set(getattr(config, "layer_types", None) or [])
    other = sorted(kinds - {"full_attention", "sliding_attention", "chunked_attention"})
    if other:
        return ", ".join(other)
    if getattr(config, "model_type", "") in ("mamba", "mamba2", "rwkv"):
        return config.model_type
    if any(name.endswith("A_log") for name, _ in model.named_parameters()):
        return "state-space layers"
    return None


def check_decode_loop_supported(model: torch.nn.Module) -> None:
    """Raise DecodeLoopUnsupported naming rollout.decode_loop=transformers for models whose layers are not all
    attention (state-space and hybrid models: Mamba, Qwen3-Next): the loop's caches hold keys and
    values only, and such models crashed inside transformers with an IndexError."""
    other = non_attention_layers(model)
    if other:
        raise DecodeLoopUnsupported(
            f"{type(model).__name__} has layers that are not attention ({other}), "
            "which lucidrl's decode loop cannot cache; set rollout.decode_loop=transformers"
        )


def common_prefix_length(prompts: torch.Tensor, prompt_mask: torch.Tensor) -> int:
    """How many leading real tokens every left-padded prompt of the batch shares (0 for one prompt,
    or when a row's real tokens are not one run ending at the right edge), leaving each row at least
    one token of its own: GRPO batches share the chat template and system prompt (159 of 206-251
    tokens in step_vs_trl's Knights & Knaves prompts)."""
    bs, width = prompts.shape
    lengths = prompt_mask.sum(-1)
    shortest = int(lengths.min()) if bs > 1 else 0
    if shortest < 2:
        return 0
    # left padding: row i's real tokens are exactly its last lengths[i] columns
    cols = torch.arange(width, device=prompts.device)
    if not torch.equal(prompt_mask.bool(), cols[None, :] >= (width - lengths)[:, None]):
        return 0
    starts = (width - lengths)[:, None] + torch.arange(shortest - 1, device=prompts.device)[None, :]
    heads = prompts.gather(1, starts)  # every row's first shortest - 1 real tokens
    differs = (heads != heads[:1]).any(0).nonzero()
    return int(differs[0]) if len(differs) else shortest - 1


def _prefill(
    model: torch.nn.Module, prompts: torch.Tensor, prompt_mask: torch.Tensor, cache: Cache, common: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill `cache` with the prompts' keys and values; return the last positions' logits (float32)
    and the mask of what the cache holds.

    With `common` >= MIN_COMMON_PREFIX the shared leading tokens run once, in a batch of one, and
    their cache is repeated to every row; then each row's remaining tokens run against it, left-padded
    among themselves, so the cache holds [common prefix | padding | the row's own tokens] under the
    mask returned. Positions count real tokens, so each token gets the position, and attends to the
    same tokens, as in the plain prefill (last logits within 1e-6 of it). In step_vs_trl's setting
    (64 prompts of 206-251 tokens, 159 shared) the prefill took 0.54 s against 1.86 s.
    """
    kw, last = _cache_kwarg(model), last_logits_only(model)
    # the prefill's many queries attend under a padding mask: on the CPU without repeat_kv's copies
    # (precision.masked_gqa); the one-query decode steps need no switch for that
    with masked_gqa() if prompts.device.type == "cpu" else contextlib.nullcontext():
        if common < MIN_COMMON_PREFIX:
            positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
            out = model(
                input_ids=prompts, attention_mask=prompt_mask, position_ids=positions, use_cache=True,
                **{kw: cache}, **last,
            )  # fmt: skip
            return out.logits[:, -1, :].float(), prompt_mask
        bs, width = prompts.shape
        lengths = prompt_mask.sum(-1)
        first = width - int(lengths[0])
        shared = prompts[:1, first : first + common]
        positions = torch.arange(common, device=prompts.device)[None, :]
        model(input_ids=shared, position_ids=positions, use_cache=True, **{kw: cache}, **last)
        cache.batch_repeat_interleave(bs)
        # the rows' own tokens: the last `own_width` columns, masked before each row's own start
        own_width = int(lengths.max()) - common
        own_ids = prompts[:, width - own_width :]
        cols = torch.arange(own_width, device=prompts.device)
        own_mask = (cols[None, :] >= (own_width - (lengths - common))[:, None]).to(prompt_mask.dtype)
        mask = torch.cat([torch.ones_like(prompt_mask[:, :common]), own_mask], dim=1)
        positions = common + (own_mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=own_ids, attention_mask=mask, position_ids=positions, use_cache=True, **{kw: cache}, **last
        )  # fmt: skip
    return out.logits[:, -1, :].float(), mask


@torch.no_grad()
def sample_group(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    n: int,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Responses (bs*n, R) and sampling log-probs (bs*n, R) for left-padded prompts (bs, P); rows interleaved.

    n > 1 decodes over each prompt's cache once (shared-prefix attention) when the model's attention
    goes through transformers' attention interface; otherwise, with a warning, each row gets a copy.
    """
    kwargs = dict(
        n=n, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id, do_sample=do_sample,
        temperature=temperature, top_k=top_k, top_p=top_p,
    )  # fmt: skip
    check_decode_loop_supported(model)
    if n > 1 and _can_share_prefix(model, prompts.shape[1] + max_new_tokens):
        # the first step samples before a layer can refuse: the plain rerun must draw the same numbers
        rng = process_rng_state()
        try:
            return _decode(model, prompts, prompt_mask, shared=True, **kwargs)
        except SharedPrefixUnsupported as e:
            set_process_rng_state(rng)
            _NO_SHARED_PREFIX.add(type(model))
            warnings.warn(
                f"{type(model).__name__}: decoding with a copy of the prompt cache per sample, not the shared "
                f"prefix ({e}); correct, only slower",
                stacklevel=2,
            )
    return _decode(model, prompts, prompt_mask, shared=False, **kwargs)


def _decode(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    shared: bool,
    n: int,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    bs = prompts.shape[0]
    device = prompts.device
    rows = bs * n
    # the prompt's cache: kept once per prompt (shared) or reserved with room for the responses
    span = prompts.shape[1] + max_new_tokens
    cache = DynamicCache() if shared else reserved_cache(span)
    kw = _cache_kwarg(model)
    # a batch's shared leading prompt tokens are prefilled once (models whose every layer attends to
    # all earlier tokens: the cache then has padding between them and each row's own tokens)
    common = common_prefix_length(prompts, prompt_mask) if _can_prefill_shared_prompt(model, span) else 0
    logits, prompt_mask = _prefill(model, prompts, prompt_mask, cache, common)
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    active = torch.arange(rows, device=device)  # which output row each decoding row belongs to
    prefix = None
    if shared:
        prefix = SharedPrefix(
            keys_t=[layer.keys.transpose(-1, -2).float().contiguous() for layer in cache.layers],
            values=[layer.values.float() for layer in cache.layers],
            mask=prompt_mask.bool(),
            n=n,
            slots=active,
            span=span,
        )
        # the rows' own tokens; on the CPU kept in the float32 that shared_prefix_attention computes in
        # (on a GPU a float32 cache of every layer would double the bf16 one: it converts per layer there)
        cache = reserved_cache(max_new_tokens, torch.float32 if device.type == "cpu" else None)
    elif n > 1:
        cache.batch_repeat_interleave(n)
    if n > 1:
        logits = logits.repeat_interleave(n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
        positions = positions.repeat_interleave(n, dim=0)
    responses = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
    attn = prompt_mask
    next_pos = positions[:, -1] + 1
    eos = torch.tensor(eos_ids, device=device)
    finished: torch.Tensor | None = None  # per decoding row: has it emitted an eos yet
    length = 0
    for t in range(max_new_tokens):
        length = t + 1
        scaled = logits / temperature if do_sample and temperature != 1.0 else logits
        logprobs = torch.log_softmax(scaled, dim=-1)
        if do_sample:
            tokens = sample_tokens(filter_logits(scaled, top_k, top_p).softmax(-1))
        else:
            tokens = scaled.argmax(-1)
        responses[active, t] = tokens
        logps[active, t] = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        # a row has ended once it has emitted an eos at any step, not only at this one
        finished = torch.isin(tokens, eos) if finished is None else finished | torch.isin(tokens, eos)
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        # rows that ended stay in the batch until enough have ended to compact it; their further
        # tokens are overwritten with the pad id at the end
        if int(finished.sum()) >= COMPACT_FRACTION * len(active):
            idx = (~finished).nonzero().squeeze(-1)
            cache.batch_select_indices(idx)
            active, tokens, attn, next_pos = active[idx], tokens[idx], attn[idx], next_pos[idx]
            finished = finished[idx]
        if prefix is not None:
            prefix.slots = active
            with attention_implementation(model, SHARED_PREFIX_ATTENTION):
                out = model(
                    input_ids=tokens[:, None], position_ids=next_pos[:, None], use_cache=True,
                    shared_prefix=prefix, **{kw: cache},
                )  # fmt: skip
            if len(prefix.layers_called) != len(prefix.values):
                raise SharedPrefixUnsupported(
                    f"its attention ran shared_prefix_attention in {len(prefix.layers_called)} of "
                    f"{len(prefix.values)} layers"
                )
        else:
            attn = torch.cat([attn, torch.ones((attn.shape[0], 1), dtype=attn.dtype, device=device)], dim=1)
            out = model(
                input_ids=tokens[:, None],
                attention_mask=attn,
                position_ids=next_pos[:, None],
                use_cache=True,
                **{kw: cache},
            )
        logits = out.logits[:, -1, :].float()
        next_pos = next_pos + 1
    responses, logps = responses[:, :length], logps[:, :length]
    # everything after a row's first eos is padding (rows that ended but were not yet compacted kept going)
    is_eos = torch.isin(responses, eos)
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return responses.masked_fill(after, pad_id), logps.masked_fill(after, 0.0)
