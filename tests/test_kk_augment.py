"""Re-rendered K&K rows: the same puzzle and solution under new names, a valid trace, nothing leaked."""

from __future__ import annotations

import json

import pytest

from lucidrl.data.kk import generate_dataset, solve
from lucidrl.data.kk.augment import puzzle_from_row, rerendered_rows
from lucidrl.rewards import default_compute_score


@pytest.fixture(scope="module")
def rows():
    train, _ = generate_dataset((2, 3), n_train=12, n_val=0, seed=4, trace=True)
    return train


def test_copies_keep_structure_and_solution_under_new_names(rows):
    out = rerendered_rows(rows, 3, seed=0, trace=True)
    assert len(out) == 3 * len(rows)
    assert [r["extra_info"]["index"] for r in out] == list(range(len(out)))
    by_structure: dict[str, list[dict]] = {}
    for r in out:
        by_structure.setdefault(r["extra_info"]["statements"], []).append(r)
    assert len(by_structure) == len(rows)  # no new structure, each one 3 times
    for copies in by_structure.values():
        assert len(copies) == 3
        knights = {tuple(r["reward_model"]["ground_truth"]["knights"]) for r in copies}
        assert len(knights) == 1  # the same solution, whoever is called what
        puzzle = puzzle_from_row(copies[0])
        assert solve(puzzle.statements) == [next(iter(knights))]
        texts = {r["prompt"][-2]["content"] for r in copies}
        assert len(texts) == 3  # every copy reads differently
        for r in copies:
            names = r["reward_model"]["ground_truth"]["names"]
            assert all(name in r["prompt"][-2]["content"] for name in names)
            # the rebuilt trace is a right derivation for the new names: full score, trace_ok 1
            prefix = r["prompt"][-1]["content"]
            result = default_compute_score(
                r["data_source"], prefix + r["response"], r["reward_model"]["ground_truth"], r["extra_info"]
            )
            assert result["score"] == 3.0 and result["trace_ok"] == 1.0
    # the layout of the rows is kept: system prompt present as in the input
    assert all([m["role"] for m in r["prompt"]] == [m["role"] for m in rows[0]["prompt"]] for r in out)


def test_prompt_only_rows_stay_prompt_only(rows):
    pool = [{k: v for k, v in r.items() if k != "response"} for r in rows]
    for r in pool:
        r["prompt"] = [m for m in r["prompt"] if m["role"] != "system"]
    out = rerendered_rows(pool, 2, seed=1, trace=False)
    assert len(out) == 2 * len(pool) and all("response" not in r for r in out)
    assert all(all(m["role"] != "system" for m in r["prompt"]) for r in out)
    assert rerendered_rows(pool, 1, seed=1, trace=False)[0].keys() == pool[0].keys()


def test_bad_inputs_are_named(rows):
    with pytest.raises(ValueError, match="copies=0"):
        rerendered_rows(rows, 0, seed=0, trace=True)
    bare = dict(rows[0], extra_info={"index": 3, "split": "train"})
    with pytest.raises(ValueError, match="row 3 has no extra_info.statements"):
        rerendered_rows([bare], 2, seed=0, trace=True)
    json.dumps(rerendered_rows(rows[:2], 2, seed=0, trace=True))  # plain JSON-able rows (parquet-ready)


def test_data_kk_renderings_flag(tmp_path, capsys):
    import pyarrow.parquet as pq

    from lucidrl.cli import main

    args = ["data", "kk", "--people", "2", "--train", "10", "--val", "5", "--trace", "--out", str(tmp_path)]
    assert main([*args, "--renderings", "3"]) == 0
    assert "wrote 30 train rows (10 puzzles x 3 renderings)" in capsys.readouterr().out
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    val = pq.read_table(tmp_path / "val.parquet").to_pylist()
    assert len(train) == 30 and len({r["extra_info"]["statements"] for r in train}) == 10 and len(val) == 5
    assert not {r["extra_info"]["statements"] for r in train} & {r["extra_info"]["statements"] for r in val}
    assert main([*args, "--renderings", "0"]) == 2
    assert "renderings=0: must be an integer >= 1" in capsys.readouterr().err
