"""Write a HuggingFace model folder atomically: a half-written folder never carries the final name."""

from __future__ import annotations

import shutil
from pathlib import Path


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
    if path.is_dir() and not any(path.iterdir()):
        for item in tmp.iterdir():
            item.rename(path / item.name)
        tmp.rmdir()
        return path
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path
