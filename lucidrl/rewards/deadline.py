"""Calling a reward function with a time limit (reward.timeout_s).

The call runs in a daemon thread and the caller waits at most `timeout_s` for it. Python cannot stop
a thread, so a call past its time is abandoned, not ended: it runs on in the background (a function
that never returns keeps its thread, and whatever CPU it spins, until the process ends), and the
next calls go to a fresh thread. A process would be stoppable, but would need the function and its
arguments to be picklable and would pay a process start; reward functions are mostly closures over
files loaded at import, and a timeout is a safety net, not a scheduler.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class RewardTimeout(Exception):
    """A reward call did not return within its time limit (it may still be running in its thread)."""


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


class DeadlineCaller:
    """Calls functions one at a time in a worker thread, each allowed `timeout_s` seconds."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.abandoned = 0  # calls past their time, perhaps still running
        self._calls: queue.Queue[_Call] | None = None

    def __call__(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """fn(**kwargs)'s value, or its exception raised here; RewardTimeout past the limit."""
        if self._calls is None:
            self._calls = queue.Queue()
            threading.Thread(target=_serve, args=(self._calls,), daemon=True, name="lucidrl-reward").start()
        call = _Call(fn, kwargs)
        self._calls.put(call)
        if not call.done.wait(self.timeout_s):
            self.abandoned += 1
            self._calls = None  # that thread is busy for who knows how long: the next call gets a new one
            raise RewardTimeout(f"no result within reward.timeout_s={self.timeout_s:g} s")
        if call.error is not None:
            raise call.error
        return call.value
