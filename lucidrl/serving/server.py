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

import ipaddress
import json
import logging
import select
import signal
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from lucidrl.diagnostics.debug import debug_enabled
from lucidrl.diagnostics.errors import UsageError
from lucidrl.protocol import WEIGHTS_PATH, RequestError, error_body
from lucidrl.serving.engine import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_REQUEST_SAMPLES,
    CompletionEngine,
    RequestCancelled,
)

log = logging.getLogger("lucidrl.serving")
MAX_BODY_BYTES = 64 * 1024 * 1024


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
        if path not in ("/v1/completions", "/v1/chat/completions", WEIGHTS_PATH):
            self._not_found(path)
            return
        engine = self.server.engine
        try:
            if path == WEIGHTS_PATH:
                self._send(200, engine.load_weights(self._read_body(engine.max_weights_bytes())))
            elif path == "/v1/chat/completions":
                self._send(200, engine.chat(self._read_json(), self._client_gone))
            else:
                self._send(200, engine.complete(engine.parse(self._read_json()), self._client_gone))
        except RequestCancelled:  # nobody to answer: the next request gets the model
            log.info("%s left; its request stopped after %d steps", self.address_string(), engine.last_steps)
            self.close_connection = True
        except RequestError as e:
            # a full queue: when to try again (a second; a generation's length is not known in advance)
            self._send(e.status, e.body(), {"Retry-After": "1"} if e.status == 503 else None)
        except Exception as e:  # a generation failure must reach the client, not just the server log
            _log_failure("completion failed", e)
            self._send(500, error_body(f"{type(e).__name__}: {e}", None, type_="internal_server_error"))

    def _client_gone(self) -> bool:
        """Whether the client closed its connection: readable with nothing to read (a peek, so a
        pipelined next request stays in the socket)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # reset by the peer, or closed
            return True

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
                f"POST /v1/completions, POST /v1/chat/completions, GET and POST {WEIGHTS_PATH}",
                None,
                type_="not_found_error",
            ),
        )

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
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
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.info("%s %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    engine: CompletionEngine
    # the listen backlog (the kernel caps it at net.core.somaxconn). socketserver's 5 reset connections
    # under a burst: 20+ clients connecting at once overflowed the accept queue while the serve loop was
    # starting handler threads, the kernel answered with SYN cookies it then failed to validate, and
    # sent a reset to clients that had already sent their request (ConnectionResetError in getresponse)
    request_queue_size = socket.SOMAXCONN

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line, not socketserver's traceback on stderr: a client that left mid-request is
        routine; anything else is named with where it was raised."""
        e = sys.exc_info()[1]
        who = client_address[0] if isinstance(client_address, tuple) else client_address
        if isinstance(e, (ConnectionError, TimeoutError)):
            log.info("%s: the connection ended before its answer was sent (%s)", who, _one_line(e))
        else:
            _log_failure(f"request from {who} failed", e)


def _log_failure(what: str, e: BaseException | None) -> None:
    """One line naming the error and where it was raised; its traceback only with LUCIDRL_DEBUG=1."""
    if debug_enabled():
        log.error("%s: %s", what, _one_line(e), exc_info=e)
    else:
        log.error("%s: %s (%s); LUCIDRL_DEBUG=1 logs its traceback", what, _one_line(e), _where(e))


def _one_line(e: BaseException | None) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0] if e is not None else "unknown error"


def _where(e: BaseException | None) -> str:
    """file:line of the frame that raised `e`."""
    frames = traceback.extract_tb(e.__traceback__) if e is not None else []
    return f"at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else "no traceback"


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
    max_queued: int = DEFAULT_MAX_QUEUED,
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
    if max_queued < 0:
        raise UsageError(
            f"--max-queued={max_queued} must be >= 0 (0: refuse any request while one generates)"
        )
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
            max_queued=max_queued,
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
    max_queued: int = DEFAULT_MAX_QUEUED,
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
        max_queued=max_queued,
    )
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        handle.start()
        print(
            f"serving {model_path} at {handle.url} (port {handle.port}): POST /v1/completions, "
            "POST /v1/chat/completions, GET /v1/models, GET /health"
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
