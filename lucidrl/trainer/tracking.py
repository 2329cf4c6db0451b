"""Where metrics go: the console and `metrics.jsonl` in the run directory."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

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
    ("timing_s/step", "s/step"),
]


def _fmt(v: float) -> str:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return f"{v:.4g}"


class Tracker:
    """Writes every metric dict to the chosen backends (`trainer.logger`)."""

    def __init__(
        self,
        backends: list[str],
        run_dir: Path,
        console: Console | None = None,
        console_keys: list[tuple[str, str]] | None = None,
    ):
        self.backends = backends
        self.console_keys = console_keys or CONSOLE_KEYS
        self.console = console or Console(highlight=False)
        self.jsonl = open(run_dir / "metrics.jsonl", "a") if "jsonl" in backends else None  # noqa: SIM115

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.jsonl is not None:
            record = {
                "step": step,
                **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()},
            }
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
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

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
