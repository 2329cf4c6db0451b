"""lucidrl's own decoding loop: each prompt prefilled once for its n samples, finished rows dropped.

`transformers.generate` prefills every copy of a prompt (n times the work for GRPO's groups) and
keeps computing rows that already ended. This loop prefills the unique prompts, repeats their KV
cache n times, samples with temperature / top-k / top-p, records the log-prob of each sampled token
under the temperature-scaled distribution (what the actor's forward computes), and compacts the
batch as rows reach an eos. Tokens after a row's eos are the pad id; log-probs there are 0.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers.cache_utils import Cache, DynamicLayer

# drop finished rows from the cache once this share of the active rows has ended
COMPACT_FRACTION = 0.25


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
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.device = key_states.device
            shape = (*key_states.shape[:2], max(self.capacity, key_states.shape[-2]), key_states.shape[-1])
            self._k = torch.empty(shape, dtype=key_states.dtype, device=self.device)
            self._v = torch.empty(shape, dtype=value_states.dtype, device=self.device)
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


def reserved_cache(capacity: int) -> Cache:
    """A cache whose layers hold `capacity` positions without reallocating."""
    return Cache(layer_class_to_replicate=functools.partial(ReservedLayer, capacity))


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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
    """Responses (bs*n, R) and sampling log-probs (bs*n, R) for left-padded prompts (bs, P); rows interleaved."""
    bs = prompts.shape[0]
    device = prompts.device
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    cache = reserved_cache(prompts.shape[1] + max_new_tokens)  # filled in place by each forward
    kw = _cache_kwarg(model)
    out = model(
        input_ids=prompts, attention_mask=prompt_mask, position_ids=positions, use_cache=True, **{kw: cache}
    )
    logits = out.logits[:, -1, :].float()
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
        positions = positions.repeat_interleave(n, dim=0)
    rows = bs * n
    responses = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
    active = torch.arange(rows, device=device)  # which output row each cache row belongs to
    attn = prompt_mask
    next_pos = positions[:, -1] + 1
    eos = torch.tensor(eos_ids, device=device)
    length = 0
    for t in range(max_new_tokens):
        length = t + 1
        scaled = logits / temperature if do_sample and temperature != 1.0 else logits
        logprobs = torch.log_softmax(scaled, dim=-1)
        if do_sample:
            probs = filter_logits(scaled, top_k, top_p).softmax(-1)
            tokens = torch.multinomial(probs, 1).squeeze(-1)
        else:
            tokens = scaled.argmax(-1)
        responses[active, t] = tokens
        logps[active, t] = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        done = torch.isin(tokens, eos)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        # rows that ended stay in the batch until enough have ended to compact it; their further
        # tokens are overwritten with the pad id at the end
        if int(done.sum()) >= COMPACT_FRACTION * len(active):
            idx = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(idx)
            active, tokens, attn, next_pos = active[idx], tokens[idx], attn[idx], next_pos[idx]
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
