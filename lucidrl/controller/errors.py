"""Errors from workers that reach the trainer with everything needed to act on them.

A worker never lets its exception cross the process boundary as a pickled object: an exception class
whose ``__init__`` takes two required arguments cannot be unpickled (Ray 2.60 then raises
UnserializableException, older Ray "Failed to unpickle serialized exception"), and the user sees
neither the type nor the message. Instead the worker sends plain strings — type name, message,
traceback, role, rank, host — and the trainer raises RemoteWorkerError from them. A user error (bad
config, data, model folder, reward output: diagnostics.errors.UserError) comes back as RemoteUserError,
which is a UserError too, so the command line prints its message alone, as it does in-process.
"""

from __future__ import annotations

import socket
import traceback
from dataclasses import dataclass

from lucidrl.diagnostics.errors import UserError


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
    user_error: bool = False  # the exception was a diagnostics.errors.UserError

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
            user_error=isinstance(exc, UserError),
        )

    @property
    def where(self) -> str:
        return f"raised in worker role={self.role} rank={self.rank} host={self.host} during '{self.method}'"

    def raise_(self) -> None:
        """Raise this failure on the trainer's side: RemoteUserError for a user error, else RemoteWorkerError."""
        raise (RemoteUserError if self.user_error else RemoteWorkerError)(self)


class RemoteWorkerError(RuntimeError):
    """An exception raised inside a worker: the original type, message, where, and its traceback."""

    def __init__(self, failure: RemoteFailure):
        self.failure = failure
        f = failure
        qual = f.type_name if f.module in ("builtins", "__main__") else f"{f.module}.{f.type_name}"
        super().__init__(f"{qual}: {f.message}\n  {f.where}\n  remote traceback:\n{_indent(f.traceback)}")

    def __reduce__(self):  # picklable with its single argument
        return (type(self), (self.failure,))

    @property
    def type_name(self) -> str:
        return self.failure.type_name


class RemoteUserError(RemoteWorkerError, UserError):
    """A user error raised inside a worker: its message and where, without the traceback, which only
    says where the bad input was noticed (LUCIDRL_DEBUG=1 adds it, as it does for local user errors)."""

    def __init__(self, failure: RemoteFailure):
        from lucidrl.diagnostics.debug import debug_enabled

        if debug_enabled():
            super().__init__(failure)
            return
        self.failure = failure  # the command line names the type: "error (ConfigError): ..."
        RuntimeError.__init__(self, f"{failure.message}\n  {failure.where}")


class WorkerDiedError(RuntimeError):
    """A worker process exited (killed, out of memory, segfault) while the trainer waited for it, or
    failed to start (`failed_to_start`: its constructor raised, e.g. lucidrl not importable there).
    `cause` is Ray's whole message: the exit type and detail (OOM, SIGSEGV, memory-monitor kill) or the
    constructor's exception are on its later lines."""

    def __init__(self, role: str, rank: int, method: str, cause: str, failed_to_start: bool = False):
        self.role, self.rank, self.method = role, rank, method
        self.failed_to_start = failed_to_start  # a restart (trainer.max_restarts) would fail the same way
        first, _, rest = cause.strip().partition("\n")
        detail = f"{first}\n{_indent(rest)}" if rest.strip() else first
        if failed_to_start:
            super().__init__(
                f"worker role={role} rank={rank} failed to start (the trainer was calling '{method}'): {detail}\n"
                "  (the worker process could not be created or its set-up raised: see the error above)"
            )
        else:
            super().__init__(
                f"worker role={role} rank={rank} died during '{method}': {detail}\n"
                "  (killed or out of memory? check the worker's log and `dmesg`; the run cannot continue "
                "without it)"
            )

    def __reduce__(self):
        return (_rebuild_died, (self.role, self.rank, self.method, str(self), self.failed_to_start))


def _rebuild_died(
    role: str, rank: int, method: str, text: str, failed_to_start: bool = False
) -> WorkerDiedError:
    err = WorkerDiedError.__new__(WorkerDiedError)
    err.role, err.rank, err.method, err.failed_to_start = role, rank, method, failed_to_start
    RuntimeError.__init__(err, text)
    return err


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())
