"""`lucidrl experiment scarce-labels` wiring, on a tiny budget: the data split, both branches from one checkpoint, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lucidrl.cli import main
from lucidrl.data.kk import from_json, puzzle_key
from lucidrl.experiments.scarce_labels import ScarceLabelsPlan, grpo_config, run_experiment, sft_config


def pool_once_infos(seed_dir):
    return pq.read_table(seed_dir / "data" / "pool_puzzles.parquet").column("extra_info").to_pylist()


@pytest.mark.slow
def test_demo_runs_both_branches_from_one_checkpoint(tmp_path, capsys, monkeypatch):
    import lucidrl.trainer.evaluation

    calls, real_evaluate = [], lucidrl.trainer.evaluation.evaluate

    def spy(model_path, data_files, **kw):
        calls.append((model_path, data_files, kw.get("limit")))
        return real_evaluate(model_path, data_files, **kw)

    monkeypatch.setattr(lucidrl.trainer.evaluation, "evaluate", spy)
    plan = ScarceLabelsPlan(
        labelled=24, unlabelled=16, val=8, sft_steps=4, rl_steps=2, hidden=64, layers=2,
        sft_batch=8, rl_prompts=4, rl_n=4, max_new_tokens=48, eval_k=2, renderings=2, pool_renderings=2,
        sft_curve_every=3, rl_curve_every=1,
    )  # fmt: skip
    seed_dir = tmp_path / "seed3"
    # a previous demo's baseline in the folder: the resumed run (which may not empty it) still starts
    (seed_dir / "sft_only").mkdir(parents=True)
    (seed_dir / "sft_only" / "metrics.jsonl").write_text('{"step": 99}\n')
    results = run_experiment(tmp_path, seeds=[3], plan=plan)
    labelled = pq.read_table(seed_dir / "data" / "labelled.parquet")
    unlabelled = pq.read_table(seed_dir / "data" / "unlabelled.parquet")
    # 24 labelled puzzles, each also under fresh names; 16 pool puzzles likewise
    assert labelled.num_rows == 48 and "response" in labelled.column_names
    structures = [i["statements"] for i in labelled.column("extra_info").to_pylist()]
    assert len(set(structures)) == 24
    # the RL pool carries prompts and the verifier's ground truth, never a trace
    assert unlabelled.num_rows == 32 and "response" not in unlabelled.column_names
    pool_structures = {i["statements"] for i in unlabelled.column("extra_info").to_pylist()}
    assert len(pool_structures) == 16 and not pool_structures & set(structures)
    # nor any puzzle told in another order of its people (logic.puzzle_key), held-out ones included
    val = pq.read_table(seed_dir / "data" / "val.parquet").column("extra_info").to_pylist()

    def keys(infos):
        return {puzzle_key([from_json(s) for s in json.loads(i["statements"])]) for i in infos}

    split_keys = [keys(labelled.column("extra_info").to_pylist()), keys(pool_once_infos(seed_dir)), keys(val)]
    assert [len(k) for k in split_keys] == [24, 16, 8]
    assert not (
        split_keys[0] & split_keys[1] or split_keys[0] & split_keys[2] or split_keys[1] & split_keys[2]
    )
    labelled_prompts = {json.dumps(p) for p in labelled.column("prompt").to_pylist()}
    assert not labelled_prompts & {json.dumps(p) for p in unlabelled.column("prompt").to_pylist()}
    # both branches start from the SFT run's end: GRPO from its weights, SFT alone resumes the run itself
    import yaml

    assert str(seed_dir / "sft" / "final") in (seed_dir / "grpo" / "config.yaml").read_text()
    baseline = yaml.safe_load((seed_dir / "sft_only" / "config.yaml").read_text())["trainer"]
    assert baseline["resume_mode"] == "resume_path" and baseline["resume_from_path"] == str(seed_dir / "sft")
    r = results[0]
    # budgets in steps: exactly that many (no collapse in two steps), whatever the machine's speed; the
    # baseline trains for as long as GRPO's steps took, by the clock its learning curve uses
    assert (r.sft_steps, r.rl_steps) == (4, 2) and r.sft_only_steps >= 1
    grpo_step_s = [
        json.loads(line).get("timing_s/step") for line in (seed_dir / "grpo" / "metrics.jsonl").open()
    ]
    assert (
        r.baseline_s == pytest.approx(sum(t for t in grpo_step_s if t))
        and baseline["max_time_s"] == r.baseline_s
    )
    assert yaml.safe_load((seed_dir / "grpo" / "config.yaml").read_text())["trainer"]["max_time_s"] is None
    # its steps carry on from the first phase's (optimizer, schedule and data position restored)
    logged = [json.loads(line)["step"] for line in (seed_dir / "sft_only" / "metrics.jsonl").open()]
    assert logged[0] == r.sft_steps + 1 and logged[-1] == r.sft_steps + r.sft_only_steps
    for acc in (r.start, r.rl, r.sft_only):
        assert 0.0 <= acc["greedy_acc"] <= 1.0 and 0.0 <= acc["sampled_format"] <= 1.0
        assert acc["greedy_trace_ok"] is None or 0.0 <= acc["greedy_trace_ok"] <= 1.0
        assert 0.0 <= acc["pool_greedy_acc"] <= 1.0
    # each of the three models is evaluated on the held-out file and on the pool puzzles GRPO drew, each
    # once as first written (pool_puzzles.parquet holds all 16)
    pool_once = pq.read_table(seed_dir / "data" / "pool_puzzles.parquet").column("extra_info").to_pylist()
    assert len(pool_once) == 16 and {i["statements"] for i in pool_once} == pool_structures
    pool = str(seed_dir / "data" / "pool_drawn.parquet")
    drawn = pq.read_table(pool).column("extra_info").to_pylist()
    assert 1 <= len(drawn) == r.pool_drawn <= 16 and len({i["statements"] for i in drawn}) == len(drawn)
    assert {json.dumps(i) for i in drawn} <= {json.dumps(i) for i in pool_once}
    for name in ("sft", "grpo", "sft_only"):
        model_path = str(seed_dir / name / "final")
        assert (model_path, [pool], None) in calls
        assert any(c[0] == model_path and c[1] == [str(seed_dir / "data" / "val.parquet")] for c in calls)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["seeds"][0]["rl"] == r.rl and saved["plan"]["labelled"] == 24
    # the verdict is written, and one seed never meets a bar of three
    assert saved["verdict"]["seeds"] == 1 and saved["verdict"]["met"] is False and saved["wall_s"] > 0
    phases = (
        "data_and_model",
        "sft",
        "start_eval",
        "grpo",
        "grpo_eval",
        "baseline",
        "baseline_eval",
        "curves",
    )
    assert all(saved["seeds"][0]["seconds"][k] > 0 for k in phases) and r.sft_steps >= 1
    assert r.seconds["rl_path"] == pytest.approx(sum(r.seconds[k] for k in phases[:5]))
    # learning curves: each run's checkpoints, every 3 SFT steps and every GRPO step (and the last), in
    # order; the branches' clocks go on from the SFT phase's, which is its step times summed
    curves = saved["seeds"][0]["curves"]
    sft_steps = [*range(3, r.sft_steps + 1, 3)] + ([r.sft_steps] if r.sft_steps % 3 else [])
    assert [p["step"] for p in curves["sft"]] == sft_steps
    assert [p["step"] for p in curves["grpo"]] == list(range(1, r.rl_steps + 1))
    assert [p["step"] for p in curves["sft_only"]][-1] == r.sft_steps + r.sft_only_steps
    step_s = [json.loads(line)["timing_s/step"] for line in (seed_dir / "sft" / "metrics.jsonl").open()]
    assert curves["sft"][-1]["train_s"] == pytest.approx(sum(step_s))
    sft_total = curves["sft"][-1]["train_s"]
    for name in ("grpo", "sft_only"):
        own = {}
        for line in (seed_dir / name / "metrics.jsonl").open():
            record = json.loads(line)
            if "timing_s/step" in record:
                own[record["step"]] = record["timing_s/step"]
        for p in curves[name]:
            assert p["train_s"] == pytest.approx(sft_total + sum(t for s, t in own.items() if s <= p["step"]))
    for p in [*curves["sft"], *curves["grpo"], *curves["sft_only"]]:
        assert 0.0 <= p["greedy_acc"] <= 1.0
    # the last GRPO point is the final model (no collapse in 3 s): the same greedy accuracy
    assert curves["grpo"][-1]["greedy_acc"] == r.rl["greedy_acc"]
    out = capsys.readouterr().out
    assert "GRPO beat both the start and SFT alone by >= 20 points in" in out and "of 1 seeds" in out
    said = " ".join(out.split())  # rich wraps long lines
    assert "the bar (>= 20 points over both the start and SFT alone, in 3 of 3 distinct seeds" in said
    assert "NOT MET (1 distinct seed(s)" in said
    assert "on the RL prompts greedy" in out and "on RL prompts" in out
    assert "SFT on the labelled traces for 4 steps" in out and "for 2 steps" in out
    assert (
        "budget per seed: SFT 4 steps + GRPO 2 steps (the baseline: SFT 4 steps + the time GRPO's steps took)"
        in said
    )
    squeezed = "".join(out.split())  # rich breaks a long path anywhere
    assert (
        f"resumedfrom{seed_dir / 'sft' / 'checkpoints'}/global_step_{r.sft_steps}afterstep{r.sft_steps}:"
        in squeezed
    )


def test_demo_refuses_more_puzzles_than_exist(tmp_path, capsys):
    assert (
        main(
            [
                "experiment",
                "scarce-labels",
                "--out",
                str(tmp_path),
                "--labelled",
                "400",
                "--unlabelled",
                "100",
            ]
        )
        == 2
    )
    assert "more than the 285 distinct 2-person puzzles" in capsys.readouterr().err
    assert main(["experiment", "scarce-labels", "--out", str(tmp_path), "--renderings", "0"]) == 2
    assert "--renderings must be > 0, got 0" in capsys.readouterr().err


def _result(seed, start, rl, sft_only, rl_path_s=600.0, collapse=None):
    from lucidrl.experiments.scarce_labels import SeedResult

    return SeedResult(
        seed=seed, start={"greedy_acc": start}, rl={"greedy_acc": rl}, sft_only={"greedy_acc": sft_only},
        collapse=collapse, seconds={"rl_path": rl_path_s},
    )  # fmt: skip


def test_the_verdict_counts_whole_points_distinct_seeds_and_the_time():
    """From a review: 0.75 - 0.55 >= 0.20 is False in floats (38 of the 81 exact 20-point pairs failed),
    repeated seeds counted as seeds, and the 15-minute part was never checked."""
    from lucidrl.experiments.scarce_labels import verdict

    exact = [_result(s, 0.55, 0.75, 0.50) for s in (0, 1, 2)]
    v = verdict(exact)
    assert v["met"] and v["wins"] == 3 and [s["gain_over_both_points"] for s in v["per_seed"]] == [20] * 3
    assert not verdict(exact[:2])["met"]  # two seeds: not the bar
    assert not verdict([*exact[:2], _result(2, 0.55, 0.74, 0.50)])["met"]  # 19 points
    assert not verdict([*exact[:2], _result(2, 0.55, 0.75, 0.50, rl_path_s=901.0)])["met"]  # over time
    collapsed = verdict([*exact[:2], _result(2, 0.55, 0.75, 0.50, collapse="policy collapse ...")])
    assert collapsed["met"] and collapsed["per_seed"][2]["collapsed"]  # counted, and said so


def test_demo_refuses_repeated_seeds_and_too_few_unlabelled_before_any_training(tmp_path, capsys):
    assert main(["experiment", "scarce-labels", "--out", str(tmp_path), "--seeds", "1", "1", "1"]) == 2
    assert "--seeds 1 1 1 repeats a seed" in capsys.readouterr().err
    assert main(["experiment", "scarce-labels", "--out", str(tmp_path), "--unlabelled", "8"]) == 2
    assert "--unlabelled 8 is fewer than the 16 prompts of one GRPO step" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was generated or trained


def test_a_three_person_plan_takes_its_own_defaults_and_four_people_are_refused(capsys):
    from lucidrl.diagnostics.errors import UsageError
    from lucidrl.experiments.scarce_labels import PEOPLE_DEFAULTS

    two, three = ScarceLabelsPlan(), ScarceLabelsPlan(people=3, labelled=50)
    assert (two.labelled, two.unlabelled, two.renderings, two.max_new_tokens) == (100, 85, 8, 160)
    # a pool that never comes round twice, and room for the longest 3-person trace (404 tokens measured)
    assert (three.labelled, three.unlabelled, three.renderings, three.max_new_tokens) == (50, 3000, 4, 448)
    assert PEOPLE_DEFAULTS[2]["max_new_tokens"] == 160  # the plan's defaults are not written back
    with pytest.raises(UsageError, match="--people 4: the experiment runs 2- or 3-person puzzles"):
        ScarceLabelsPlan(people=4)
    assert main(["experiment", "scarce-labels", "--people", "4"]) == 2
    assert "--people 4: the experiment runs 2- or 3-person puzzles" in capsys.readouterr().err
    # the 285-puzzle limit is 2-person K&K's; its error names the way out
    assert main(["experiment", "scarce-labels", "--labelled", "200", "--unlabelled", "100"]) == 2
    assert "lower them, or give --people 3" in capsys.readouterr().err


def test_three_person_demo_data_split(tmp_path):
    from lucidrl.experiments.scarce_labels import POOL_EVAL_MAX, write_data

    plan = ScarceLabelsPlan(people=3, labelled=6, unlabelled=POOL_EVAL_MAX + 30, val=4, renderings=2)
    files = write_data(tmp_path, plan, seed=0)

    def infos(name):
        return pq.read_table(files[name]).column("extra_info").to_pylist()

    labelled, pool, once, val = infos("labelled"), infos("unlabelled"), infos("pool_puzzles"), infos("val")
    assert {i["n_people"] for i in labelled + pool + once + val} == {3}
    assert len(labelled) == 12 and len(pool) == POOL_EVAL_MAX + 30 and len(val) == 4
    # every pool puzzle once as first written, for the accuracy on those GRPO draws (write_drawn_pool)
    assert sorted(i["statements"] for i in once) == sorted(i["statements"] for i in pool)

    def keys(rows):
        return {puzzle_key([from_json(s) for s in json.loads(i["statements"])]) for i in rows}

    parts = [keys(labelled), keys(pool), keys(val)]
    assert [len(k) for k in parts] == [6, POOL_EVAL_MAX + 30, 4]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert "response" in pq.read_table(files["labelled"]).column_names
    assert "response" not in pq.read_table(files["unlabelled"]).column_names


def test_the_pool_accuracy_is_measured_on_the_first_distinct_puzzles_grpo_drew(tmp_path):
    from types import SimpleNamespace

    from lucidrl.experiments.scarce_labels import POOL_EVAL_MAX, write_data, write_drawn_pool

    plan = ScarceLabelsPlan(people=3, labelled=2, unlabelled=POOL_EVAL_MAX + 40, val=2, renderings=1)
    files = write_data(tmp_path, plan, seed=1)
    pool = pq.read_table(files["pool_puzzles"]).to_pylist()
    # drawn in another order than the file's, with repeats (a second epoch, or re-rendered copies)
    picks = [pool[i] for i in [7, 3, 7, 0, *range(10, POOL_EVAL_MAX + 20), 3]]
    drawn = [SimpleNamespace(extra_info=row["extra_info"]) for row in picks]
    assert write_drawn_pool(files, drawn) == POOL_EVAL_MAX + 13  # distinct puzzles drawn in all
    rows = pq.read_table(files["pool_drawn"]).to_pylist()
    expect = [7, 3, 0, *range(10, POOL_EVAL_MAX + 7)]  # the first POOL_EVAL_MAX distinct ones
    assert [r["extra_info"]["statements"] for r in rows] == [
        pool[i]["extra_info"]["statements"] for i in expect
    ]
    assert rows[0] == pool[7]  # as first written: prompt, ground truth and all


@pytest.mark.slow
def test_learning_curve_points_their_times_and_a_restored_end(tmp_path, kk_data, tiny_model, monkeypatch):
    """Each complete checkpoint once (a killed save's .tmp left out), at its run's summed step times; a run
    that ended on restored weights has them as its point at the step they hold, and its last checkpoint
    (saved after the restore, under the last step's number) is left out (found in review)."""
    import shutil

    import lucidrl.trainer.evaluation
    from lucidrl.experiments.scarce_labels import learning_curve

    run = tmp_path / "grpo"
    for name in ("global_step_2", "global_step_4", "global_step_6", "global_step_8.tmp"):
        shutil.copytree(tiny_model["path"], run / "checkpoints" / name / "actor" / "model")
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "timing_s/step": 1.0 + s}) + "\n" for s in range(1, 7))
    )
    evaluated = []
    real = lucidrl.trainer.evaluation.evaluate

    def spy(path, files, **kw):
        evaluated.append(path.split("/")[-3])
        return real(path, files, **kw)

    monkeypatch.setattr(lucidrl.trainer.evaluation, "evaluate", spy)
    plan = ScarceLabelsPlan(max_new_tokens=8)
    files = {"val": kk_data["val"]}
    points = learning_curve(run, files, plan, seed=0, start_s=100.0)
    assert [p["step"] for p in points] == [2, 4, 6] and evaluated == [
        "global_step_2",
        "global_step_4",
        "global_step_6",
    ]
    assert [p["train_s"] for p in points] == [100 + 2 + 3, 100 + 2 + 3 + 4 + 5, 100 + 2 + 3 + 4 + 5 + 6 + 7]
    evaluated.clear()
    final = {"step": 3, "greedy_acc": 0.5, "greedy_trace_ok": None}
    points = learning_curve(run, files, plan, seed=0, start_s=100.0, restored=final)
    assert evaluated == ["global_step_2", "global_step_4"]  # the last one holds step 3's weights
    assert [p["step"] for p in points] == [2, 3, 4] and points[1] == {
        **final,
        "train_s": 109.0,
        "restored": True,
    }


def test_a_pretrained_start_gets_rates_and_micro_batches_of_its_own():
    scratch, pretrained = ScarceLabelsPlan(), ScarceLabelsPlan(model="models/smollm2")
    assert (scratch.sft_lr, scratch.rl_lr, scratch.rl_micro_batch) == (1e-3, 1e-4, 64)
    assert (pretrained.sft_lr, pretrained.rl_lr, pretrained.rl_micro_batch) == (2e-5, 2e-5, 32)
    assert ScarceLabelsPlan(model="m", rl_lr=1e-4).rl_lr == 1e-4  # a value given is kept
    # the pretrained model's logits go through the chunked head; the scratch model's as they were
    files = {"unlabelled": "u.parquet"}
    assert grpo_config("m", files, Path("r"), pretrained, 0)["actor"]["head_chunk_tokens"] == 1024
    assert grpo_config("m", files, Path("r"), scratch, 0)["actor"]["head_chunk_tokens"] == 0
    files["labelled"] = "l.parquet"
    assert sft_config("m", files, Path("r"), pretrained, 0, 10.0)["head_chunk_tokens"] == 1024
    assert sft_config("m", files, Path("r"), scratch, 0, 10.0)["head_chunk_tokens"] == 0


def test_budgets_in_steps_end_the_phases_by_steps_and_are_refused_when_doubled(tmp_path, capsys):
    files = {"labelled": "l.parquet", "unlabelled": "u.parquet"}
    timed, counted = ScarceLabelsPlan(), ScarceLabelsPlan(sft_steps=30, rl_steps=20)
    sft, grpo = (
        sft_config("m", files, Path("r"), counted, 0, 300.0, steps=30),
        grpo_config("m", files, Path("r"), counted, 0),
    )
    assert (sft["trainer"]["total_training_steps"], sft["trainer"]["max_time_s"]) == (30, None)
    assert (grpo["trainer"]["total_training_steps"], grpo["trainer"]["max_time_s"]) == (20, None)
    sft, grpo = (
        sft_config("m", files, Path("r"), timed, 0, 300.0),
        grpo_config("m", files, Path("r"), timed, 0),
    )
    assert (sft["trainer"]["total_training_steps"], sft["trainer"]["max_time_s"]) == (timed.max_steps, 300.0)
    assert (grpo["trainer"]["total_training_steps"], grpo["trainer"]["max_time_s"]) == (
        timed.max_steps,
        360.0,
    )
    out = str(tmp_path / "x")
    assert main(["experiment", "scarce-labels", "--out", out, "--rl-seconds", "60", "--rl-steps", "5"]) == 2
    assert "--rl-seconds and --rl-steps are two budgets for one phase" in capsys.readouterr().err
    assert main(["experiment", "scarce-labels", "--out", out, "--sft-steps", "0"]) == 2
    assert "--sft-steps must be an integer >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_bf16_compute_only_for_a_pretrained_start_on_a_cpu_with_native_bf16(monkeypatch):
    import lucidrl.models.precision as precision

    for native, expected in ((True, "bfloat16"), (False, None), (None, None)):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        assert ScarceLabelsPlan(model="m").compute_dtype == expected
        assert ScarceLabelsPlan().compute_dtype is None  # the scratch model keeps float32
    plan = ScarceLabelsPlan(model="m", compute_dtype="bfloat16")
    files = {"labelled": "l.parquet", "unlabelled": "u.parquet"}
    assert sft_config("m", files, Path("r"), plan, 0, 10.0)["model"]["compute_dtype"] == "bfloat16"
    assert grpo_config("m", files, Path("r"), plan, 0)["model"]["compute_dtype"] == "bfloat16"
