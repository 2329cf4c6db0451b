"""One trained model's full training state (weights, AdamW state, LR schedule) in a checkpoint folder.

torch.distributed.checkpoint (DCP) writes it: with FSDP2 every rank saves and loads its own shards,
with DDP or one process the same calls write whole tensors. `trainer/checkpoint.py` lays the folders
out and decides when to save and what to resume.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A checkpoint cannot be found, read, or resumed with this config; the message says which and why."""


@contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group; one process is what the local backend means."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def save_train_state(model: torch.nn.Module, optimizer, scheduler, path: Path, extra: dict[str, Any]) -> None:
    """Weights, optimizer and schedule of one trained model, each rank its own shard (collective).

    An optimizer that has not stepped yet (the actor during critic.warmup_steps) is saved as absent:
    asking torch for its state dict would create the state with a zero-gradient step, and the first
    real update would then be AdamW's second.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    has_optim = bool(optimizer.state)
    state = {
        "model": get_model_state_dict(model),
        "scheduler": scheduler.state_dict(),
        "extra": {**extra, "has_optim": has_optim},
    }
    if has_optim:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    with _single_process_quiet():
        dcp.save(state, checkpoint_id=str(path))


def load_train_state(model: torch.nn.Module, optimizer, scheduler, path: Path, extra: dict[str, Any]) -> dict:
    """The inverse of save_train_state, into modules built as the run builds them; returns `extra` filled."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if not (path / ".metadata").is_file():
        raise CheckpointError(f"checkpoint folder {path} is missing or incomplete (no .metadata)")
    state: dict[str, Any] = {
        "model": get_model_state_dict(model),
        "scheduler": scheduler.state_dict(),
        "extra": {**extra, "has_optim": False},
    }
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=str(path))  # strict: a weight the checkpoint lacks is an error
        set_model_state_dict(model, state["model"])
        scheduler.load_state_dict(state["scheduler"])
        if state["extra"].pop("has_optim"):
            # partial: a parameter that had no gradient before the save has no AdamW state in it
            optim = {"optim": get_optimizer_state_dict(model, optimizer)}
            dcp.load(optim, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True))
            set_optimizer_state_dict(model, optimizer, optim["optim"])
    return state["extra"]


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Only the weights of a train-state folder, into a plain (unsharded) module: for export."""
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=str(path))
    model.load_state_dict(state["model"])
