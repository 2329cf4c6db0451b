"""Load a causal LM and its tokenizer from local folders, offline, with errors that say what to fix.

lucidrl never contacts a model hub: every `from_pretrained` call passes `local_files_only=True`,
so `model.path` must be a folder on disk (a HuggingFace checkpoint, or one built by
`lucidrl model tiny --out DIR`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from lucidrl.diagnostics.errors import UserError

# Any one of these marks a folder as holding a tokenizer that AutoTokenizer can read.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
_BUILD_HINT = (
    "build a local one with `lucidrl model tiny --out DIR` or point it at a downloaded checkpoint folder"
)


# model.dtype values and the torch dtypes they mean
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ModelLoadError(UserError, ValueError):
    """A model or tokenizer folder could not be loaded; the message names the path, config key and fix."""


def _check_folder(path: str, config_key: str, what: str) -> Path:
    """Return `path` as a Path if it is an existing folder, else raise ModelLoadError explaining the key."""
    if not str(path or "").strip():  # Path("") is the working directory: a model there loaded unasked
        raise ModelLoadError(f"{config_key} is not set; set it to a local model folder, or {_BUILD_HINT}.")
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelLoadError(
            f"{config_key}={path!r}: {what} folder does not exist. lucidrl loads models from local "
            f"folders only (no model hub access); set {config_key} to an existing folder, or {_BUILD_HINT}."
        )
    if not folder.is_dir():
        raise ModelLoadError(
            f"{config_key}={path!r} is a file, not a folder; set {config_key} to the folder that holds "
            f"the {what} files (config.json, tokenizer.json, ...)."
        )
    return folder


def load_tokenizer(
    path: str,
    pad_token: str | None = None,
    *,
    config_key: str = "model.path",
    trust_remote_code: bool = False,
) -> Any:
    """Load a tokenizer from a local folder and make sure it has a pad token.

    Pad token rule: an explicit `pad_token` (config `model.pad_token`) must already be in the
    vocabulary and is used as is; otherwise a tokenizer without a pad token pads with its eos token
    and warns once. `padding_side` is left as the folder sets it, since lucidrl pads by hand.
    `config_key` names the setting `path` came from (`model.path` or `model.tokenizer_path`).
    """
    from transformers import AutoTokenizer

    folder = _check_folder(path, config_key, "tokenizer")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{config_key}={path!r} has no tokenizer files (looked for {', '.join(TOKENIZER_FILES)}); "
            f"set {config_key} to a folder that contains a tokenizer, or {_BUILD_HINT}."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... depending on what broke
        raise ModelLoadError(
            f"{config_key}={path!r}: AutoTokenizer could not load the tokenizer "
            f"({type(exc).__name__}: {exc}); check the tokenizer files in that folder, or {_BUILD_HINT}."
        ) from exc

    if pad_token is not None:
        if pad_token not in tokenizer.get_vocab():
            raise ModelLoadError(
                f"model.pad_token={pad_token!r} is not a token of the tokenizer at {config_key}={path!r}; "
                f"use one of its existing tokens (eos is {tokenizer.eos_token!r}), or leave model.pad_token "
                "unset to pad with eos."
            )
        tokenizer.pad_token = pad_token
    elif tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(
                f"the tokenizer at {config_key}={path!r} has neither a pad token nor an eos token; "
                "set model.pad_token to a token of its vocabulary."
            )
        warnings.warn(
            f"the tokenizer at {config_key}={path!r} has no pad token; padding with its eos token "
            f"{tokenizer.eos_token!r}. Set model.pad_token to silence this warning.",
            UserWarning,
            stacklevel=2,
        )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model_folder(path: str, config_key: str = "model.path") -> Path:
    """`path` as a folder holding a HuggingFace config.json, else ModelLoadError naming `config_key`."""
    folder = _check_folder(path, config_key, "model")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"{config_key}={path!r} has no config.json, so it is not a HuggingFace model folder; "
            f"set {config_key} to a folder saved by `save_pretrained`, or {_BUILD_HINT}."
        )
    return folder


def read_weight_shapes(
    folder: Path, config_key: str = "model.path"
) -> tuple[list[str], dict[str, tuple[int, ...]]] | None:
    """(files, name -> shape) read from the safetensors headers only (nothing loaded); None if the weights
    are not safetensors. ModelLoadError naming the file for a truncated or foreign one, where transformers
    said only "Error while deserializing header" with the folder."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(
                f"{index} is not a safetensors index ({type(e).__name__}: {e}): it must be JSON with a "
                '"weight_map" of tensor name -> file; save the model again with save_pretrained'
            ) from e
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise ModelLoadError(
                f"model folder {str(folder)!r}: model.safetensors.index.json names the shard {name!r}, which "
                "is not in the folder; copy the missing shard (an interrupted download or copy)"
            )
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except Exception as exc:  # safetensors raises SafetensorError for a truncated or foreign file
            raise ModelLoadError(
                f"{config_key}={str(folder)!r}: weight file '{path}' is not a readable safetensors file "
                f"({type(exc).__name__}: {exc}; {path.stat().st_size} bytes): it was truncated (an interrupted "
                "download, copy or save) or is another kind of file; copy or download it again (its size "
                "should match the source's), or save the model again with save_pretrained"
            ) from exc
    return files, shapes


# config.json keys checked against the weights' shapes before a load: (key, name endings, dimension).
# transformers said only "You set `ignore_mismatched_sizes` to `False`" (the shapes in a log above it)
_SIZED_BY = (
    (
        "vocab_size",
        ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight", "lm_head.weight"),
        0,
    ),
    ("intermediate_size", ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.fc1.weight"), 0),
    ("intermediate_size", ("mlp.down_proj.weight", "mlp.fc2.weight"), 1),
)


def _file_of(folder: Path, tensor: str, files: list[str]) -> Path:
    """The weight file holding `tensor`: the only one, or the shard the index names."""
    if len(files) > 1:
        try:
            return (
                folder
                / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][tensor]
            )
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return folder / files[0]


def check_config_fits_weights(
    folder: Path, shapes: dict[str, tuple[int, ...]], files: list[str], config_key: str = "model.path"
) -> None:
    """ModelLoadError when config.json's vocab_size or intermediate_size is not the size of the tensors
    the weight files hold (a config.json edited, or copied from another model of the family)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # transformers says what is wrong with it
    if not isinstance(config, dict):
        return
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for key, endings, dim in _SIZED_BY:
        value = config.get(key, text.get(key))
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        for name, shape in sorted(shapes.items()):
            if name.endswith(endings) and len(shape) == 2 and shape[dim] != value:
                raise ModelLoadError(
                    f"{config_key}={str(folder)!r}: config.json says {key}={value}, but '{_file_of(folder, name, files)}' holds "
                    f"{name} of shape {list(shape)}, so {key} is {shape[dim]} there: config.json does not "
                    f"describe these weights (edited, or copied from another model); set {key} to "
                    f"{shape[dim]} in {folder / 'config.json'}, or put back the config.json saved with the weights"
                )


def load_model(
    path: str,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    *,
    config_key: str = "model.path",
) -> Any:
    """Load a causal LM (`AutoModelForCausalLM`) from a local folder (config key `model.path`), offline;
    `attn_implementation` (model.attn_implementation) picks its attention code, None transformers' own choice.
    The safetensors headers are read first (nothing loaded): a truncated file or a config.json that does
    not fit the weights is named before transformers reads them."""
    from transformers import AutoModelForCausalLM

    folder = check_model_folder(path, config_key)
    found = read_weight_shapes(folder, config_key)
    if found is not None:
        check_config_fits_weights(folder, found[1], found[0], config_key)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    try:
        return AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code, **kwargs
        )
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... depending on what broke
        said = str(exc)
        # transformers: ImportError "FlashAttention2 has been toggled on, but it cannot be used ...", or
        # ValueError naming attn_implementation for a model without that kind of attention
        if attn_implementation is not None and ("toggled on" in said or "attn_implementation" in said):
            raise ModelLoadError(
                f"model.attn_implementation={attn_implementation!r}: the model at model.path={path!r} cannot "
                f"run it ({type(exc).__name__}: {exc}); set model.attn_implementation to eager or sdpa, or "
                "leave it unset for transformers' own choice."
            ) from exc
        raise ModelLoadError(
            f"{config_key}={path!r}: AutoModelForCausalLM could not load the model "
            f"({type(exc).__name__}: {exc}); check the folder's config.json and weight files, or {_BUILD_HINT}."
        ) from exc


def load_run_model(m: Any, dtype: torch.dtype) -> Any:
    """The causal LM a run's `model` section names (model.path), with its model.trust_remote_code and
    model.attn_implementation, its weights in `dtype`."""
    return load_model(
        m.path, dtype=dtype, trust_remote_code=m.trust_remote_code, attn_implementation=m.attn_implementation
    )


def load_run_tokenizer(m: Any) -> Any:
    """The tokenizer a run's `model` section names (model.tokenizer_path, else model.path), with its
    model.pad_token and model.trust_remote_code; errors name the key the folder came from."""
    return load_tokenizer(
        m.tokenizer_path or m.path,
        pad_token=m.pad_token,
        config_key="model.tokenizer_path" if m.tokenizer_path else "model.path",
        trust_remote_code=m.trust_remote_code,
    )


def check_tokenizer_matches_model(
    model: Any, tokenizer: Any, path: str, config_key: str = "model.path"
) -> None:
    """Raise ModelLoadError if the tokenizer can emit ids the model's embedding has no row for."""
    embedding_rows = model.get_input_embeddings().weight.shape[0]
    if embedding_rows < len(tokenizer):
        raise ModelLoadError(
            f"the model at {config_key}={path!r} has {embedding_rows} embedding rows but its tokenizer has "
            f"{len(tokenizer)} tokens, so some token ids would index past the embedding; use the tokenizer "
            "saved with this model (model.tokenizer_path) or resize the model's embeddings."
        )
