"""Process settings that must be in place before Python starts: glibc's allocator.

PyTorch on a CPU allocates and frees activation-sized buffers every forward. With glibc's defaults,
buffers over the mmap threshold go straight back to the kernel on free and come back as fresh,
zeroed pages on the next allocation: page faults on every step. Keeping the heap (no mmap for big
blocks, no trimming, a 1 GiB top pad) removes them; `benchmarks/step_vs_trl.py --ablations` measures
the effect side by side (`lucidrl-untuned`). The cost is that the process keeps its peak heap: RSS
does not fall after a big step, and big buffers whose sizes change every step (whole logits over a
large vocabulary, cut to each micro-batch's length) leave holes the next ones do not fit, so RSS
keeps growing; the chunked LM head (actor.head_chunk_tokens, SFT's head_chunk_tokens) avoids them
(docs/sft.md).

glibc reads these variables once, at start-up, so the `lucidrl` command re-executes itself with them
set (before importing torch). `LUCIDRL_MALLOC_TUNING=0` turns it off; values you set yourself win.
Ray workers get the same variables through their runtime_env (controller/worker_group.py).
"""

from __future__ import annotations

import os
import platform
import sys

MALLOC_ENV = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
    "MALLOC_TOP_PAD_": "1073741824",
}
_OFF = "LUCIDRL_MALLOC_TUNING"
_DONE = "LUCIDRL_MALLOC_TUNED"


def malloc_tuning_enabled(env: dict[str, str] | None = None) -> bool:
    """On unless LUCIDRL_MALLOC_TUNING is 0/false/off; only glibc (Linux, not musl) reads the variables."""
    env = os.environ if env is None else env
    value = env.get(_OFF, "1").strip().lower()
    if value not in {"0", "1", "true", "false", "on", "off", "yes", "no", ""}:
        raise ValueError(
            f"{_OFF}={env.get(_OFF)!r}: use 1 (default, tune glibc malloc) or 0 (leave it alone)"
        )
    libc = platform.libc_ver()[0]
    return value in {"1", "true", "on", "yes", ""} and sys.platform == "linux" and libc == "glibc"


def tuned_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default os.environ) plus MALLOC_ENV where the variable is not already set."""
    env = dict(os.environ if env is None else env)
    if malloc_tuning_enabled(env):
        for key, value in MALLOC_ENV.items():
            env.setdefault(key, value)
    return env


def reexec_with_malloc_tuning() -> None:
    """Replace this process with itself plus the allocator variables, once; no-op when not needed.

    Called by the `lucidrl` console entry point before anything heavy is imported. `sys.orig_argv` is
    the interpreter's own command line, so `lucidrl ...` and `python -m lucidrl ...` both come back
    exactly as they were started.
    """
    if os.environ.get(_DONE) or not malloc_tuning_enabled():
        return
    env = tuned_env()
    if all(os.environ.get(k) == env[k] for k in MALLOC_ENV):
        return  # the user already set all three: nothing to do
    env[_DONE] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)
