"""trainer.max_restarts: which deaths restart the run, from where, and what is said (the Ray end-to-end
case, a rank SIGKILLed mid-run, is tests/test_distributed_e2e.py)."""

import pytest
from rich.console import Console

from lucidrl.config import load_config
from lucidrl.controller.errors import WorkerDiedError
from lucidrl.trainer import checkpoint
from lucidrl.trainer.restart import RestartsExhaustedError, fit_with_restarts, restart_config


class FakeTrainer:
    """Dies (as a Ray rank's death reaches the trainer) in `fit` while `deaths` has entries."""

    def __init__(self, cfg, deaths, seen):
        self.cfg, self.deaths, self.global_step = cfg, deaths, 3
        seen.append(cfg.trainer)

    def announce(self):
        pass

    def fit(self):
        if self.deaths:
            raise self.deaths.pop(0)


def _died(rank=1, failed_to_start=False):
    return WorkerDiedError("actor", rank, "update_actor", "ActorDiedError: killed", failed_to_start)


def _cfg(tmp_path, *extra):
    return load_config(None, [f"trainer.run_dir={tmp_path}", "trainer.backend=ray", *extra])


def _save_step(run_dir, step):
    tmp = checkpoint.begin(run_dir, step)
    (tmp / "trainer_state.json").write_text("{}")
    checkpoint.commit(tmp, None)


def test_a_death_restarts_from_the_latest_checkpoint_and_says_why(tmp_path):
    _save_step(tmp_path, 2)
    console = Console(record=True, width=300)
    deaths, seen = [_died()], []
    cfg = _cfg(tmp_path, "trainer.max_restarts=2")
    trainer = fit_with_restarts(cfg, console, make=lambda c: FakeTrainer(c, deaths, seen))
    assert trainer.cfg.trainer.resume_from_path == str(tmp_path / "checkpoints" / "global_step_2")
    assert [t.resume_mode for t in seen] == ["auto", "resume_path"]
    said = console.export_text()
    assert (
        "restart 1 of 2 (trainer.max_restarts): worker role=actor rank=1 died during 'update_actor' in step 3"
        in said
    )
    assert (
        f"resuming from {tmp_path / 'checkpoints' / 'global_step_2'}" in said
        and "ActorDiedError: killed" in said
    )


def test_without_a_checkpoint_a_restart_starts_again_and_past_the_limit_every_death_is_listed(tmp_path):
    console = Console(record=True, width=300)
    deaths, seen = [_died(0), _died(1)], []
    with pytest.raises(RestartsExhaustedError) as info:
        fit_with_restarts(
            _cfg(tmp_path, "trainer.max_restarts=1"), console, make=lambda c: FakeTrainer(c, deaths, seen)
        )
    assert (seen[1].resume_mode, seen[1].overwrite) == ("disable", True)  # nothing to resume: step 0
    assert "starting again from step 0 (no checkpoint yet)" in console.export_text()
    text = str(info.value)
    assert "a worker died 2 times, more than trainer.max_restarts=1 allows" in text
    assert "worker role=actor rank=1 died during 'update_actor'" in text  # the last death in full
    assert (
        "1. in step 3: worker role=actor rank=0" in text and "2. in step 3: worker role=actor rank=1" in text
    )


def test_no_restart_without_max_restarts_or_for_a_rank_that_fails_to_start(tmp_path):
    for cfg, death in (
        (_cfg(tmp_path), _died()),
        (_cfg(tmp_path, "trainer.max_restarts=3"), _died(failed_to_start=True)),
    ):
        seen = []
        with pytest.raises(WorkerDiedError):
            fit_with_restarts(cfg, Console(), make=lambda c, d=death, s=seen: FakeTrainer(c, [d], s))
        assert len(seen) == 1


def test_a_run_that_resumed_from_elsewhere_restarts_from_there_until_it_saves(tmp_path):
    elsewhere = tmp_path / "other"
    _save_step(elsewhere, 5)
    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"trainer.run_dir={run}",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={elsewhere}",
        ],
    )
    assert restart_config(cfg, run).trainer.resume_from_path == str(elsewhere)
    _save_step(run, 6)
    assert restart_config(cfg, run).trainer.resume_from_path == str(run / "checkpoints" / "global_step_6")
