"""The HTTP wire format between lucidrl's rollout client and a completions server: one place.

The server side (`lucidrl serve`, lucidrl/serving/) parses and validates the OpenAI completions
request it accepts and answers errors in OpenAI's shape; the client side (the `server` rollout
engine, lucidrl/workers/rollout/server_engine.py) reads those error bodies (and vLLM's), compares model
fingerprints, and pushes weights to `WEIGHTS_PATH`.

Every rejected request names the offending field (`param`), the value it got and what to send
instead, in OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`. Fields the
server does not implement (stop strings, penalties, streaming, top-k alternatives in `logprobs`)
are refused rather than silently ignored, so a client never gets something else than it asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Fields accepted and honoured; anything else is refused unless it is in _NEUTRAL at its neutral value.
SUPPORTED_FIELDS = (
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "seed",
    "logprobs",
    "return_token_ids",
    "user",
)
# Fields clients often send at their default value; accepted only at these values.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stream": (False, None),
    "echo": (False, None),
    "stop": (None, [], ""),
    "suffix": (None, ""),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "repetition_penalty": (1, 1.0, None),
    "min_p": (0, 0.0, None),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "skip_special_tokens": (True, None),
}
WEIGHTS_PATH = "/lucidrl/weights"  # lucidrl serve: GET says whether it takes weights, POST pushes them
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


# config keys that say nothing about the function a checkpoint computes (paths, versions, dtype, caching
# and output switches, labels, padding)
_NOT_THE_FUNCTION = {
    "_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache", "architectures",
    "_attn_implementation", "_attn_implementation_autoset", "attn_implementation", "output_attentions",
    "output_hidden_states", "return_dict", "id2label", "label2id", "problem_type", "pad_token_id",
    "num_labels", "_commit_hash", "torchscript", "chunk_size_feed_forward",
}  # fmt: skip


def model_fingerprint(config: Any) -> dict[str, Any]:
    """A model config as the plain JSON values that decide what it computes, for the trainer and a
    weight-taking server to compare: two checkpoints of equal parameter shapes can still compute other
    functions (another rope_theta or norm epsilon), and a weight push would then make the server sample
    from a policy that is not the actor's."""
    import json

    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    kept = {k: v for k, v in raw.items() if k not in _NOT_THE_FUNCTION and not k.endswith("dropout")}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def fingerprint_differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """`key: ours vs theirs` for each key the two fingerprints disagree on."""
    keys = sorted(set(ours) | set(theirs))
    return [f"{k}: {ours.get(k)!r} vs {theirs.get(k)!r}" for k in keys if ours.get(k) != theirs.get(k)]


class RequestError(ValueError):
    """A request the server cannot serve; becomes an HTTP error with an OpenAI-style body."""

    def __init__(
        self,
        message: str,
        param: str | None,
        *,
        status: int = 400,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type_
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.param, type_=self.type, code=self.code)


def error_body(
    message: str, param: str | None, *, type_: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape, as the openai client and vLLM's server use it."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass
class CompletionRequest:
    """A validated /v1/completions request; `prompts` are token ids, one list per prompt."""

    prompts: list[list[int]]
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None  # None: no log-probs; 0: the sampled token's
    return_token_ids: bool = False


GREEDY_BELOW = 1e-5  # a temperature below this is greedy decoding, as in vLLM


def parse_completion_request(
    body: Any,
    *,
    served_model: str,
    tokenizer: Any,
    vocab_size: int,
    max_positions: int | None,
    max_samples: int | None = None,
) -> CompletionRequest:
    """Validate a decoded JSON body; raise RequestError naming the first bad field. `max_samples`: the
    most prompts x n one request may ask for (None: no limit)."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got a JSON {type(body).__name__}", None)
    for key, value in body.items():
        if key in SUPPORTED_FIELDS:
            continue
        if key in _NEUTRAL:
            if not any(value is v or (type(value) is type(v) and value == v) for v in _NEUTRAL[key]):
                raise RequestError(
                    f"{key}={value!r} is not supported by lucidrl's server; leave it out "
                    f"(or send {_NEUTRAL[key][0]!r})",
                    key,
                )
            continue
        raise RequestError(
            f"unknown field {key!r}; lucidrl's server accepts {', '.join(SUPPORTED_FIELDS)}", key
        )

    model = body.get("model")
    if model is not None and model != served_model:
        raise RequestError(
            f"the model {model!r} does not exist; this server serves {served_model!r} (GET /v1/models)",
            "model",
            status=404,
            code="model_not_found",
        )
    if "prompt" not in body:
        raise RequestError(
            "missing required field 'prompt' (a string, list of strings or token ids)", "prompt"
        )
    prompts = _parse_prompt(body["prompt"], tokenizer, vocab_size)

    temperature = _number(body, "temperature", 1.0, low=0.0)
    if temperature < GREEDY_BELOW:
        # vLLM's rule (_SAMPLING_EPS): logits / 1e-40 overflow float32, and the softmax was NaN
        temperature = 0.0
    logprobs = _integer(body, "logprobs", None, low=0)
    if logprobs is not None and logprobs > 0:
        raise RequestError(
            f"logprobs={logprobs}: lucidrl's server returns the log-prob of each sampled token only, "
            "not top-k alternatives; send logprobs=0",
            "logprobs",
        )
    req = CompletionRequest(
        prompts=prompts,
        max_tokens=_integer(body, "max_tokens", DEFAULT_MAX_TOKENS, low=1),
        temperature=temperature,
        top_p=_number(body, "top_p", 1.0, low=0.0, low_open=True, high=1.0),
        top_k=_top_k(body),
        n=_integer(body, "n", 1, low=1),
        seed=_integer(body, "seed", None, low=-(2**63), high=2**63 - 1),  # torch.manual_seed's range
        logprobs=logprobs,
        return_token_ids=_boolean(body, "return_token_ids", False),
    )
    if max_samples is not None and len(prompts) * req.n > max_samples:
        raise RequestError(
            f"{len(prompts)} prompt(s) x n={req.n} = {len(prompts) * req.n} samples is more than this server "
            f"takes in one request ({max_samples}: lucidrl serve --max-request-samples); split the request "
            "or lower n",
            "n",
        )
    if max_positions is not None:
        longest = max(len(p) for p in prompts)
        if longest + req.max_tokens > max_positions:
            raise RequestError(
                f"a prompt of {longest} tokens plus max_tokens={req.max_tokens} exceeds the model's "
                f"{max_positions} positions; lower max_tokens or shorten the prompt",
                "max_tokens",
            )
    return req


def _parse_prompt(value: Any, tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """A string, list of strings, list of token ids or list of lists of token ids → token id lists."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_int(x) for x in value):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise RequestError(
            f"prompt must be a non-empty string, list of strings, list of token ids or list of lists of "
            f"token ids; got {_short(value)}",
            "prompt",
        )
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids = tokenizer(item, add_special_tokens=True)["input_ids"]
        elif isinstance(item, list) and all(_is_int(x) for x in item):
            ids = item
            bad = [x for x in ids if not 0 <= x < vocab_size]
            if bad:
                raise RequestError(
                    f"prompt {i} holds token id {bad[0]}, outside the model's vocabulary [0, {vocab_size})",
                    "prompt",
                )
        else:
            raise RequestError(
                f"prompt {i} must be a string or a list of integer token ids, got {_short(item)}; "
                "a list must not mix strings and token ids",
                "prompt",
            )
        if not ids:
            raise RequestError(f"prompt {i} is empty (no tokens); send at least one token", "prompt")
        prompts.append(list(ids))
    return prompts


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _integer(
    body: dict[str, Any], key: str, default: int | None, *, low: int | None = None, high: int | None = None
) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise RequestError(f"{key} must be an integer, got {_short(value)}", key)
    if low is not None and value < low:
        raise RequestError(f"{key}={value} must be >= {low}", key)
    if high is not None and value > high:
        raise RequestError(f"{key}={value} must be <= {high}", key)
    return value


def _number(
    body: dict[str, Any],
    key: str,
    default: float,
    *,
    low: float,
    low_open: bool = False,
    high: float | None = None,
) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise RequestError(f"{key} must be a finite number, got {_short(value)}", key)
    if value < low or (low_open and value == low) or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}{']' if high is not None else ')'}"
        raise RequestError(f"{key}={value} must be in {bounds}", key)
    return float(value)


def _top_k(body: dict[str, Any]) -> int:
    value = _integer(body, "top_k", -1)
    if value in (0, -1):  # vLLM reads both as "off"
        return -1
    if value < -1:
        raise RequestError(f"top_k={value} must be -1 (off) or a positive integer", "top_k")
    return value


def _boolean(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, got {_short(value)}", key)
    return value


def error_message(body: Any) -> str:
    """The message of an OpenAI-style error body ({"error": {"message"}}) or vLLM's older flat one."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            param = err.get("param")
            return f"{err['message']}" + (f" (param: {param})" if param else "")
        if "message" in body:
            return str(body["message"])
    return str(body)[:500] if body else "(empty body)"
