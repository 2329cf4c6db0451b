"""What a checkpoint save that failed for want of disk space says: where, how much is free, what to do.

A full disk shows up in many forms: `OSError: [Errno 28] No space left on device` from
torch.distributed.checkpoint, `RuntimeError: ... unexpected pos 704 vs 598` from torch.save's zip
writer (no errno at all), the same text from a Ray worker inside a RemoteWorkerError. So the error
chain is searched for ENOSPC and its text, and the free space of the run's filesystem is measured
while the half-written folder still takes its room.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lucidrl.workers.training.checkpoint_files import CheckpointError, cause_of

MiB = 2**20
# less than this free after a failed write: the write failed for want of space whatever it said
NEARLY_FULL = 4 * MiB


def folder_size(path: Path) -> int:
    """Bytes of the files under `path` (0 when it is gone)."""
    try:
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return 0


def _says_no_space(exc: BaseException) -> bool:
    """ENOSPC (or a quota) anywhere in `exc`'s chain, or in the ranks' errors torch.distributed.checkpoint's
    CheckpointException holds, or its text in a message (a Ray worker's error arrives as text)."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
        failures = getattr(e, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) else failure
                if isinstance(inner, BaseException):
                    todo.append(inner)
    return False


def save_failed(tmp: Path, exc: BaseException, latest: Path | None) -> CheckpointError | None:
    """The CheckpointError for a save into `tmp` that raised `exc` for want of space, else None (the
    caller re-raises `exc`). `latest`: the newest complete checkpoint, which the failure leaves as is."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):  # not the disk's doing
        return None
    try:
        free = shutil.disk_usage(tmp.parent).free
    except OSError:
        free = None
    if not _says_no_space(exc) and (free is None or free >= NEARLY_FULL):
        return None
    written = folder_size(tmp)
    before = folder_size(latest) if latest is not None else 0
    needed = (
        f"the last checkpoint took {before / MiB:.1f} MiB"
        if before
        else f"{written / MiB:.1f} MiB were written"
    )
    resume = (
        f"{latest} is still the newest complete checkpoint: free space, then run the same command again to "
        "continue from it"
        if latest is not None
        else "there is no complete checkpoint yet: free space, then run the same command again"
    )
    return CheckpointError(
        f"saving {tmp.name.removesuffix('.tmp')} failed: no space left on the device holding "
        f"{tmp.parent} ({'unknown' if free is None else f'{free / MiB:.1f} MiB'} free; {needed}). "
        f"The half-written {tmp} was removed; {resume}. Lower trainer.max_ckpt_to_keep, or move "
        f"trainer.run_dir to a larger disk. ({cause_of(exc)})"
    )


@contextmanager
def removed_on_failure(tmp: Path, latest: Path | None) -> Iterator[Path]:
    """Around writing the folder `tmp` (renamed into place when complete): when the block raises,
    `tmp` is removed, so no half-written folder stays behind, and running out of space is a
    CheckpointError that says so (save_failed); any other error is raised as it was."""
    try:
        yield tmp
    except BaseException as exc:
        error = save_failed(tmp, exc, latest)  # measured while the half-written folder takes its room
        shutil.rmtree(tmp, ignore_errors=True)
        if error is None:
            raise
        raise error from exc
