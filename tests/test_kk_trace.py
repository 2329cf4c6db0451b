"""K&K truth-table traces: an exact grammar, a correct derivation (re-read independently), reward 3.0."""

from __future__ import annotations

import itertools
import json
import re

import pyarrow.parquet as pq
import pytest

from lucidrl.cli import main
from lucidrl.data.kk import Binary, Leaf, Not, Puzzle, answer_response, generate_dataset, write_kk_parquet
from lucidrl.data.kk.trace import build_trace, trace_response
from lucidrl.rewards import default_compute_score

# ---- an independent reader of the trace (written without the trace module's code) -------------------

_LEAF = r"(\w+) ([KN]):([KN]) ([TF])"
_CLAUSE = re.compile(r"^ (\w+) ([KN]) says (.+) =([TF]) (ok|x)$")
_OPS = {
    "and": lambda a, b: a and b,
    "or": lambda a, b: a or b,
    "then": lambda a, b: (not a) or b,
    "iff": lambda a, b: a == b,
}


def _parse_expression(text: str) -> tuple[str, list[tuple[str, bool, bool, bool]]]:
    """("leaf" | "not" | op, [(name, claimed knight, actual knight, written value), ...])."""
    forms = [("leaf", rf"^{_LEAF}$"), ("not", rf"^not {_LEAF}$")]
    forms += [(op, rf"^{_LEAF} {op} {_LEAF}$") for op in _OPS]
    for kind, pattern in forms:
        m = re.match(pattern, text)
        if m:
            g = m.groups()
            leaves = [(g[i], g[i + 1] == "K", g[i + 2] == "K", g[i + 3] == "T") for i in range(0, len(g), 4)]
            return kind, leaves
    raise AssertionError(f"unreadable expression {text!r}")


def _check_trace(response: str, names: list[str], knights: list[bool], statements_json: str) -> int:
    """Assert every step of the trace is right; returns the number of rows."""
    m = re.fullmatch(r" (.+) </think> <answer> (.+) </answer>", response, re.DOTALL)
    assert m, f"response is not ' TRACE </think> <answer> ... </answer>': {response!r}"
    statements = json.loads(statements_json)
    rows = m.group(1).split("; ")
    order = list(itertools.product((True, False), repeat=len(names)))
    for r, row in enumerate(rows):
        header, body = row.split(":", 1)
        tokens = header.split(" ")
        assert tokens[0::2] == names, f"row {r} header {header!r} does not list {names} in order"
        assignment = [t == "K" for t in tokens[1::2]]
        assert assignment == list(order[r]), f"row {r} is {header!r}; expected assignment {order[r]}"
        role = dict(zip(names, assignment, strict=True))
        clauses = body.split(",")
        verdicts = []
        for speaker, clause in enumerate(clauses):
            cm = _CLAUSE.match(clause)
            assert cm, f"row {r}: unreadable clause {clause!r}"
            name, speaker_role, expr, value, verdict = cm.groups()
            assert name == names[speaker] and (speaker_role == "K") == role[name], clause
            kind, leaves = _parse_expression(expr)
            stated = statements[speaker]
            if stated[0] in ("knight", "knave"):
                expected_kind, expected_leaves = "leaf", [stated]
            else:
                expected_kind, expected_leaves = {"implies": "then"}.get(stated[0], stated[0]), stated[1:]
            assert kind == expected_kind, f"{clause!r} does not have the shape of statement {stated}"
            for (leaf_name, claimed, actual, written), (tag, person) in zip(
                leaves, expected_leaves, strict=True
            ):
                assert leaf_name == names[person] and claimed == (tag == "knight"), (clause, stated)
                assert actual == role[leaf_name], f"row {r}: {clause!r} misreads {leaf_name}'s role"
                assert written == (claimed == actual), f"row {r}: {clause!r} has a wrong leaf value"
            values = [leaf[3] for leaf in leaves]
            if kind == "leaf":
                truth = values[0]
            elif kind == "not":
                truth = not values[0]
            else:
                truth = _OPS[kind](*values)
            assert (value == "T") == truth, f"row {r}: {clause!r} combines its leaves wrongly"
            assert (verdict == "ok") == (truth == role[name]), f"row {r}: {clause!r} has a wrong verdict"
            verdicts.append(verdict)
        assert "x" not in verdicts[:-1], f"row {r} goes on after an inconsistent speaker"
        last = r == len(rows) - 1
        if last:
            assert verdicts == ["ok"] * len(names), "the last row must fit every speaker"
            assert assignment == knights, "the trace ends on an assignment other than the solution"
        else:
            assert verdicts[-1] == "x", f"row {r} is not rejected, yet the trace goes on"
    return len(rows)


@pytest.fixture(scope="module")
def traced_rows() -> list[dict]:
    train, val = generate_dataset((2, 5), n_train=60, n_val=12, seed=5, trace=True)
    return train + val


def test_every_trace_is_a_correct_derivation(traced_rows):
    rows_seen = set()
    for row in traced_rows:
        gt = row["reward_model"]["ground_truth"]
        n_rows = _check_trace(row["response"], gt["names"], gt["knights"], row["extra_info"]["statements"])
        rows_seen.add(n_rows)
    assert len(rows_seen) > 3, "solutions sit at various places in the table"


def test_every_traced_row_scores_three(traced_rows):
    for row in traced_rows:
        prefix = row["prompt"][-1]["content"]
        result = default_compute_score(
            row["data_source"],
            prefix + row["response"],
            row["reward_model"]["ground_truth"],
            row["extra_info"],
        )
        assert result["score"] == 3.0 and result["acc"] == 1.0, row["response"]


def test_trace_ok_tells_a_right_derivation_from_a_lucky_answer(traced_rows):
    row = traced_rows[0]
    prefix = row["prompt"][-1]["content"]
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]

    def score(response, extra_info=info):
        return default_compute_score(row["data_source"], prefix + response, gt, extra_info)

    assert score(row["response"])["trace_ok"] == 1.0
    assert score(row["response"].replace("  ", " ").replace(" ", "  ", 3))["trace_ok"] == 1.0  # spacing
    # one step wrong, the same right answer: full score, trace_ok 0
    wrong = re.sub(r"=([TF])", lambda m: "=" + ("F" if m.group(1) == "T" else "T"), row["response"], count=1)
    assert wrong != row["response"]
    assert score(wrong)["score"] == 3.0 and score(wrong)["trace_ok"] == 0.0
    # a trace that starts with a name the puzzle does not have is a wrong trace, not "no trace"
    first = info["names"][0] if "names" in info else gt["names"][0]
    assert score(row["response"].replace(first, "Zebedee"))["trace_ok"] == 0.0
    # free-form reasoning, or a row without statements: no trace_ok at all (never part of the score)
    answer = row["response"].split("</think>", 1)[1]
    assert "trace_ok" not in score(" let me think </think>" + answer)
    # ordinary openings that look like one name-role pair are free-form too (they counted as wrong traces)
    for opening in ("Step N: list the statements", "Case K: suppose the first is a knight", "Let N be the"):
        assert "trace_ok" not in score(f" {opening} </think>" + answer), opening
    assert "trace_ok" not in score(row["response"], extra_info={"index": 0})
    with pytest.raises(ValueError, match=r"extra_info.statements=.*does not describe a puzzle"):
        score(row["response"], extra_info={"statements": '[["knight", 7]]'})


def test_trace_option_changes_only_the_response():
    plain = generate_dataset((2, 3), n_train=6, n_val=2, seed=5)
    traced = generate_dataset((2, 3), n_train=6, n_val=2, seed=5, trace=True)
    for a, b in zip(plain[0] + plain[1], traced[0] + traced[1], strict=True):
        assert {k: v for k, v in a.items() if k != "response"} == {
            k: v for k, v in b.items() if k != "response"
        }
        assert a["response"].startswith(" </think> <answer> ")
        assert b["response"].endswith(a["response"]) and len(b["response"]) > len(a["response"])


def test_exact_grammar_on_a_hand_made_puzzle():
    # Henry: "Ava is a knave"; Ava: "Henry is a knight and Ava is a knight" -> Henry knight, Ava knave.
    statements = (Leaf(1, False), Binary("and", Leaf(0, True), Leaf(1, True)))
    puzzle = Puzzle(statements, ("Henry", "Ava"), (True, False))
    assert build_trace(statements, puzzle.names) == (
        "Henry K Ava K: Henry K says Ava N:K F =F x; "
        "Henry K Ava N: Henry K says Ava N:N T =T ok, Ava N says Henry K:K T and Ava K:N F =F ok",
        (True, False),
    )
    assert trace_response(puzzle) == " " + build_trace(statements, puzzle.names)[0] + answer_response(puzzle)
    negated = (Not(Leaf(1, True)), Binary("implies", Leaf(0, True), Leaf(1, True)))
    trace, solution = build_trace(negated, ("Mia", "Leo"))
    assert trace.startswith(
        "Mia K Leo K: Mia K says not Leo K:K T =F x; Mia K Leo N: Mia K says not Leo K:N F =T ok"
    )
    assert " Leo N says Mia K:K T then Leo K:N F =F ok" in trace and solution == (True, False)


def test_a_puzzle_without_a_unique_solution_is_refused():
    # Both say "the other is a knight": (K, K) and (N, N) both fit; the stored answer is the second.
    statements = (Leaf(1, True), Leaf(0, True))
    with pytest.raises(ValueError, match="more than one solution"):
        trace_response(Puzzle(statements, ("Mia", "Leo"), (False, False)))
    with pytest.raises(ValueError, match="no consistent assignment"):
        build_trace((Leaf(0, False), Leaf(0, True)), ("Mia", "Leo"))  # Mia: "I am a knave"


def test_data_kk_trace_flag_writes_traced_responses(tmp_path, capsys):
    assert (
        main(
            ["data", "kk", "--people", "2-3", "--train", "4", "--val", "2", "--out", str(tmp_path), "--trace"]
        )
        == 0
    )
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert all(" says " in r["response"] and r["response"].endswith(" </answer>") for r in rows)
    assert "truth-table traces" in capsys.readouterr().out
    info = write_kk_parquet(tmp_path / "plain", people=(2, 3), n_train=4, n_val=2, seed=0)
    assert all(" says " not in r["response"] for r in pq.read_table(info["train"]).to_pylist())
