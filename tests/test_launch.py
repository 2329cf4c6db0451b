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
