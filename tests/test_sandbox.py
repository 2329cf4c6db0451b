"""The python tool's sandbox: code that tries to get out is contained, and the result says how.

Each attempt runs with every kernel layer this host gives, and again with the audit hook alone (the
fallback where landlock, seccomp and namespaces are missing)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from lucidrl.workers.rollout.agent.sandbox import (
    ALL_LAYERS,
    SandboxLimits,
    format_result,
    layers,
    python_tool,
    run_python,
)
from lucidrl.workers.rollout.agent.tools import ToolError

pytestmark = [
    pytest.mark.slow,  # starts processes
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's"),
]
LAYERS = {"kernel": ALL_LAYERS, "audit-hook": ()}
LIMITS = SandboxLimits(timeout_s=5, cpu_s=5, memory_mb=512, max_output_bytes=100_000)


def _run(code: str, layer_set: str, limits: SandboxLimits = LIMITS):
    return run_python(textwrap.dedent(code), limits, layers=LAYERS[layer_set])


def _alive(pattern: str) -> list[int]:
    """Pids of processes whose command line holds `pattern`."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if pattern.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                continue
    return found


def test_what_this_host_gives():
    held, missing = layers()
    assert "rlimits" in held
    if sys.platform.startswith("linux") and os.path.exists("/proc/self/ns/user"):
        print("sandbox layers:", held, "missing:", missing)


def test_plain_code_runs_and_prints():
    r = _run("import math\nprint(math.factorial(20))", "kernel")
    assert r.ok and r.stdout == "2432902008176640000\n" and format_result(r) == "2432902008176640000\n"
    assert r.applied[0].startswith("namespaces") or "namespaces" in r.missing


@pytest.mark.parametrize("layer_set", list(LAYERS))
def test_writing_outside_its_directory_is_refused(tmp_path, layer_set):
    target, existing = tmp_path / "escaped.txt", tmp_path / "keep.txt"
    existing.write_text("mine")
    r = _run(
        f"""
        import os
        open("inside.txt", "w").write("fine")  # its own directory is writable
        for attempt in (lambda: open({str(target)!r}, "w"), lambda: os.remove({str(existing)!r}),
                        lambda: os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)):
            try:
                attempt()
                print("ESCAPED")
            except PermissionError as e:
                print("refused:", e)
        """,
        layer_set,
    )
    assert "ESCAPED" not in r.stdout and r.stdout.count("refused:") == 3
    assert not target.exists() and existing.read_text() == "mine"


@pytest.mark.parametrize("layer_set", list(LAYERS))
def test_sleeping_forever_is_killed_at_the_wall_clock_limit(layer_set):
    r = _run(
        "import time\nprint('going to sleep', flush=True)\ntime.sleep(10**6)",
        layer_set,
        SandboxLimits(timeout_s=1.5),
    )
    assert r.killed == "wall-clock limit of 1.5 s" and not r.ok
    assert r.stdout == "going to sleep\n" and format_result(r).endswith("[killed: wall-clock limit of 1.5 s]")


@pytest.mark.parametrize("layer_set", list(LAYERS))
def test_printing_gigabytes_is_stopped_at_the_output_limit(layer_set):
    r = _run("chunk = 'x' * 1_000_000\nwhile True:\n    print(chunk)", layer_set)
    assert r.killed == "output limit of 100000 bytes" and r.signal == signal.SIGXFSZ
    assert len(r.stdout) == LIMITS.max_output_bytes


@pytest.mark.parametrize("layer_set", list(LAYERS))
def test_connecting_out_is_refused(layer_set):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        r = _run(
            f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2)
                print("CONNECTED")
            except OSError as e:
                print("refused:", type(e).__name__, e)
            """,
            layer_set,
        )
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever reached the server
    finally:
        server.close()
    assert "CONNECTED" not in r.stdout and r.stdout.startswith("refused: PermissionError")


@pytest.mark.parametrize("layer_set", list(LAYERS))
def test_forking_many_processes_is_refused_and_leaves_none_behind(layer_set):
    r = _run(
        """
        import os, subprocess
        print(os.getcwd(), flush=True)
        started = 0
        for attempt in (os.fork, lambda: subprocess.Popen(["sleep", "60"])):
            for _ in range(200):
                try:
                    if attempt() == 0:  # a child: keep forking
                        continue
                    started += 1
                except (PermissionError, BlockingIOError) as e:
                    print("refused:", e)
                    break
        print("started", started)
        """,
        layer_set,
    )
    workdir = r.stdout.splitlines()[0]
    assert r.stdout.count("refused:") == 2 and "started 0" in r.stdout
    assert _alive(workdir) == []  # no process of the call is left


@pytest.mark.parametrize("layer_set", list(LAYERS))
def test_allocating_too_much_memory_is_reported(layer_set):
    r = _run("blob = bytearray(4 * 1024**3)", layer_set)
    assert r.killed == "memory limit of 512 MiB" and "MemoryError" in r.stderr


def test_spinning_is_killed_at_the_cpu_limit():
    r = _run("while True:\n    pass", "kernel", SandboxLimits(timeout_s=20, cpu_s=1))
    assert r.killed == "CPU-time limit of 1 s"


@pytest.mark.parametrize("layer_set", list(LAYERS))
def test_signalling_another_process_is_refused(layer_set):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        r = _run(
            f"""
            import os, signal
            try:
                os.kill({victim.pid}, signal.SIGKILL)
                print("KILLED")
            except OSError as e:
                print("refused:", type(e).__name__)
            """,
            layer_set,
        )
        assert "KILLED" not in r.stdout and victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_the_python_tool_answers_with_output_or_with_the_error():
    tool = python_tool(LIMITS)
    assert tool.name == "python" and tool.parameters["required"] == ["code"]
    assert tool.function(code="print(6 * 7)") == "42\n"
    with pytest.raises(ToolError, match=r"ZeroDivisionError(.|\n)*\[exit code 1\]"):
        tool.function(code="1/0")
