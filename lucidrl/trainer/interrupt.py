"""Ctrl-C and SIGTERM during training: finish the step, save, say how to resume, exit 130 or 143.

Inside `StopSignals`, the first SIGINT or SIGTERM only sets a flag (and says so): the trainer ends
the step it is in, so no half-updated weights and no half-written checkpoint come of it, saves a
checkpoint (trainer.save_on_interrupt) and raises RunInterrupted, whose message says where the run
stopped and how to go on; the command line prints it and exits 128 + the signal's number, as a
shell expects. A second signal raises RunInterrupted at once, wherever the trainer is (a save in
progress removes its half-written folder on the way out).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int) -> str:
    return {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}.get(signum, f"signal {signum}")


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM: `exit_code` is 128 + the signal's number (130, 143), the
    message what was saved and how to continue. A KeyboardInterrupt, so code that lets Ctrl-C pass
    lets this pass too."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def _say(line: str) -> None:
    # os.write, not print: a handler runs between two bytecodes of the main thread, which may be
    # inside a write to the same buffered stream (a reentrant write raises RuntimeError there)
    os.write(2, f"\nlucidrl: {line}\n".encode())


class StopSignals:
    """While active (a `with` block in the main thread), SIGINT and SIGTERM ask the trainer to stop after
    the current step: `requested` holds the first one's number. A second one raises RunInterrupted at
    once. `doing()` says what the trainer is in the middle of, for the message the first one prints.
    Outside the main thread (where Python cannot take signals) it does nothing."""

    def __init__(
        self,
        doing: Callable[[], str] = lambda: "the current step",
        then: Callable[[], str] = lambda: "",
    ):
        self.doing = doing  # what is being done now
        self.then = then  # how to go on, for the message of a second signal
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in HANDLED}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            raise RunInterrupted(
                signum,
                f"{signal_name(signum)} again: stopped at once, in the middle of {self.doing()}, which is not "
                f"saved; {self.then()}",
            )
        self.requested = signum
        _say(
            f"{signal_name(signum)} received: finishing {self.doing()}, then saving and stopping "
            "(send it again to stop at once, without saving)"
        )


class RaiseOnSigterm:
    """Outside training (loading models, data), SIGTERM stops the command as Ctrl-C does (a
    RunInterrupted, exit 143), instead of killing it without a word."""

    def __enter__(self) -> RaiseOnSigterm:
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    @staticmethod
    def _handle(signum: int, frame: FrameType | None) -> None:
        raise RunInterrupted(
            signum, f"{signal_name(signum)}: stopped while the run was being set up; nothing was trained"
        )


def how_to_continue(latest: Path | None, resume_mode: str) -> str:
    """How a stopped run goes on from its newest checkpoint `latest` (None: it has none)."""
    if latest is None:
        return "no checkpoint was saved, so running the same command again starts from step 0"
    if resume_mode == "auto":
        return f"the newest checkpoint is {latest}: run the same command again to continue from it"
    return (
        f"the newest checkpoint is {latest}: to continue from it, run the same command with "
        f"trainer.resume_mode=resume_path trainer.resume_from_path={latest}"
    )


def stopped_message(signum: int, step: int, total: int, latest: Path | None, resume_mode: str) -> str:
    """What a run stopped by `signum` after `step` of `total` says: what was saved, how to continue."""
    said = f"{signal_name(signum)}: stopped after step {step} of {total}"
    if latest is None:
        return f"{said}; {how_to_continue(None, resume_mode)} (trainer.save_on_interrupt=false)"
    if latest.name != f"global_step_{step}":
        said += f" (step {step} is not saved)"
    return f"{said}; {how_to_continue(latest, resume_mode)}"
