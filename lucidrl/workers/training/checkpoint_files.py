"""Reading a checkpoint's files without trusting them: errors that name the file and the way out.

A checkpoint can be damaged (a save cut short by a full disk or a kill before lucidrl wrote files
atomically, a file truncated by a copy, an edit by hand) or not lucidrl's at all. Each reader here
turns what the libraries raise (`EOFError`, `AssertionError: metadata is None`, `Size mismatch`,
`JSONDecodeError`) into a CheckpointError that names the file, says what is wrong with it, and lists
the earlier complete checkpoints to resume from instead.

RNG state files are read with `torch.load(weights_only=True)`: tensors, numbers, tuples and dicts
only, so a crafted `rng.pt` cannot run code when a run resumes. PyTorch's distributed checkpoint
reader unpickles each role's `.metadata`; before it does, `verify_checkpoint` checks every file
against the manifest the save wrote (`manifest.json`: each file's size and sha256) and reads each
`.metadata` with an unpickler that builds DCP's own metadata classes and nothing else, so a file
replaced by a pickle that runs code is refused, naming it, before torch's reader opens it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from lucidrl.diagnostics.errors import UserError

log = logging.getLogger(__name__)

STEP_FOLDER = re.compile(r"global_step_(\d+)")
STATE = "trainer_state.json"  # what marks a step folder as a complete checkpoint


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be found, read, or resumed with this config; the message says which and why."""


def step_folder(path: Path) -> Path | None:
    """The `global_step_N` folder `path` is in (or is), or None."""
    for p in (path, *path.parents):
        if STEP_FOLDER.fullmatch(p.name):
            return p
    return None


def earlier_checkpoints(step: Path) -> list[Path]:
    """The complete checkpoints beside `step` (a global_step_N folder) with a smaller N, newest first."""
    n = int(STEP_FOLDER.fullmatch(step.name).group(1))
    found = []
    for p in step.parent.glob("global_step_*"):
        m = STEP_FOLDER.fullmatch(p.name)
        if m and int(m.group(1)) < n and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, reverse=True)]


def way_out(path: Path) -> str:
    """What to do about a damaged file under `path`: resume from the newest earlier checkpoint."""
    step = step_folder(path)
    if step is None:
        return "restore the file from where it came from, or resume from another checkpoint"
    earlier = earlier_checkpoints(step)
    if earlier:
        return (
            f"resume from the checkpoint before it: trainer.resume_mode=resume_path "
            f"trainer.resume_from_path={earlier[0]}"
            + (f" (also complete: {', '.join(p.name for p in earlier[1:4])})" if len(earlier) > 1 else "")
        )
    return (
        f"{step.parent} holds no earlier complete checkpoint: start the run again (trainer.resume_mode=disable "
        "trainer.overwrite=true), or restore the file from a backup"
    )


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a checkpoint raises: any Exception, and torch.distributed.checkpoint's own
    CheckpointException (a BaseException, holding each rank's error)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def cause_of(exc: BaseException) -> str:
    """`exc` in one line: type and first line of its message (for a CheckpointException, its first rank's)."""
    failures = getattr(exc, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        rank, failure = next(iter(failures.items()))
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, BaseException):
            return f"rank {rank}: {cause_of(inner)}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def damaged(path: Path, what: str, exc: BaseException) -> CheckpointError:
    """The error for a checkpoint file or folder `path` holding `what` that could not be read."""
    return CheckpointError(
        f"cannot read {what} in {path} ({cause_of(exc)}): the file is damaged (truncated by a full disk or an "
        f"interrupted copy, or edited) or was not written by lucidrl; {way_out(path)}"
    )


def missing(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint file {path} ({what}) is missing: the checkpoint is incomplete (a file deleted or left out of "
        f"a copy); {way_out(path)}"
    )


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A checkpoint's JSON file as a dict, or a CheckpointError naming it."""
    if not path.is_file():
        raise missing(path, what)
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(path, what, exc) from exc
    if not isinstance(value, dict):
        raise damaged(path, what, ValueError(f"a JSON {type(value).__name__}, not an object"))
    return value


def load_rng_state(path: Path) -> dict[str, Any]:
    """An RNG state file as `process_rng_state` wrote it, read without unpickling code (weights_only)."""
    if not path.is_file():
        raise missing(path, "the process's RNG state")
    try:
        rng = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        # weights_only refused a global: a file that would run code (or build objects) when unpickled
        raise CheckpointError(
            f"{path} holds Python objects other than tensors, numbers, tuples and dicts, which lucidrl's RNG "
            "state files never do: it was altered or not written by lucidrl, and unpickling it could run code, "
            f"so it was not loaded; {way_out(path)} (if you trust it)"
        ) from None
    except Exception as exc:  # a truncated zip archive, an empty file, ...
        raise damaged(path, "the process's RNG state", exc) from exc
    if not (isinstance(rng, dict) and isinstance(rng.get("torch"), torch.Tensor) and "python" in rng):
        raise damaged(
            path, "the process's RNG state", ValueError("not a dict of 'torch' and 'python' states")
        )
    return rng


def check_saved_shapes(weights: Path, expected: dict[str, torch.Size], key: str = "model.path") -> None:
    """CheckpointError unless the safetensors files in `weights` (a HuggingFace folder with an index, as
    the checkpoint writer leaves it) hold every tensor of `expected` (name -> full shape) in that shape.

    Read from the file headers only. A model folder rebuilt at another size under the same `key`
    otherwise fails deep in torch.distributed.checkpoint with "Size mismatch" and no folder named.
    """
    from safetensors import safe_open

    index = weights / "model.safetensors.index.json"
    weight_map = read_json(index, "the weights' index").get("weight_map", {})
    saved: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(weight_map.values())):
        try:
            with safe_open(str(weights / file), "pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is no dict
                    saved[name] = tuple(f.get_slice(name).get_shape())
        except FileNotFoundError:
            raise missing(weights / file, "weights") from None
        except Exception as exc:  # safetensors' "invalid header length", "incomplete metadata", ...
            raise damaged(weights / file, "weights", exc) from exc
    wrong = [(n, saved.get(n), tuple(s)) for n, s in expected.items() if saved.get(n) != tuple(s)]
    if not wrong:
        return
    name, was, now = wrong[0]
    found = f"is {list(was)} in the checkpoint" if was is not None else "is not in the checkpoint"
    more = f" (and {len(wrong) - 1} more tensors differ)" if len(wrong) > 1 else ""
    raise CheckpointError(
        f"cannot resume from {weights.parent.parent}: its weights do not fit the model this run builds from "
        f"{key}: {name} {found} and {list(now)} in the model{more}. The model folder was replaced (another "
        f"size or architecture) since the checkpoint was saved; the checkpoint keeps its own copy in {weights}. "
        f"Put back the model the run started from, or start a new run from the checkpoint's weights "
        f"({key}={weights} with another trainer.experiment_name)"
    )


MANIFEST = "manifest.json"  # every file of a checkpoint, its size and sha256, written when the save ends
METADATA = ".metadata"  # torch.distributed.checkpoint's index of a role's state: a pickle


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file under `folder` (relative, '/'-separated, sorted), the manifest left out."""
    found = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != MANIFEST:
                found.append(rel)
    return sorted(found)


def write_manifest(folder: Path) -> None:
    """`folder`/manifest.json: the size and sha256 of every file in the checkpoint `folder`, which
    `verify_checkpoint` checks before anything of the checkpoint is read again."""
    files = {
        rel: {"size": (folder / rel).stat().st_size, "sha256": _sha256(folder / rel)}
        for rel in _files(folder)
    }
    (folder / MANIFEST).write_text(json.dumps({"version": 1, "files": files}, indent=1) + "\n")


def verify_checkpoint(path: Path) -> None:
    """CheckpointError, naming the file, unless every file of the checkpoint folder `path` is as its
    save wrote it (manifest.json: no file missing, added, resized or changed) and every `.metadata`
    holds DCP's metadata classes only. Run before any reader, torch's included, opens a file of it.

    A checkpoint written before lucidrl wrote manifests is resumed with a warning (its `.metadata`
    files are still checked)."""
    manifest = path / MANIFEST
    if manifest.is_file():
        _check_manifest(path, read_json(manifest, "the list of the checkpoint's files and their hashes"))
    else:
        log.warning(
            "%s has no %s (written by a lucidrl version before checkpoints had one): its files cannot be "
            "checked against what the save wrote; resuming it as it is",
            path,
            MANIFEST,
        )
    for metadata in sorted(path.rglob(METADATA)):
        check_dcp_metadata(metadata)


def _check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    ):
        raise damaged(
            path / MANIFEST,
            "the list of the checkpoint's files",
            ValueError("no 'files' of sizes and hashes"),
        )
    present = set(_files(path))
    for rel in sorted(present - set(files)):
        raise CheckpointError(
            f"checkpoint file {path / rel} is not one its save wrote (it is not in {path / MANIFEST}): a file "
            f"was added to the checkpoint after it was saved, and lucidrl reads no file it cannot check; "
            f"remove it, or {way_out(path)}"
        )
    for rel in sorted(files):  # sizes of all first (cheap), then the hashes
        if rel not in present:
            raise missing(path / rel, f"listed in {MANIFEST}")
        size = (path / rel).stat().st_size
        if size != files[rel]["size"]:
            raise _altered(path / rel, f"is {size} bytes and its save wrote {files[rel]['size']}")
    for rel in sorted(files):
        if _sha256(path / rel) != files[rel]["sha256"]:
            raise _altered(
                path / rel, f"has other contents than its save wrote (sha256 differs from {MANIFEST}'s)"
            )


def _altered(file: Path, how: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint file {file} {how}: it was truncated, altered or replaced after the save, so it was not "
        f"read; {way_out(file)}"
    )


class _ForeignGlobal(pickle.UnpicklingError):
    """A global that DCP's metadata never names (a function a crafted pickle would call)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds what torch.distributed.checkpoint writes to `.metadata` (its dataclasses, torch.Size,
    dtypes, paths) and refuses every other global: no function a crafted pickle names is called."""

    def find_class(self, module: str, name: str) -> Any:
        import torch.distributed.checkpoint.metadata as dcp_metadata

        if module == dcp_metadata.__name__ and isinstance(getattr(dcp_metadata, name, None), type):
            return getattr(dcp_metadata, name)
        if (module, name) in {
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"),
            ("pathlib", "WindowsPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "PureWindowsPath"),
            ("collections", "OrderedDict"),
        }:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.memory_format):
            return getattr(torch, name)
        raise _ForeignGlobal(f"{module}.{name}")


def check_dcp_metadata(file: Path) -> None:
    """CheckpointError naming `file` unless it is torch.distributed.checkpoint's metadata, read without
    calling anything but DCP's metadata classes (torch's own reader then unpickles it)."""
    import io

    from torch.distributed.checkpoint.metadata import Metadata

    what = "the index of the optimizer state and LR schedule (torch.distributed.checkpoint metadata)"
    try:
        value = _MetadataUnpickler(io.BytesIO(file.read_bytes())).load()
    except _ForeignGlobal as exc:
        raise CheckpointError(
            f"{file} is not torch.distributed.checkpoint metadata: it names global '{exc}', which unpickling "
            "would call, so it was not loaded (lucidrl's checkpoints never hold one: the file was altered or "
            f"not written by lucidrl); {way_out(file)}"
        ) from None
    except Exception as exc:  # EOFError of a truncated file, ...
        raise damaged(file, what, exc) from exc
    if not isinstance(value, Metadata):
        raise damaged(file, what, ValueError(f"a pickled {type(value).__name__}, not DCP's Metadata"))
