"""`lucidrl report`: plots of a run's metrics.jsonl and one self-contained HTML page to read or share.

Writes RUN_DIR/report/<plot>.png for each plot whose metrics the run logged (RL: reward, validation
accuracy, KL, entropy, response length, time per stage; SFT: loss and token accuracy) and
RUN_DIR/report/report.html with every PNG embedded (base64) and the run's config.yaml. A plot whose
metrics are all absent is skipped and listed with the reason. matplotlib is imported only here
(`pip install lucidrl[report]`), through its object API, so no global backend is switched.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucidrl.diagnostics.errors import UsageError

Series = dict[str, list[tuple[int, float]]]  # metric name -> (step, value), by step, one per step


class ReportError(UsageError):
    """A run directory or metrics file that cannot be reported on (names the file, line and fix)."""


@dataclass(frozen=True)
class PlotSpec:
    """One plot: file stem, title, y label, which metrics it shows (regexes) and, for humans, which it needs."""

    name: str
    title: str
    ylabel: str
    patterns: tuple[str, ...]  # regexes matched against whole metric names; lines in pattern order
    needs: str  # the metrics in words, for the "skipped" list
    stacked: bool = False  # stack the lines (parts of a whole, e.g. time per stage)
    total: str | None = None  # with `stacked`: the metric that is the whole, drawn as a line on top


PLOTS = (
    PlotSpec(
        "reward",
        "Reward (training batch)",
        "score",
        (r"critic/score/mean", r"critic/score/(min|max)"),
        "critic/score/mean",
    ),
    PlotSpec(
        "val_accuracy",
        "Validation accuracy",
        "accuracy",
        (r"val/acc", r"val/[^/]+/acc/\d+_people"),
        "val/acc or val/<data_source>/acc/<n>_people",
    ),
    PlotSpec(
        "kl",
        "KL to the reference",
        "KL",
        (r"actor/kl_loss", r"actor/reward_kl_penalty"),
        "actor/kl_loss or actor/reward_kl_penalty",
    ),
    PlotSpec("entropy", "Policy entropy", "nats / token", (r"actor/entropy",), "actor/entropy"),
    PlotSpec(
        "response_length",
        "Response length",
        "tokens",
        (r"response_length/mean", r"response_length/(min|max)"),
        "response_length/mean",
    ),
    PlotSpec(
        "timing",
        "Time per stage (stacked; line: whole step)",
        "seconds",
        (r"timing_s/(?!step$).+", r"timing_s/step"),
        "timing_s/<stage> or timing_s/step",
        stacked=True,
        total="timing_s/step",
    ),
    PlotSpec(
        "sft_loss", "SFT loss", "cross-entropy / token", (r"sft/loss", r"val/loss"), "sft/loss or val/loss"
    ),
    PlotSpec(
        "sft_token_acc", "SFT validation token accuracy", "accuracy", (r"val/token_acc",), "val/token_acc"
    ),
)


@dataclass
class MetricsFile:
    """What read_metrics found: each metric's (step, value) pairs, sorted by step, one per step; the
    metrics logged only as null (NaN); and what was set aside, in words (a torn last line, steps
    logged twice)."""

    series: Series
    all_null: set[str]
    notes: list[str]


def read_metrics(path: Path) -> MetricsFile:
    """Every numeric metric in a metrics.jsonl as (step, value) pairs; null (NaN) values are left out.

    A step logged more than once (a run resumed from an older copy of its folder) keeps its last
    record, and the points are in step order. A last line that is not JSON (a run killed, or still
    running, mid-write) is skipped and said so in `notes`, as a resume does. Raises ReportError for a
    missing or empty file and for any other line that is not a JSON object with a finite "step",
    naming the file and line number.
    """
    if not path.is_file():
        raise ReportError(
            f"{path} does not exist; a run directory holds metrics.jsonl when trainer.logger includes "
            "'jsonl' (the default). Give the directory a `lucidrl train` or `lucidrl sft` run wrote."
        )
    with open(path, encoding="utf-8") as handle:
        lines = [(n, line) for n, line in enumerate(handle, start=1) if line.strip()]
    points: dict[str, dict[int, float]] = {}
    seen: set[str] = set()
    steps_seen: set[int] = set()
    repeated: set[int] = set()
    notes: list[str] = []
    for index, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if index == len(lines) - 1 and index > 0:
                notes.append(
                    f"line {number} (the last) is not JSON and was left out: a run killed or still writing "
                    f"({e.msg} at column {e.colno})"
                )
                continue
            raise ReportError(
                f"{path} line {number} is not JSON ({e.msg} at column {e.colno}): {line.strip()[:80]!r}; "
                "fix or delete that line"
            ) from e
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not _finite(step):
            raise ReportError(
                f"{path} line {number} is not a metrics record: expected a JSON object with a finite numeric "
                f'"step", got {line.strip()[:80]!r}'
            )
        step = int(step)
        if step in steps_seen:
            repeated.add(step)
        steps_seen.add(step)
        for key, value in record.items():
            if key == "step":
                continue
            seen.add(key)
            if _is_number(value):
                points.setdefault(key, {})[step] = float(value)  # a later record of the step wins
    if not steps_seen:
        raise ReportError(f"{path} holds no metrics records (it is empty); did the run log a step yet?")
    if repeated:
        notes.append(
            f"{len(repeated)} step(s) were logged more than once ({_ranges(sorted(repeated))}): each is "
            "plotted with its last record (a resumed run trains them again)"
        )
    series = {k: sorted(v.items()) for k, v in points.items()}
    return MetricsFile(series, seen - set(series), notes)


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7" (at most five ranges, then "...")."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    text = [f"{a}-{b}" if a != b else f"{a}" for a, b in runs[:5]]
    return ", ".join(text) + (", ..." if len(runs) > 5 else "")


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)


def select_metrics(spec: PlotSpec, names: list[str]) -> list[str]:
    """The logged metric names a plot shows: those matching its patterns, in pattern order, then sorted."""
    chosen: list[str] = []
    for pattern in spec.patterns:
        matches = sorted((n for n in names if re.fullmatch(pattern, n) and n not in chosen), key=_natural_key)
        chosen.extend(matches)
    return chosen


def _natural_key(name: str) -> list[Any]:
    """Sort "val/x/acc/10_people" after "val/x/acc/9_people"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _figure_class() -> Any:
    """matplotlib's Figure, imported lazily with an install hint when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ReportError(
            "lucidrl report draws its plots with matplotlib, which is not installed; "
            "install it with `pip install lucidrl[report]` (or `pip install matplotlib`)"
        ) from e
    return Figure


def draw_plot(spec: PlotSpec, series: Series, metrics: list[str], out: Path) -> None:
    """Draw `metrics` (steps on x) as lines, or as stacked areas with the whole (e.g. step time) as a line."""
    figure = _figure_class()(figsize=(7.0, 4.0), dpi=100)
    ax = figure.add_subplot()
    if spec.stacked:
        parts = [m for m in metrics if m != spec.total]
        steps = sorted({s for m in parts for s, _ in series[m]})
        if parts:
            lookups = [dict(series[m]) for m in parts]  # once per part, not once per step
            layers = [[d.get(s, 0.0) for s in steps] for d in lookups]
            ax.stackplot(steps, layers, labels=[_label(m) for m in parts], alpha=0.8)
        if spec.total in metrics:
            total = series[spec.total]
            ax.plot(
                [s for s, _ in total],
                [v for _, v in total],
                color="black",
                lw=1.2,
                label=f"{_label(spec.total)} (whole)",
            )
    else:
        for metric in metrics:
            points = series[metric]
            sparse = len(points) <= 30
            style = (
                {"lw": 0.8, "alpha": 0.6, "ls": "--"} if re.search(r"/(min|max)$", metric) else {"lw": 1.6}
            )
            ax.plot(
                [s for s, _ in points],
                [v for _, v in points],
                marker="o" if sparse else None,
                markersize=3,
                label=_label(metric),
                **style,
            )
    ax.set_title(spec.title)
    ax.set_xlabel("step")
    ax.set_ylabel(spec.ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(out, format="png")


def _label(metric: str) -> str:
    return metric.removeprefix("timing_s/")


def write_report(run_dir: str | Path) -> dict[str, Any]:
    """Write RUN_DIR/report/*.png and report.html from RUN_DIR/metrics.jsonl (+ config.yaml if present).

    Returns {"plots": [png paths], "skipped": {plot name: reason}, "html": path, "steps": int}.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ReportError(
            f"run directory {str(run_dir)!r} does not exist or is not a directory; give the folder a run "
            "wrote (trainer.run_dir, by default runs/<trainer.experiment_name>)"
        )
    found = read_metrics(run / "metrics.jsonl")
    series = found.series
    _figure_class()  # fail before creating anything when matplotlib is missing
    out_dir = run / "report"
    out_dir.mkdir(exist_ok=True)
    names = list(series)
    plots: list[tuple[PlotSpec, Path, list[str]]] = []
    skipped: dict[str, str] = {}
    for spec in PLOTS:
        metrics = select_metrics(spec, names)
        if not metrics:
            null = sorted(n for n in found.all_null if select_metrics(spec, [n]))
            skipped[spec.name] = (
                f"{', '.join(null)} logged, but every value is null (NaN)"
                if null
                else f"no {spec.needs} in metrics.jsonl"
            )
            continue
        path = out_dir / f"{spec.name}.png"
        draw_plot(spec, series, metrics, path)
        plots.append((spec, path, metrics))
    config_path = run / "config.yaml"
    config = config_path.read_text(encoding="utf-8") if config_path.is_file() else None
    steps = sorted({s for points in series.values() for s, _ in points})
    page = render_html(run, plots, skipped, config, steps, found.notes)
    html_path = out_dir / "report.html"
    html_path.write_text(page, encoding="utf-8")
    return {
        "plots": [p for _, p, _ in plots],
        "skipped": skipped,
        "html": html_path,
        "steps": len(steps),
        "notes": found.notes,
    }


def render_html(
    run: Path,
    plots: list[tuple[PlotSpec, Path, list[str]]],
    skipped: dict[str, str],
    config: str | None,
    steps: list[int],
    notes: list[str] = (),
) -> str:
    """One HTML page with nothing external: title, plots as base64 PNGs, what was skipped, the config."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>lucidrl report: {esc(run.name)}</title>",
        "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto;padding:0 1em}"
        "img{max-width:100%;border:1px solid #ddd}pre{background:#f6f6f6;padding:1em;overflow:auto}"
        "figcaption{color:#555;font-size:0.9em}</style>",
        "</head><body>",
        f"<h1>lucidrl report: {esc(run.name)}</h1>",
        f"<p>Run directory <code>{esc(str(run.resolve()))}</code>; "
        + (f"steps {steps[0]}&ndash;{steps[-1]} ({len(steps)} logged)" if steps else "no steps")
        + ".</p>",
    ]
    if notes:
        parts.append("<ul>" + "".join(f"<li>metrics.jsonl: {esc(n)}</li>" for n in notes) + "</ul>")
    for spec, path, metrics in plots:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(
            f'<figure id="{spec.name}"><h2>{esc(spec.title)}</h2>'
            f'<img alt="{esc(spec.name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(path.name)}: {esc(', '.join(metrics))}</figcaption></figure>"
        )
    if skipped:
        parts.append("<h2>Skipped plots</h2><ul>")
        parts += [f"<li>{esc(name)}: {esc(reason)}</li>" for name, reason in skipped.items()]
        parts.append("</ul>")
    parts.append("<h2>config.yaml</h2>")
    parts.append(
        f"<pre>{esc(config)}</pre>" if config is not None else "<p>(no config.yaml in the run directory)</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
