"""The one forward pass actor and reference share: log-probs (and entropy) of the response tokens."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from lucidrl.algos.fused_logprob import log_probs_and_entropy
from lucidrl.algos.head_logprob import head_log_probs
from lucidrl.algos.logprob import sum_pi_squared_from_logits
from lucidrl.batch import Batch, response_attention
from lucidrl.diagnostics.errors import UserError
from lucidrl.workers.common.model_support import (
    _cache_kwarg,
    checkpointing_active,
    last_logits_only,
    non_attention_layers,
)


def sequence_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask and position_ids for prompt+response, prompts left-padded.

    Positions count only attended tokens, exactly as `generate` numbered them, so the log-probs of
    a training forward match the ones sampled. A multi-turn response's tool tokens are attended to
    (batch.response_attention), though out of the loss mask.
    """
    input_ids = torch.cat([batch["prompts"], batch["responses"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], response_attention(batch)], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def group_starts(uids: list) -> list[int]:
    """Indices where a run of equal consecutive uids begins (samples of one prompt sit together)."""
    return [i for i in range(len(uids)) if i == 0 or uids[i] != uids[i - 1]]


def _run(model: torch.nn.Module, hidden: bool, **kwargs) -> torch.Tensor:
    """The model's logits, or with `hidden` its decoder's last hidden states (the LM head's input)."""
    if hidden:
        return model.get_decoder()(**kwargs).last_hidden_state
    return model(**kwargs).logits


def _response_logits_shared_prefix(
    model: torch.nn.Module, batch: Batch, hidden: bool = False
) -> torch.Tensor:
    """(bs, R, V) logits predicting each response token, each prompt run through the model once
    (with `hidden`: (bs, R, H), the hidden states the LM head turns into those logits).

    The prompt forward fills a KV cache for the distinct prompts; the cache rows are then gathered
    per sample (differentiably, so gradients reach the prompt positions) and the responses run on top
    of it. GRPO's n samples per prompt thus cost one prompt forward instead of n: the same numbers as
    the full forward (up to float rounding), far fewer FLOPs when prompts are long.
    """
    starts = group_starts(batch["uid"])
    ends = [*starts[1:], len(batch)]
    row_group = torch.tensor(
        [g for g, (a, b) in enumerate(zip(starts, ends, strict=True)) for _ in range(b - a)]
    )
    prompts, prompt_mask = batch["prompts"][starts], batch["prompt_mask"][starts]
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()  # filled in place by the forward (gradients flow through it)
    kw = _cache_kwarg(model)
    out = _run(
        model, hidden, input_ids=prompts, attention_mask=prompt_mask, position_ids=prompt_pos,
        use_cache=True, **{kw: cache}, **({} if hidden else last_logits_only(model)),
    )  # fmt: skip
    first = out[:, -1:, :][row_group]  # predicts each sample's first response token
    cache.batch_select_indices(row_group.to(prompts.device))
    mask = torch.cat([batch["prompt_mask"], response_attention(batch)], dim=1)
    resp_pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, prompts.shape[1] :]
    out = _run(
        model, hidden, input_ids=batch["responses"], attention_mask=mask, position_ids=resp_pos,
        use_cache=True, **{kw: cache},
    )  # fmt: skip
    return torch.cat([first, out[:, :-1, :]], dim=1)


def response_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float,
    with_entropy: bool,
    share_prompt: bool = False,
    data_parallel: bool = False,
    entropy_grad: bool = True,
    head_chunk_tokens: int = 0,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(response token) (bs, R) at `temperature`, and the entropy (bs, R) if asked.

    `entropy_grad=False`: the entropy is a metric only, computed outside autograd, so its (bs, R, V)
    softmax is neither kept for backward nor part of the graph (with a 150k vocabulary that is
    gigabytes per micro-batch).

    `share_prompt`: run each distinct prompt once for all its samples (_response_logits_shared_prefix;
    consecutive samples with equal uids, as rollouts lay them out), when some uid repeats in `batch`.
    With `data_parallel` it takes that path whenever the batch has uids: the model is then called
    twice (prompts, then responses) in every micro-batch, so ranks whose shares split the groups
    differently still run the same number of FSDP2 / DDP forwards (their collectives must pair up).

    `head_chunk_tokens` > 0: the (bs, R, V) logits are never formed. The LM head, log-prob and entropy
    run on at most that many response tokens at a time (`chunked_head_log_probs`), only on tokens of
    the response mask; positions outside it get log-prob and entropy 0.

    `compiled`: log-prob and entropy by torch.compile'd fused kernels (lucidrl.algos.fused_logprob),
    eager where compiling fails.
    """
    lp, ent, _ = _response_outputs(
        model, batch, temperature=temperature, with_entropy=with_entropy, share_prompt=share_prompt,
        data_parallel=data_parallel, entropy_grad=entropy_grad, head_chunk_tokens=head_chunk_tokens,
        compiled=compiled, with_sum_pi_squared=False,
    )  # fmt: skip
    return lp, ent


def response_log_probs_and_sum_pi_squared(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float,
    share_prompt: bool = False,
    data_parallel: bool = False,
    head_chunk_tokens: int = 0,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As `response_log_probs` with the entropy, plus sum_v pi(v)^2 (bs, R) at each response position
    (for the optimal token baselines), from the same forward; no gradient. Positions outside the
    response mask get 0 where the LM head runs in chunks."""
    lp, ent, spsq = _response_outputs(
        model, batch, temperature=temperature, with_entropy=True, share_prompt=share_prompt,
        data_parallel=data_parallel, entropy_grad=False, head_chunk_tokens=head_chunk_tokens,
        compiled=compiled, with_sum_pi_squared=True,
    )  # fmt: skip
    assert ent is not None and spsq is not None
    return lp, ent, spsq


def _response_outputs(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float,
    with_entropy: bool,
    share_prompt: bool,
    data_parallel: bool,
    entropy_grad: bool,
    head_chunk_tokens: int,
    compiled: bool,
    with_sum_pi_squared: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The forward behind response_log_probs: log-probs, entropy if asked, sum pi^2 if asked."""
    hidden = head_chunk_tokens > 0
    if hidden:
        check_chunkable_head(model)
    groups = "uid" in batch and (data_parallel or len(set(batch["uid"])) < len(batch))
    # under activation checkpointing transformers drops the key-value cache inside each layer: the
    # responses would run without their prompt. Every rank of a group checkpoints alike, so each still
    # makes the same number of model calls
    if share_prompt and groups and not checkpointing_active(model):
        states = _response_logits_shared_prefix(model, batch, hidden)
    else:
        input_ids, attention_mask, position_ids = sequence_inputs(batch)
        resp_len = batch["responses"].shape[1]
        out = _run(
            model, hidden, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=False,
        )  # fmt: skip
        # the output at position t predicts token t+1: responses are predicted by the R positions before them
        states = out[:, -resp_len - 1 : -1, :]
    if hidden:
        lp, ent = chunked_head_log_probs(
            model.get_output_embeddings(), states, batch["responses"], batch["response_mask"],
            temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
            chunk_tokens=head_chunk_tokens, compiled=compiled,
        )  # fmt: skip
    else:
        lp, ent = log_probs_and_entropy(
            states, batch["responses"], temperature=temperature, with_entropy=with_entropy,
            entropy_grad=entropy_grad, compiled=compiled,
        )  # fmt: skip
    spsq = None
    if with_sum_pi_squared:
        with torch.no_grad():
            if hidden:
                spsq = _chunked_sum_pi_squared(
                    model.get_output_embeddings(), states.detach(), batch["response_mask"], temperature,
                    head_chunk_tokens,
                )  # fmt: skip
            else:
                spsq = sum_pi_squared_from_logits(states.detach(), temperature)
    return lp, ent, spsq


def _chunked_sum_pi_squared(
    head: torch.nn.Module, hidden: torch.Tensor, mask: torch.Tensor, temperature: float, chunk_tokens: int
) -> torch.Tensor:
    """(bs, R) sum pi^2 on the masked-in positions, the LM head run `chunk_tokens` positions at a time
    (0 elsewhere), as chunked_head_log_probs runs it."""
    sel = mask.bool()
    h = hidden[sel]
    parts = [
        sum_pi_squared_from_logits(head(h[i : i + chunk_tokens]).float(), temperature)
        for i in range(0, h.shape[0], chunk_tokens)
    ]
    out = hidden.new_zeros(mask.shape, dtype=torch.float32)
    return out.masked_scatter(sel, torch.cat(parts)) if parts else out


class SharedPromptUnsupported(UserError, ValueError):
    """A model whose prompt state a key-value cache cannot hold, with the shared-prompt forward on."""


def check_prompt_sharable(model: torch.nn.Module, key: str = "actor.share_prompt_forward") -> None:
    """The shared-prompt forward runs each prompt once into a KV cache and the responses on top of it:
    state-space and hybrid models (Mamba, Falcon-H1) crashed inside transformers with an IndexError."""
    other = non_attention_layers(getattr(model, "module", model))
    if other:
        raise SharedPromptUnsupported(
            f"{type(model).__name__} has layers that are not attention ({other}), whose state the shared-prompt "
            f"forward's key-value cache cannot hold; set {key}=false (each sample then runs whole)"
        )


# config attributes of models whose logits are more than lm_head(hidden): the chunked path would skip them
_LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
    "lm_head_multiplier",  # Falcon-H1
)


def check_chunkable_head(model: torch.nn.Module, key: str = "actor.head_chunk_tokens") -> None:
    """Raise ValueError unless the model's logits are exactly `get_output_embeddings()(decoder output)`;
    the messages name the config `key` that asked for the chunked head."""
    name = type(model).__name__
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        # The chunked path calls the decoder and the head directly, past the root's forward hooks that
        # all-gather FSDP2's root parameter group (embeddings, final norm, head).
        raise ValueError(
            f"{key} > 0 is not supported with FSDP2 yet (the model is a {name}: the "
            f"chunked path would bypass the root's all-gather); set {key}=0 or use one rank"
        )
    if not (hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")):
        raise ValueError(
            f"{key} > 0 needs a plain HuggingFace causal LM (get_decoder / "
            f"get_output_embeddings), but the model is a {name} (a DDP or other wrapper: the chunked LM "
            f"head runs with one rank only for now); set {key}=0"
        )
    config = getattr(model, "config", None)
    transforms = [a for a in _LOGIT_TRANSFORMS if getattr(config, a, None) not in (None, 1, 1.0)]
    if transforms or model.get_output_embeddings() is None:
        raise ValueError(
            f"{key} > 0: {name}'s logits are not just its LM head's output "
            f"({', '.join(transforms) or 'no output embeddings'} in its config), which the chunked path "
            f"would skip; set {key}=0"
        )
    gap = _head_probe(model)
    if gap is not None:
        raise ValueError(
            f"{key} > 0: {name}'s logits are not just its LM head's output (on a probe of "
            f"a few tokens, the model's logits and head(decoder(...)) differ by up to {gap:.3g}: a transform "
            f"in its forward, which the chunked path would skip); set {key}=0"
        )


@torch.no_grad()
def _head_probe(model: torch.nn.Module) -> float | None:
    """None when `model`'s logits are its LM head's output on its decoder's last hidden states, else
    the largest difference: one forward of six tokens, once per model. The config names above are the
    known transforms; this finds the ones no list has (Falcon-H1's multiplier was missing from it:
    0.16 nats off, silently)."""
    cached = model.__dict__.get("_lucidrl_head_probe", "unset")
    if cached != "unset":
        return cached
    param = next(model.parameters())
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = (torch.arange(6, device=param.device) % vocab).unsqueeze(0)
    was_training = model.training
    model.eval()
    try:
        full = model(input_ids=ids, use_cache=False).logits.float()
        head = model.get_output_embeddings()(_run(model, True, input_ids=ids, use_cache=False)).float()
    finally:
        model.train(was_training)
    gap = (full - head).abs().max().item()
    result = None if gap <= 1e-4 * max(1.0, full.abs().max().item()) else gap
    model.__dict__["_lucidrl_head_probe"] = result
    return result


def chunked_head_log_probs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    chunk_tokens: int,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of `labels` (bs, R) under head(hidden) / temperature, `chunk_tokens`
    masked positions at a time, in float32.

    Each chunk's logits exist only while its chunk is computed, and are recomputed in the backward
    pass, so neither pass ever holds more than one chunk's (chunk_tokens, V) logits. A plain
    `nn.Linear` head runs as one autograd function (lucidrl.algos.head_logprob), which forms the logits'
    gradient in place; other heads (a LoRA-wrapped one), the compiled kernels and an entropy with a
    gradient run each chunk under activation checkpointing. Same numbers as the whole-batch path up
    to float rounding; positions outside `mask` get 0.
    """
    sel = mask.bool()
    h, y = hidden[sel], labels[sel]
    entropy_in_graph = with_entropy and entropy_grad and torch.is_grad_enabled()
    if type(head) is torch.nn.Linear and not compiled and not entropy_in_graph:
        # one autograd function over the chunks: the logits' gradient formed in place, never stored
        lp, ent = head_log_probs(
            h, head, y, temperature=temperature, chunk_tokens=chunk_tokens, with_entropy=with_entropy
        )
    else:
        lp, ent = _checkpointed_chunks(
            head, h, y, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
            chunk_tokens=chunk_tokens, compiled=compiled,
        )  # fmt: skip
    zeros = hidden.new_zeros(labels.shape, dtype=lp.dtype)
    return zeros.masked_scatter(sel, lp), (zeros.masked_scatter(sel, ent) if ent is not None else None)


def _checkpointed_chunks(
    head: torch.nn.Module,
    h: torch.Tensor,
    y: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    chunk_tokens: int,
    compiled: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) float32 log-probs (and entropies) of `y` under head(h) / temperature, each chunk of
    `chunk_tokens` rows under activation checkpointing when gradients are needed."""
    grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters()))

    def chunk(hc: torch.Tensor, yc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head(hc)
        if not compiled:
            logits = logits.float()  # one chunk in float32 at once (a bf16 head's output too)
        lp, ent = log_probs_and_entropy(
            logits, yc, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
            compiled=compiled,
        )  # fmt: skip
        return lp, ent if ent is not None else lp.new_zeros(())

    lps, ents = [], []
    for start in range(0, h.shape[0], chunk_tokens):
        hc, yc = h[start : start + chunk_tokens], y[start : start + chunk_tokens]
        lp, ent = checkpoint(chunk, hc, yc, use_reentrant=False) if grad else chunk(hc, yc)
        lps.append(lp)
        ents.append(ent)
    if not lps:  # no response token in the micro-batch
        empty = h.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)
