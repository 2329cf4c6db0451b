"""What the side-by-side benchmarks share: each variant runs in a fresh process of the same script,
which prints one JSON line; memory is read from the process itself."""

from __future__ import annotations

import json
import resource
import subprocess
import sys


def rss_mb() -> float:
    """This process's resident memory now, MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    """The most resident memory this process has held, MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_variant(script: str, name: str, work: str, *extra: str) -> dict:
    """Run `script --worker NAME --work WORK EXTRA...` in a fresh interpreter; its last stdout line as JSON.
    Exits with the variant's stderr tail if it failed."""
    cmd = [sys.executable, script, "--worker", name, "--work", work, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"variant {name!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
