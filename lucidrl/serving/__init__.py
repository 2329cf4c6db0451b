"""Serving: `lucidrl serve`, an OpenAI-compatible completions server over lucidrl's HF generation."""

from lucidrl.protocol import CompletionRequest, RequestError, parse_completion_request
from lucidrl.serving.server import CompletionEngine, ServerHandle, make_server, run_server

__all__ = [
    "CompletionEngine",
    "CompletionRequest",
    "RequestError",
    "ServerHandle",
    "make_server",
    "parse_completion_request",
    "run_server",
]
