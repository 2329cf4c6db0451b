"""Acting on the collapse monitor's verdicts while a run trains: keep healthy weights, restore, report.

`CollapseMonitor` (collapse.py) reads each step's metrics and says when a sign of collapse or of
saturation has held `patience` steps. The guard does what the verdict means for the weights:

- with `trainer.collapse.keep_last_healthy`, it keeps a copy of the actor's weights in memory: each
  step snapshots the weights it starts from (`before_step`), and once that step's measurements show
  no sign the snapshot becomes the kept copy (`after_step`);
- a collapse with `action: stop` restores the kept copy, and so does a sign still building up when the
  run ends (not yet `patience` steps long, so not reported, but the last weights are unmeasured and
  the ones before showed it);
- saturation (the prompts solved) stops the run with `action: stop` on its own weights: nothing to restore;
- each report is printed once and written to COLLAPSE.txt or SATURATED.txt in the run directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from lucidrl.trainer.collapse import CollapseMonitor, CollapseReport


@dataclass
class StepVerdict:
    """What the guard made of one step: stop the run, and whether the step's weights collapsed."""

    stop: bool
    collapsed: bool  # a collapse was reported at this step: its weights must not be checkpointed


class CollapseGuard:
    """Watches each step's metrics (`after_step`) and keeps, restores and reports the actor's weights."""

    def __init__(
        self,
        cfg: Any,  # config.schema.CollapseConfig
        actor: Any,  # the actor's worker group: snapshot_actor, keep_snapshot, restore_actor
        say: Callable[[str], None],  # prints one line of rich markup
        run_dir: Path,
    ):
        self.cfg, self.actor, self.say, self.run_dir = cfg, actor, say, run_dir
        self.monitor = CollapseMonitor(cfg)
        self.keep = bool(cfg.keep_last_healthy)
        self.collapse: CollapseReport | None = None  # the collapse that stopped (or was reported in) the run
        self.saturation: CollapseReport | None = None  # the prompts solved
        self.healthy_step = 0  # the step whose weights the kept snapshot holds
        self.restored_step: int | None = None  # set when the run ended on those weights instead of its last
        self._first_step = 1

    def start(self, step: int) -> None:
        """Before the first step of this process (`step` steps already done): keep the starting weights,
        until a step's measurements certify later ones."""
        self.healthy_step, self._first_step = step, step + 1
        if self.keep:
            self.actor.snapshot_actor()
            self.actor.keep_snapshot()

    def before_step(self, step: int) -> None:
        """A step's rollouts, entropy and KL measure the weights it starts from: those are the ones its
        verdict certifies (its own update's are measured by the next step), so they are copied now."""
        if self.keep and step > self._first_step:  # the first starts from the copy `start` made
            self.actor.snapshot_actor()

    def after_step(self, step: int, metrics: dict[str, float], ending: bool) -> StepVerdict:
        """Feed the step's metrics to the monitor and act on its verdict. `ending`: the run ends after
        this step anyway (its last step, or out of time). Adds collapse/detected or collapse/saturated
        to `metrics` when reported."""
        verdict = self.monitor.update(step, metrics)
        collapse = verdict if verdict is not None and verdict.kind != "saturation" else None
        saturation = verdict if verdict is not None and verdict.kind == "saturation" else None
        stop_on_sign = self.cfg.action == "stop"
        if saturation is not None:
            self.saturation = saturation
            metrics["collapse/saturated"] = 1.0
            self._report(saturation)
        if collapse is not None:
            self.collapse = collapse
            metrics["collapse/detected"] = 1.0
            self._report(collapse)
        elif self.keep and self.monitor.healthy:
            self.actor.keep_snapshot()
            self.healthy_step = step - 1
        stop = verdict is not None and stop_on_sign
        if self.keep and stop_on_sign:
            if collapse is not None:
                which = (
                    f"the weights after step {self.healthy_step}"
                    if self.healthy_step
                    else "the starting weights (step 0)"
                )
                self._restore(
                    f"restored {which}, the last whose rollouts showed no sign of collapse; validation and "
                    "the final model use them"
                )
            elif (ending or stop) and not self.monitor.healthy:
                self._restore(
                    f"the run ended with a sign of collapse held since step {self.monitor.bad_since} (fewer "
                    "than trainer.collapse.patience steps, so not reported): restored the weights after step "
                    f"{self.healthy_step}, the last measured healthy; validation and the final model use them"
                )
        return StepVerdict(stop=stop, collapsed=collapse is not None)

    def _restore(self, line: str) -> None:
        self.actor.restore_actor()
        self.restored_step = self.healthy_step
        self.say(f"[dim]lucidrl:[/dim] {escape(line)}")

    def _report(self, report: CollapseReport) -> None:
        then = (
            "stopping the run" if self.cfg.action == "stop" else "training on (trainer.collapse.action=warn)"
        )
        if report.kind == "saturation":
            if self.cfg.action == "stop":
                then += " on its last weights (a saturated run has not collapsed: nothing is restored)"
            self.say(f"[bold yellow]lucidrl: {escape(report.message())}[/bold yellow]; {then}")
            (self.run_dir / "SATURATED.txt").write_text(report.message() + "\n")
            return
        self.say(f"[bold red]lucidrl: {escape(report.message())}[/bold red]; {then}")
        (self.run_dir / "COLLAPSE.txt").write_text(report.message() + "\n")
