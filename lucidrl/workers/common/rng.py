"""This process's random number generators as one state: saved with checkpoints, set around a seeded call."""

from __future__ import annotations

import random
from typing import Any

import torch


def process_rng_state() -> dict[str, Any]:
    """This process's torch (CPU and CUDA) and Python RNG states."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    # every GPU's generator (a local run may sample on cuda:1 while cuda:0 is current), once CUDA is
    # in use; a resume on a host that shows fewer GPUs restores the ones it has
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def set_process_rng_state(rng: dict[str, Any]) -> None:
    """Put back what process_rng_state returned (load_rng_state reads it from a checkpoint file)."""
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        for index, state in enumerate(rng["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, index)
    random.setstate(rng["python"])
