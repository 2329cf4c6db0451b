"""The one forward pass actor and reference share: log-probs (and entropy) of the response tokens."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from lucidrl.algos import entropy_from_logits, logprobs_from_logits
from lucidrl.batch import Batch
from lucidrl.workers.decode import _cache_kwarg, last_logits_only


def sequence_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask and position_ids for prompt+response, prompts left-padded.

    Positions count only attended tokens, exactly as `generate` numbered them, so the log-probs of
    a training forward match the ones sampled.
    """
    input_ids = torch.cat([batch["prompts"], batch["responses"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def group_starts(uids: list) -> list[int]:
    """Indices where a run of equal consecutive uids begins (samples of one prompt sit together)."""
    return [i for i in range(len(uids)) if i == 0 or uids[i] != uids[i - 1]]


def _response_logits_shared_prefix(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """(bs, R, V) logits predicting each response token, each prompt run through the model once.

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
    out = model(
        input_ids=prompts, attention_mask=prompt_mask, position_ids=prompt_pos, use_cache=True,
        **{kw: cache}, **last_logits_only(model),
    )  # fmt: skip
    first = out.logits[:, -1:, :][row_group]  # predicts each sample's first response token
    cache.batch_select_indices(row_group.to(prompts.device))
    mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1)
    resp_pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, prompts.shape[1] :]
    out = model(
        input_ids=batch["responses"],
        attention_mask=mask,
        position_ids=resp_pos,
        use_cache=True,
        **{kw: cache},
    )
    return torch.cat([first, out.logits[:, :-1, :]], dim=1)


def response_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float,
    with_entropy: bool,
    share_prompt: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(response token) (bs, R) at `temperature`, and the entropy (bs, R) if asked.

    `entropy_grad=False`: the entropy is a metric only, computed outside autograd, so its (bs, R, V)
    softmax is neither kept for backward nor part of the graph (with a 150k vocabulary that is
    gigabytes per micro-batch).

    `share_prompt`: run each distinct prompt once for all its samples (_response_logits_shared_prefix);
    it applies when consecutive samples share a uid, as rollouts lay them out.
    """
    if share_prompt and "uid" in batch and len(set(batch["uid"])) < len(batch):
        logits = _response_logits_shared_prefix(model, batch)
    else:
        input_ids, attention_mask, position_ids = sequence_inputs(batch)
        resp_len = batch["responses"].shape[1]
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        # the logit at position t predicts token t+1: responses are predicted by the R positions before them
        logits = out.logits[:, -resp_len - 1 : -1, :]
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = logprobs_from_logits(logits, batch["responses"])
    entropy = None
    if with_entropy and entropy_grad:
        entropy = entropy_from_logits(logits)
    elif with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    return log_probs, entropy
