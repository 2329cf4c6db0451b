"""Write a HuggingFace model folder atomically: a half-written folder never carries the final name."""

from __future__ import annotations

import shutil
from pathlib import Path


def save_hf_folder(model, tokenizer, path: str | Path) -> Path:
    """save_pretrained model and tokenizer under `<path>.tmp`, then rename to `path` (replacing it)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path
