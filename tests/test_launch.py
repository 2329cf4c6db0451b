"""The `lucidrl` command restarts itself once with glibc's allocator settings (lucidrl/launch.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lucidrl.launch import MALLOC_ENV, malloc_tuning_enabled, tuned_env

PROBE = (
    "import os\n"
    "from lucidrl.launch import reexec_with_malloc_tuning\n"
    "print('start', os.getpid(), flush=True)\n"
    "reexec_with_malloc_tuning()\n"
    "print('env', os.environ.get('MALLOC_MMAP_MAX_'), os.environ.get('MALLOC_TOP_PAD_'))\n"
)
pytestmark = pytest.mark.skipif(not malloc_tuning_enabled({}), reason="glibc only")


def _run(extra_env: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV and not k.startswith("LUCIDRL_MALLOC")}
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split("\n")


def test_reexec_sets_allocator_env_once():
    lines = _run({})
    starts = [ln for ln in lines if ln.startswith("start")]
    assert len(starts) == 2, lines  # the original process and exactly one re-exec (same pid: execve)
    assert starts[0] == starts[1]
    assert "env 0 1073741824" in lines


def test_user_values_win_and_switch_off():
    lines = _run({"MALLOC_TOP_PAD_": "4096"})
    assert "env 0 4096" in lines
    lines = _run({"LUCIDRL_MALLOC_TUNING": "0"})
    assert len([ln for ln in lines if ln.startswith("start")]) == 1
    assert "env None None" in lines


def test_bad_switch_value_is_named():
    with pytest.raises(ValueError, match="LUCIDRL_MALLOC_TUNING='maybe'"):
        tuned_env({"LUCIDRL_MALLOC_TUNING": "maybe"})


def test_cli_still_runs_through_the_reexec():
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "lucidrl", "version"], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip()


LIGHT_COMMANDS = """
import sys
from lucidrl.cli import main
assert main(["version"]) == 0
assert main(["data", "kk", "--people", "9", "--out", sys.argv[1]]) == 2  # a UsageError, printed as one line
heavy = sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules)
print("imported:", heavy)
"""


def test_commands_that_need_no_model_import_no_torch(tmp_path):
    """The CLI's error handling matches on a base class (diagnostics/errors.py) instead of importing every
    module that defines an error type: `lucidrl --help` took 10 s here, importing torch and transformers."""
    out = subprocess.run(
        [sys.executable, "-c", LIGHT_COMMANDS, str(tmp_path / "kk")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "imported: []" in out.stdout
    assert "error (UsageError)" in out.stderr


def test_every_user_error_is_still_the_builtin_it_was():
    from lucidrl.batch import BatchError
    from lucidrl.config import ConfigError
    from lucidrl.data.dataset import DatasetError
    from lucidrl.diagnostics.errors import UsageError, UserError
    from lucidrl.models.loading import ModelLoadError
    from lucidrl.rewards import RewardOutputError, UnknownDataSourceError
    from lucidrl.rewards.custom import CustomFunctionError
    from lucidrl.rewards.manager import RewardFunctionError
    from lucidrl.trainer.setup import RunDirError
    from lucidrl.workers.rollout.server_engine import RolloutServerError
    from lucidrl.workers.training.optim import NonFiniteLossError
    from lucidrl.workers.training.train_state import CheckpointError

    builtin = {
        UsageError: ValueError,
        BatchError: ValueError,
        ConfigError: ValueError,
        DatasetError: ValueError,
        ModelLoadError: ValueError,
        RewardOutputError: ValueError,
        UnknownDataSourceError: ValueError,
        CustomFunctionError: ValueError,
        RunDirError: ValueError,
        CheckpointError: ValueError,
        RewardFunctionError: RuntimeError,
        RolloutServerError: RuntimeError,
        NonFiniteLossError: FloatingPointError,
    }
    for cls, base in builtin.items():
        assert issubclass(cls, UserError) and issubclass(cls, base), cls


def test_small_cli_inputs_that_crashed_are_usage_errors(tmp_path, monkeypatch, capsys):
    """From a review: each raised a raw traceback (exit 1), or wrote an empty split with exit 0."""
    from lucidrl.cli import entry, main

    monkeypatch.setenv("LUCIDRL_MALLOC_TUNING", "maybe")
    assert entry() == 2
    assert "LUCIDRL_MALLOC_TUNING='maybe': use 1" in capsys.readouterr().err
    monkeypatch.delenv("LUCIDRL_MALLOC_TUNING")
    assert main(["data", "kk", "--train", "0", "--out", str(tmp_path / "kk")]) == 2
    assert "need --train >= 1" in capsys.readouterr().err and not (tmp_path / "kk").exists()
    assert main(["serve", str(tmp_path), "--port", "99999"]) == 2
    assert "--port 99999 is not a TCP port" in capsys.readouterr().err
