"""RUN_DIR/run_status.json: whether the run in a folder is running, finished, failed or was interrupted.

Written when a run starts (running, with its process id and host), and when it ends. A run killed
(SIGKILL, out of memory, a lost machine) leaves "running" behind with a process that no longer
exists: that is how a re-run tells a crashed run, which it may start again, from a finished one,
which it must not overwrite unasked, and from one still running in the same folder, which it must
never touch.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATUS = "run_status.json"
ENDED = ("finished", "failed", "interrupted")


def _start_time(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (Linux), to tell it from a later process
    that got the same id; None where /proc does not say."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def read(run_dir: Path) -> dict[str, Any] | None:
    """The status a run left in `run_dir`, or None (none written, or unreadable: a write cut short)."""
    try:
        status = json.loads((Path(run_dir) / STATUS).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def write(run_dir: Path, state: str, **info: Any) -> None:
    """Record `state` (running, finished, failed, interrupted) for this process, replacing the file whole."""
    path = Path(run_dir) / STATUS
    status = {
        "state": state,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "process_start": _start_time(os.getpid()),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **info,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, indent=2) + "\n")
    os.replace(tmp, path)


def running_elsewhere(status: dict[str, Any] | None) -> str | None:
    """'pid N on HOST since T' when `status` says running and that process, not this one, still runs
    (on another host it cannot be checked: assumed running); else None."""
    if not status or status.get("state") != "running":
        return None
    pid, host = status.get("pid"), status.get("host")
    if pid == os.getpid() and host == socket.gethostname():
        return None  # this process: a restart after a dead worker (trainer/restart.py)
    where = f"pid {pid} on {host} since {status.get('time', '?')}"
    if host != socket.gethostname():
        return where + " (another host: lucidrl cannot see whether it still runs)"
    if not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process: it exists
        return where
    started = status.get("process_start")
    return where if started is None or started == _start_time(pid) else None


def crashed(status: dict[str, Any] | None) -> bool:
    """Whether `status` is a run that ended without finishing: failed, interrupted, or killed while running."""
    if not status:
        return False
    return status.get("state") in ("failed", "interrupted") or (
        status.get("state") == "running" and running_elsewhere(status) is None
    )


@contextmanager
def recorded(run_dir: Path, step: Callable[[], int]) -> Iterator[None]:
    """Around a run's training: "running" now; "finished", "interrupted" (Ctrl-C, SIGTERM) or "failed"
    (with the error) when the block ends, each with the step reached."""
    write(run_dir, "running", step=step())
    try:
        yield
    except KeyboardInterrupt:  # trainer/interrupt.py's RunInterrupted is one
        write(run_dir, "interrupted", step=step())
        raise
    except BaseException as exc:
        write(run_dir, "failed", step=step(), error=f"{type(exc).__name__}: {str(exc)[:500]}")
        raise
    write(run_dir, "finished", step=step())
