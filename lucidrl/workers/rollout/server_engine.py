"""Rollout engine over an external OpenAI-compatible completions server (`lucidrl serve`, `vllm serve`).

The contract of engine.py (generate, sync_from, eos_ids). Prompts go out as token ids and come back as token ids (vLLM's
`return_token_ids` extension), so nothing is re-tokenized. The server holds its own weights; for
on-policy training (`rollout.name=server`) the trainer pushes the actor's weights to it after every
update (`sync_from`, rank 0's push; every rank takes part in the gathers):
- `lucidrl serve --accept-weights`: POST /lucidrl/weights, a safetensors body.
- `vllm serve` started with VLLM_SERVER_DEV_MODE=1 (its development endpoints): the weights are written
  as a safetensors checkpoint into a temporary folder that the server reads (`rollout.server.weights_dir`,
  by default the system's temporary folder: the server must run on this host or share that
  filesystem), then POST /collective_rpc runs vLLM's in-place `reload_weights` from it and POST
  /reset_prefix_cache drops the prompt cache of the old weights. vLLM's other RL route
  (/update_weights) moves tensors over NCCL or CUDA IPC, which a CPU server has neither of.
  Without dev mode, vllm serve only suits evaluation and frozen-policy generation.
Abort: a request in flight runs to its end on the server; `abort()` refuses.

Seeds: `params.seed` is sent as the request's `seed`; lucidrl's server and vLLM then make each
prompt's samples depend on (seed, prompt) only, whereas HFRollout seeds by (seed, uid), so the two
engines draw different (each reproducible) samples.

Log-prob caveat: lucidrl's server returns log-probs at the request's temperature, as HFRollout
does; vLLM's server returns them before temperature unless started with
`--logprobs-mode processed_logprobs`.
"""

from __future__ import annotations

import http.client
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import torch

from lucidrl.batch import Batch
from lucidrl.diagnostics.errors import UserError
from lucidrl.protocol import WEIGHTS_PATH, error_message
from lucidrl.workers.rollout.engine import AbortUnsupported, SamplingParams, eos_token_ids
from lucidrl.workers.rollout.responses import batch_from_token_lists
from lucidrl.workers.rollout.weight_push import rollout_weights


class RolloutServerError(UserError, RuntimeError):
    """The generation server could not be reached or refused a request; the message names the URL."""


class ServerRollout:
    """Generates through an HTTP completions server at `base_url` (or `host`/`port`)."""

    name = "server"
    runs_actor_module = False  # the server holds its own weights
    can_abort = False

    def __init__(
        self,
        base_url: str | None,
        tokenizer: Any,
        *,
        host: str | None = None,
        port: int | None = None,
        timeout_s: float = 600.0,
        model_name: str | None = None,
        eos_ids: list[int] | None = None,
        weights_dir: str | None = None,
    ):
        if (base_url is None) == (host is None or port is None):
            raise ValueError(
                f"ServerRollout needs either base_url or both host and port, got base_url={base_url!r}, "
                f"host={host!r}, port={port!r}"
            )
        url = base_url if base_url is not None else f"http://{host}:{port}"
        url = url.rstrip("/")
        self.base_url = url[: -len("/v1")] if url.endswith("/v1") else url
        if timeout_s <= 0:
            raise ValueError(f"ServerRollout timeout_s={timeout_s} must be > 0 seconds")
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self._opener, self.proxy = _opener_for(self.base_url)
        self.max_weights_bytes: int | None = None  # the largest push the server takes (check_accepts_weights)
        self.vllm_reload = False  # a `vllm serve` in dev mode: weights go in through reload_weights
        self.weights_dir = weights_dir
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = eos_ids if eos_ids is not None else [tokenizer.eos_token_id]
        if self.pad_id is None or None in self.eos_ids:
            raise ValueError(
                f"ServerRollout needs a tokenizer with pad and eos tokens (pad id {self.pad_id}, "
                f"eos ids {self.eos_ids}); load it with lucidrl.models.load_tokenizer"
            )
        self.model_name = self._check_health(model_name)

    def check_accepts_weights(self, model_config: Any = None) -> int:
        """Fail unless the server takes weight updates, and (given the actor's `model_config`) unless it
        serves a model that computes the same function; returns how many updates it has taken so far."""
        status, body = self._http("GET", WEIGHTS_PATH, purpose="weight-update check")
        if status == 404 and self._is_vllm():
            # a route that exists answers GET with 405 (it takes POST only); without dev mode it is 404
            if self._http("GET", "/collective_rpc", purpose="dev-mode check")[0] == 405:
                self.vllm_reload = True
                return 0
            raise RolloutServerError(
                f"the server at {self.base_url} is vLLM's, started without its development endpoints: it "
                "cannot receive the actor's weights. Start it with VLLM_SERVER_DEV_MODE=1 (`VLLM_SERVER_DEV_MODE=1 "
                "vllm serve MODEL`) on this host, so that weights can be reloaded from a folder; or use the "
                "server without training (evaluation), or rollout.name=hf or vllm."
            )
        if status != 200 or not isinstance(body, dict) or not body.get("accepts"):
            why = (
                "it was started without --accept-weights"
                if status == 200 and isinstance(body, dict)
                else f"GET {WEIGHTS_PATH} answered HTTP {status} (neither a lucidrl server nor vLLM's)"
            )
            raise RolloutServerError(
                f"the server at {self.base_url} cannot receive the actor's weights: {why}. On-policy "
                "training with rollout.name=server needs `lucidrl serve MODEL --accept-weights` or "
                "`VLLM_SERVER_DEV_MODE=1 vllm serve MODEL`; for a frozen policy (evaluation) use the server "
                "without training, or use rollout.name=hf or vllm."
            )
        self.max_weights_bytes = body.get("max_bytes")
        served = body.get("config")
        if model_config is not None and isinstance(served, dict):
            from lucidrl.protocol import fingerprint_differences, model_fingerprint

            differ = fingerprint_differences(model_fingerprint(model_config), served)
            if differ:
                raise RolloutServerError(
                    f"the server at {self.base_url} serves {self.model_name!r}, whose config differs from the "
                    f"actor's in {len(differ)} key(s) ({'; '.join(differ[:5])}; actor's vs server's): with the "
                    "actor's weights pushed in, it would sample from another function than the policy being "
                    "trained. Serve the actor's model.path (`lucidrl serve MODEL.PATH --accept-weights`)"
                )
        return int(body.get("version", 0))

    def load_weights(self, named: dict[str, torch.Tensor]) -> str:
        """Push every parameter (HF names; a tied weight may come under each of its names) to the
        server; it swaps them between requests."""
        from safetensors.torch import save

        # safetensors refuses tensors that share memory (a tied head under its second name): copies
        raw = save({k: v.detach().to("cpu").contiguous().clone() for k, v in named.items()})
        if self.vllm_reload:
            return self._vllm_reload(raw, len(named))
        limit = self.max_weights_bytes
        if limit is not None and len(raw) > limit:  # the server would answer 413 unread: a broken pipe here
            raise RolloutServerError(
                f"the actor's weights ({len(named)} tensors, {len(raw) / 2**20:.1f} MiB) exceed what "
                f"{self.base_url} takes ({limit / 2**20:.1f} MiB, its own model's size): it serves a smaller "
                "model than the actor's; serve the actor's model.path"
            )
        status, body = self._http(
            "POST", WEIGHTS_PATH, raw, purpose="weight update", content_type="application/octet-stream"
        )
        if status != 200:
            raise RolloutServerError(
                f"{self.base_url}{WEIGHTS_PATH} refused the actor's weights ({len(named)} tensors, "
                f"{len(raw) / 2**20:.1f} MiB): HTTP {status}: {error_message(body)}"
            )
        return f"pushed v{body.get('version')}"

    def _vllm_reload(self, raw: bytes, count: int) -> str:
        """`vllm serve` (dev mode): the weights as a checkpoint folder the server reloads from."""
        with tempfile.TemporaryDirectory(prefix="lucidrl-weights-", dir=self.weights_dir) as folder:
            with open(os.path.join(folder, "model.safetensors"), "wb") as f:
                f.write(raw)
            os.chmod(folder, 0o755)  # a server running as another user reads it too
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": folder}}
            status, body = self._http("POST", "/collective_rpc", rpc, purpose="weight reload")
            if status != 200:
                raise RolloutServerError(
                    f"{self.base_url}/collective_rpc could not reload the actor's weights ({count} tensors) from "
                    f"{folder}: HTTP {status}: {error_message(body)}. The server reads that folder itself: it "
                    "must run on this host, or rollout.server.weights_dir must be a folder both can reach"
                )
        status, body = self._http("POST", "/reset_prefix_cache", purpose="prefix-cache reset")
        if status != 200:
            raise RolloutServerError(
                f"{self.base_url}/reset_prefix_cache answered HTTP {status} after a weight reload: "
                f"{error_message(body)}; cached prompts would keep the old weights' keys and values"
            )
        return f"reloaded {count} tensors"

    def _is_vllm(self) -> bool:
        status, body = self._http("GET", "/version", purpose="server version check")
        return status == 200 and isinstance(body, dict) and "version" in body

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
    ) -> ServerRollout:
        sv = cfg.rollout.server
        engine = cls(
            sv.base_url,
            tokenizer,
            host=sv.host,
            port=sv.port,
            timeout_s=sv.timeout_s,
            eos_ids=eos_token_ids(model, tokenizer),
            weights_dir=sv.weights_dir,
        )
        engine.check_accepts_weights(model.config)
        return engine

    def sync_from(self, actor: torch.nn.Module, *, rank: int = 0, world_size: int = 1) -> str:
        """Push the actor's parameters (HF names, LoRA merged) to the server: one server, one push
        (rank 0's), while every rank takes part in the gathers of a sharded actor."""
        if rank != 0:  # its part of each gather, keeping nothing
            for _ in rollout_weights(actor):
                pass
            return "rank 0 pushes"
        return self.load_weights(dict(rollout_weights(actor)))

    def abort(self) -> None:
        raise AbortUnsupported(
            f"rollout.name=server cannot cut a running generation short ({self.base_url} answers each "
            "request whole); partial rollouts need rollout.name=hf"
        )

    def full_model(self) -> None:
        return None  # the weights live in the server

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Repeat each prompt n times (interleaved) and add responses, response_mask, rollout_log_probs."""
        prompts = [
            row[mask.bool()].tolist()
            for row, mask in zip(batch["prompts"].cpu(), batch["prompt_mask"].cpu(), strict=True)
        ]
        # greedy samples of a prompt are all the same, and vLLM refuses n > 1 at temperature 0: ask once
        n = params.n if params.do_sample else 1
        payload: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompts,
            "n": n,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature if params.do_sample else 0.0,
            "top_p": params.top_p if params.do_sample else 1.0,
            "top_k": params.top_k if params.do_sample else -1,
            # vLLM's server fills unsent penalties from the model's generation_config (Qwen2.5-Instruct:
            # repetition_penalty 1.05), which would sample from another distribution than the actor's
            "repetition_penalty": 1.0,
            "min_p": 0.0,
            "return_token_ids": True,
        }
        if params.do_sample:
            payload["logprobs"] = 0
        seed = getattr(params, "seed", None)  # SamplingParams.seed is newer than this engine
        if seed is not None and params.do_sample:
            payload["seed"] = seed
        status, body = self._http("POST", "/v1/completions", payload, purpose="completion request")
        if status != 200:
            raise RolloutServerError(
                f"{self.base_url}/v1/completions answered HTTP {status}: {error_message(body)}"
            )
        ids, logps = self._parse_choices(
            body, expected=len(prompts) * n, want_logprobs=params.do_sample, max_tokens=params.max_new_tokens
        )
        ids = [tokens for tokens in ids for _ in range(params.n // n)]

        # a stop rule cuts the finished responses (an OpenAI-style server stops at strings only)
        return batch_from_token_lists(batch, params, ids, logps, self.pad_id, self.eos_ids, self.tokenizer)

    # -- HTTP -------------------------------------------------------------------------------------

    def _check_health(self, model_name: str | None) -> str:
        """GET /health (lucidrl, vLLM), then /v1/models for the model name if still unknown."""
        status, body = self._http("GET", "/health", purpose="health check")
        if status not in (200, 404):
            raise RolloutServerError(
                f"health check GET {self.base_url}/health answered HTTP {status}: {error_message(body)}; "
                "the server is up but not ready (still loading the model?)"
            )
        if model_name is None and status == 200 and isinstance(body, dict):
            model_name = body.get("model")
        if model_name is not None:
            return model_name
        status, body = self._http("GET", "/v1/models", purpose="model listing")
        data = body.get("data") if isinstance(body, dict) else None
        if status != 200 or not data or "id" not in data[0]:
            raise RolloutServerError(
                f"GET {self.base_url}/v1/models answered HTTP {status} without a model list "
                f"({error_message(body)}); is it an OpenAI-compatible server? Pass model_name to skip this."
            )
        return str(data[0]["id"])

    def _http(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | bytes | None = None,
        *,
        purpose: str,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """(status, decoded JSON body or raw text); connection failures raise RolloutServerError."""
        url = self.base_url + path
        if isinstance(payload, bytes):
            data: bytes | None = payload
        else:
            data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            via = (
                f" through the proxy {self.proxy} (the http_proxy environment variable; add the host to "
                "no_proxy if the server is reached directly)"
                if self.proxy
                else ""
            )
            raise RolloutServerError(
                f"{purpose} {method} {url} failed{via} (rollout.server.timeout_s={self.timeout_s}): "
                f"{type(reason).__name__}: {reason}. Check that the server is running and listening on "
                f"that host and port (`lucidrl serve MODEL --port PORT` or `vllm serve MODEL --port PORT`), "
                "and that base_url/host/port point at it; a server still loading its model, or a long "
                "generation, may need a larger rollout.server.timeout_s."
            ) from e
        text = raw.decode("utf-8", errors="replace")
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    def _parse_choices(
        self, body: Any, *, expected: int, want_logprobs: bool, max_tokens: int | None = None
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        where = f"{self.base_url}/v1/completions"
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or len(choices) != expected:
            got = len(choices) if isinstance(choices, list) else "no"
            raise RolloutServerError(f"{where} returned {got} choices, expected {expected} (prompts × n)")
        choices = sorted(choices, key=lambda c: c.get("index", 0))
        ids, logps = [], []
        for c in choices:
            tokens = c.get("token_ids")
            if not isinstance(tokens, list):
                raise RolloutServerError(
                    f"{where} returned a choice without token_ids; the server must support the "
                    "`return_token_ids` request field (lucidrl serve, or vLLM >= 0.10.2)"
                )
            tokens = [int(t) for t in tokens]
            ended = bool(tokens) and tokens[-1] in self.eos_ids
            if max_tokens is not None and not ended and len(tokens) < max_tokens:
                raise RolloutServerError(
                    f"{where} ended choice {c.get('index')} after {len(tokens)} of max_tokens={max_tokens} tokens "
                    f"without one of the trainer's eos ids {sorted(self.eos_ids)} (finish_reason="
                    f"{c.get('finish_reason')!r}, last token {tokens[-1] if tokens else None}): the server "
                    "stopped it for a reason of its own, and training would read it as unfinished. vLLM caps "
                    "max_tokens at --max-model-len minus the prompt and stops at its generation config's eos "
                    "ids: serve with --max-model-len >= data.max_prompt_length + data.max_response_length, and "
                    "the actor's tokenizer and generation config"
                )
            ids.append(tokens)
            if want_logprobs:
                lp = (c.get("logprobs") or {}).get("token_logprobs")
                if not isinstance(lp, list) or len(lp) != len(tokens) or any(x is None for x in lp):
                    raise RolloutServerError(
                        f"{where} returned no per-token logprobs for choice {c.get('index')} "
                        f"({len(tokens)} tokens) though the request set logprobs=0"
                    )
                logps.append([float(x) for x in lp])
        return ids, (logps if want_logprobs else None)


def _opener_for(base_url: str) -> tuple[urllib.request.OpenerDirector, str | None]:
    """(an opener for the server, the proxy it goes through or None). A server on this host is reached
    directly: urllib would send even 127.0.0.1 through http_proxy (weight pushes included), and a proxy
    that cannot reach back here makes a running server look down."""
    parts = urllib.parse.urlsplit(base_url)
    host = parts.hostname or ""
    loopback = host == "localhost" or host.startswith("127.") or host == "::1"
    if loopback:
        return urllib.request.build_opener(urllib.request.ProxyHandler({})), None
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and urllib.request.proxy_bypass(host):
        proxy = None
    return urllib.request.build_opener(), proxy
