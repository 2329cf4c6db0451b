"""A rollout's output batch from token ids: the response mask up to the first eos, a stop rule's cut,
the sampling log-probs. Shared by the engines that get token lists back (vllm, server)."""

from __future__ import annotations

import torch

from lucidrl.batch import Batch
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.stop_rule import STOPPED_FIELD, stop_rule


def response_mask_from_ids(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 for every token up to and including the first eos of each row, 0 after it. (bs, R) → (bs, R)."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, device=responses.device))
    # tokens strictly after the first eos have a positive count of eos before them
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()


def batch_from_token_lists(
    batch: Batch,
    params: SamplingParams,
    ids: list[list[int]],
    logps: list[list[float]] | None,
    pad_id: int,
    eos_ids: list[int],
    tokenizer=None,
) -> Batch:
    """Right-pad per-sample token ids (n per prompt, interleaved) into the rollout's output batch; with
    `params.stop_regex`, cut by that rule (decoded with `tokenizer`)."""
    expanded = batch.repeat(params.n, interleave=True) if params.n > 1 else batch
    if len(ids) != len(expanded):
        raise RuntimeError(f"{len(ids)} responses for {len(expanded)} prompt copies (prompts x n)")
    device = batch["prompts"].device
    width = max(1, max(len(x) for x in ids))
    responses = torch.full((len(ids), width), pad_id, dtype=torch.long)
    present = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        present[i, : len(row)] = 1
    mask = present * response_mask_from_ids(responses, eos_ids)
    if params.stop_regex is not None and tokenizer is None:
        raise ValueError("a stop rule (SamplingParams.stop_regex) needs the tokenizer to read the responses")
    rule = stop_rule(params.stop_regex, tokenizer, eos_ids)
    if rule is not None:
        mask, stopped = rule.cut(responses, mask)
        expanded.set(STOPPED_FIELD, stopped.to(device))
    expanded.set("responses", responses.masked_fill(mask == 0, pad_id).to(device))
    expanded.set("response_mask", mask.to(device))
    if logps is not None:
        lp = torch.zeros((len(ids), width), dtype=torch.float32)
        for i, row in enumerate(logps):
            lp[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        expanded.set("rollout_log_probs", (lp * mask).to(device))
    expanded.meta["sampling"] = params
    expanded.meta["pad_token_id"] = pad_id  # ranks' outputs of other widths are padded with it on merge
    return expanded
