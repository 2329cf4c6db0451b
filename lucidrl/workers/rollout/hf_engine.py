"""The hf rollout engine: generates with the actor's module in this process (engine.py's contract)."""

from __future__ import annotations

import threading
import zlib
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from lucidrl.algos import logprobs_from_logits
from lucidrl.batch import Batch
from lucidrl.diagnostics.debug import debug_enabled
from lucidrl.models.precision import compute_context
from lucidrl.workers.common.distributed import copy_full_parameters, unwrap
from lucidrl.workers.common.model_support import check_decode_loop_supported
from lucidrl.workers.rollout.decode import sample_group
from lucidrl.workers.rollout.engine import ABORTED_FIELD, SamplingParams, eos_token_ids
from lucidrl.workers.rollout.responses import response_mask_from_ids
from lucidrl.workers.rollout.stop_rule import STOPPED_FIELD, StopRule, StopRuleCriteria, stop_rule
from lucidrl.workers.rollout.weight_push import (
    check_rollout_weights,
    default_sync_atol,
    probe_log_probs,
    rollout_weights,
)


class HFRollout:
    """Generates with a HF causal LM in this process (colocated with the actor: weights are shared).

    `decode_loop="lucidrl"` (default) uses lucidrl's loop (each prompt prefilled once for its n
    samples, finished rows dropped: lucidrl.workers.rollout.decode); "transformers" calls `model.generate`.
    """

    name = "hf"
    runs_actor_module = True  # the actor's own module (one rank) or a full copy of it (several)
    can_abort = True

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
        self._lock = threading.Lock()
        self._running: threading.Event | None = None  # set by abort() while a generate runs
        # with a copy of the actor (several ranks, or rollout.mode one_step_off/async): compare its
        # log-probs of a few fixed tokens with the actor's after each sync (rollout.check_weight_sync)
        self.check_weight_sync = False
        self.weight_sync_atol = 1e-3

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        device: str,
        rank: int,
        world_size: int,
        compute_dtype: torch.dtype | None,
    ) -> HFRollout:
        r = cfg.rollout
        engine = cls(
            model,
            tokenizer,
            micro_batch_size=r.micro_batch_size,
            decode_loop=r.decode_loop,
            compute_dtype=compute_dtype,
        )
        engine.check_weight_sync = r.check_weight_sync
        engine.weight_sync_atol = r.weight_sync_atol or default_sync_atol(compute_dtype is None)
        return engine

    def sync_from(self, actor: torch.nn.Module, *, rank: int = 0, world_size: int = 1) -> str:
        """The actor's weights into this engine's module: nothing to do when it is the actor's own
        module; a copy (one gathered tensor at a time: a collective when the actor is sharded) otherwise."""
        if unwrap(actor) is self.model:
            return "shared"
        copy_full_parameters(self.model, actor)
        result = "gathered" if world_size > 1 else "copied"
        if self.check_weight_sync or debug_enabled():
            result += "; " + check_rollout_weights(
                actor,
                self,
                vocab_size=len(self.tokenizer),
                compute_dtype=self.compute_dtype,
                atol=self.weight_sync_atol,
                rank=rank,
                world_size=world_size,
            )
        return result

    def probe_log_probs(self, ids: list[int]) -> torch.Tensor:
        """The weight-sync check's side of the engine: this module's log-probs of the probe tokens."""
        return probe_log_probs(self.model, ids, self.compute_dtype)

    def compare_weights(self, named) -> tuple[list[str], list[str]]:
        """(mismatches, not compared) of the actor's pushed parameters against this module's own."""
        mine = dict(rollout_weights(self.model, self.compute_dtype, tied_copies=True))
        mismatches, skipped = [], []
        for name, tensor in named:
            if name not in mine:
                skipped.append(name)
            elif not torch.equal(mine[name].to(tensor.device), tensor):
                gap = (mine[name].float().to(tensor.device) - tensor.float()).abs().max().item()
                mismatches.append(f"{name} (max |engine - actor| {gap:.3g})")
        return mismatches, skipped

    def full_model(self) -> torch.nn.Module:
        return self.model

    def abort(self) -> None:
        """Stop the generation running in another thread at its next token (no-op when none runs)."""
        with self._lock:
            if self._running is not None:
                self._running.set()

    @torch.no_grad()
    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Repeat each prompt n times (interleaved) and add responses, response_mask, rollout_log_probs."""
        expanded = batch.repeat(params.n, interleave=True) if params.n > 1 else batch
        per_prompt = params.seed is not None
        prompts_per_call = 1 if per_prompt else max(1, self.micro_batch_size // params.n)
        was_training = self.model.training
        self.model.eval()
        rule = stop_rule(params.stop_regex, self.tokenizer, self.eos_ids)
        outs, logps, cut = [], [], []  # cut: per row, still open when abort() ended its chunk
        eos = torch.tensor(self.eos_ids, device=batch["prompts"].device)
        aborted = threading.Event()
        with self._lock:
            self._running = aborted
        try:
            for chunk in batch.split(prompts_per_call):
                rows = len(chunk) * params.n
                if aborted.is_set():  # prompts not begun: empty responses, all marked aborted
                    outs.append(
                        torch.full((rows, 0), self.pad_id, dtype=torch.long, device=chunk["prompts"].device)
                    )
                    logps.append(torch.zeros((rows, 0), device=chunk["prompts"].device))
                    cut.append(torch.ones(rows, dtype=torch.bool, device=eos.device))
                    continue
                if per_prompt:
                    chunk = _strip_left_padding(chunk)
                    torch.manual_seed(params.seed + zlib.crc32(str(chunk["uid"][0]).encode()))
                with compute_context(self.model, self.compute_dtype, gqa=False):  # decode.py: prefill only
                    resp, lp = self._decode(chunk["prompts"], chunk["prompt_mask"], params, rule, aborted)
                outs.append(resp)
                logps.append(lp)
                early = aborted.is_set() and resp.shape[1] < params.max_new_tokens
                cut.append(
                    ~torch.isin(resp, eos).any(-1)
                    if early
                    else torch.zeros_like(resp[:, 0], dtype=torch.bool)
                )
        finally:
            with self._lock:
                self._running = None
            self.model.train(was_training)
        width = max(1, max(o.shape[1] for o in outs))
        responses = torch.cat([_pad_right(o, width, self.pad_id) for o in outs])
        # no row has tokens past its chunk's width (a pad id that is also an eos id must not count)
        made = torch.cat([torch.full((o.shape[0],), o.shape[1], device=responses.device) for o in outs])
        mask = response_mask_from_ids(responses, self.eos_ids)
        mask = mask * (torch.arange(width, device=responses.device)[None, :] < made[:, None])
        if rule is not None:  # the loops stopped such rows; the cut drops what generate padded them with
            mask, stopped = rule.cut(responses, mask)
            expanded.set(STOPPED_FIELD, stopped)
        cut_rows = torch.cat(cut)
        if cut_rows.any():  # rows abort() cut short (a stop-rule match ended a row too)
            if rule is not None:
                cut_rows &= ~expanded[STOPPED_FIELD].bool()
            expanded.set(ABORTED_FIELD, cut_rows)
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
        self,
        prompts: torch.Tensor,
        prompt_mask: torch.Tensor,
        params: SamplingParams,
        rule: StopRule | None,
        aborted: threading.Event,
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
                should_stop=aborted.is_set,
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
                    [_Aborted(aborted)]
                    + ([StopRuleCriteria(rule, prompts.shape[1])] if rule is not None else [])
                ),
            )
        finally:
            self.model.generation_config = saved
        resp = out.sequences[:, prompts.shape[1] :]
        if not params.do_sample:
            return resp, torch.zeros(resp.shape, dtype=torch.float32)
        logits = torch.stack(out.logits, dim=1).float() / params.temperature
        return resp, logprobs_from_logits(logits, resp)


class _Aborted(StoppingCriteria):
    """transformers' generate ends every row once abort() was called."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


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
