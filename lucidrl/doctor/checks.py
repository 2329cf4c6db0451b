"""What a doctor check reports (ok, warn, fail or skip, with a fix), and how one is run and printed."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail" | "skip"
    detail: str
    fix: str = ""
    seconds: float = 0.0


@dataclass
class Needs:
    """What the checks must hold the machine to: from the config, or nothing when there is none."""

    gpu: bool = False
    compile: bool = False
    vllm: bool = False
    ray: bool = False
    ray_address: str | None = None
    joins_cluster: bool = False  # trainer.ray_address or RAY_ADDRESS: the ranks may run on other hosts
    ranks: int = 1
    cpus_per_rank: int = 1
    gpus: int = 0  # GPUs this host must have (cuda ranks placed on one node)
    logits_dtype: str = "float32"  # what the actor's head computes in: torch.compile builds a graph per dtype


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {"ok": not self.failed, "checks": [asdict(c) for c in self.checks]}


def run_check(name: str, fn: Callable[[], Any]) -> tuple[Check, Any]:
    """Run one check (`fn` returns a Check, or a Check and what later checks need).

    The framework's own errors (a bad config key, model folder, data row) become the check's failure
    as they are: their messages already say what to do. Any other exception is a failure of the check
    itself, reported, never a crash of the doctor.
    """
    from lucidrl.diagnostics.debug import debug_enabled
    from lucidrl.diagnostics.errors import UserError

    start = time.perf_counter()
    value = None
    try:
        out = fn()
        check, value = out if isinstance(out, tuple) else (out, None)
    except UserError as exc:
        check = Check(name, "fail", str(exc))
    except Exception as exc:
        check = Check(
            name,
            "fail",
            f"the check raised {type(exc).__name__}: {exc}",
            "run with LUCIDRL_DEBUG=1 for the traceback; if the error is not about your setup, report it",
        )
        if debug_enabled():
            traceback.print_exc()
    check.name, check.seconds = name, time.perf_counter() - start
    return check, value


_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def format_check(check: Check) -> str:
    """One check as rich markup: status, name, detail, and the fix on its own line."""
    from rich.markup import escape

    took = f" [dim]({check.seconds:.1f} s)[/dim]" if check.seconds >= 0.5 else ""
    text = f"[{_STYLE[check.status]}]{check.status:>4}[/] [bold]{escape(check.name)}[/bold]: {escape(check.detail)}{took}"
    if check.fix:
        text += f"\n     [bold]fix:[/bold] {escape(check.fix)}"
    return text
