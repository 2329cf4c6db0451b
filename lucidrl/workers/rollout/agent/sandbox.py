"""The built-in `python` tool: the model's code in a confined subprocess, with limits and a report.

Each call gets a fresh temporary directory as its working directory (deleted afterwards), a minimal
environment, and a process that confines itself before reading the code (sandbox_child.py):

| layer | stops | needs |
|---|---|---|
| rlimits | CPU seconds, address space, bytes written per file (stdout and stderr are files), open files | nothing |
| wall clock | a call that outlives `timeout_s` (sleeping, blocked): every process of it is killed | nothing |
| user + network namespace | all network: the process sees no interface | unprivileged user namespaces |
| pid namespace | processes left behind: when the call ends, everything it started ends | unprivileged user namespaces |
| landlock | writes outside its directory; TCP; signals to and abstract unix sockets of other processes | Linux >= 5.13 with landlock on |
| seccomp | new processes (fork, vfork, clone without CLONE_THREAD) and non-unix sockets | x86_64 or aarch64 |
| audit hook | the same at the Python level (writes, processes, sockets, signals), where a kernel layer is missing | nothing; not a boundary (native code and ctypes get past such hooks, so it also refuses ctypes) |

What it does not stop: reading files the trainer's user may read (reads are not restricted, so keep
secrets out of reach of the training user), using the CPU time and memory it is allowed, threads,
and anything a kernel exploit can do. It is meant to keep a model's mistakes and reward hacks
(infinite loops, fork bombs, huge prints, writing over the run's files, calling out) from harming a
training run, not to host hostile code. `layers()` says what this host gives; a layer that is not
available is replaced by the audit hook and named in every result.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lucidrl.workers.rollout.agent.tools import Tool, ToolError, tool_from_function

log = logging.getLogger(__name__)

CHILD = str(Path(__file__).with_name("sandbox_child.py"))
ALL_LAYERS = ("namespaces", "landlock", "seccomp")


@dataclass(frozen=True)
class SandboxLimits:
    """rollout.multi_turn.python's limits."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    max_output_bytes: int = 1_000_000


@dataclass
class SandboxResult:
    """What one run of code did: its output, how it ended, and which layers confined it."""

    stdout: str
    stderr: str
    exit_code: int | None  # None: killed by a signal
    signal: int | None
    killed: str | None  # why the sandbox ended it (a limit), in words; None when it ended on its own
    applied: list[str]  # the confinement layers that held
    missing: dict[str, str]  # the layers that did not, and why

    @property
    def ok(self) -> bool:
        return self.killed is None and self.exit_code == 0


def run_python(code: str, limits: SandboxLimits, layers: tuple[str, ...] = ALL_LAYERS) -> SandboxResult:
    """Run `code` in a confined subprocess; `layers`: the kernel layers to try (tests leave some out to
    check the audit hook that replaces them)."""
    box = Path(tempfile.mkdtemp(prefix="lucidrl-python-"))
    work = box / "work"
    work.mkdir()
    (work / "main.py").write_text(code, encoding="utf-8")
    read_fd, write_fd = os.pipe()
    settings = {
        "workdir": str(work),
        "report_fd": write_fd,
        "layers": list(layers),
        "cpu_s": int(limits.cpu_s),
        "memory_mb": int(limits.memory_mb),
        "max_output_bytes": int(limits.max_output_bytes),
    }
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(work),
        "TMPDIR": str(work),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        # numeric libraries start a thread per core at import, each reserving address space
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    reports: list[dict] = []
    timed_out = False
    try:
        with open(box / "stdout", "wb") as out, open(box / "stderr", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", CHILD, json.dumps(settings)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work, env=env,
                pass_fds=(write_fd,), start_new_session=True,
            )  # fmt: skip
        os.close(write_fd)
        write_fd = -1
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        reports += _read_reports(read_fd, wait_s=0.0)
        _kill_all(proc, reports)
        proc.wait()
        reports += _read_reports(read_fd, wait_s=2.0)  # until every holder of the pipe has ended
        stdout = _head(box / "stdout", limits.max_output_bytes)
        stderr = _head(box / "stderr", limits.max_output_bytes)
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        shutil.rmtree(box, ignore_errors=True)
    merged: dict = {}
    for r in reports:
        merged.update(r)
    if "fatal" in merged:
        raise RuntimeError(f"the python tool's sandbox could not confine itself: {merged['fatal']}")
    sig = merged.get("signal")
    killed = None
    if timed_out:
        killed = f"wall-clock limit of {limits.timeout_s:g} s"
    elif sig in (signal.SIGXCPU, signal.SIGKILL):
        killed = f"CPU-time limit of {limits.cpu_s} s"
    elif sig == signal.SIGXFSZ:
        killed = f"output limit of {limits.max_output_bytes} bytes"
    elif merged.get("exit", 0) != 0 and "MemoryError" in stderr[-2000:]:
        killed = f"memory limit of {limits.memory_mb} MiB"
    namespaces = merged.get("namespaces", [])
    applied = ([f"namespaces ({', '.join(namespaces)})"] if namespaces else []) + merged.get("applied", [])
    missing = dict(merged.get("missing", {}))
    if "namespaces" in layers and not namespaces:
        missing["namespaces"] = "unshare(CLONE_NEWUSER) refused (unprivileged user namespaces off?)"
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=merged.get("exit"),
        signal=sig,
        killed=killed,
        applied=applied,
        missing=missing,
    )


def _read_reports(fd: int, wait_s: float) -> list[dict]:
    """The JSON lines waiting on the report pipe; with `wait_s`, read on until it closes (or that long)."""
    chunks = []
    deadline = time.monotonic() + wait_s
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
    out = []
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _kill_all(proc: subprocess.Popen, reports: list[dict]) -> None:
    """SIGKILL the namespace's init (ending every process in it) or the code's process, and the group."""
    for r in reports:
        if "kill_pid" in r:
            try:
                os.kill(int(r["kill_pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _head(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=1)
def layers() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(layers that hold, (layer, why missing) pairs) on this host, from one run of `pass`."""
    r = run_python("pass", SandboxLimits(timeout_s=30))
    return tuple(r.applied), tuple(r.missing.items())


def format_result(result: SandboxResult, max_chars: int = 4000) -> str:
    """What the model reads: stdout, then stderr's end, then how the run ended when not cleanly."""
    parts = []
    if result.stdout:
        parts.append(result.stdout[:max_chars])
    if result.stderr:
        parts.append("stderr:\n" + result.stderr[-max_chars:])
    if result.killed:
        parts.append(f"[killed: {result.killed}]")
    elif result.exit_code not in (0, None):
        parts.append(f"[exit code {result.exit_code}]")
    elif result.signal is not None:
        parts.append(f"[ended by signal {signal.Signals(result.signal).name}]")
    return "\n".join(parts) if parts else "(no output)"


def python_tool(limits: SandboxLimits) -> Tool:
    """The `python` tool: runs code in the sandbox; a failed run (non-zero exit, a limit) is a ToolError
    whose text (output, traceback, the limit) is what the model reads, counted as a tool error."""
    held, missing = layers()
    if missing:
        log.warning(
            "python tool sandbox on this host: %s; missing %s (the audit hook stands in, which is not a boundary)",
            ", ".join(held),
            "; ".join(f"{k}: {v}" for k, v in missing),
        )

    def python(code: str) -> str:
        """Run Python code in a sandbox and return what it prints. No network; files only in its own
        temporary directory; limited time and memory.

        Args:
            code: the program; print() what you need to see
        """
        result = run_python(code, limits)
        text = format_result(result)
        if not result.ok:
            raise ToolError(text)
        return text

    return tool_from_function(python, "the built-in python tool")
