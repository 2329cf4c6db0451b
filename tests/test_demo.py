"""`lucidrl demo`: set-up made once and reused, a GRPO run per seed, the table, the JSON and the plot.

The tiny model cannot learn word problems in two steps; these tests check the mechanics (what runs,
what is measured and written, what is refused). What the demo measures on SmolLM2 is in docs/demo.md.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from lucidrl.cli import main
from lucidrl.demo.plan import DemoPlan, SeedResult
from lucidrl.demo.report import verdict
from lucidrl.demo.run import run_demo
from lucidrl.demo.setup import ensure_data
from lucidrl.diagnostics.errors import UsageError

SMALL = dict(n_train=32, n_val=8, steps=2, prompts=4, n=2, max_new_tokens=8, eval_every=1)


def test_two_seeds_run_and_write_their_curves_the_table_and_the_plot(tiny_model, tmp_path, capsys):
    out = tmp_path / "demo"
    results = run_demo(out, seeds=[0, 1], plan=DemoPlan(**SMALL), model=str(tiny_model["path"]))
    assert [r.seed for r in results] == [0, 1]
    summary = json.loads((out / "demo_results.json").read_text())
    assert summary["plan"]["steps"] == 2 and [s["seed"] for s in summary["seeds"]] == [0, 1]
    for r in results:
        assert r.steps == 2
        assert [p["step"] for p in r.curve] == [0, 1, 2]  # the base model, then every step
        assert r.base_acc == r.curve[0]["acc"] and r.final_acc == r.curve[-1]["acc"]
        assert [p["step"] for p in r.reward] == [1, 2]
        assert (out / f"seed{r.seed}" / "metrics.jsonl").is_file()
    assert (out / "demo_curves.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "held-out greedy accuracy" in printed and "lucidrl demo --seeds 0 1 2" in printed
    assert summary["verdict"]["seeds"] == 2 and summary["verdict"]["met"] is False  # fewer than 3 seeds


def test_data_is_made_once_and_again_when_the_plan_changes(tmp_path):
    console = Console(record=True, width=200)
    files = ensure_data(tmp_path, DemoPlan(**SMALL), console)
    before = (tmp_path / "val.parquet").stat().st_mtime_ns
    assert ensure_data(tmp_path, DemoPlan(**SMALL), console) == files
    assert (tmp_path / "val.parquet").stat().st_mtime_ns == before
    assert "made by an earlier run" in console.export_text()
    import pyarrow.parquet as pq

    ensure_data(tmp_path, DemoPlan(**{**SMALL, "n_val": 12}), console)
    assert pq.read_table(files["val"]).num_rows == 12


def test_the_verdict_needs_three_distinct_seeds_each_twenty_points_up():
    def seed(s, base, final):
        return SeedResult(seed=s, base_acc=base, final_acc=final)

    assert verdict([seed(0, 0.10, 0.30), seed(1, 0.1, 0.5), seed(2, 0.05, 0.25)])["met"] is True
    # 0.55 - 0.35 is 0.19999... in floats: compared in whole points it is 20
    assert verdict([seed(0, 0.35, 0.55), seed(1, 0.1, 0.5), seed(2, 0.1, 0.5)])["met"] is True
    assert verdict([seed(0, 0.10, 0.29), seed(1, 0.1, 0.5), seed(2, 0.1, 0.5)])["met"] is False
    assert verdict([seed(0, 0.1, 0.5), seed(1, 0.1, 0.5)])["met"] is False  # two seeds
    assert verdict([seed(0, 0.1, 0.5), seed(1, 0.1, 0.5), seed(2, None, None)])["met"] is False


def test_bad_requests_are_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(UsageError, match="repeats a seed"):
        run_demo(tmp_path / "a", seeds=[0, 0], plan=DemoPlan(**SMALL))
    assert main(["demo", "--out", str(tmp_path / "b"), "--model", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["demo", "--out", str(tmp_path / "c"), "--steps", "0"]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    assert main(["demo", "--out", str(tmp_path / "d"), "--warmup-steps", "-1"]) == 2
    assert "warmup-steps must be >= 0" in capsys.readouterr().err


def test_the_flags_reach_the_plan_and_the_run_config(monkeypatch, tmp_path):
    import lucidrl.demo.run as demo_run

    seen = {}
    monkeypatch.setattr(demo_run, "run_demo", lambda out, seeds, plan, model: seen.update(plan=plan))
    # the ten-step plan the demo ran before, from the command line
    assert main(["demo", "--out", str(tmp_path), "--steps", "10", "--lr", "2e-5", "--warmup-steps", "3"]) == 0
    plan = seen["plan"]
    assert (plan.steps, plan.lr, plan.warmup_steps, plan.prompts) == (10, 2e-5, 3, DemoPlan().prompts)
    cfg = demo_run.grpo_config("m", {"train": "t", "val": "v"}, tmp_path, plan, seed=0)
    assert cfg["actor"]["optim"] == {"lr": 2e-5, "warmup_steps": 3}
    assert cfg["trainer"]["total_training_steps"] == 10


def test_bf16_compute_only_where_the_cpu_has_it(monkeypatch):
    import lucidrl.models.precision as precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)  # AVX2 only: bf16 is emulated
    assert DemoPlan().resolved_compute_dtype() is None
    assert DemoPlan(device="cuda").resolved_compute_dtype() == "bfloat16"
    assert DemoPlan(compute_dtype="bfloat16").resolved_compute_dtype() == "bfloat16"  # asked for
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert DemoPlan().resolved_compute_dtype() == "bfloat16"


def test_the_user_is_told_before_the_run_when_the_cpu_forces_float32(monkeypatch):
    import lucidrl.models.precision as precision
    from lucidrl.demo.run import float32_note

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    note = float32_note(DemoPlan())
    assert note is not None and "no native bfloat16" in note and "docs/demo.md" in note
    assert float32_note(DemoPlan(compute_dtype=None)) is None  # float32 asked for: nothing to explain
    assert float32_note(DemoPlan(device="cuda")) is None
    for native in (True, None):  # bf16 compute, or a CPU whose flags cannot be read
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        assert float32_note(DemoPlan()) is None


def test_eager_attention_only_under_bf16_compute_on_an_amx_cpu(monkeypatch, tmp_path):
    import lucidrl.models.precision as precision
    from lucidrl.demo.run import grpo_config

    for native, amx, expected in (
        (True, True, "eager"),
        (True, False, None),
        (False, True, None),
        (True, None, None),
    ):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        monkeypatch.setattr(precision, "cpu_has_amx", lambda amx=amx: amx)
        assert DemoPlan().resolved_attn_implementation() == expected, (native, amx)
        assert DemoPlan(device="cuda").resolved_attn_implementation() is None
        assert DemoPlan(attn_implementation="sdpa").resolved_attn_implementation() == "sdpa"  # asked for
        cfg = grpo_config("m", {"train": "t", "val": "v"}, tmp_path, DemoPlan(), seed=0)
        assert cfg["model"]["attn_implementation"] == expected


def test_the_demo_ends_answers_by_its_stop_rule_unless_told_not_to(monkeypatch, tmp_path):
    from lucidrl.demo import run as demo_run
    from lucidrl.rewards.word_problems import STOP_AFTER_ANSWER

    files = {"train": "t.parquet", "val": "v.parquet"}
    assert (
        demo_run.grpo_config("m", files, tmp_path, DemoPlan(), 0)["rollout"]["stop_regex"]
        == STOP_AFTER_ANSWER
    )
    plans = []
    monkeypatch.setattr(demo_run, "run_demo", lambda out, seeds, plan, model: plans.append(plan))
    assert main(["demo", "--out", str(tmp_path)]) == 0
    assert main(["demo", "--out", str(tmp_path), "--no-stop-rule", "--steps", "2"]) == 0
    assert plans[0].stop_regex == STOP_AFTER_ANSWER
    assert plans[1].stop_regex is None and plans[1].steps == 2
    assert demo_run.grpo_config("m", files, tmp_path, plans[1], 0)["rollout"]["stop_regex"] is None
