"""How far a slow reward scoring has got, on the console while it runs.

A step's console line comes when the step ends; a reward function that takes seconds per sample (a
sandbox, a judge, a hang) left the run silent for minutes. Once a scoring has run `delay_s`, a line
says how many samples are scored and how long the current one has taken, then again every
`every_s`: from a timer thread, so a sample that never returns is seen too.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape


class ScoringProgress:
    """The reward manager's `progress`: begin(total) when a batch's scoring starts, advance(done) after
    each sample, end() when it is over."""

    def __init__(self, console: Console, delay_s: float = 10.0, every_s: float = 30.0):
        self.console, self.delay_s, self.every_s = console, delay_s, every_s
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self.lines = 0  # printed so far (tests read it)

    def begin(self, total: int) -> None:
        now = time.perf_counter()
        with self._lock:
            self.total, self.done, self.started, self.sample_started = total, 0, now, now
        self._stop = threading.Event()
        threading.Thread(target=self._tick, args=(self._stop,), daemon=True, name="lucidrl-progress").start()

    def advance(self, done: int) -> None:
        with self._lock:
            self.done, self.sample_started = done, time.perf_counter()

    def end(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _tick(self, stop: threading.Event) -> None:
        wait = self.delay_s
        while not stop.wait(wait):
            self.console.print(f"[dim]lucidrl:[/dim] {escape(self.line())}")
            self.lines += 1
            wait = self.every_s

    def line(self) -> str:
        with self._lock:
            now = time.perf_counter()
            text = f"scoring rewards: {self.done}/{self.total} samples in {now - self.started:.0f} s"
            if self.done < self.total:
                text += f"; sample {self.done + 1} running for {now - self.sample_started:.0f} s"
        return text


def show_scoring_progress(reward: Any, console: Console) -> None:
    """Give the rule reward manager of `reward` (itself, or a reward-model scorer's rule) a progress line."""
    rule = getattr(reward, "rule", reward)
    if hasattr(rule, "progress"):
        rule.progress = ScoringProgress(console)
