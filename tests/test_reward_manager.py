import pytest
import torch

from lucidrl.batch import Batch
from lucidrl.rewards.custom import CustomFunctionError
from lucidrl.rewards.manager import RewardFunctionError, RuleRewardManager


def _batch(tok, texts, gts, data_source="kk_logic"):
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, ids)) + 2
    responses = torch.full((len(ids), width), tok.pad_token_id)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    n = len(texts)
    return Batch(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": [data_source] * n,
            "ground_truth": gts,
            "extra_info": [{"index": i} for i in range(n)],
            "assistant_prefix": ["<think>"] * n,
        },
    )


GT = {
    "solution_text_format": "(1) Zoey is a knight\n(2) Oliver is a knave",
    "names": ["Zoey", "Oliver"],
    "knights": [True, False],
}


def test_kk_scores_land_on_the_last_response_token(tiny_tokenizer):
    right = " reasoning </think> <answer> (1) Zoey is a knight\n(2) Oliver is a knave </answer>"
    wrong = " reasoning </think> <answer> (1) Zoey is a knave\n(2) Oliver is a knave </answer>"
    batch = _batch(tiny_tokenizer, [right, wrong, "garbage"], [GT, GT, GT])
    out, extras = RuleRewardManager(tiny_tokenizer).score(batch)
    scores = out["token_level_scores"]
    last = batch["response_mask"].sum(-1) - 1
    assert scores.sum(-1).tolist() == [3.0, -0.5, -3.0]
    assert [scores[i, last[i]].item() for i in range(3)] == [3.0, -0.5, -3.0]
    assert extras["acc"] == [1.0, 0.0, 0.0]
    assert out["response_text"][0].startswith("<think> reasoning")


def test_custom_function_from_config(tmp_path, tiny_tokenizer):
    f = tmp_path / "my_reward.py"
    f.write_text(
        "def score_len(data_source, solution_str, ground_truth, extra_info):\n"
        "    return {'score': float(len(solution_str)), 'is_long': float(len(solution_str) > 10)}\n"
        "def broken(data_source, solution_str, ground_truth, extra_info):\n"
        "    raise KeyError('missing_field')\n"
    )
    batch = _batch(tiny_tokenizer, ["abc", "abcdefghijklmnop"], ["x", "y"], data_source="my_task")
    out, extras = RuleRewardManager.from_config(tiny_tokenizer, str(f), "score_len").score(batch)
    assert out["token_level_scores"].sum(-1).tolist() == [len("<think>abc"), len("<think>abcdefghijklmnop")]
    assert extras["is_long"] == [0.0, 1.0]
    with pytest.raises(
        RewardFunctionError,
        match=r"(?s)raised KeyError: 'missing_field'.*data_source='my_task', sample 0.*my_reward.py\", line 4",
    ):
        RuleRewardManager.from_config(tiny_tokenizer, str(f), "broken").score(batch)
    with pytest.raises(CustomFunctionError, match="nope"):
        RuleRewardManager.from_config(tiny_tokenizer, str(f), "nope")


def test_custom_functions_are_called_by_keyword_as_verl_calls_them(tmp_path, tiny_tokenizer):
    """A function written for verl with its parameters in another order scored 0.0 silently (called by
    position, solution_str got the data_source); one with other names is refused when loaded."""
    f = tmp_path / "verl_style.py"
    f.write_text(
        "def reordered(solution_str, ground_truth, data_source=None, extra_info=None):\n"
        "    return float(ground_truth in solution_str and data_source == 'my_task')\n"
        "def keyword_only(*, data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(ground_truth in solution_str)\n"
        "def other_names(ds, text, gt, info):\n"
        "    return 1.0\n"
    )
    batch = _batch(tiny_tokenizer, ["so x", "no"], ["x", "y"], data_source="my_task")
    for name in ("reordered", "keyword_only"):
        out, _ = RuleRewardManager.from_config(tiny_tokenizer, str(f), name).score(batch)
        assert out["token_level_scores"].sum(-1).tolist() == [1.0, 0.0], name
    with pytest.raises(CustomFunctionError, match=r"other_names\(ds, text, gt, info\) cannot be called as"):
        RuleRewardManager.from_config(tiny_tokenizer, str(f), "other_names")


def test_text_extras_are_left_out_of_the_metrics_and_said_once(tmp_path, tiny_tokenizer, caplog):
    """verl's math_dapo returns {"score", "acc", "pred": "<parsed answer>"}: a function returning it
    stopped the run (RewardOutputError); the text is no metric, so it is left out, with one warning."""
    f = tmp_path / "dapo_like.py"
    f.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 1.0, 'acc': True, 'pred': solution_str[-3:]}\n"
    )
    manager = RuleRewardManager.from_config(tiny_tokenizer, str(f), "compute_score")
    assert manager.score_is_accuracy is False and RuleRewardManager(tiny_tokenizer).score_is_accuracy
    batch = _batch(tiny_tokenizer, ["abc", "defg"], ["x", "y"], data_source="my_task")
    with caplog.at_level("WARNING"):
        out, extras = manager.score(batch)
        manager.score(batch)
    assert extras == {"acc": [1.0, 1.0]} and out["token_level_scores"].sum(-1).tolist() == [1.0, 1.0]
    warned = [r.getMessage() for r in caplog.records if "'pred'" in r.getMessage()]
    assert len(warned) == 1 and "not a metric" in warned[0]


def test_unknown_data_source_is_an_error(tiny_tokenizer):
    batch = _batch(tiny_tokenizer, ["x"], ["1"], data_source="kk_logik")
    with pytest.raises(Exception, match="kk_logik.*kk_logic"):
        RuleRewardManager(tiny_tokenizer).score(batch)


FLAKY = """
import threading
RELEASE = threading.Event()

def compute_score(data_source, solution_str, ground_truth, extra_info):
    kind = extra_info["kind"]
    if kind == "raise":
        raise ZeroDivisionError("flaky reward")
    if kind == "hang":
        RELEASE.wait()  # until the test lets it go
        return 5.0
    if kind == "nan":
        return float("nan")
    return 1.0
"""


def _flaky(tmp_path, tok, kinds, on_error, timeout_s=None):
    f = tmp_path / "flaky.py"
    f.write_text(FLAKY)
    manager = RuleRewardManager.from_config(
        tok, str(f), "compute_score", on_error=on_error, timeout_s=timeout_s
    )
    batch = _batch(tok, ["a"] * len(kinds), [None] * len(kinds), data_source="my_task")
    batch.set("extra_info", [{"kind": k} for k in kinds])
    return manager, batch


@pytest.mark.parametrize("on_error", ["mask", "zero"])
def test_a_failing_reward_is_marked_counted_and_its_first_error_shown_once(
    tmp_path, tiny_tokenizer, caplog, on_error
):
    manager, batch = _flaky(tmp_path, tiny_tokenizer, ["ok", "raise", "ok", "raise", "nan"], on_error)
    out, _ = manager.score(batch)
    assert out["token_level_scores"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert out["reward_failed"].tolist() == [False, True, False, True, True]
    assert not out["reward_timed_out"].any()
    text = caplog.text
    # the first exception in full, with its traceback and what happens to such samples; then only counts
    assert text.count("ZeroDivisionError: flaky reward") == 2  # the message and the traceback's last line
    assert 'flaky.py", line' in text and "sample 1" in text and "sample 3" not in text
    assert f"reward.on_error={on_error}" in text and "reward/failed" in text
    assert text.count("returned nan for sample 4") == 1  # a score that is no number: its own kind, once
    caplog.clear()
    manager.score(batch)
    assert "flaky reward" not in caplog.text


def test_on_error_raise_stops_at_the_first_failure_as_before(tmp_path, tiny_tokenizer):
    manager, batch = _flaky(tmp_path, tiny_tokenizer, ["ok", "raise"], "raise")
    with pytest.raises(RewardFunctionError, match=r"raised ZeroDivisionError: flaky reward\n.*sample 1"):
        manager.score(batch)


def test_a_reward_past_its_timeout_is_a_failure_and_the_next_samples_still_score(tmp_path, tiny_tokenizer):
    from lucidrl.rewards.manager import RewardTimeoutError

    manager, batch = _flaky(tmp_path, tiny_tokenizer, ["ok", "hang", "ok", "raise"], "mask", timeout_s=0.2)
    raising, hanging = _flaky(tmp_path, tiny_tokenizer, ["hang"], "raise", timeout_s=0.2)
    try:
        out, _ = manager.score(batch)
        assert out["reward_failed"].tolist() == [False, True, False, True]
        assert out["reward_timed_out"].tolist() == [False, True, False, False]
        assert out["token_level_scores"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
        assert manager.caller.timed_out == 1  # its worker process was killed; the later samples got a new one
        assert manager.caller.started == 2
        with pytest.raises(RewardTimeoutError, match=r"not return within reward.timeout_s=0.2 s on sample 0"):
            raising.score(hanging)
        # an exception in the worker process comes back with the function's own traceback
        strict, failing = _flaky(tmp_path, tiny_tokenizer, ["ok", "raise"], "raise", timeout_s=30)
        with pytest.raises(
            RewardFunctionError, match=r"raised ZeroDivisionError: flaky reward\n.*sample 1"
        ) as e:
            strict.score(failing)
        assert 'flaky.py", line' in str(e.value) and "in the reward's worker process" in str(e.value)
        strict.close()
    finally:
        for m in (manager, raising):
            m.close()


HANGS = """
import os, subprocess, sys, time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if extra_info["kind"] == "ok":
        return 1.0
    # a process of its own, as a sandbox or a judge would start; then never returns
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
    with open(extra_info["pids"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    if extra_info["kind"] == "forever":
        while True:
            time.sleep(0.01)
    time.sleep(extra_info["sleep"])
    with open(extra_info["marker"], "w") as f:  # what a call left running would do, late
        f.write("written after its timeout")
    return 1.0
"""


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its parent to reap it is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_reward_past_its_timeout_is_killed_with_what_it_started(tmp_path, tiny_tokenizer, caplog):
    """reward.timeout_s ran the call in a thread, which Python cannot stop: a reward that never returned
    spun on until the run ended, and one that slept past its time still wrote its file. Now its worker
    process and the processes it started are killed, and the message says so."""
    import threading
    import time

    f = tmp_path / "hangs.py"
    f.write_text(HANGS)
    manager = RuleRewardManager.from_config(
        tiny_tokenizer, str(f), "compute_score", on_error="mask", timeout_s=1.0
    )
    marker, pids = tmp_path / "late.txt", [tmp_path / "pids0", tmp_path / "pids1"]
    batch = _batch(tiny_tokenizer, ["a"] * 3, [None] * 3, data_source="my_task")
    batch.set(
        "extra_info",
        [
            {"kind": "forever", "pids": str(pids[0])},
            {"kind": "late", "pids": str(pids[1]), "sleep": 2.0, "marker": str(marker)},
            {"kind": "ok"},
        ],
    )
    threads = set(threading.enumerate())
    try:
        with caplog.at_level("WARNING"):
            out, _ = manager.score(batch)
        assert out["reward_timed_out"].tolist() == [True, True, False]
        assert out["token_level_scores"].sum(-1).tolist() == [0.0, 0.0, 1.0]  # the next sample still scores
        assert "it was stopped: its worker process (and every process it started) was killed" in caplog.text
        assert manager.caller.timed_out == 2 and manager.caller.started == 3
        worker = manager.caller.pid
    finally:
        manager.close()
    started = [int(p) for path in pids for p in path.read_text().split()]  # 2 workers and their children
    assert len(started) == 4
    time.sleep(2.5)  # past when the late call would have written its file
    assert not marker.exists()
    assert not any(_alive(p) for p in [*started, worker]), [p for p in started if _alive(p)]
    assert manager.caller.pid is None
    assert {t for t in threading.enumerate() if t.is_alive()} <= threads  # no thread left behind


def test_without_a_timeout_a_reward_is_called_in_the_trainers_process(tmp_path, tiny_tokenizer):
    f = tmp_path / "pid.py"
    f.write_text(
        "import os\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info):\n    return {'score': 1.0, 'pid': os.getpid()}\n"
    )
    manager = RuleRewardManager.from_config(tiny_tokenizer, str(f), "compute_score")
    _, extras = manager.score(_batch(tiny_tokenizer, ["a"], [None], data_source="my_task"))
    import os

    assert manager.caller is None and extras["pid"] == [os.getpid()]
    timed = RuleRewardManager.from_config(tiny_tokenizer, str(f), "compute_score", timeout_s=30)
    try:
        _, extras = timed.score(_batch(tiny_tokenizer, ["a", "b"], [None, None], data_source="my_task"))
    finally:
        timed.close()
    assert extras["pid"][0] == extras["pid"][1] != os.getpid()  # one worker process, for every call
    # a function given as an object that cannot be pickled falls back to a thread, and says so on timeout
    from lucidrl.rewards.deadline import ThreadCaller

    fallback = RuleRewardManager(tiny_tokenizer, lambda **kw: 1.0, timeout_s=30).caller
    assert isinstance(fallback, ThreadCaller) and "background thread" in fallback.on_timeout


def test_scoring_progress_is_shown_while_a_sample_hangs(tmp_path, tiny_tokenizer):
    from rich.console import Console

    from lucidrl.trainer.reward_progress import ScoringProgress

    console = Console(record=True, width=200)
    manager, batch = _flaky(tmp_path, tiny_tokenizer, ["ok", "hang"], "mask", timeout_s=1.0)
    manager.progress = ScoringProgress(console, delay_s=0.05, every_s=0.05)
    try:
        manager.score(batch)
    finally:
        manager.close()
    shown = console.export_text()
    # printed from a timer thread while sample 2 hung, not after it
    assert "scoring rewards: 1/2 samples in" in shown and "sample 2 running for" in shown
