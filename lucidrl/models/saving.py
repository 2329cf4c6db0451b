"""Write a HuggingFace model folder atomically (a half-written folder never carries the final name) that
every transformers version a user may load it with reads the same: 5.x and the 4.5x range verl's vLLM
versions pin."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

# tokenizer classes transformers 5 writes that 4.x has under another name
_TOKENIZER_CLASSES_4X = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (the names renamed into it), or a file's contents, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """Flush every file under `root`, and its folders, to disk. Called before the rename that makes a
    folder final: the rename must not reach the disk before the contents, or after a power loss or a
    VM's hard stop the folder is complete by name and empty or torn inside (ext4 and xfs may order
    them so)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fsync_dir(os.path.join(dirpath, name))  # the same call flushes a file
        fsync_dir(dirpath)


def save_hf_folder(model, tokenizer, path: str | Path) -> Path:
    """save_pretrained model and tokenizer under `<path>.tmp`, then rename to `path` (replacing it).

    An existing empty folder (`lucidrl export CKPT .` in a new directory) is kept and filled, so that a
    shell inside it is not left in a deleted directory.
    """
    path = Path(path).resolve()  # "." has no name to put ".tmp" after
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    make_portable(tmp)
    fsync_tree(tmp)
    if path.is_dir() and not any(path.iterdir()):
        for item in tmp.iterdir():
            item.rename(path / item.name)
        tmp.rmdir()
        fsync_dir(path)
        return path
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    fsync_dir(path.parent)
    return path


def make_portable(folder: str | Path) -> None:
    """Make a folder transformers 5 wrote read the same in transformers 4.5x, and give its files a normal
    file's permissions.

    - tokenizer_config.json: 5.x writes the special tokens as a list under `extra_special_tokens`, which 4.x
      reads as a mapping (AutoTokenizer failed: "'list' object has no attribute 'keys'"); they go to
      `additional_special_tokens`, which both read. 5.x's generic `TokenizersBackend` class is 4.x's
      `PreTrainedTokenizerFast`.
    - config.json: 5.x writes RoPE as `rope_parameters`; 4.x reads `rope_theta` and `rope_scaling`, and
      without them silently builds the model with its default base (10000: a Qwen2.5 at 1e6 would load
      with wrong positions). Both are written beside it.
    - permissions: save_pretrained writes model.safetensors 0600 (a temporary file renamed); every file
      gets what a plain write gives, 0666 less the umask.
    """
    folder = Path(folder)
    _edit_json(folder / "tokenizer_config.json", _tokenizer_config_for_4x)
    _edit_json(folder / "config.json", _config_for_4x)
    mode = 0o666 & ~current_umask()
    for dirpath, _, names in os.walk(folder):
        for name in names:
            os.chmod(os.path.join(dirpath, name), mode)


def current_umask() -> int:
    """This process's umask (read from /proc where it is, so no other thread sees it changed)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _edit_json(path: Path, edit: Any) -> None:
    if not path.is_file():
        return
    data = json.loads(path.read_text())
    if edit(data):
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _tokenizer_config_for_4x(data: dict[str, Any]) -> bool:
    changed = False
    extra = data.get("extra_special_tokens")
    if isinstance(extra, list):  # a mapping (named tokens such as image_token) is 4.x's shape already
        data["additional_special_tokens"] = list(
            dict.fromkeys([*(data.get("additional_special_tokens") or []), *extra])
        )
        del data["extra_special_tokens"]
        changed = True
    name = data.get("tokenizer_class")
    if name in _TOKENIZER_CLASSES_4X:
        data["tokenizer_class"] = _TOKENIZER_CLASSES_4X[name]
        changed = True
    return changed


def _config_for_4x(data: dict[str, Any]) -> bool:
    changed = False
    for config in (data, data.get("text_config")):
        rope = config.get("rope_parameters") if isinstance(config, dict) else None
        if not isinstance(rope, dict) or "rope_theta" not in rope:
            continue  # absent, or per attention type (Gemma 3): no flat 4.x form to add
        if "rope_theta" not in config:
            config["rope_theta"] = rope["rope_theta"]
            changed = True
        if rope.get("rope_type", "default") != "default" and config.get("rope_scaling") is None:
            config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
            changed = True
    return changed
