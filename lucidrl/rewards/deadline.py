"""Calling a reward function with a time limit (reward.timeout_s).

`ProcessCaller`, used wherever it can be: the function runs in a worker process, which loads it once
(from its file, by `reward.custom_function.path` and `.name`) and then scores sample after sample. A
call past its time is stopped: the worker and every process it started (its process group) are
killed, and the next call starts a new worker. A call that returns in time costs a round trip through
a pipe (its arguments and value are pickled); the worker's start does not count against a call's time.

`ThreadCaller`, the fallback for a function handed over as a Python object that cannot be pickled (a
lambda or a closure passed to RuleRewardManager directly, never one loaded from a file): Python cannot
stop a thread, so a call past its time is abandoned, not ended; it runs on in the background and the
next calls go to a fresh thread.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

START_TIMEOUT_S = 120.0  # for a worker to start and load the function (its module's imports included)


class RewardTimeout(Exception):
    """A reward call did not return within its time limit."""


class RemoteError(Exception):
    """The function raised in the worker process: its exception's type name, message and traceback."""

    def __init__(self, type_name: str, message: str, traceback_text: str):
        super().__init__(message)
        self.type_name, self.message, self.traceback_text = type_name, message, traceback_text


class RewardWorkerError(RuntimeError):
    """The worker process could not start, load the function, or answer (it died mid-call)."""


# ---- in a thread ---------------------------------------------------------------------------------


class _Call:
    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any]):
        self.fn, self.kwargs = fn, kwargs
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


def _serve(calls: queue.Queue[_Call]) -> None:
    while True:
        call = calls.get()
        try:
            call.value = call.fn(**call.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who decides
            call.error = exc
        call.done.set()


class ThreadCaller:
    """Calls `fn` one call at a time in a worker thread, each allowed `timeout_s` seconds; a call past
    it runs on in the background (abandoned, not stopped)."""

    stops_on_timeout = False
    on_timeout = "its call runs on in a background thread (the function cannot be pickled, so it cannot run in a process)"

    def __init__(self, fn: Callable[..., Any], timeout_s: float):
        self.fn, self.timeout_s = fn, timeout_s
        self.timed_out = 0  # calls past their time, perhaps still running
        self._calls: queue.Queue[_Call] | None = None

    def __call__(self, **kwargs: Any) -> Any:
        """fn(**kwargs)'s value, or its exception raised here; RewardTimeout past the limit."""
        if self._calls is None:
            self._calls = queue.Queue()
            threading.Thread(target=_serve, args=(self._calls,), daemon=True, name="lucidrl-reward").start()
        call = _Call(self.fn, kwargs)
        self._calls.put(call)
        if not call.done.wait(self.timeout_s):
            self.timed_out += 1
            self._calls = None  # that thread is busy for who knows how long: the next call gets a new one
            raise RewardTimeout(f"no result within reward.timeout_s={self.timeout_s:g} s")
        if call.error is not None:
            raise call.error
        return call.value

    def close(self) -> None:
        """Nothing to stop: an idle thread waits for calls, an abandoned one cannot be stopped."""


# ---- in a process --------------------------------------------------------------------------------


def _same(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


def _describe(e: BaseException) -> tuple[str, str, str]:
    return type(e).__name__, str(e), "".join(traceback.format_exception(type(e), e, e.__traceback__))


def _kill_group() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _watch_parent(parent: int) -> None:
    """In the worker: end it, and what it started, once the trainer is gone (killed, say, mid-call)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            _kill_group()


def _work(conn: Any, load: Callable[[], Callable[..., Any]], parent: int) -> None:
    """The worker process: load the function, then answer calls until the pipe closes."""
    os.setpgrp()  # its own process group: a kill on timeout reaches the processes the function started
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        fn = load()
    except BaseException as e:  # noqa: BLE001 - reported to the trainer
        conn.send(("error", _describe(e)))
        return
    conn.send(("ready", None))
    while True:
        try:
            kwargs = conn.recv()
        except (EOFError, OSError):  # the trainer closed its end
            return
        try:
            reply: tuple[str, Any] = ("ok", fn(**kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who decides
            reply = ("error", _describe(e))
        try:
            conn.send(reply)  # pickled before anything is written: a failure leaves the pipe clean
        except Exception as e:
            conn.send(
                (
                    "error",
                    (
                        "RewardOutputError",
                        f"returned {type(reply[1]).__name__} {reply[1]!r:.200}, which cannot be sent from "
                        f"the reward's worker process ({type(e).__name__}: {e}); return a float, a bool, or "
                        "a dict of them",
                        "",
                    ),
                )
            )


_LIVE: weakref.WeakSet[ProcessCaller] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # before multiprocessing's own exit handler, which would SIGTERM the worker only
    for caller in list(_LIVE):
        caller.close()


class ProcessCaller:
    """Calls the function `load()` returns in a worker process, one call at a time, each allowed
    `timeout_s` seconds; past it the worker and the processes it started are killed."""

    stops_on_timeout = True
    on_timeout = "it was stopped: its worker process (and every process it started) was killed"

    def __init__(self, load: Callable[[], Callable[..., Any]], timeout_s: float):
        self.load, self.timeout_s = load, timeout_s
        self.timed_out = 0  # calls killed past their time
        self.started = 0  # worker processes started (one, plus one after each kill)
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        """The worker process's id, while one runs."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no locks or threads forked mid-use
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=_work, args=(theirs, self.load, os.getpid()), name="lucidrl-reward", daemon=True
        )
        proc.start()
        theirs.close()
        self._proc, self._conn = proc, ours
        self.started += 1
        if not ours.poll(START_TIMEOUT_S):
            self._kill()
            raise RewardWorkerError(
                f"the reward function's worker process did not load it within {START_TIMEOUT_S:g} s"
            )
        try:
            kind, detail = ours.recv()
        except (EOFError, OSError) as e:
            code = proc.exitcode
            self._kill()
            raise RewardWorkerError(
                f"the reward function's worker process ended before loading it (exit code {code})"
            ) from e
        if kind == "error":
            self._kill()
            type_name, message, text = detail
            raise RewardWorkerError(
                f"the reward function could not be loaded in its worker process: {type_name}: {message}\n{text}"
            )

    def __call__(self, **kwargs: Any) -> Any:
        """fn(**kwargs)'s value; RemoteError if it raised; RewardTimeout past the limit (killed)."""
        with self._lock:
            if self._proc is None:
                self._start()
            self._conn.send(kwargs)
            if not self._conn.poll(self.timeout_s):
                self.timed_out += 1
                self._kill()
                raise RewardTimeout(f"no result within reward.timeout_s={self.timeout_s:g} s")
            try:
                kind, detail = self._conn.recv()
            except (EOFError, OSError) as e:  # it died mid-call: killed from outside, out of memory, os._exit
                code = self._proc.exitcode if self._proc is not None else None
                self._kill()
                raise RewardWorkerError(
                    f"the reward function's worker process died during the call (exit code {code}); "
                    "the next call starts a new one"
                ) from e
            if kind == "error":
                raise RemoteError(*detail)
            return detail

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own group
        except (ProcessLookupError, PermissionError):  # before its setpgrp, or gone already
            proc.kill()
        proc.join(10)
        conn.close()

    def close(self) -> None:
        """Stop the worker (and anything it left running)."""
        with self._lock:
            self._kill()


def make_caller(
    fn: Callable[..., Any], timeout_s: float, load: Callable[[], Callable[..., Any]] | None = None
) -> ProcessCaller | ThreadCaller:
    """A ProcessCaller of `load` (how a worker process gets `fn`: by default `fn` itself, pickled by
    reference), or a ThreadCaller of `fn` when that cannot be pickled."""
    load = load or functools.partial(_same, fn)
    try:
        pickle.dumps(load)
    except Exception:
        return ThreadCaller(fn, timeout_s)
    return ProcessCaller(load, timeout_s)
