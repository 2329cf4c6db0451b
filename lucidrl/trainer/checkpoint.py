"""RL checkpoints: save every `trainer.save_freq` steps, resume where a run stopped, export to HuggingFace.

A checkpoint is `RUN_DIR/checkpoints/global_step_N/`:

    actor/, critic/        torch.distributed.checkpoint folders: weights, AdamW state, LR schedule
                           (every rank writes its own shard, so FSDP2 never gathers to save)
    trainer_state.json     step, loader position, generation rounds, KL coefficient
    rng.pt                 the trainer process's torch and Python RNG states
    config.yaml            the config the run had when it saved

It is written under a `.tmp` name and renamed when complete; `checkpoints/latest` names the newest
complete one, so a run killed mid-save resumes from the one before. Resuming restores all of the
above in every worker group, then refuses if a key that gives the saved state its meaning changed
(FROZEN_KEYS) and lists the keys that changed otherwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from lucidrl.workers.train_state import CheckpointError

STATE = "trainer_state.json"
LATEST = "latest"
PREFIX = "global_step_"
# keys the saved state depends on: the weights' architecture, the data order, the batch arithmetic
FROZEN_KEYS = (
    "model.path",
    "data.train_files",
    "data.train_batch_size",
    "data.shuffle",
    "data.seed",
    "rollout.n",
    "algorithm.adv_estimator",
    "trainer.seed",
)

# keys that differ between a run and its own resume by nature: not worth announcing
RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path", "trainer.overwrite")


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None when it has none."""
    root = checkpoints_dir(run_dir)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not (path / STATE).is_file():
        raise CheckpointError(
            f"{pointer} names '{path.name}', which is not a complete checkpoint (no {STATE}); point it at "
            f"a complete one among {sorted(p.name for p in root.glob(PREFIX + '*') if p.is_dir())}, or set "
            "trainer.resume_mode=disable with trainer.overwrite=true to start over"
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


def drop_metrics_after(run_dir: Path, step: int) -> int:
    """Remove metrics.jsonl records of steps after `step` (they are trained again); returns how many."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def begin(run_dir: Path, step: int) -> Path:
    """A fresh temporary folder for step `step`'s checkpoint (a stale one from a killed save is removed)."""
    tmp = checkpoints_dir(run_dir) / f"{PREFIX}{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit(tmp: Path, keep: int | None) -> Path:
    """Rename the finished `tmp` into place, point `latest` at it, and keep the newest `keep` checkpoints."""
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    if final.exists():  # the same step saved again after a resume
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer = final.parent / LATEST
    pointer.with_suffix(".tmp").write_text(final.name + "\n")
    os.replace(pointer.with_suffix(".tmp"), pointer)
    if keep is not None:
        done = sorted(
            (p for p in final.parent.glob(PREFIX + "*") if p.is_dir() and not p.name.endswith(".tmp")),
            key=lambda p: int(p.name.removeprefix(PREFIX)),
        )
        for old in done[:-keep]:
            shutil.rmtree(old)
    return final


def write_trainer_state(path: Path, state: dict[str, Any], config: dict[str, Any]) -> None:
    (path / STATE).write_text(json.dumps(state, indent=2) + "\n")
    (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, path / "rng.pt")


def read_state_and_config(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer state, saved config) of a checkpoint."""
    return json.loads((path / STATE).read_text()), yaml.safe_load((path / "config.yaml").read_text())


def read_trainer_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer state, saved config) of a checkpoint; restores the RNG states of this process."""
    state, config = read_state_and_config(path)
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return state, config


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between a checkpoint's config and this run's: key -> (saved, now)."""
    a, b = _flatten(saved), _flatten(current)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def refuse_frozen_changes(changes: dict[str, tuple[Any, Any]], path: Path) -> None:
    frozen = {k: v for k, v in changes.items() if k in FROZEN_KEYS}
    if frozen:
        listed = "; ".join(f"{k}: {old!r} in the checkpoint, {new!r} now" for k, (old, new) in frozen.items())
        raise CheckpointError(
            f"cannot resume from {path}: {listed}. The saved weights, optimizer and data position belong to "
            "the old value; put it back, or start a new run (another trainer.experiment_name, or "
            "trainer.resume_mode=disable with trainer.overwrite=true)"
        )


def export_checkpoint(path: str | Path, out: str | Path) -> Path:
    """A HuggingFace folder of a checkpoint's actor: the run's model.path architecture, the saved weights."""
    from lucidrl.config import config_from_dict
    from lucidrl.models import load_model, load_tokenizer
    from lucidrl.models.loading import DTYPES
    from lucidrl.models.saving import save_hf_folder
    from lucidrl.workers.train_state import load_weights

    ckpt = check_checkpoint(path, key="CHECKPOINT")
    cfg = config_from_dict(
        yaml.safe_load((ckpt / "config.yaml").read_text()), source=str(ckpt / "config.yaml")
    )
    m = cfg.model
    model = load_model(m.path, dtype=DTYPES[m.dtype], trust_remote_code=m.trust_remote_code)
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, pad_token=m.pad_token)
    load_weights(model, ckpt / "actor")
    return save_hf_folder(model, tokenizer, out)
