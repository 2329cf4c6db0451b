"""Checkpoints of RL and SFT runs: save every `trainer.save_freq` steps, resume where a run stopped
(`lucidrl export` turns one into a HuggingFace folder: trainer/export.py).

A checkpoint is `RUN_DIR/checkpoints/global_step_N/`:

    actor/, critic/        AdamW state and LR schedule (torch.distributed.checkpoint; every rank
                           writes its own shard, so FSDP2 never gathers to save)
    actor/model/           the weights as a HuggingFace folder (safetensors, config.json, tokenizer):
    critic/model/          `from_pretrained` and `lucidrl eval` load it as it is
    trainer_state.json     kind ("rl", or "sft": `lucidrl sft` saves its model as the actor),
                           step, loader position, generation rounds, KL coefficient
    rng.pt                 the trainer process's torch and Python RNG states
    rng/GROUP_rank_R.pt    each worker rank's, per worker group (with Ray, its own process; sampling draws from it)
    config.yaml            the config the run had when it saved
    manifest.json          every file above, its size and sha256 (written last)

It is written under a `.tmp` name and renamed when complete; `checkpoints/latest` names the newest
complete one, so a run killed mid-save resumes from the one before; a save that fails (a full disk)
removes its `.tmp` folder and says what to free (trainer/save_failure.py). Resuming restores all of the
above in every worker group, then refuses if a key that gives the saved state its meaning changed
(FROZEN_KEYS, SFT_FROZEN_KEYS) and lists the keys that changed otherwise. A file that cannot be read
is an error naming it and the earlier checkpoints (workers/training/checkpoint_files.py). Before any file
is read, every file is checked against manifest.json (a file missing, added, resized or changed is
refused, naming it) and each `.metadata` pickle is read with an unpickler that builds DCP's metadata
classes only, so a replaced one cannot run code when torch's reader unpickles it; RNG files are read as
tensors and numbers only, weights as safetensors.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml

from lucidrl.config import flat_keys
from lucidrl.models.saving import fsync_dir, fsync_tree
from lucidrl.trainer.save_failure import removed_on_failure
from lucidrl.workers.common.rng import process_rng_state
from lucidrl.workers.training.checkpoint_files import (
    damaged,
    missing,
    read_json,
    verify_checkpoint,
    write_manifest,
)
from lucidrl.workers.training.train_state import CheckpointError, check_train_state, restore_rng_file

log = logging.getLogger(__name__)

STATE = "trainer_state.json"
LATEST = "latest"
PREFIX = "global_step_"
# keys the saved state depends on: the weights' architecture, the data order, the batch arithmetic
FROZEN_KEYS = (
    "model.path",
    "model.tokenizer_path",
    "model.lora_rank",  # the adapters' shapes, and what their weights mean
    "model.lora_alpha",
    "model.target_modules",
    "critic.model_path",
    "data.train_files",
    "data.prompt_key",
    "data.max_prompt_length",  # with filter_overlong_prompts, which rows the loader keeps
    "data.filter_overlong_prompts",
    "data.train_batch_size",
    "data.shuffle",
    "data.seed",
    "rollout.n",
    "algorithm.adv_estimator",
    "trainer.seed",
)

# the same for `lucidrl sft`: the architecture, the rows and their order, the batch
SFT_FROZEN_KEYS = (
    "model.path",
    "model.tokenizer_path",
    "data.train_files",
    "data.prompt_key",
    "data.response_key",
    "data.max_length",
    "data.batch_size",
    "data.shuffle",
    "data.seed",
    "trainer.seed",
)
COMMANDS = {"rl": "lucidrl train", "sft": "lucidrl sft"}  # which command wrote a checkpoint, by its kind

# keys that differ between a run and its own resume by nature: not worth announcing
RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path", "trainer.overwrite")


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None when it has none."""
    root = checkpoints_dir(run_dir)
    pointer = root / LATEST
    if not pointer.is_file():
        # a first save killed between renaming its folder into place and writing `latest`: the folder is
        # complete (it is renamed only then), so it is the latest
        complete = [p for p in _step_folders(root) if (p / STATE).is_file()]
        if not complete:
            return None
        newest = max(complete, key=_step_of)
        log.warning(
            "%s: no %s pointer; %s is the newest complete checkpoint, pointing it there",
            root,
            LATEST,
            newest.name,
        )
        point_latest(newest)
        return newest
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        name = f"<unreadable: {type(exc).__name__}>"
    if not name.startswith(PREFIX) or "/" in name or "\\" in name or not name.removeprefix(PREFIX).isdigit():
        raise CheckpointError(
            f"{pointer} should hold the name of the newest checkpoint ({PREFIX}N) and holds {name[:60]!r}: it was "
            f"overwritten; write the newest complete one's name into it (among "
            f"{sorted(p.name for p in _step_folders(root))}), or delete it to have the newest found, or resume "
            "from one with trainer.resume_mode=resume_path and trainer.resume_from_path"
        )
    path = root / name
    replaced = path.with_name(path.name + ".old")
    if not path.exists() and (replaced / STATE).is_file():
        # a save of the same step killed between commit's two renames: the checkpoint it replaced comes back
        os.rename(replaced, path)
        log.warning("%s: restored from %s (a save of the same step was interrupted)", path, replaced.name)
    if not (path / STATE).is_file():
        raise CheckpointError(
            f"{pointer} names '{path.name}', which is not a complete checkpoint (no {STATE}); point it at "
            f"a complete one among {sorted(p.name for p in root.glob(PREFIX + '*') if p.is_dir())}, or resume "
            "from one of them with trainer.resume_mode=resume_path and trainer.resume_from_path"
        )
    return path


def check_checkpoint(path: str | Path, key: str = "trainer.resume_from_path") -> Path:
    """`path` as a complete checkpoint folder (or a run directory: its latest), else CheckpointError."""
    p = Path(path)
    if (p / STATE).is_file():
        return p
    if p.is_dir():
        found = latest_checkpoint(p)
        if found is not None:
            return found
    raise CheckpointError(
        f"{key}={str(path)!r} is not a checkpoint: expected a folder holding {STATE} (RUN_DIR/checkpoints/"
        f"{PREFIX}N) or a run directory with checkpoints/{LATEST}"
    )


def resume_point(cfg: Any, run_dir: Path) -> Path | None:
    """The checkpoint this run continues from, by trainer.resume_mode; None to start afresh."""
    t = cfg.trainer
    if t.resume_mode == "resume_path":
        return check_checkpoint(t.resume_from_path)
    if t.resume_mode == "auto" and not t.overwrite and Path(run_dir).is_dir():
        return latest_checkpoint(run_dir)
    return None


def resumes_in_place(resume: Path | None, run_dir: Path) -> bool:
    """Whether the run continues from a checkpoint of its own run directory (and so keeps its files)."""
    return resume is not None and Path(run_dir).resolve() in Path(resume).resolve().parents


def continue_from(run_dir: Path, path: Path, step: int) -> int:
    """Resuming `run_dir` from its checkpoint `path` at `step`: the steps after it are trained again, so
    their metrics.jsonl records go (returns how many), and `latest` points at `path`, also when a later
    checkpoint exists (trainer.resume_from_path to an earlier one): a run killed before its next save
    then resumes where its metrics end, not from the abandoned continuation."""
    if resumes_in_place(path, run_dir):
        point_latest(Path(path))
    return drop_metrics_after(run_dir, step)


def point_latest(final: Path) -> None:
    """checkpoints/latest names `final`, replaced atomically."""
    pointer = final.parent / LATEST
    tmp = pointer.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(final.name + "\n")
        f.flush()
        os.fsync(f.fileno())  # on disk before the name does (else `latest` may come back empty)
    os.replace(tmp, pointer)
    fsync_dir(pointer.parent)


def drop_metrics_after(run_dir: Path, step: int) -> int:
    """Remove metrics.jsonl records of steps after `step` (they are trained again); returns how many."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped, torn = [], 0, 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn += 1  # the last line of a process killed while writing it
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
        else:
            dropped += 1
    path.write_text("".join(line + "\n" for line in kept))
    if torn:
        log.warning("%s: dropped %d unreadable line(s) (a run killed while writing them)", path, torn)
    return dropped


def begin(run_dir: Path, step: int) -> Path:
    """A fresh temporary folder for step `step`'s checkpoint (a stale one from a killed save is removed)."""
    tmp = checkpoints_dir(run_dir) / f"{PREFIX}{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


@contextmanager
def writing(run_dir: Path, step: int) -> Iterator[Path]:
    """`begin`'s temporary folder, removed again when the block raises: a failed save (a full disk, a
    worker that died, a second Ctrl-C) leaves no half-written folder behind. Running out of space is
    a CheckpointError that says so, with the space free and needed (trainer/save_failure.py)."""
    with removed_on_failure(begin(run_dir, step), latest_name(run_dir)) as tmp:
        yield tmp


def latest_name(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names (not checked), or None."""
    pointer = checkpoints_dir(run_dir) / LATEST
    try:
        return pointer.parent / pointer.read_text().strip() if pointer.is_file() else None
    except OSError:
        return None


def commit(tmp: Path, keep: int | None) -> Path:
    """Rename the finished `tmp` into place, point `latest` at it, and keep the newest `keep` checkpoints."""
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    replaced = None
    if final.exists():  # the same step saved again after a resume: moved aside, not deleted, until the
        # new one is in place (a kill in between used to leave `latest` naming a deleted folder)
        replaced = final.with_name(final.name + ".old")
        if replaced.exists():
            shutil.rmtree(replaced)
        os.rename(final, replaced)
    write_manifest(tmp)  # the size and hash of every file, checked before a resume reads any
    fsync_tree(tmp)  # every shard on disk before the folder is complete by name
    os.rename(tmp, final)
    point_latest(final)
    if replaced is not None:
        shutil.rmtree(replaced)
    if keep is not None:
        # the newest `keep` up to this one; later steps are an abandoned continuation (a resume from
        # an earlier checkpoint retrains them), so they go too
        step = _step_of(final)
        others = _step_folders(final.parent)
        earlier = sorted((p for p in others if _step_of(p) < step), key=_step_of)
        later = [p for p in others if _step_of(p) > step]
        for old in earlier[: max(0, len(earlier) - (keep - 1))] + later:
            shutil.rmtree(old)
    return final


def _step_folders(root: Path) -> list[Path]:
    """The global_step_N folders in `root` (not .tmp or .old ones)."""
    return [p for p in root.glob(PREFIX + "*") if p.is_dir() and p.name.removeprefix(PREFIX).isdigit()]


def saved_steps(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of each complete checkpoint of a run, in step order (none: [])."""
    root = checkpoints_dir(Path(run_dir))
    return sorted((_step_of(p), p) for p in _step_folders(root)) if root.is_dir() else []


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix(PREFIX))


def saved_line(path: Path, seconds: float) -> str:
    """What a finished save prints: where, how big, how long."""
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
    return f"checkpoint {path} ({size:.1f} MiB) in {seconds:.1f} s"


def write_trainer_state(path: Path, state: dict[str, Any], config: dict[str, Any]) -> None:
    (path / STATE).write_text(json.dumps(state, indent=2) + "\n")
    (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    torch.save(process_rng_state(), path / "rng.pt")


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json (CheckpointError naming it when it is no such file)."""
    state = read_json(path / STATE, "the trainer's state")
    needed = ("global_step", "batches_drawn")
    if any(not isinstance(state.get(k), int) for k in needed):
        raise damaged(path / STATE, "the trainer's state", ValueError(f"no integer {' and '.join(needed)}"))
    return state


def read_config(path: Path) -> dict[str, Any]:
    """The config a checkpoint was saved with (its config.yaml)."""
    file = path / "config.yaml"
    if not file.is_file():
        raise missing(file, "the config the run saved with")
    try:
        config = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise damaged(file, "the config the run saved with", exc) from exc
    if not isinstance(config, dict):
        raise damaged(file, "the config the run saved with", ValueError("not a mapping of keys"))
    return config


def resumable(
    path: Path, config: dict[str, Any], *, kind: str = "rl"
) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """(trainer state, config changes worth announcing) of resuming a `kind` run ("rl" or "sft") from
    `path` with `config`; refuses (CheckpointError) another command's checkpoint, a file missing or
    unreadable, or a change to a key the saved state depends on. Every file is first checked against
    the checkpoint's manifest, before any reader opens it (verify_checkpoint)."""
    verify_checkpoint(path)
    state = read_state(path)
    saved = state.get("kind", "rl")
    if saved != kind:
        raise CheckpointError(
            f"{path} is a checkpoint of `{COMMANDS[saved]}`, and this is `{COMMANDS[kind]}`: resume it with "
            f"`{COMMANDS[saved]}`, or start from its weights with model.path={path / 'actor' / 'model'}"
        )
    for role in ("actor", "critic"):
        if role == "actor" or (path / role).exists():
            check_train_state(path / role)
    if not (path / "rng.pt").is_file():  # found now, before a worker group loads anything
        raise missing(path / "rng.pt", "the trainer process's RNG state")
    changes = config_changes(read_config(path), config)
    refuse_frozen_changes(changes, path, SFT_FROZEN_KEYS if kind == "sft" else FROZEN_KEYS)
    return state, {k: v for k, v in changes.items() if k not in RESUME_KEYS}


def restore_rng(path: Path) -> None:
    """This process's RNG states as the checkpoint saved them (read as tensors and numbers only)."""
    restore_rng_file(path / "rng.pt")


class _Missing:
    """Stands for a key one of the two configs lacks; printed as what that means."""

    def __init__(self, label: str):
        self.label = label

    def __repr__(self) -> str:
        return self.label


# a key added to lucidrl after the checkpoint was written, or one removed since
NOT_IN_CHECKPOINT = _Missing("<not in the checkpoint's config: it was written before the key existed>")
NO_LONGER_A_KEY = _Missing("<no longer a key>")


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between a checkpoint's config and this run's: key -> (saved, now).

    A key only one side has gets NOT_IN_CHECKPOINT or NO_LONGER_A_KEY on the other, not None: None is
    a value a key can have, and "None -> True" would say the checkpoint's run had the key set to None.
    """
    a, b = flat_keys(saved), flat_keys(current)
    return {
        k: (a.get(k, NOT_IN_CHECKPOINT), b.get(k, NO_LONGER_A_KEY))
        for k in sorted(set(a) | set(b))
        if k not in a or k not in b or a[k] != b[k]
    }


def refuse_frozen_changes(
    changes: dict[str, tuple[Any, Any]], path: Path, keys: tuple[str, ...] = FROZEN_KEYS
) -> None:
    frozen = {k: v for k, v in changes.items() if k in keys}
    if frozen:
        listed = "; ".join(f"{k}: {old!r} in the checkpoint, {new!r} now" for k, (old, new) in frozen.items())
        raise CheckpointError(
            f"cannot resume from {path}: {listed}. The saved weights, optimizer and data position belong to "
            "the old value; put it back, or start a new run (another trainer.experiment_name, or "
            "trainer.resume_mode=disable with trainer.overwrite=true)"
        )
