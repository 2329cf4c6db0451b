"""lucidrl's own decoding loop: each prompt prefilled once for its n samples, finished rows dropped.

`transformers.generate` prefills every copy of a prompt (n times the work for GRPO's groups) and
keeps computing rows that already ended. This loop prefills the unique prompts once (and the leading
tokens they all share, such as a system prompt, once for the batch: `_prefill`), samples with
temperature / top-k / top-p (sampling.py; each row's random draw per step fixed by the row and the
step, so a row's tokens do not depend on when other rows end), records the log-prob of each sampled
token under the temperature-scaled distribution (what the actor's forward computes), and compacts the
batch as rows reach an eos. Tokens after a row's eos are the pad id; log-probs there are 0. With n > 1
the samples of a prompt decode over one copy of its cache (shared_prefix.py) where the model allows it
(model_support.py); the caches are kv_cache.py's. A stop rule (stop_rule.py) ends a row like an eos, with
the token that completed its match kept.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from lucidrl.models.precision import masked_gqa
from lucidrl.workers.common.model_support import (
    _cache_kwarg,
    _can_prefill_shared_prompt,
    _can_share_prefix,
    check_decode_loop_supported,
    last_logits_only,
    mark_no_shared_prefix,
)
from lucidrl.workers.common.rng import process_rng_state, set_process_rng_state
from lucidrl.workers.rollout.kv_cache import reserved_cache
from lucidrl.workers.rollout.sampling import RowDraws, filter_logits, sample_tokens
from lucidrl.workers.rollout.shared_prefix import (
    SHARED_PREFIX_ATTENTION,
    SharedPrefix,
    SharedPrefixUnsupported,
    attention_implementation,
)
from lucidrl.workers.rollout.stop_rule import StopRule

# drop finished rows from the cache once this share of the active rows has ended
COMPACT_FRACTION = 0.25


# prefill a batch's shared leading prompt tokens once when there are at least this many (_prefill)
MIN_COMMON_PREFIX = 16


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
    same tokens, as in the plain prefill (last logits within 1e-6 of it). K&K prompts share most of
    their tokens (the system prompt): benchmarks/decode_cpu.py measures what it saves.
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
    stop: StopRule | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Responses (bs*n, R) and sampling log-probs (bs*n, R) for left-padded prompts (bs, P); rows interleaved.

    n > 1 decodes over each prompt's cache once (shared-prefix attention) when the model's attention
    goes through transformers' attention interface; otherwise, with a warning, each row gets a copy.
    `should_stop` (the engine's abort) is asked after every token: True ends every row where it is.
    """
    kwargs = dict(
        n=n, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id, do_sample=do_sample,
        temperature=temperature, top_k=top_k, top_p=top_p, stop=stop, should_stop=should_stop,
    )  # fmt: skip
    check_decode_loop_supported(model)
    if n > 1 and _can_share_prefix(model, prompts.shape[1] + max_new_tokens):
        # the first step samples before a layer can refuse: the plain rerun must draw the same numbers
        rng = process_rng_state()
        try:
            return _decode(model, prompts, prompt_mask, shared=True, **kwargs)
        except SharedPrefixUnsupported as e:
            set_process_rng_state(rng)
            mark_no_shared_prefix(model)
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
    stop: StopRule | None = None,
    should_stop: Callable[[], bool] | None = None,
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
    finished: torch.Tensor | None = None  # per decoding row: has it emitted an eos yet (or met the stop rule)
    # per output row: its length where the stop rule ended it (tokens after are padding), else the limit
    stop_at = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
    draws = RowDraws(rows, device) if do_sample else None
    scanner = stop.scanner() if stop is not None else None
    length = 0
    for t in range(max_new_tokens):
        length = t + 1
        scaled = logits / temperature if do_sample and temperature != 1.0 else logits
        logprobs = torch.log_softmax(scaled, dim=-1)
        if do_sample:
            tokens = sample_tokens(filter_logits(scaled, top_k, top_p).softmax(-1), draws.at(t, active))
        else:
            tokens = scaled.argmax(-1)
        responses[active, t] = tokens
        logps[active, t] = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        # a row has ended once it has emitted an eos at any step, not only at this one
        finished = torch.isin(tokens, eos) if finished is None else finished | torch.isin(tokens, eos)
        if scanner is not None:
            # each open row's text grows by its new token; the scanner knows rows by their output row
            # (active[i]), which stays the same while the batch compacts. One copy to the host per step
            open_rows = (~finished).nonzero().squeeze(-1)
            at, out_rows, new = torch.stack((open_rows, active[open_rows], tokens[open_rows])).tolist()
            for i, row, hit in zip(at, out_rows, scanner.push(out_rows, new), strict=True):
                if hit:
                    finished[i] = True
                    stop_at[row] = t + 1
        if bool(finished.all()) or t == max_new_tokens - 1 or (should_stop is not None and should_stop()):
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
    # everything after a row's first eos, or its stop, is padding (rows that ended but were not yet
    # compacted kept going)
    is_eos = torch.isin(responses, eos)
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    after |= torch.arange(length, device=device)[None, :] >= stop_at[:, None]
    return responses.masked_fill(after, pad_id), logps.masked_fill(after, 0.0)
