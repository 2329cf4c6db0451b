"""LUCIDRL_DEBUG=1: print batch shapes and devices at every hop of the step."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lucidrl.batch import Batch


def debug_enabled() -> bool:
    return os.environ.get("LUCIDRL_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def debug_hop(hop: str, batch: Batch) -> None:
    """One block per hop (e.g. "rollout.generate → trainer") when LUCIDRL_DEBUG is set."""
    if debug_enabled():
        print(f"[lucidrl debug] {hop}\n{batch.describe()}", file=sys.stderr, flush=True)
