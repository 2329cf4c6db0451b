"""A run that outlives its Ray workers: when one dies, start the groups again and resume (trainer.max_restarts).

The controller notices a dead rank when it waits for it (WorkerDiedError, controller/errors.py): the
run's `with self.workers` block has then killed the other ranks (they may be stuck in a collective
with the dead one) and removed the placement groups. `fit_with_restarts` builds a new trainer,
which starts new worker groups and resumes from the run directory's latest checkpoint, exactly as
running the command again would (from the start when the run saved none), and trains on. Each
restart is printed with its cause; past the limit, the last death is raised with the restarts
before it listed.

Only a death is restarted: a rank that fails to start (its constructor raised, lucidrl missing on
the node) would fail the same way again, and an exception a worker raises is a bug or bad input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from lucidrl.config import LucidConfig
from lucidrl.controller.errors import WorkerDiedError
from lucidrl.trainer import checkpoint
from lucidrl.trainer.interrupt import RaiseOnSigterm
from lucidrl.trainer.ppo import PPOTrainer
from lucidrl.trainer.setup import run_dir_of


class RestartsExhaustedError(RuntimeError):
    """Workers died more often than trainer.max_restarts allows; the message lists every death."""


def restart_config(cfg: LucidConfig, run_dir: Path) -> LucidConfig:
    """The config of a restart: resume from the run directory's latest checkpoint, else from where the
    run first resumed (trainer.resume_from_path), else start again (the run dir holds no checkpoint)."""
    latest = checkpoint.latest_checkpoint(run_dir) if checkpoint.checkpoints_dir(run_dir).is_dir() else None
    t = cfg.trainer
    if latest is not None:
        trainer = dataclasses.replace(
            t, resume_mode="resume_path", resume_from_path=str(latest), overwrite=False
        )
    elif t.resume_mode == "resume_path":
        trainer = t
    else:
        trainer = dataclasses.replace(t, resume_mode="disable", resume_from_path=None, overwrite=True)
    return dataclasses.replace(cfg, trainer=trainer)


def _where_from(cfg: LucidConfig) -> str:
    t = cfg.trainer
    if t.resume_mode == "resume_path":
        return f"resuming from {t.resume_from_path}"
    return "starting again from step 0 (no checkpoint yet)"


def fit_with_restarts(
    cfg: LucidConfig,
    console: Console | None = None,
    make: Callable[[LucidConfig], PPOTrainer] = PPOTrainer,
) -> PPOTrainer:
    """Build, announce and fit a trainer; on a worker's death, up to trainer.max_restarts times, build
    another that resumes from the latest checkpoint. Returns the trainer that finished."""
    console = console or Console(highlight=False)
    deaths: list[str] = []
    limit = cfg.trainer.max_restarts
    attempt_cfg = cfg
    while True:
        trainer = None
        try:
            with RaiseOnSigterm():  # loading models and data: SIGTERM stops with a word, not silently
                trainer = make(attempt_cfg)
                trainer.announce()
            trainer.fit()
            return trainer
        except WorkerDiedError as died:
            if died.failed_to_start or not limit:
                raise
            when = f"in step {trainer.global_step}" if trainer is not None else "while the run was set up"
            deaths.append(f"{when}: {str(died).splitlines()[0]}")
            if len(deaths) > limit:
                listed = "\n".join(f"  {i + 1}. {d}" for i, d in enumerate(deaths))
                raise RestartsExhaustedError(
                    f"a worker died {len(deaths)} times, more than trainer.max_restarts={limit} allows; the "
                    f"last death:\n{died}\nall of them:\n{listed}\n(the run directory keeps its latest "
                    "checkpoint: running the same command again resumes from it)"
                ) from died
            attempt_cfg = restart_config(cfg, run_dir_of(cfg))
            console.print(
                f"[bold yellow]lucidrl: restart {len(deaths)} of {limit}[/bold yellow] "
                + escape(
                    f"(trainer.max_restarts): worker role={died.role} rank={died.rank} died during "
                    f"'{died.method}' {when}; the worker groups start again, {_where_from(attempt_cfg)}. "
                    f"Cause: {str(died).splitlines()[0]}"
                )
            )
