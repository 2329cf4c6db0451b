"""learning_vs_trl.py's verdict over several seeds: each seed's crossing, the curves averaged point by point,
the crossing of the averages, and the --json files it combines (the training itself needs TRL: not run here)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning_vs_trl.py"


@pytest.fixture(scope="module")
def lvt():
    spec = importlib.util.spec_from_file_location("learning_vs_trl", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _curve(points):
    return [{"step": step, "train_s": s, "acc": acc} for step, s, acc in points]


def _run(seed, lucid, trl, steps=3):
    return {
        "setting": "smollm2",
        "model": "m",
        "steps": steps,
        "eval_every": 1,
        "n_eval": 150,
        "seed": seed,
        "curves": {"lucidrl": _curve(lucid), "trl": _curve(trl)},
    }


# seed 0: lucidrl never reaches TRL's final (0.45); seed 1: it does at step 2, at 0.15 of TRL's time
SEED0 = _run(
    0,
    [(0, 0, 0.07), (1, 100, 0.25), (2, 220, 0.20), (3, 375, 0.37)],
    [(0, 0, 0.07), (1, 430, 0.42), (2, 860, 0.49), (3, 1300, 0.45)],
)
SEED1 = _run(
    1,
    [(0, 0, 0.07), (1, 80, 0.09), (2, 165, 0.47), (3, 305, 0.61)],
    [(0, 0, 0.07), (1, 390, 0.20), (2, 770, 0.12), (3, 1100, 0.18)],
)


def test_reached_is_the_first_point_at_or_above_trls_final(lvt):
    miss, line = lvt.reached(SEED0["curves"]["lucidrl"], SEED0["curves"]["trl"], 1)
    assert (
        miss is None
        and "never reached TRL's final accuracy 0.450" in line
        and "best was 0.370 at step 3" in line
    )
    hit, line = lvt.reached(SEED1["curves"]["lucidrl"], SEED1["curves"]["trl"], 1)
    assert (hit["step"], hit["train_s"], hit["trl_train_s"]) == (2, 165, 1100)
    assert hit["ratio"] == pytest.approx(0.15) and "met" in line


def test_mean_curves_average_each_point_and_the_mean_decides(lvt, capsys):
    runs = [
        {**run, "reached": lvt.reached(run["curves"]["lucidrl"], run["curves"]["trl"], 1)[0]}
        for run in (SEED0, SEED1)
    ]
    mean = lvt.mean_curves(runs)
    assert [p["acc"] for p in mean["lucidrl"]] == pytest.approx([0.07, 0.17, 0.335, 0.49])
    assert [p["train_s"] for p in mean["trl"]] == pytest.approx([0, 410, 815, 1200])
    summary = lvt.print_seeds(runs)
    out = capsys.readouterr().out
    # one seed of two met the goal; the averages cross at step 2 (0.335 >= TRL's mean final 0.315)
    assert summary["seeds_met"] == 1 and summary["seeds"] == [0, 1]
    assert summary["reached"]["step"] == 2
    assert summary["reached"]["ratio"] == pytest.approx(192.5 / 1200)
    assert "goal met in 1 of 2 seeds; on the mean curves, lucidrl reached TRL's final accuracy 0.315" in out


def test_runs_of_other_settings_do_not_average(lvt):
    with pytest.raises(SystemExit, match="seed 1's run has steps=2, seed 0's 3"):
        lvt.mean_curves([SEED0, _run(1, [(0, 0, 0.1), (2, 9, 0.2)], [(0, 0, 0.1), (2, 9, 0.2)], steps=2)])


def test_combine_reads_one_seed_files_and_several_seed_files(lvt, tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps({**SEED0, "reached": None}))
    two.write_text(json.dumps({"runs": [{**SEED1, "reached": None}], "mean": None}))
    assert [run["seed"] for run in lvt.load_runs([str(one), str(two)])] == [0, 1]
    with pytest.raises(SystemExit, match=r"seeds \[0, 0\] repeat"):
        lvt.load_runs([str(one), str(one)])
    (tmp_path / "other.json").write_text('{"curves": {}}')
    with pytest.raises(SystemExit, match="other.json: not this script's --json output"):
        lvt.load_runs([str(tmp_path / "other.json")])
