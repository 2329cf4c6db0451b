"""The one forward pass actor and reference share: log-probs (and entropy) of the response tokens."""

from __future__ import annotations

import torch

from lucidrl.algos import entropy_from_logits, logprobs_from_logits
from lucidrl.batch import Batch


def sequence_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask and position_ids for prompt+response, prompts left-padded.

    Positions count only attended tokens, exactly as `generate` numbered them, so the log-probs of
    a training forward match the ones sampled.
    """
    input_ids = torch.cat([batch["prompts"], batch["responses"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def response_log_probs(
    model: torch.nn.Module, batch: Batch, *, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(response token) (bs, R) at `temperature`, and the entropy (bs, R) if asked."""
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
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs, entropy
