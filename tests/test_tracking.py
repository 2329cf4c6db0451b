"""trainer.logger: TensorBoard, W&B (offline) and MLflow (a local sqlite store) get what metrics.jsonl
gets, and a run resumed in its own directory keeps logging into the same W&B and MLflow runs."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from lucidrl.config import ConfigError, SFTConfig, load_config
from lucidrl.diagnostics.errors import UserError
from lucidrl.trainer.sft import SFTTrainer
from lucidrl.trainer.tracking import IDS_FILE, Tracker


@pytest.fixture
def trackers_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


def _sft(tmp_path, kk_data, tiny_model, steps: int, *extra: str) -> SFTTrainer:
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model['path']}",
            f"data.train_files=[{kk_data['train']}]",
            "data.batch_size=8",
            "micro_batch_size=8",
            "optim.lr=1e-3",
            "trainer.logger=[jsonl,tensorboard,wandb,mlflow]",
            "trainer.project_name=lucidrl-tests",
            "trainer.experiment_name=sft-tracked",
            f"trainer.run_dir={tmp_path / 'run'}",
            f"trainer.total_training_steps={steps}",
            "trainer.save_freq=2",
            *extra,
        ],
        schema=SFTConfig,
    )
    trainer = SFTTrainer(cfg)
    trainer.fit()
    return trainer


@pytest.mark.slow
def test_every_tracker_gets_the_metrics_and_a_resume_continues_the_same_runs(
    tmp_path, kk_data, tiny_model, trackers_offline, capsys
):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = _sft(tmp_path, kk_data, tiny_model, 3)  # checkpoints at steps 2 and 3 (the last)
    ids = json.loads((first.run_dir / IDS_FILE).read_text())
    assert set(ids) == {"wandb", "mlflow"}
    out = capsys.readouterr().out
    assert "logging to TensorBoard:" in out and f"W&B run {ids['wandb']}" in out and "MLflow run" in out
    first_step3 = json.loads((first.run_dir / "metrics.jsonl").read_text().splitlines()[2])["sft/loss"]
    # as if the run had died after logging step 3 but before saving it: the resume trains step 3 again
    shutil.rmtree(first.run_dir / "checkpoints" / "global_step_3")
    (first.run_dir / "checkpoints" / "latest").write_text("global_step_2\n")
    resumed = _sft(tmp_path, kk_data, tiny_model, 4)
    assert resumed.resumed_from.name == "global_step_2"
    assert json.loads((resumed.run_dir / IDS_FILE).read_text()) == ids  # the same W&B and MLflow runs
    sessions = list((resumed.run_dir / "wandb").glob(f"offline-run-*-{ids['wandb']}"))
    assert len(sessions) == 2  # two sessions, one run id

    logged = [json.loads(line) for line in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert MlflowClient().get_run(ids["mlflow"]).info.status == "FINISHED"
    history = MlflowClient().get_metric_history(ids["mlflow"], "sft/loss")
    # MLflow keeps both values of the step trained twice (as docs/metrics.md says)
    both = [(r["step"], r["sft/loss"]) for r in logged] + [(3, first_step3)]
    assert sorted((m.step, m.value) for m in history) == sorted(both)
    params = MlflowClient().get_run(ids["mlflow"]).data.params
    assert params["optim.lr"] == "0.001" and params["data.batch_size"] == "8"

    events = EventAccumulator(str(resumed.run_dir / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("sft/loss")
    assert [s.step for s in scalars] == [1, 2, 3, 4]  # the first run's step 3 was purged on resume
    assert all(
        abs(s.value - r["sft/loss"]) <= 1e-6 * abs(r["sft/loss"])
        for s, r in zip(scalars, logged, strict=True)
    )


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs lucidrl[wandb]")
def test_wandb_without_a_login_says_how_to_log_in_before_any_step(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_MODE_OFFLINE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: this machine has never logged in
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()  # W&B keeps the settings it read first for the whole process: read these
    try:
        with pytest.raises(UserError) as err:
            Tracker(["jsonl", "wandb"], tmp_path, project="p", experiment="e", config={})
    finally:
        wandb.teardown()  # and the next test reads its own
    message = str(err.value)
    assert "No API key configured" in message  # W&B's own words, then the ways out
    assert "wandb login" in message and "WANDB_API_KEY" in message and "WANDB_MODE=offline" in message
    assert str(tmp_path / "wandb") in message and "trainer.logger" in message
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # opened, closed, nothing logged


def test_wandb_receives_each_step(tmp_path, trackers_offline):
    tracker = Tracker(["wandb"], tmp_path, project="p", experiment="e", config={"a": {"b": 1}})
    wandb_run = tracker.external[0].run
    tracker.log({"critic/score/mean": 0.25, "val/kk/acc": 0.5, "note": None}, step=1)
    tracker.log({"critic/score/mean": 0.75}, step=2)
    assert wandb_run.summary["critic/score/mean"] == 0.75 and wandb_run.summary["val/kk/acc"] == 0.5
    assert "note" not in wandb_run.summary.keys()  # only numbers go to a tracker
    assert wandb_run.config["a"] == {"b": 1}
    tracker.close()


def test_a_tracker_that_is_not_installed_is_a_config_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(
        ConfigError,
        match=r"trainer.logger has 'wandb' but wandb is not installed: pip install 'lucidrl\[wandb\]'",
    ):
        load_config(None, ["model.path=/m", "data.train_files=[/t]", "trainer.logger=[console,wandb]"])
    with pytest.raises(
        ConfigError, match="unknown backend.*'neptune'.*available: console, jsonl, tensorboard, wandb, mlflow"
    ):
        load_config(None, ["model.path=/m", "data.train_files=[/t]", "trainer.logger=[neptune]"])


@pytest.mark.slow
def test_a_run_that_raises_is_marked_failed_and_the_next_one_gets_its_own_run(tmp_path, trackers_offline):
    from mlflow.tracking import MlflowClient

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(RuntimeError, match="boom"):
        with Tracker(["mlflow", "wandb"], tmp_path / "a", project="p", experiment="a") as tracker:
            first = next(t.run_id for t in tracker.external if hasattr(t, "run_id"))  # the MLflow one
            tracker.log({"x": 1.0}, step=1)
            raise RuntimeError("boom")
    assert MlflowClient().get_run(first).info.status == "FAILED"
    with Tracker(["mlflow"], tmp_path / "b", project="p", experiment="b") as tracker:  # no "already active"
        second = tracker.external[0].run_id
    assert second != first and MlflowClient().get_run(second).info.status == "FINISHED"


def test_a_run_stopped_by_a_signal_is_killed_in_mlflow_and_preempting_in_wandb(tmp_path, trackers_offline):
    """Ctrl-C and SIGTERM save and say how to resume: the trackers are told the run was stopped, not that
    it failed (MLflow KILLED; W&B preempting, with the shell's exit code 128 + the signal)."""
    import signal

    from mlflow.tracking import MlflowClient

    from lucidrl.trainer.interrupt import RunInterrupted

    called = []
    with pytest.raises(RunInterrupted):
        with Tracker(["mlflow", "wandb"], tmp_path, project="p", experiment="a") as tracker:
            mlflow_run = next(t.run_id for t in tracker.external if hasattr(t, "run_id"))
            wandb_run = next(t.run for t in tracker.external if hasattr(t, "run"))
            preempting, finish = wandb_run.mark_preempting, wandb_run.finish
            wandb_run.mark_preempting = lambda: (called.append("preempting"), preempting())[1]
            wandb_run.finish = lambda exit_code: (called.append(exit_code), finish(exit_code=exit_code))[1]
            tracker.log({"x": 1.0}, step=1)
            raise RunInterrupted(signal.SIGTERM, "stopped after step 1; saved")
    assert MlflowClient().get_run(mlflow_run).info.status == "KILLED"
    assert called == ["preempting", 143]


@pytest.mark.parametrize(
    "key, name",
    [
        ("val/kk/acc", "val/kk/acc"),
        ("val//acc", "val/acc"),
        ("/x/", "x"),
        ("a/../b", "b"),
        ("r@k", "r_at_k"),  # as verl writes mean@4; "_" made pass@k and pass#k one series
        ("pass#k", "pass_k"),
        ("/", "_"),
    ],
)
def test_metric_names_mlflow_would_refuse_are_made_acceptable(key, name):
    from lucidrl.trainer.tracking import mlflow_metric_name

    assert mlflow_metric_name(key) == name


@pytest.mark.slow
def test_a_deleted_mlflow_run_or_a_failing_tracker_start_does_not_strand_the_run(
    tmp_path, trackers_offline, caplog, monkeypatch
):
    """Resuming into a deleted MLflow run crashed (a deleted run is still found, and refuses RUNNING); a
    tracker that failed to start left the ones before it open (the W&B run never finished)."""
    import json as json_module

    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with Tracker(["jsonl", "mlflow"], run_dir, project="p", experiment="e") as tracker:
        tracker.log({"x": 1.0, "inf": float("inf"), "nan": float("nan")}, step=1)
    first = json_module.loads((run_dir / IDS_FILE).read_text())["mlflow"]
    line = (run_dir / "metrics.jsonl").read_text().splitlines()[0]
    assert json_module.loads(line, parse_constant=lambda c: pytest.fail(c)) == {
        "step": 1,
        "x": 1.0,
        "inf": None,
        "nan": None,
    }  # fmt: skip  (strict JSON: Infinity was written bare)
    MlflowClient().delete_run(first)
    with caplog.at_level("WARNING"):
        with Tracker(["mlflow"], run_dir, project="p", experiment="e", resumed_step=1) as tracker:
            second = tracker.external[0].run_id
    assert second != first and "is deleted: logging to a new run" in caplog.text
    # wandb starts, then mlflow fails: the wandb run is finished (failed), not left open
    import lucidrl.trainer.tracking as tracking

    opened = []

    class Recording(tracking._Wandb):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            opened.append(self)

    def store_down(*a, **k):
        raise ConnectionError("tracking store down")

    monkeypatch.setattr(tracking, "_Wandb", Recording)
    monkeypatch.setattr(tracking, "_MLflow", store_down)
    (tmp_path / "other").mkdir()
    with pytest.raises(ConnectionError, match="store down"):
        Tracker(["jsonl", "wandb", "mlflow"], tmp_path / "other", project="p", experiment="x")
    assert len(opened) == 1 and opened[0].run._is_finished
    assert "wandb" in json_module.loads(
        (tmp_path / "other" / IDS_FILE).read_text()
    )  # kept for the next start
