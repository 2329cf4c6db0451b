"""Where metrics go (`trainer.logger`): the console, `metrics.jsonl` in the run directory, and the
trackers people already use — TensorBoard, Weights & Biases, MLflow (optional extras).

TensorBoard writes under RUN_DIR/tensorboard. W&B and MLflow take their usual settings from the
environment (WANDB_MODE, WANDB_API_KEY, MLFLOW_TRACKING_URI, ...); the project is
`trainer.project_name`, the run name `trainer.experiment_name`, and the config goes with the run.
Their run ids are kept in RUN_DIR/tracking_runs.json, so a run resumed in its own directory keeps
logging into the same W&B and MLflow runs.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import re
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from lucidrl.config import flat_keys, missing_logger_packages, to_dict
from lucidrl.diagnostics.errors import UserError

log = logging.getLogger(__name__)

# the few numbers worth a glance on each console line; everything is in metrics.jsonl
CONSOLE_KEYS = [
    ("critic/score/mean", "score"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad"),
    ("critic/vf_loss", "vf_loss"),
    ("response_length/mean", "resp_len"),
    ("critic/groups_with_mixed_scores", "mixed"),
    ("reward/failed", "reward_failed"),  # reward.on_error mask or zero: samples whose reward failed
    ("timing_s/step", "s/step"),
]


def _fmt(v: float) -> str:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return f"{v:.4g}"


IDS_FILE = "tracking_runs.json"

# how a run ended, as the trackers are told (Tracker.close)
FINISHED, FAILED, INTERRUPTED = "finished", "failed", "interrupted"


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a tracker can plot: numbers (NaN kept: it is news), not None or text."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class _TensorBoard:
    def __init__(self, run_dir: Path, resumed_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        # after a resume, events of the steps trained again are dropped from the old files
        purge = resumed_step + 1 if resumed_step is not None else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        self.where = f"TensorBoard: {run_dir / 'tensorboard'}"

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, outcome: str, exit_code: int) -> None:
        self.writer.close()


class _Wandb:
    def __init__(
        self, run_dir: Path, ids: dict[str, str], project: str, experiment: str, config: dict | None
    ):
        import wandb

        try:
            self.run = wandb.init(
                project=project,
                name=experiment,
                id=ids.get("wandb"),
                resume="allow" if ids.get("wandb") else None,
                config=config,
                dir=str(run_dir),
                reinit="create_new",  # a second trainer in one process gets its own run, not the last one
            )
        except (wandb.errors.UsageError, wandb.errors.AuthenticationError) as exc:
            # no login on this machine, or a key W&B refuses: said before any step, with the ways out
            raise UserError(
                f"trainer.logger has wandb, but W&B would not start a run: {exc} "
                f"({type(exc).__name__}). Log in once with `wandb login` or set WANDB_API_KEY; or set "
                f"WANDB_MODE=offline to log under {run_dir / 'wandb'} and `wandb sync` it later; or take "
                "wandb out of trainer.logger"
            ) from exc
        ids["wandb"] = self.run.id
        self.where = f"W&B run {self.run.id} ({getattr(self.run, 'url', None) or 'offline'})"

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step, commit=True)  # a step is complete when the trainer logs it

    def close(self, outcome: str, exit_code: int) -> None:
        if outcome == INTERRUPTED:  # stopped by a signal after saving: to be resumed, not failed
            self.run.mark_preempting()
        self.run.finish(exit_code=exit_code)


# MLflow refuses metric names outside these characters, and names that are not normalised paths
_MLFLOW_NAME = re.compile(r"[^\w\-. :/]")


def mlflow_metric_name(key: str) -> str:
    """`key` as a name MLflow accepts ("val//acc" -> "val/acc", "a/../b" -> "b"; "@" is "_at_", as verl
    writes it, so mean@4 does not become the name of another metric)."""
    name = posixpath.normpath(_MLFLOW_NAME.sub("_", key.replace("@", "_at_"))).strip("/")
    return name if name not in ("", ".", "..") else "_"


class _MLflow:
    """Logs through MlflowClient with an explicit run id: no process-wide active run to collide with."""

    def __init__(self, ids: dict[str, str], project: str, experiment: str, config: dict | None):
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.client = client = MlflowClient()
        run_id = ids.get("mlflow")
        if run_id is not None:
            try:
                stage = client.get_run(run_id).info.lifecycle_stage
            except MlflowException as exc:
                stage = f"not in the store ({exc.error_code})"
            if stage != "active":  # a deleted run is still found, and refuses to be set RUNNING again
                log.warning(
                    "MLflow run %s (RUN_DIR/%s) in the tracking store %s is %s: logging to a new run",
                    run_id,
                    IDS_FILE,
                    client.tracking_uri,
                    stage,
                )
                run_id = None
        if run_id is None:
            found = client.get_experiment_by_name(project)
            if found is not None and found.lifecycle_stage == "deleted":
                raise RuntimeError(
                    f"MLflow experiment {project!r} (trainer.project_name) is deleted in {client.tracking_uri}: "
                    "restore it (mlflow experiments restore), delete it for good (mlflow gc), or set another "
                    "trainer.project_name"
                )
            experiment_id = found.experiment_id if found else client.create_experiment(project)
            run_id = client.create_run(experiment_id, run_name=experiment).info.run_id
            if config is not None:
                params = [Param(k, str(v)[:6000]) for k, v in flat_keys(config).items()]
                for start in range(0, len(params), 100):  # MLflow takes at most 100 params a call
                    client.log_batch(run_id, params=params[start : start + 100])
        else:
            client.update_run(run_id, status="RUNNING")
        self.run_id = ids["mlflow"] = run_id
        self.where = f"MLflow run {run_id} at {client.tracking_uri}"
        self.collisions: set[tuple[str, str]] = set()  # metric pairs sharing a name, warned once

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        first: dict[str, str] = {}  # MLflow name -> the first metric logged under it this step
        batch = []
        for key, value in metrics.items():
            name = mlflow_metric_name(key)
            if first.setdefault(name, key) != key and (first[name], key) not in self.collisions:
                self.collisions.add((first[name], key))
                log.warning(
                    "metrics %r and %r have one MLflow name %r: MLflow holds both values under it",
                    first[name],
                    key,
                    name,
                )
            batch.append(Metric(name, value, now, step))
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def close(self, outcome: str, exit_code: int) -> None:
        status = {FINISHED: "FINISHED", FAILED: "FAILED", INTERRUPTED: "KILLED"}[outcome]
        self.client.set_terminated(self.run_id, status=status)


class Tracker:
    """Writes every metric dict to the chosen backends (`trainer.logger`)."""

    def __init__(
        self,
        backends: list[str],
        run_dir: Path,
        console: Console | None = None,
        console_keys: list[tuple[str, str]] | None = None,
        *,
        project: str = "lucidrl",
        experiment: str = "run",
        config: dict | None = None,
        resumed_step: int | None = None,
    ):
        """`resumed_step`: the run continues in `run_dir` after that step, so W&B and MLflow continue the
        runs they logged to and TensorBoard drops its events of later steps (they are trained again).

        Use it as a context manager around training: a run that raises is marked failed in W&B and MLflow,
        one stopped by Ctrl-C or SIGTERM (which saves first) preempting in W&B and KILLED in MLflow.
        """
        self.backends = backends
        self.console_keys = console_keys or CONSOLE_KEYS
        self.console = console or Console(highlight=False)
        self.jsonl = open(run_dir / "metrics.jsonl", "a") if "jsonl" in backends else None  # noqa: SIM115
        missing = missing_logger_packages(backends)  # a config built without load_config
        if missing:
            raise RuntimeError("; ".join(missing))
        ids_path = Path(run_dir) / IDS_FILE
        resuming = resumed_step is not None
        ids = json.loads(ids_path.read_text()) if resuming and ids_path.is_file() else {}
        self.external: list[Any] = []
        try:
            if "tensorboard" in backends:
                self.external.append(_TensorBoard(Path(run_dir), resumed_step))
            if "wandb" in backends:
                self.external.append(_Wandb(Path(run_dir), ids, project, experiment, config))
            if "mlflow" in backends:
                self.external.append(_MLflow(ids, project, experiment, config))
        except BaseException:
            # one that fails to start leaves no other open: the W&B run marked failed, files closed, and
            # the ids of the runs already created kept for the next start to continue
            if ids:
                ids_path.write_text(json.dumps(ids, indent=2) + "\n")
            self.close(FAILED)
            raise
        if ids:
            ids_path.write_text(json.dumps(ids, indent=2) + "\n")
        for tracker in self.external:
            self.console.print(f"[dim]lucidrl:[/dim] logging to {escape(tracker.where)}")

    @classmethod
    def for_run(
        cls, cfg, run_dir: Path, resumed_step: int | None, console_keys: list[tuple[str, str]] | None = None
    ) -> Tracker:
        """The tracker of a `lucidrl train` or `lucidrl sft` run: its trainer.logger, names and config."""
        t = cfg.trainer
        return cls(
            t.logger,
            run_dir,
            console_keys=console_keys,
            project=t.project_name,
            experiment=t.experiment_name,
            config=to_dict(cfg),
            resumed_step=resumed_step,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.jsonl is not None:
            record = {
                "step": step,
                # strict JSON has no NaN or infinity: both are null (the other backends get the numbers)
                **{
                    k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in metrics.items()
                },
            }
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        numbers = _numbers(metrics) if self.external else {}
        for tracker in self.external:
            tracker.log(numbers, step)
        if "console" in self.backends:
            val = {k: v for k, v in metrics.items() if k.startswith("val/")}
            train = [f"{short}={_fmt(metrics[k])}" for k, short in self.console_keys if k in metrics]
            if train:
                self.console.print(f"[bold]step {step}[/bold]  " + "  ".join(train))
            if val:
                self.console.print(
                    f"[cyan]validation @ step {step}[/cyan]  "
                    + "  ".join(f"{k[4:]}={_fmt(v)}" for k, v in sorted(val.items()))
                )

    def close(self, outcome: str = FINISHED, exit_code: int | None = None) -> None:
        """Close every backend, telling W&B and MLflow how the run ended: FINISHED, FAILED, or INTERRUPTED
        (Ctrl-C or SIGTERM: W&B's run marked preempting, MLflow's KILLED). `exit_code`: the process's,
        for W&B (default 0 when finished, else 1)."""
        if exit_code is None:
            exit_code = 0 if outcome == FINISHED else 1
        if self.jsonl is not None and not self.jsonl.closed:
            self.jsonl.close()
        for tracker in self.external:
            tracker.close(outcome, exit_code)
        self.external = []

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close(FINISHED)
        elif issubclass(exc_type, KeyboardInterrupt):  # interrupt.RunInterrupted is one
            self.close(INTERRUPTED, getattr(exc, "exit_code", 130))
        else:
            self.close(FAILED)
