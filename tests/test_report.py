"""`lucidrl report`: PNG plots and a self-contained HTML page from a hand-written metrics.jsonl."""

from __future__ import annotations

import base64
import json
import re

import pytest

from lucidrl.cli import main
from lucidrl.trainer.report import ReportError, read_metrics, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIG = "model:\n  path: models/tiny\nactor:\n  optim:\n    lr: 0.0001  # <tuned>\n"


def _rl_records(steps: int = 12) -> list[dict]:
    records = [
        {"step": 0, "val/acc": 0.1, "val/kk_logic/acc/2_people": 0.2, "val/kk_logic/acc/3_people": 0.0}
    ]
    for s in range(1, steps + 1):
        records.append(
            {
                "step": s,
                "critic/score/mean": -3 + 0.4 * s,
                "critic/score/max": -2 + 0.4 * s,
                "critic/score/min": -3.0,
                "actor/kl_loss": 0.001 * s,
                "actor/entropy": 2.0 - 0.05 * s,
                "actor/pg_loss": None,  # NaN is logged as null and must be skipped, not plotted
                "response_length/mean": 40 + s,
                "timing_s/gen": 1.5,
                "timing_s/update_actor": 0.8 + 0.01 * s,
                "timing_s/ref": 0.3,
                "timing_s/step": 2.7 + 0.01 * s,
            }
        )
        if s % 6 == 0:
            records[-1].update({"val/acc": 0.1 + 0.03 * s, "val/kk_logic/acc/2_people": 0.2 + 0.04 * s})
            records[-1]["val/kk_logic/acc/3_people"] = 0.02 * s
    return records


def _run_dir(tmp_path, records: list[dict], config: str | None = CONFIG):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config is not None:
        (run / "config.yaml").write_text(config)
    return run


@pytest.mark.slow
def test_rl_run_report_has_valid_pngs_and_an_html_page_embedding_them(tmp_path):
    run = _run_dir(tmp_path, _rl_records())
    info = write_report(run)
    names = sorted(p.stem for p in info["plots"])
    assert names == ["entropy", "kl", "response_length", "reward", "timing", "val_accuracy"]
    assert sorted(info["skipped"]) == ["sft_loss", "sft_token_acc"]
    assert "sft/loss or val/loss" in info["skipped"]["sft_loss"]
    assert info["steps"] == 13
    for path in info["plots"]:
        assert path.parent == run / "report"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5_000, path
    page = info["html"].read_text()
    assert info["html"] == run / "report" / "report.html"
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == len(info["plots"])
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(p.read_bytes() for p in info["plots"])
    for name in names:
        assert f'id="{name}"' in page
    # the config, HTML-escaped inside <pre>; the page loads nothing from elsewhere
    assert "<pre>model:\n  path: models/tiny\nactor:" in page and "# &lt;tuned&gt;" in page
    assert "http://" not in page and "https://" not in page
    assert "val/kk_logic/acc/3_people" in page  # captions list the metrics drawn


@pytest.mark.slow
def test_sft_run_report_plots_loss_and_token_accuracy(tmp_path, capsys):
    records = [{"step": s, "sft/loss": 3.0 / s, "timing_s/step": 0.5} for s in range(1, 11)]
    records[4].update({"val/loss": 0.9, "val/token_acc": 0.4})
    records[9].update({"val/loss": 0.5, "val/token_acc": 0.7})
    run = _run_dir(tmp_path, records, config=None)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    for name in ("sft_loss", "sft_token_acc", "timing"):
        assert (run / "report" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    for name in ("reward", "kl", "entropy", "val_accuracy", "response_length"):
        assert f"skipped {name}:" in out
        assert not (run / "report" / f"{name}.png").exists()
    assert f"report: {run / 'report' / 'report.html'}" in out
    assert "no config.yaml" in (run / "report" / "report.html").read_text()


def test_null_values_are_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0, "b": null}\n\n{"step": 2, "a": 2, "b": 0.5, "c": "text"}\n')
    found = read_metrics(path)
    assert found.series == {"a": [(1, 1.0), (2, 2.0)], "b": [(2, 0.5)]} and found.notes == []
    assert found.all_null == {"c"}  # logged, never a number
    # a step logged twice keeps its last record, in step order (points were in file order: the line
    # ran back from step 5 to 3), and an integer too large for a float is no number, not a crash
    path.write_text(
        "".join(f'{{"step": {s}, "a": {s}}}\n' for s in range(1, 6))
        + "".join(f'{{"step": {s}, "a": {-s}, "big": {10**400}}}\n' for s in range(3, 8))
    )
    found = read_metrics(path)
    assert found.series == {"a": [(1, 1.0), (2, 2.0), (3, -3.0), (4, -4.0), (5, -5.0), (6, -6.0), (7, -7.0)]}
    assert found.notes == [
        "3 step(s) were logged more than once (3-5): each is plotted with its last record (a resumed run trains them again)"
    ]


def test_a_run_still_writing_is_reported_and_all_null_metrics_are_named(tmp_path, capsys):
    """A torn last line (a run killed, or still running, mid-write) stopped the report; a metric logged
    only as null was reported as not logged at all."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "critic/score/mean": 1.0, "val/acc": null}\n{"step": 2, "critic/score/mean": 1.5, "val/acc": null}\n{"step": 3, "critic/sc'
    )
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "note: metrics.jsonl line 3 (the last) is not JSON and was left out" in out
    assert "plot: " in out and "reward.png" in out
    assert "skipped val_accuracy: val/acc logged, but every value is null (NaN)" in out
    assert "line 3 (the last) is not JSON" in (run / "report" / "report.html").read_text()


def test_the_timing_plot_looks_each_part_up_once(tmp_path, monkeypatch):
    """It rebuilt a dict of a part's points for every step: minutes for a long run's one PNG."""
    import lucidrl.trainer.report as report

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "timing_s/gen": 1.0, "timing_s/step": 2.0}) + "\n" for s in range(1, 301)
        )
    )
    built = []
    real = dict

    class CountingDict(real):
        def __init__(self, *a, **k):
            if a and isinstance(a[0], list):
                built.append(len(a[0]))
            super().__init__(*a, **k)

    series = report.read_metrics(run / "metrics.jsonl").series
    (timing,) = [spec for spec in report.PLOTS if spec.name == "timing"]
    monkeypatch.setattr(report, "dict", CountingDict, raising=False)  # draw_plot's own dict() calls
    report.draw_plot(timing, series, report.select_metrics(timing, list(series)), run / "t.png")
    assert len(built) == 1, len(built)  # once for the one part (was once per step: 300)


def test_missing_dir_missing_file_empty_file_and_bad_lines_are_clear_errors(tmp_path, capsys):
    with pytest.raises(ReportError, match="does not exist or is not a directory"):
        write_report(tmp_path / "nope")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ReportError, match=r"metrics.jsonl does not exist"):
        write_report(run)
    (run / "metrics.jsonl").write_text("\n")
    with pytest.raises(ReportError, match="holds no metrics records"):
        write_report(run)
    (run / "metrics.jsonl").write_text('{"step": 1, "a": 1}\n{"step": 2, "a": \n{"step": 3, "a": 1}\n')
    with pytest.raises(ReportError, match=r"metrics.jsonl line 2 is not JSON"):
        write_report(run)  # torn in the middle: not a run mid-write
    for step in ("NaN", "Infinity", '"3"'):
        (run / "metrics.jsonl").write_text(f'{{"step": 1, "a": 1}}\n{{"step": {step}, "a": 1}}\n')
        with pytest.raises(ReportError, match=r"line 2 is not a metrics record.*finite numeric \"step\""):
            write_report(run)
    (run / "metrics.jsonl").write_text('{"step": 1, "a": 1}\n[1, 2]\n')
    with pytest.raises(ReportError, match=r"line 2 is not a metrics record.*numeric \"step\""):
        write_report(run)
    assert not (run / "report").exists()
    # through the CLI: one line on stderr and exit code 2
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
