"""Errors from workers that reach the trainer with everything needed to act on them.

A worker never lets its exception cross the process boundary as a pickled object: an exception class
whose ``__init__`` takes two required arguments cannot be unpickled (Ray 2.60 then raises
UnserializableException, older Ray "Failed to unpickle serialized exception"), and the user sees
neither the type nor the message. Instead the worker sends plain strings — type name, message,
traceback, role, rank, host — and the trainer raises RemoteWorkerError from them.
"""

from __future__ import annotations

import socket
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class RemoteFailure:
    """What a worker sends back instead of its exception (strings only: always picklable)."""

    type_name: str
    module: str
    message: str
    traceback: str
    role: str
    rank: int
    host: str
    method: str

    @classmethod
    def capture(cls, exc: BaseException, *, role: str, rank: int, method: str) -> RemoteFailure:
        try:
            message = str(exc)
        except Exception as e:  # an exception whose __str__ itself fails
            message = f"<str() of the exception failed: {e!r}>"
        return cls(
            type_name=type(exc).__qualname__,
            module=type(exc).__module__,
            message=message,
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            role=role,
            rank=rank,
            host=socket.gethostname(),
            method=method,
        )


class RemoteWorkerError(RuntimeError):
    """An exception raised inside a worker: the original type, message, where, and its traceback."""

    def __init__(self, failure: RemoteFailure):
        self.failure = failure
        f = failure
        qual = f.type_name if f.module in ("builtins", "__main__") else f"{f.module}.{f.type_name}"
        super().__init__(
            f"{qual}: {f.message}\n"
            f"  raised in worker role={f.role} rank={f.rank} host={f.host} during '{f.method}'\n"
            f"  remote traceback:\n{_indent(f.traceback)}"
        )

    def __reduce__(self):  # picklable with its single argument
        return (type(self), (self.failure,))

    @property
    def type_name(self) -> str:
        return self.failure.type_name


class WorkerDiedError(RuntimeError):
    """A worker process exited (killed, out of memory, segfault) while the trainer waited for it."""

    def __init__(self, role: str, rank: int, method: str, cause: str):
        self.role, self.rank, self.method = role, rank, method
        super().__init__(
            f"worker role={role} rank={rank} died during '{method}': {cause}\n"
            f"  (killed or out of memory? check the worker's log and `dmesg`; the run cannot continue without it)"
        )

    def __reduce__(self):
        return (_rebuild_died, (self.role, self.rank, self.method, str(self)))


def _rebuild_died(role: str, rank: int, method: str, text: str) -> WorkerDiedError:
    err = WorkerDiedError.__new__(WorkerDiedError)
    err.role, err.rank, err.method = role, rank, method
    RuntimeError.__init__(err, text)
    return err


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())
