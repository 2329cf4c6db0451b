"""Rollout engine over transformers' `generate`: n samples per prompt with their sampling log-probs."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, StoppingCriteriaList

from lucidrl.algos import logprobs_from_logits
from lucidrl.batch import Batch
from lucidrl.models.precision import compute_context
from lucidrl.workers.common.model_support import check_decode_loop_supported
from lucidrl.workers.rollout.decode import sample_group
from lucidrl.workers.rollout.stop_rule import STOPPED_FIELD, StopRule, StopRuleCriteria, stop_rule


@dataclass
class SamplingParams:
    """How to sample: `do_sample=False` is greedy decoding (temperature, top_p, top_k unused)."""

    n: int = 1
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    max_new_tokens: int = 256
    # set: each prompt's n samples are generated in their own call from an RNG seeded by (seed, uid),
    # so the samples do not depend on batching or on how prompts are spread over data-parallel ranks
    seed: int | None = None
    # set: a response ends with the token after which its text first matches this regular expression
    # (rollout.stop_regex; stop_rule.py), in every engine
    stop_regex: str | None = None


def response_mask_from_ids(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 for every token up to and including the first eos of each row, 0 after it. (bs, R) → (bs, R)."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, device=responses.device))
    # tokens strictly after the first eos have a positive count of eos before them
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()


def eos_token_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """The ids that end a response: the generation config's eos ids plus the tokenizer's."""
    gen = getattr(model, "generation_config", None)
    eos = gen.eos_token_id if gen is not None else None
    eos_ids = list(eos) if isinstance(eos, list) else ([eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    if not eos_ids:
        raise ValueError(
            "the tokenizer and the model's generation_config define no eos token; generation could not stop"
        )
    return eos_ids


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


class HFRollout:
    """Generates with a HF causal LM in this process (colocated with the actor: weights are shared).

    `decode_loop="lucidrl"` (default) uses lucidrl's loop (each prompt prefilled once for its n
    samples, finished rows dropped: lucidrl.workers.rollout.decode); "transformers" calls `model.generate`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        micro_batch_size: int = 64,
        decode_loop: str = "lucidrl",
        compute_dtype: torch.dtype | None = None,
    ):
        if decode_loop not in ("lucidrl", "transformers"):
            raise ValueError(f"rollout.decode_loop must be 'lucidrl' or 'transformers', got {decode_loop!r}")
        self.decode_loop = decode_loop
        if decode_loop == "lucidrl":
            check_decode_loop_supported(model)  # at start, not at the first generation
        self.compute_dtype = compute_dtype  # autocast dtype while decoding (model.compute_dtype)
        self.model = model
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id

    def sync_weights(self, model: torch.nn.Module) -> str:
        """After an actor update: colocated in one process, the rollout already holds the same module."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())
            return "copied"
        return "shared"

    @torch.no_grad()
    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Repeat each prompt n times (interleaved) and add responses, response_mask, rollout_log_probs."""
        expanded = batch.repeat(params.n, interleave=True) if params.n > 1 else batch
        per_prompt = params.seed is not None
        prompts_per_call = 1 if per_prompt else max(1, self.micro_batch_size // params.n)
        was_training = self.model.training
        self.model.eval()
        rule = stop_rule(params.stop_regex, self.tokenizer, self.eos_ids)
        outs, logps = [], []
        try:
            for chunk in batch.split(prompts_per_call):
                if per_prompt:
                    chunk = _strip_left_padding(chunk)
                    torch.manual_seed(params.seed + zlib.crc32(str(chunk["uid"][0]).encode()))
                with compute_context(self.model, self.compute_dtype, gqa=False):  # decode.py: prefill only
                    resp, lp = self._decode(chunk["prompts"], chunk["prompt_mask"], params, rule)
                outs.append(resp)
                logps.append(lp)
        finally:
            self.model.train(was_training)
        width = max(o.shape[1] for o in outs)
        responses = torch.cat([_pad_right(o, width, self.pad_id) for o in outs])
        mask = response_mask_from_ids(responses, self.eos_ids)
        if rule is not None:  # the loops stopped such rows; the cut drops what generate padded them with
            mask, stopped = rule.cut(responses, mask)
            expanded.set(STOPPED_FIELD, stopped)
        responses = responses.masked_fill(mask == 0, self.pad_id)
        expanded.set("responses", responses)
        expanded.set("response_mask", mask)
        if params.do_sample:
            lp = torch.cat([_pad_right(x, width, 0.0) for x in logps])
            expanded.set("rollout_log_probs", lp * mask)
        expanded.meta["sampling"] = params
        expanded.meta["pad_token_id"] = (
            self.pad_id
        )  # ranks' outputs of other widths are padded with it on merge
        return expanded

    def _decode(
        self, prompts: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams, rule: StopRule | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """n samples per prompt, interleaved: (bs*n, R) token ids and sampling log-probs."""
        if self.decode_loop == "lucidrl":
            return sample_group(
                self.model,
                prompts,
                prompt_mask,
                n=params.n,
                max_new_tokens=params.max_new_tokens,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                do_sample=params.do_sample,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                stop=rule,
            )
        gen_cfg = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=params.do_sample,
            temperature=params.temperature if params.do_sample else None,
            top_p=params.top_p if params.do_sample else None,
            top_k=(params.top_k if params.top_k > 0 else 0) if params.do_sample else None,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            bos_token_id=None,
            return_dict_in_generate=True,
            output_logits=params.do_sample,
        )
        if params.n > 1:
            prompts = prompts.repeat_interleave(params.n, dim=0)
            prompt_mask = prompt_mask.repeat_interleave(params.n, dim=0)
        # transformers fills every field gen_cfg leaves unset from model.generation_config: a checkpoint's
        # repetition_penalty (Qwen2.5-Instruct: 1.05), min_p, no_repeat_ngram_size or min_length would
        # then reshape the distribution the rollout log-probs and the actor's forward do not see. For
        # this call the model's defaults are transformers' global ones.
        saved, self.model.generation_config = self.model.generation_config, GenerationConfig()
        try:
            out = self.model.generate(
                input_ids=prompts,
                attention_mask=prompt_mask,
                generation_config=gen_cfg,
                stopping_criteria=StoppingCriteriaList(
                    [StopRuleCriteria(rule, prompts.shape[1])] if rule is not None else []
                ),
            )
        finally:
            self.model.generation_config = saved
        resp = out.sequences[:, prompts.shape[1] :]
        if not params.do_sample:
            return resp, torch.zeros(resp.shape, dtype=torch.float32)
        logits = torch.stack(out.logits, dim=1).float() / params.temperature
        return resp, logprobs_from_logits(logits, resp)


def _strip_left_padding(chunk: Batch) -> Batch:
    """Drop prompt columns that are padding in every row (a group alone needs none)."""
    keep = int(chunk["prompt_mask"].sum(0).nonzero().min()) if chunk["prompt_mask"].any() else 0
    if keep == 0:
        return chunk
    out = Batch(dict(chunk.tensors), dict(chunk.non_tensors), dict(chunk.meta))
    out.tensors["prompts"] = chunk["prompts"][:, keep:]
    out.tensors["prompt_mask"] = chunk["prompt_mask"][:, keep:]
    return out


def _pad_right(x: torch.Tensor, width: int, value: float | int) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    pad = torch.full((x.shape[0], width - x.shape[1]), value, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=1)
