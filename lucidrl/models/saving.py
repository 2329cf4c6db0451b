"""Write a HuggingFace model folder atomically: a half-written folder never carries the final name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


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
