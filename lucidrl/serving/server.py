"""`lucidrl serve`: an OpenAI-compatible completions server over lucidrl's own HF generation engine.

For evaluation, frozen-policy rollouts and debugging a client against exactly the sampler lucidrl
trains with (HFRollout: same sampling, same log-probs at the request's temperature). Stdlib HTTP
only; requests are served one at a time, since `model.generate` is not thread-safe.

Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/completions` (see protocol.py for the fields).
With `--accept-weights` also `POST /lucidrl/weights`: a safetensors file of the model's parameters
(every one, by name, same shapes) replaces the weights between requests; the trainer's server rollout
engine (`rollout.name=server`) pushes the actor's weights this way after each update.
`GET /lucidrl/weights` says whether the server accepts them and how many updates it has taken.
Binds to 127.0.0.1 by default; any other address must be asked for explicitly.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import logging
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from lucidrl.batch import Batch
from lucidrl.diagnostics.errors import UsageError
from lucidrl.protocol import (
    WEIGHTS_PATH,
    CompletionRequest,
    RequestError,
    error_body,
    model_fingerprint,
    parse_completion_request,
)
from lucidrl.workers.forward import response_log_probs
from lucidrl.workers.rollout_hf import HFRollout, SamplingParams

log = logging.getLogger("lucidrl.serving")
MAX_BODY_BYTES = 64 * 1024 * 1024
# prompts x n one request may ask for: a request for millions of samples would hold the server for hours
# and their tokens in memory; a trainer's step asks for its rank's batch x rollout.n
DEFAULT_MAX_REQUEST_SAMPLES = 65536


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
    ):
        self.model = model.eval()
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

    def parse(self, body: Any) -> CompletionRequest:
        return parse_completion_request(
            body,
            served_model=self.model_name,
            tokenizer=self.tokenizer,
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            max_samples=self.max_request_samples,
        )

    def complete(self, req: CompletionRequest) -> dict[str, Any]:
        """Generate n samples per prompt; choices are ordered prompt-major (prompt i, sample j at i*n+j)."""
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
        with self._lock:
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
                # a running sum (summing every prefix was quadratic: 2.4 s a choice at 8192 tokens)
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


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "lucidrl-serve"
    # seconds a connection may stall while sending its request (StreamRequestHandler's socket timeout):
    # a client that announced a body and never sent it held a handler thread forever
    timeout = 120.0

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0].rstrip("/")
        engine = self.server.engine
        if path == "/health":
            self._send(200, {"status": "ok", "model": engine.model_name})
        elif path == "/v1/models":
            self._send(200, engine.models())
        elif path == WEIGHTS_PATH:
            self._send(200, engine.weights_status())
        else:
            self._not_found(path)

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/completions", WEIGHTS_PATH):
            self._not_found(path)
            return
        engine = self.server.engine
        try:
            if path == WEIGHTS_PATH:
                self._send(200, engine.load_weights(self._read_body(engine.max_weights_bytes())))
                return
            req = engine.parse(self._read_json())
            self._send(200, engine.complete(req))
        except RequestError as e:
            self._send(e.status, e.body())
        except Exception as e:  # a generation failure must reach the client, not just the server log
            log.error("completion failed:\n%s", traceback.format_exc())
            self._send(500, error_body(f"{type(e).__name__}: {e}", None, type_="internal_server_error"))

    def _read_body(self, limit: int) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError("the request needs a Content-Length header and a body", None)
        if int(length) > limit:
            raise RequestError(f"request body of {length} bytes exceeds {limit}", None, status=413)
        try:
            return self.rfile.read(int(length))
        except TimeoutError as e:
            raise RequestError(
                f"the request body ({length} bytes announced) did not arrive within {self.timeout:g} s",
                None,
                status=408,
            ) from e

    def _read_json(self) -> Any:
        raw = self._read_body(MAX_BODY_BYTES)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not valid JSON: {e}", None) from e

    def _not_found(self, path: str) -> None:
        self._send(
            404,
            error_body(
                f"no route {self.command} {path}; this server has GET /health, GET /v1/models, "
                f"POST /v1/completions, GET and POST {WEIGHTS_PATH}",
                None,
                type_="not_found_error",
            ),
        )

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        try:  # strict JSON: Python's NaN literal is not JSON, and other clients' parsers refuse it
            data = json.dumps(payload, allow_nan=False).encode()
        except ValueError:
            status, payload = (
                500,
                error_body(
                    "the reply holds a non-finite number (a NaN or infinite log-prob): the model's logits are "
                    "not finite for this request; report it with the request",
                    None,
                    type_="internal_server_error",
                ),
            )
            data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.info("%s %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    engine: CompletionEngine


class ServerHandle:
    """Starts and stops a server's serve loop from any thread; stop is idempotent."""

    def __init__(self, server: ThreadingHTTPServer):
        self.server = server
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerHandle:
        """Serve in a daemon thread; returns at once."""
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"the server at {self.url} was stopped; make a new one with make_server")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self.server.serve_forever,
                    kwargs={"poll_interval": 0.1},
                    name="lucidrl-serve",
                    daemon=True,
                )
                self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (an in-flight generation is not interrupted)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            if self._thread is not None:
                self.server.shutdown()
                self._thread.join()
            self.server.server_close()

    def __enter__(self) -> ServerHandle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and the name localhost (no name is resolved)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_batch: int = 64,
    allow_non_loopback: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str | None = None,
    accept_weights: bool = False,
    max_request_samples: int | None = DEFAULT_MAX_REQUEST_SAMPLES,
) -> tuple[ThreadingHTTPServer, ServerHandle]:
    """Bind a completions server for the HF model folder `model_path`; call handle.start() to serve.

    The socket is bound before the model loads, so a port in use fails at once. `port=0` picks a
    free port (read it from handle.port). A non-loopback `host` needs `allow_non_loopback=True`.
    `accept_weights=True` lets clients replace the weights (POST /lucidrl/weights).
    """
    from lucidrl.models import check_tokenizer_matches_model, load_model, load_tokenizer

    if not is_loopback(host) and not allow_non_loopback:
        raise UsageError(
            f"refusing to serve on host {host!r}: the server has no authentication, so by default it binds "
            "to 127.0.0.1 only; pass --host explicitly (allow_non_loopback=True) to expose it on a network"
        )
    if max_batch < 1:
        raise UsageError(f"--max-batch={max_batch} must be >= 1")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a TCP port: use 1-65535, or 0 for a free one")
    if max_request_samples is not None and max_request_samples < 1:
        raise UsageError(f"--max-request-samples={max_request_samples} must be >= 1")
    try:
        server = _Server((host, port), _Handler, bind_and_activate=True)
    except OSError as e:
        raise UsageError(
            f"cannot listen on {host}:{port} ({e.strerror or e}); pick another port with --port, or "
            "--port 0 for a free one"
        ) from e
    try:
        tokenizer = load_tokenizer(model_path, config_key="the MODEL argument of lucidrl serve")
        model = load_model(model_path, dtype=dtype)
        check_tokenizer_matches_model(model, tokenizer, model_path)
        target = device or ("cuda" if torch.cuda.is_available() else "cpu")
        server.engine = CompletionEngine(
            model.to(target),
            tokenizer,
            model_path,
            max_batch=max_batch,
            accept_weights=accept_weights,
            max_request_samples=max_request_samples,
        )
    except BaseException:
        server.server_close()
        raise
    return server, ServerHandle(server)


def run_server(
    model_path: str,
    host: str | None,
    port: int,
    *,
    max_batch: int = 64,
    dtype: torch.dtype = torch.float32,
    accept_weights: bool = False,
    max_request_samples: int | None = DEFAULT_MAX_REQUEST_SAMPLES,
) -> None:
    """The `lucidrl serve` command: serve until SIGINT or SIGTERM, then shut down cleanly."""
    explicit = host is not None
    host = host or "127.0.0.1"
    if explicit and not is_loopback(host):
        print(
            f"warning: serving on {host}, reachable from other machines; the server has no "
            "authentication. Use the default 127.0.0.1 unless you mean to expose it.",
            file=sys.stderr,
            flush=True,
        )
    _, handle = make_server(
        model_path,
        host,
        port,
        max_batch=max_batch,
        allow_non_loopback=explicit,
        dtype=dtype,
        accept_weights=accept_weights,
        max_request_samples=max_request_samples,
    )
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        handle.start()
        print(
            f"serving {model_path} at {handle.url} (port {handle.port}): POST /v1/completions, "
            "GET /v1/models, GET /health"
            + (f", POST {WEIGHTS_PATH} (weight updates accepted)" if accept_weights else "")
            + ". Ctrl-C stops.",
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    finally:
        handle.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
    print("server stopped", flush=True)
