"""The generation behind `lucidrl serve`: OpenAI completion and chat requests turned into responses.

One request generates at a time (`model.generate` and lucidrl's decode loop are not thread-safe); a
request whose client went away stops at the next decoding step (`cancelled`), so an abandoned
n=256 x 1000-token request does not hold the server for minutes.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lucidrl.batch import Batch
from lucidrl.protocol import (
    CompletionRequest,
    RequestError,
    model_fingerprint,
    parse_completion_request,
)
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.training.forward import response_log_probs

DEFAULT_MAX_QUEUED = 8  # requests that may wait while one generates; more are answered 503 at once
# prompts x n one request may ask for: a request for millions of samples would hold the server for hours
# and their tokens in memory; a trainer's step asks for its rank's batch x rollout.n
DEFAULT_MAX_REQUEST_SAMPLES = 65536


class RequestCancelled(Exception):
    """The client of the request being generated has gone: its generation stops at the next step."""


class CompletionEngine:
    """Turns validated completion requests into OpenAI responses, one request at a time."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        model_name: str,
        *,
        max_batch: int = 64,
        accept_weights: bool = False,
        max_request_samples: int | None = DEFAULT_MAX_REQUEST_SAMPLES,
        max_queued: int = DEFAULT_MAX_QUEUED,
    ):
        self.model = model.eval()
        self.max_queued = max_queued
        self.admitted = 0  # requests generating or waiting to: at most 1 + max_queued
        self.cancelled_steps: list[int] = []  # per request stopped because its client left: its steps
        self.last_steps = 0  # model forwards (≈ decoding steps) the last request ran
        self._gone: Callable[[], bool] | None = None  # the generating request's "client gone?" check
        # every forward of a generation (prefill, each decoding step) asks whether its client is still there
        model.register_forward_pre_hook(self._step)
        self.max_request_samples = max_request_samples
        self.accept_weights = accept_weights
        self.weights_version = 0  # weight updates taken so far
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.rollout = HFRollout(model, tokenizer, micro_batch_size=max_batch)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.created = int(time.time())
        self._lock = threading.Lock()
        self._queue_lock = threading.Lock()

    def parse(self, body: Any) -> CompletionRequest:
        return parse_completion_request(
            body,
            served_model=self.model_name,
            tokenizer=self.tokenizer,
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            max_samples=self.max_request_samples,
        )

    def _step(self, module: torch.nn.Module, args: Any) -> None:
        self.last_steps += 1
        if self._gone is not None and self._gone():
            raise RequestCancelled

    @contextlib.contextmanager
    def _turn(self, gone: Callable[[], bool] | None) -> Iterator[None]:
        """Wait for the generation in progress (at most max_queued requests wait), then hold the model;
        raises RequestCancelled if the client left while waiting or leaves while generating."""
        with self._queue_lock:
            # counted under one lock from admission to the end, so exactly 1 + max_queued get in (the
            # holder counted among the waiters between its acquire and its decrement refused one too many)
            if self.admitted > self.max_queued:
                raise RequestError(
                    f"the server is busy and its queue is full: one request generates and {self.max_queued} "
                    f"wait for it (--max-queued {self.max_queued}); retry later, or restart `lucidrl serve` "
                    "with a larger --max-queued to let more requests wait",
                    None,
                    status=503,
                    type_="server_busy",
                )
            self.admitted += 1
        try:
            with self._lock:
                try:
                    self.last_steps = 0
                    if gone is not None and gone():
                        raise RequestCancelled
                    self._gone = gone
                    yield
                except RequestCancelled:
                    self.cancelled_steps.append(self.last_steps)
                    raise
                finally:
                    self._gone = None
        finally:
            with self._queue_lock:
                self.admitted -= 1

    def complete(self, req: CompletionRequest, gone: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Generate n samples per prompt; choices are ordered prompt-major (prompt i, sample j at i*n+j).
        `gone()` says whether the client has left: then generation stops (RequestCancelled)."""
        do_sample = req.temperature > 0
        # greedy with log-probs: the argmax decoded, then scored by one forward at temperature 1 (top_k=1
        # sampling, as before, drew among exactly tied top logits: not the argmax every time)
        params = SamplingParams(
            n=req.n,
            do_sample=do_sample,
            temperature=req.temperature if do_sample else 1.0,
            top_p=req.top_p if do_sample else 1.0,
            top_k=req.top_k if do_sample else -1,
            max_new_tokens=req.max_tokens,
        )
        with self._turn(gone):
            if req.seed is None:
                samples = self._generate(req.prompts, params, req.logprobs is not None)
            else:  # as vLLM: a prompt's samples depend on (seed, prompt) only, not on the other prompts
                samples = []
                for prompt in req.prompts:
                    with _seeded(req.seed, self._device()):
                        samples += self._generate([prompt], params, req.logprobs is not None)
        choices, completion_tokens = [], 0
        for i, (ids, logps) in enumerate(samples):
            completion_tokens += len(ids)
            choice: dict[str, Any] = {
                "index": i,
                "text": self.tokenizer.decode(ids, skip_special_tokens=True),
                "logprobs": None,
                "finish_reason": "stop" if ids and ids[-1] in self.rollout.eos_ids else "length",
                "stop_reason": None,
            }
            if logps is not None:
                # text pieces, as vLLM and OpenAI send them (not the vocabulary's byte-level pieces, which
                # join to other text and are null for ids past the tokenizer's end)
                pieces = [self.tokenizer.decode([t], skip_special_tokens=True) for t in ids]
                # a running sum (summing every prefix was quadratic in the response's length)
                offsets = [0, *itertools.accumulate(len(p) for p in pieces)][: len(pieces)]
                choice["logprobs"] = {
                    "tokens": pieces,
                    "token_logprobs": logps,
                    "top_logprobs": [{p: lp} for p, lp in zip(pieces, logps, strict=True)],
                    "text_offset": offsets,
                }
            if req.return_token_ids:
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = req.prompts[i // req.n]
            choices.append(choice)
        prompt_tokens = sum(len(p) for p in req.prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _generate(
        self, prompts: list[list[int]], params: SamplingParams, with_logprobs: bool
    ) -> list[tuple[list[int], list[float] | None]]:
        """(token ids up to and including eos, their log-probs) per sample, n per prompt in order."""
        out = self.rollout.generate(self._prompt_batch(prompts), params)
        if with_logprobs and not params.do_sample:
            with torch.no_grad():
                lp, _ = response_log_probs(
                    self.model, out, temperature=1.0, with_entropy=False, share_prompt=False
                )
            out.set("rollout_log_probs", lp * out["response_mask"])
        lengths = out["response_mask"].sum(dim=1).tolist()
        logps = out["rollout_log_probs"].tolist() if with_logprobs else None
        rows = []
        for i, (row, length) in enumerate(zip(out["responses"].tolist(), lengths, strict=True)):
            rows.append((row[: int(length)], logps[i][: int(length)] if logps is not None else None))
        return rows

    def weights_status(self) -> dict[str, Any]:
        return {
            "accepts": self.accept_weights,
            "version": self.weights_version,
            "parameters": sum(1 for _ in self.model.named_parameters()),
            "max_bytes": self.max_weights_bytes(),
            # what the served checkpoint computes, for the trainer to compare with its actor's
            "config": model_fingerprint(self.model.config),
        }

    def max_weights_bytes(self) -> int:
        """The largest weights body accepted: the parameters in float64, plus room for the header."""
        return sum(p.numel() * 8 for p in self.model.parameters()) + (16 << 20)

    def load_weights(self, raw: bytes) -> dict[str, Any]:
        """Replace every parameter from a safetensors payload; refuse a partial or mis-shaped set."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        if not self.accept_weights:
            raise RequestError(
                "this server does not take weight updates; start it with `lucidrl serve MODEL "
                "--accept-weights` to let a trainer push its weights",
                None,
                status=403,
            )
        try:
            new = load(raw)
        except (SafetensorError, ValueError) as e:
            raise RequestError(f"the weights body is not a safetensors file: {e}", None) from e
        own = dict(self.model.named_parameters())
        # a tied weight's second name (lm_head.weight beside the embedding): the same parameter, skipped
        aliases = set(dict(self.model.named_parameters(remove_duplicate=False))) - set(own)
        new = {k: v for k, v in new.items() if k not in aliases}
        missing, unexpected = sorted(set(own) - set(new)), sorted(set(new) - set(own))
        if missing or unexpected:
            raise RequestError(
                f"the weights do not match the served model {self.model_name}: {len(missing)} parameter(s) "
                f"missing (first: {missing[:3]}), {len(unexpected)} unexpected (first: {unexpected[:3]}); "
                "push every parameter of the same architecture, by its named_parameters() name",
                None,
            )
        bad = [
            f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}"
            for k, v in new.items()
            if v.shape != own[k].shape
        ]
        bad += [
            f"{k} is {v.dtype}, not a floating-point tensor"
            for k, v in new.items()
            if not v.is_floating_point()
        ]
        if bad:
            raise RequestError(f"{len(bad)} parameter(s) have the wrong shape or dtype: {bad[:3]}", None)
        nonfinite = [k for k, v in new.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if nonfinite:
            raise RequestError(f"{len(nonfinite)} parameter(s) hold NaN or inf: {nonfinite[:3]}", None)
        with self._lock, torch.no_grad():  # between generations, never during one
            for k, v in new.items():
                own[k].copy_(v)
            self.weights_version += 1
        return {"version": self.weights_version, "parameters": len(new)}

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "lucidrl"}
            ],
        }

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _prompt_batch(self, prompts: list[list[int]]) -> Batch:
        """Left-pad token id lists into `prompts (bs, P)` and `prompt_mask (bs, P)`, as collate does."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        device = self._device()
        return Batch(tensors={"prompts": ids.to(device), "prompt_mask": mask.to(device)})

    def chat(self, body: Any, gone: Callable[[], bool] | None = None) -> dict[str, Any]:
        """/v1/chat/completions: the messages through the tokenizer's chat template, generated as a
        completion, answered as chat choices (assistant messages; log-probs in the chat shape)."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object", None)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError(
                f"'messages' must be a non-empty list of {{role, content}} objects, got {messages!r:.200}",
                "messages",
            )
        if body.get("top_logprobs") not in (None, 0):
            raise RequestError("top_logprobs > 0 is not supported; send logprobs=true alone", "top_logprobs")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError(
                f"the tokenizer of {self.model_name} has no chat template; send the prompt to /v1/completions",
                "messages",
            )
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # a template's own check (roles, content types)
            raise RequestError(f"the chat template refused the messages: {e}", "messages") from e
        fields = {k: v for k, v in body.items() if k not in ("messages", "logprobs", "top_logprobs")}
        if "max_completion_tokens" in fields:
            fields["max_tokens"] = fields.pop("max_completion_tokens")
        fields["prompt"] = [self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        if body.get("logprobs"):
            fields["logprobs"] = 0
        out = self.complete(self.parse(fields), gone)
        for choice in out["choices"]:
            lp = choice.pop("logprobs")
            choice["message"] = {"role": "assistant", "content": choice.pop("text")}
            choice["logprobs"] = (
                {
                    "content": [
                        {"token": t, "logprob": x, "bytes": None, "top_logprobs": []}
                        for t, x in zip(lp["tokens"], lp["token_logprobs"], strict=True)
                    ]
                }
                if lp
                else None
            )
        return {**out, "id": "chat" + out["id"], "object": "chat.completion"}


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed the sampler for one request without disturbing the process's random state."""
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
