"""The fault suite: bad inputs and damaged checkpoints a new user meets, each stopped before any time is
spent with an error that names the file and the fix; Ctrl-C and SIGTERM; processes killed at the worst
moments and resumed (docs/troubleshooting.md lists each case with the test that reproduces it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import TOY_REWARD
from safetensors.torch import load_file

from lucidrl.config import load_config
from lucidrl.data.dataset import DatasetError
from lucidrl.rewards.registry import UnknownDataSourceError
from lucidrl.trainer import checkpoint, run_status
from lucidrl.trainer.ppo import PPOTrainer
from lucidrl.workers.training.train_state import CheckpointError


def _args(tmp_path, model: str, train: str, run: Path, *extra: str) -> list[str]:
    reward = tmp_path / "reward.py"
    if not reward.exists():
        reward.write_text(TOY_REWARD)
    return [
        f"model.path={model}",
        f"data.train_files=[{train}]",
        "data.max_prompt_length=1000",
        "data.max_response_length=6",
        "data.train_batch_size=2",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size=4",
        "actor.optim.lr=1e-3",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={run}",
        f"reward.custom_function.path={reward}",
        *extra,
    ]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, kk_data, tiny_model):
    """A 2-step run with a checkpoint after each step, on a copy of the tiny model (one test rebuilds it)."""
    root = tmp_path_factory.mktemp("faults")
    model = root / "model"
    shutil.copytree(tiny_model["path"], model)
    run = root / "run"
    args = _args(
        root, str(model), kk_data["train"], run, "trainer.total_training_steps=2", "trainer.save_freq=1"
    )
    PPOTrainer(load_config(None, args)).fit()
    return {"root": root, "model": model, "run": run, "train": kk_data["train"]}


def _damaged(saved_run, tmp_path, damage, *, manifest: bool = True) -> Path:
    """A copy of the saved run with `damage(step_2_folder)` done to it; returns the copy's run dir.
    Without `manifest`, its checkpoints lose their manifest.json, as a lucidrl version before manifests
    wrote them: the damage then meets the readers themselves."""
    run = tmp_path / "run"
    shutil.copytree(saved_run["run"], run)
    if not manifest:
        for file in (run / "checkpoints").glob("global_step_*/manifest.json"):
            file.unlink()
    damage(run / "checkpoints" / "global_step_2")
    return run


def _resume(saved_run, tmp_path, run: Path, *extra: str) -> PPOTrainer:
    steps = "trainer.total_training_steps=3"
    args = _args(saved_run["root"], str(saved_run["model"]), saved_run["train"], run, steps, *extra)
    return PPOTrainer(load_config(None, args))


def _earlier(run: Path) -> str:
    return f"trainer.resume_mode=resume_path trainer.resume_from_path={run / 'checkpoints' / 'global_step_1'}"


def _truncate(path: Path, size: int = 100) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


@pytest.mark.slow
def test_a_truncated_distcp_names_the_folder_and_the_checkpoint_before(saved_run, tmp_path):
    run = _damaged(
        saved_run, tmp_path, lambda step: _truncate(step / "actor" / "__0_0.distcp", 1000), manifest=False
    )
    with pytest.raises(CheckpointError) as info:
        _resume(saved_run, tmp_path, run)
    text = str(info.value)
    assert f"cannot read the optimizer state and LR schedule (.metadata, *.distcp) in {run}" in text
    assert "EOFError" in text and _earlier(run) in text


@pytest.mark.slow
def test_truncated_checkpoint_weights_name_the_file(saved_run, tmp_path):
    weights = "actor/model/model-00001-of-00001.safetensors"
    run = _damaged(saved_run, tmp_path, lambda step: _truncate(step / weights), manifest=False)
    with pytest.raises(CheckpointError) as info:
        _resume(saved_run, tmp_path, run)
    text = str(info.value)
    assert f"cannot read weights in {run / 'checkpoints' / 'global_step_2' / weights}" in text
    assert "metadata is None" not in text and _earlier(run) in text


@pytest.mark.slow
def test_a_garbage_trainer_state_names_the_file(saved_run, tmp_path):
    run = _damaged(
        saved_run, tmp_path, lambda step: (step / "trainer_state.json").write_text("{garbage"), manifest=False
    )
    with pytest.raises(
        CheckpointError, match=r"cannot read the trainer's state in .*trainer_state.json \(JSONDecodeError"
    ):
        _resume(saved_run, tmp_path, run)


@pytest.mark.slow
def test_a_missing_rng_file_names_it_before_anything_loads(saved_run, tmp_path):
    run = _damaged(saved_run, tmp_path, lambda step: (step / "rng.pt").unlink(), manifest=False)
    with pytest.raises(CheckpointError) as info:
        _resume(saved_run, tmp_path, run)
    assert "rng.pt (the trainer process's RNG state) is missing" in str(info.value)
    assert _earlier(run) in str(info.value)


EVIL = """
import os, pathlib, torch

class Payload:
    def __reduce__(self):  # what unpickling runs
        return (pathlib.Path.touch, (pathlib.Path({marker!r}),))

torch.save({{"torch": torch.get_rng_state(), "python": Payload()}}, {path!r})
"""


@pytest.mark.slow
@pytest.mark.parametrize("rng_file", ["rng.pt", "rng/actor+rollout_rank_0.pt"])
def test_a_crafted_rng_file_runs_no_code_on_resume(saved_run, tmp_path, rng_file):
    marker = tmp_path / "pwned"

    def craft(step):
        code = EVIL.format(marker=str(marker), path=str(step / rng_file))
        subprocess.run([sys.executable, "-c", code], check=True)  # written as an attacker would

    run = _damaged(saved_run, tmp_path, craft, manifest=False)  # else the manifest refuses it first
    # torch.load(weights_only=False), as before, would run it: the test's payload does work
    with pytest.raises(CheckpointError, match="unpickling it could run code, so it was not loaded"):
        _resume(saved_run, tmp_path, run)
    assert not marker.exists()
    torch.load(run / "checkpoints" / "global_step_2" / rng_file, weights_only=False)
    assert marker.exists()


EVIL_METADATA = """
import pathlib, pickle

class Payload:
    def __reduce__(self):  # what unpickling runs
        return (pathlib.Path.touch, (pathlib.Path({marker!r}),))

pathlib.Path({path!r}).write_bytes(pickle.dumps(Payload()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("manifest", ["kept", "rewritten", "absent"])
def test_a_metadata_file_replaced_by_a_pickle_runs_no_code_on_resume(saved_run, tmp_path, manifest):
    """torch.distributed.checkpoint unpickles `.metadata`: the manifest refuses a replaced one, and
    with the manifest rewritten to match (or gone, as in checkpoints of older versions) the file is
    read with an unpickler that calls nothing but DCP's metadata classes."""
    from lucidrl.workers.training.checkpoint_files import write_manifest

    marker = tmp_path / "pwned"
    metadata = "actor/.metadata"

    def craft(step):
        code = EVIL_METADATA.format(marker=str(marker), path=str(step / metadata))
        subprocess.run([sys.executable, "-c", code], check=True)
        if manifest == "rewritten":
            write_manifest(step)
        elif manifest == "absent":
            (step / "manifest.json").unlink()

    run = _damaged(saved_run, tmp_path, craft)
    file = run / "checkpoints" / "global_step_2" / metadata
    with pytest.raises(CheckpointError) as info:
        _resume(saved_run, tmp_path, run)
    text = str(info.value)
    if manifest == "kept":
        assert text.startswith(f"checkpoint file {file} is ") and "its save wrote" in text
    else:
        assert text.startswith(
            f"{file} is not torch.distributed.checkpoint metadata: it names global 'pathlib.Path.touch', "
            "which unpickling would call, so it was not loaded"
        )
    assert _earlier(run) in text and not marker.exists()
    import pickle

    pickle.loads(file.read_bytes())  # the payload does work: torch's reader would have run it
    assert marker.exists()


@pytest.mark.slow
def test_a_checkpoint_file_changed_added_or_truncated_is_named_by_the_manifest(saved_run, tmp_path, caplog):
    step2 = Path("checkpoints") / "global_step_2"

    def flip(step):  # same size, other bytes
        file = step / "actor" / "__0_0.distcp"
        data = bytearray(file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        file.write_bytes(bytes(data))

    run = _damaged(saved_run, tmp_path, flip)
    with pytest.raises(CheckpointError) as info:
        _resume(saved_run, tmp_path, run)
    assert str(info.value).startswith(
        f"checkpoint file {run / step2 / 'actor' / '__0_0.distcp'} has other contents than its save wrote"
    )
    assert _earlier(run) in str(info.value)
    shutil.rmtree(run)
    run = _damaged(saved_run, tmp_path, lambda step: (step / "actor" / "extra.distcp").write_bytes(b"x"))
    with pytest.raises(CheckpointError, match=r"extra.distcp is not one its save wrote \(it is not in "):
        _resume(saved_run, tmp_path, run)
    shutil.rmtree(run)
    run = _damaged(saved_run, tmp_path, lambda step: _truncate(step / "actor" / ".metadata", 10))
    with pytest.raises(CheckpointError, match=r"actor/.metadata is 10 bytes and its save wrote \d+: it was"):
        _resume(saved_run, tmp_path, run)
    shutil.rmtree(run)
    # the same truncated .metadata in a checkpoint without a manifest: named by the metadata check
    run = _damaged(
        saved_run, tmp_path, lambda step: _truncate(step / "actor" / ".metadata", 10), manifest=False
    )
    with pytest.raises(CheckpointError) as info:
        _resume(saved_run, tmp_path, run)
    assert str(info.value).startswith(
        "cannot read the index of the optimizer state and LR schedule (torch.distributed.checkpoint metadata) "
        f"in {run / step2 / 'actor' / '.metadata'} (UnpicklingError: pickle data was truncated): the file is"
    )
    shutil.rmtree(run)
    # an intact checkpoint of a version before manifests resumes, with a warning
    run = _damaged(saved_run, tmp_path, lambda step: None, manifest=False)
    with caplog.at_level("WARNING"):
        trainer = _resume(saved_run, tmp_path, run)
    assert trainer.global_step == 2
    assert "has no manifest.json (written by a lucidrl version before checkpoints had one)" in caplog.text


@pytest.mark.slow
def test_a_model_folder_rebuilt_at_another_size_is_named_with_the_shapes(saved_run, tmp_path):
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model

    run = _damaged(saved_run, tmp_path, lambda step: None)
    model = saved_run["model"]
    kept = tmp_path / "model_before"
    shutil.copytree(model, kept)
    try:
        shutil.rmtree(model)
        build_tiny_model(
            model, kk_tokenizer_corpus(seed=0, n_puzzles=100), hidden_size=96, num_layers=2, seed=0
        )
        with pytest.raises(CheckpointError) as info:
            _resume(saved_run, tmp_path, run)
    finally:
        shutil.rmtree(model)
        shutil.copytree(kept, model)
    text = str(info.value)
    assert "its weights do not fit the model this run builds from model.path" in text
    assert "model.embed_tokens.weight is [" in text and ", 64] in the checkpoint and [" in text
    assert (
        "Size mismatch" not in text
        and f"model.path={run / 'checkpoints' / 'global_step_2' / 'actor' / 'model'}" in text
    )


@pytest.mark.slow
def test_a_full_disk_during_a_save_says_so_and_leaves_no_tmp_folder(saved_run, tmp_path, monkeypatch):
    """torch.save's zip writer says "unexpected pos 704 vs 598" when the disk fills, with no errno."""
    from lucidrl.trainer import save_failure

    run = _damaged(
        saved_run,
        tmp_path,
        lambda step: shutil.rmtree(step) or (step.parent / "latest").write_text("global_step_1\n"),
    )
    trainer = _resume(saved_run, tmp_path, run, "trainer.save_freq=1")  # from step 1, to save step 2 again
    real = torch.save

    def full(obj, f, *args, **kwargs):
        if "global_step_2.tmp" in str(f):
            Path(f).write_bytes(b"PK\x03\x04" + bytes(594))
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598")
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(save_failure.shutil, "disk_usage", lambda p: SimpleNamespace(free=1024))
    with pytest.raises(CheckpointError) as info:
        trainer.fit()
    text = str(info.value)
    assert "saving global_step_2 failed: no space left on the device holding" in text
    assert "0.0 MiB free; the last checkpoint took" in text and "unexpected pos 704 vs 598" in text
    assert f"{run / 'checkpoints' / 'global_step_1'} is still the newest complete checkpoint" in text
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["global_step_1", "latest"]
    assert run_status.read(run)["state"] == "failed"


@pytest.mark.slow
def test_a_real_full_disk_on_a_small_tmpfs(saved_run, tmp_path):
    """The same on a 3 MiB tmpfs: torch.distributed.checkpoint's ENOSPC arrives inside its own
    CheckpointException (a BaseException). Needs root to mount; skipped elsewhere."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)]).returncode
    ):
        pytest.skip("mounting a tmpfs needs root")
    try:
        args = _args(
            saved_run["root"], str(saved_run["model"]), saved_run["train"], mnt / "run",
            "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.save_final_model=false",
        )  # fmt: skip
        with pytest.raises(CheckpointError, match="failed: no space left on the device holding") as info:
            PPOTrainer(load_config(None, args)).fit()
        assert "Errno 28" in str(info.value)
        assert not list((mnt / "run" / "checkpoints").glob("*.tmp"))
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.mark.slow
def test_unknown_data_sources_are_found_at_load_before_any_step(saved_run, tmp_path):
    rows = pq.read_table(saved_run["train"]).to_pylist()[:6]
    rows[3]["data_source"] = "kk_logc"
    bad = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist(rows), bad)
    run = tmp_path / "run"
    args = _args(
        saved_run["root"], str(saved_run["model"]), saved_run["train"], run, "trainer.total_training_steps=1"
    )
    plain = [a for a in args if not a.startswith("reward.custom_function")]  # the built-in rules
    with pytest.raises(UnknownDataSourceError) as info:
        PPOTrainer(load_config(None, [*plain, f"data.val_files=[{bad}]"]))
    text = str(info.value)
    assert text.startswith(
        f"data.val_files: no reward function for data_source 'kk_logc' (1 rows, the first {bad} row 3)"
    )
    assert "Did you mean 'kk_logic'?" in text and "nothing was trained" in text
    assert not (run / "metrics.jsonl").exists()
    with pytest.raises(UnknownDataSourceError, match=r"^data.train_files: no reward function"):
        PPOTrainer(
            load_config(None, [*[a for a in plain if "train_files" not in a], f"data.train_files=[{bad}]"])
        )


def test_a_tokenizer_without_a_chat_template_and_an_empty_file_are_named(
    tmp_path, kk_data, tiny_model, tiny_tokenizer
):
    from lucidrl.data.dataset import load_prompts

    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(kk_data["train"]).slice(0, 0), empty)
    with pytest.raises(DatasetError, match=f"data.val_files: '{empty}' holds no rows"):
        load_prompts(
            [kk_data["train"], str(empty)], tiny_tokenizer, max_prompt_length=1024, what="data.val_files"
        )
    template = tiny_tokenizer.chat_template
    try:
        tiny_tokenizer.chat_template = None
        with pytest.raises(DatasetError) as info:
            load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=1024)
    finally:
        tiny_tokenizer.chat_template = template
    text = str(info.value)
    assert (
        f"the tokenizer from '{tiny_model['path']}' (model.tokenizer_path, else model.path) has no chat template"
        in text
    )
    # every row filtered as overlong: the error says by whom and how long they are
    with pytest.raises(
        DatasetError, match=r"all 32 prompts are longer than data.max_prompt_length=10 tokens"
    ):
        load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=10, filter_overlong=True)


HOOKED_REWARD = (
    TOY_REWARD
    + '''
import os, signal

CALLS = [0]

def _hook():
    """LUCIDRL_TEST_SIGNAL=CALL:NAME[:TIMES] sends NAME to this process at its CALL-th score;
    LUCIDRL_TEST_KILL=score:CALL SIGKILLs it there (the trainer process, where rewards are scored)."""
    CALLS[0] += 1
    sent = os.environ.get("LUCIDRL_TEST_SIGNAL", "")
    if sent:
        at, name, *times = sent.split(":")
        if CALLS[0] == int(at):
            for _ in range(int(times[0]) if times else 1):
                os.kill(os.getpid(), getattr(signal, name))
    kill = os.environ.get("LUCIDRL_TEST_KILL", "")
    if kill.startswith("score:") and CALLS[0] == int(kill.split(":")[1]):
        os.kill(os.getpid(), signal.SIGKILL)


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


_KILL = os.environ.get("LUCIDRL_TEST_KILL", "")
if _KILL.startswith("save_rng:"):  # half of the trainer's rng.pt of step N written, then killed
    import torch

    _save = torch.save

    def _half_save(obj, f, *args, **kwargs):
        _save(obj, f, *args, **kwargs)
        if f"global_step_{_KILL.split(':')[1]}.tmp" in str(f) and str(f).endswith("rng.pt"):
            data = open(f, "rb").read()
            open(f, "wb").write(data[: len(data) // 2])
            _die()

    torch.save = _half_save
if _KILL.startswith("before_latest:"):  # step N's folder renamed into place, `latest` not yet updated
    from lucidrl.trainer import checkpoint as _checkpoint

    _point = _checkpoint.point_latest

    def _point_or_die(final):
        if final.name == f"global_step_{_KILL.split(':')[1]}":
            _die()
        return _point(final)

    _checkpoint.point_latest = _point_or_die

_toy = compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info):
    _hook()
    return _toy(data_source, solution_str, ground_truth, extra_info)
'''
)


@pytest.mark.slow
def test_ctrl_c_and_sigterm_end_the_step_save_say_how_to_resume_and_exit_130_143(
    saved_run, tmp_path, monkeypatch, capfd
):
    """Signals sent from inside a step (the reward is scored in the trainer's process): the step ends,
    a checkpoint of it is saved (save_freq=0: trainer.save_on_interrupt alone), the command exits
    128 + the signal. A second Ctrl-C stops at once, without saving that step."""
    from lucidrl.cli import main

    reward = tmp_path / "hooked.py"
    reward.write_text(HOOKED_REWARD)
    run = tmp_path / "run"
    args = [
        "train",
        *_args(saved_run["root"], str(saved_run["model"]), saved_run["train"], run),
        f"reward.custom_function.path={reward}",  # the later one wins
        "trainer.total_training_steps=4",
    ]
    ckpts = run / "checkpoints"

    def train(signal_spec: str) -> tuple[int, str]:
        monkeypatch.setenv("LUCIDRL_TEST_SIGNAL", signal_spec)
        code = main(args)
        return code, capfd.readouterr().err

    code, err = train("2:SIGINT")  # in step 1 (4 samples a step)
    assert code == 130
    assert "SIGINT (Ctrl-C) received: finishing step 1, then saving and stopping" in err
    assert (
        f"SIGINT (Ctrl-C): stopped after step 1 of 4; the newest checkpoint is {ckpts / 'global_step_1'}"
        in err
    )
    assert "run the same command again to continue from it" in err and "Traceback" not in err
    assert run_status.read(run)["state"] == "interrupted"

    code, err = train("2:SIGTERM")  # resumed: in step 2
    assert code == 143 and "SIGTERM: stopped after step 2 of 4" in err and "Traceback" not in err
    assert checkpoint.latest_name(run) == ckpts / "global_step_2"

    code, err = train("2:SIGINT:2")  # step 3, interrupted twice
    assert code == 130 and "SIGINT (Ctrl-C) again: stopped at once, in the middle of step 3" in err
    assert f"the newest checkpoint is {ckpts / 'global_step_2'}" in err and "Traceback" not in err
    assert sorted(p.name for p in ckpts.iterdir()) == ["global_step_1", "global_step_2", "latest"]

    code, err = train("")
    assert code == 0 and run_status.read(run)["state"] == "finished"
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def _cli(args: list[str], kill: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "LUCIDRL_TEST_KILL": kill, "COLUMNS": "500"}  # rich wraps no line
    env.pop("LUCIDRL_TEST_SIGNAL", None)
    return subprocess.run(
        [sys.executable, "-m", "lucidrl", "train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.slow
def test_processes_killed_mid_save_and_mid_step_resume_to_the_uninterrupted_weights(saved_run, tmp_path):
    """SIGKILL (no handler runs) at three moments, then the same command again each time: half-way through
    writing the first checkpoint's rng.pt (no complete checkpoint: the re-run starts the run again, it is
    not refused as "already holds a run"); between renaming step 3's folder into place and updating
    `latest` (step 2 is resumed: `latest` is the authority); mid-step in the second epoch. The last
    re-run ends with weights bit-equal to an uninterrupted run's, and metrics.jsonl holds each step once."""
    train = tmp_path / "train.parquet"  # 4 prompts: 2 steps an epoch, so step 3 starts the second
    pq.write_table(pq.read_table(saved_run["train"]).slice(0, 4), train)
    reward = tmp_path / "hooked.py"
    reward.write_text(HOOKED_REWARD)

    def args(run):
        base = _args(
            saved_run["root"], str(saved_run["model"]), str(train), run, "trainer.total_training_steps=3"
        )
        return [
            *base,
            "trainer.save_freq=1",
            "actor.use_kl_loss=true",
            f"reward.custom_function.path={reward}",
        ]

    straight = _cli(args(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr[-3000:]
    run = tmp_path / "run"
    ckpts = run / "checkpoints"

    killed = _cli(args(run), kill="save_rng:1")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert sorted(p.name for p in ckpts.iterdir()) == ["global_step_1.tmp"]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert run_status.read(run)["state"] == "running"  # what a kill leaves: the process is gone

    killed = _cli(args(run), kill="before_latest:3")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (
        "was killed after logging step 1, with no checkpoint to resume from: starting it again"
        in killed.stderr
    )
    assert (ckpts / "global_step_3" / "trainer_state.json").is_file()
    assert (ckpts / "latest").read_text().strip() == "global_step_2"

    killed = _cli(args(run), kill="score:3")  # resumed from step 2: killed in step 3, the second epoch
    assert killed.returncode == -9 and f"resumed from {ckpts / 'global_step_2'} after step 2" in killed.stdout

    done = _cli(args(run))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {ckpts / 'global_step_2'} after step 2" in done.stdout
    a = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    b = load_file(run / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert run_status.read(run)["state"] == "finished"


def test_a_folder_a_run_is_training_in_is_refused_and_a_crashed_one_is_started_again(
    tmp_path, monkeypatch, caplog
):
    from lucidrl.trainer.setup import RunDirError, prepare_run_dir

    run = tmp_path / "run"
    cfg = load_config(None, [f"trainer.run_dir={run}"])
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # a run in progress: the pid of a process that lives (written as that process would)
        monkeypatch.setattr(os, "getpid", lambda: alive.pid)
        run_status.write(run, "running", step=2)
        monkeypatch.undo()
        with pytest.raises(RunDirError, match=rf"is in use: a run is training there \(pid {alive.pid} on "):
            prepare_run_dir(cfg)
        resume = load_config(None, [f"trainer.run_dir={run}", "trainer.overwrite=true"])
        with pytest.raises(RunDirError, match="is in use"):  # overwrite does not delete it either
            prepare_run_dir(resume)
    finally:
        alive.kill()
        alive.wait()
    # its process gone, no checkpoint: a crash; the same command starts it again, saying so
    prepare_run_dir(cfg)
    assert "was killed after logging step 2, with no checkpoint to resume from" in caplog.text
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
    # a finished run is protected as before
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    run_status.write(run, "finished", step=1)
    with pytest.raises(RunDirError, match="already holds a run"):
        prepare_run_dir(cfg)


def test_sigterm_while_a_run_is_set_up_stops_it_with_a_word_and_143(capsys):
    import signal

    from lucidrl.cli import main
    from lucidrl.trainer.interrupt import RaiseOnSigterm, RunInterrupted

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunInterrupted) as info, RaiseOnSigterm():
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would, while models load
    assert info.value.exit_code == 143 and "stopped while the run was being set up" in str(info.value)
    assert signal.getsignal(signal.SIGTERM) is before  # put back

    def interrupted(args):
        raise KeyboardInterrupt

    import lucidrl.cli.version as version

    real = version.run
    try:
        version.run = interrupted  # Ctrl-C outside training: no traceback, exit 130
        assert main(["version"]) == 130
    finally:
        version.run = real
    assert capsys.readouterr().err == "lucidrl: interrupted (Ctrl-C)\n"


def test_lengths_past_the_models_positions_are_refused_before_any_data_loads(tmp_path, kk_data, tiny_model):
    """1024 + 6 tokens on a 1024-position model, and a 64-position model with the default lengths, were
    trained on (positions the model never learned)."""
    from lucidrl.config.errors import ConfigError
    from lucidrl.trainer import setup

    run = tmp_path / "run"
    args = _args(tmp_path, str(tiny_model["path"]), kk_data["train"], run, "data.max_prompt_length=1024")
    with pytest.raises(ConfigError) as info:
        setup.load_data(load_config(None, args), None)  # refused before the tokenizer is used
    assert str(info.value).startswith(
        "data.max_prompt_length + data.max_response_length = 1024 + 6 = 1030 tokens is more than the 1024 "
        f"positions of the model at model.path='{tiny_model['path']}' (max_position_embeddings in its config.json)"
    )
    assert "lower data.max_prompt_length to at most 1018" in str(info.value)
    small = tmp_path / "small"
    shutil.copytree(tiny_model["path"], small)
    conf = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**conf, "max_position_embeddings": 64}))
    plain = [a for a in args if not a.startswith(("data.max_", "model.path"))]
    with pytest.raises(
        ConfigError,
        match=r"= 512 \+ 256 = 768 tokens is more than the 64 positions.*lower data.max_response_length below 64",
    ):
        setup.load_data(load_config(None, [*plain, f"model.path={small}"]), None)
    setup.check_positions(load_config(None, [*args, "data.max_prompt_length=1018"]))  # fits: no error


def _rows_file(tmp_path, kk_data, name: str, change) -> str:
    rows = pq.read_table(kk_data["train"]).to_pylist()[:4]
    change(rows)
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_a_ground_truth_the_rule_cannot_score_is_found_at_load_for_every_row(
    tmp_path, kk_data, tiny_tokenizer
):
    """A None, NaN or wrong-shaped ground truth failed only when its sample was first scored."""
    from lucidrl.rewards.registry import GroundTruthError
    from lucidrl.trainer import setup

    def none_in_row_2(rows):
        rows[2]["reward_model"] = {**rows[2]["reward_model"], "solution_text_format": None}
        for r in rows:  # the ground truth column as Logic-RL's files hold it: the solution text
            r["reward_model"] = {"style": "rule", "ground_truth": r["reward_model"]["ground_truth"]}
        rows[2]["reward_model"]["ground_truth"] = None

    bad = _rows_file(tmp_path, kk_data, "kk_none", none_in_row_2)
    args = _args(tmp_path, "unused", bad, tmp_path / "run", "data.max_prompt_length=512")
    plain = [a for a in args if not a.startswith("reward.custom_function")]  # the built-in rules
    with pytest.raises(GroundTruthError) as info:
        setup.load_data(load_config(None, plain), tiny_tokenizer)
    text = str(info.value)
    assert text.startswith(
        "data.train_files: reward_model.ground_truth that the built-in rule cannot score: data_source 'kk_logic': "
        f"1 rows, the first {bad} row 2 with ground_truth 'None' (K&K ground truth of type NoneType"
    )
    assert "nothing was trained" in text

    def gsm8k(rows):
        for i, r in enumerate(rows):
            r["data_source"] = "openai/gsm8k"
            r["reward_model"] = {"style": "rule", "ground_truth": float("nan") if i == 1 else 72.0}

    bad = _rows_file(tmp_path, kk_data, "gsm8k_nan", gsm8k)
    with pytest.raises(
        GroundTruthError, match=r"'openai/gsm8k': 4 rows, the first .*row 0 with ground_truth '72.0' \(GSM8K"
    ):
        setup.load_data(load_config(None, [*plain, f"data.train_files=[{bad}]"]), tiny_tokenizer)
    # with a function of the user's, the rows are its to read
    setup.load_data(load_config(None, [*args[:1], *args[2:], f"data.train_files=[{bad}]"]), tiny_tokenizer)


def test_prompts_that_are_not_utf8_text_are_named_at_load(tmp_path, kk_data, tiny_tokenizer):
    """Invalid UTF-8 bytes in a prompt were read (a raw UnicodeDecodeError, or U+FFFD trained on)."""
    from lucidrl.data.dataset import load_prompts

    rows = pq.read_table(kk_data["train"]).to_pylist()[:3]
    content = rows[1]["prompt"][0]["content"]
    # a string column holding latin-1 bytes: pyarrow stores them, and raises UnicodeDecodeError when read
    prompts = pa.array(
        [r["prompt"][0]["content"].encode() for r in rows[:1]] + [content.encode()[:10] + b"caf\xe9 au lait"]
    )
    table = pa.table({"prompt": prompts.view(pa.string()), "data_source": ["kk_logic"] * 2,
                      "reward_model": [r["reward_model"] for r in rows[:2]]})  # fmt: skip
    latin = tmp_path / "latin1.parquet"
    pq.write_table(table, latin)
    with pytest.raises(DatasetError) as info:
        load_prompts([str(latin)], tiny_tokenizer, max_prompt_length=1000)
    assert str(info.value).startswith(
        f"data.train_files: '{latin}' row 1, column 'prompt', holds bytes that are not UTF-8 text (invalid "
        "continuation byte at byte 13"
    )
    # the same text decoded with errors="replace" before it was written: U+FFFD where the bytes were
    rows[2]["prompt"][0]["content"] = content[:10] + b"caf\xe9 au lait".decode("utf-8", errors="replace")
    replaced = tmp_path / "replaced.parquet"
    pq.write_table(pa.Table.from_pylist(rows), replaced)
    with pytest.raises(
        DatasetError,
        match=rf"{replaced} row 2: column 'prompt' holds the replacement character U\+FFFD at character 13",
    ):
        load_prompts([str(replaced)], tiny_tokenizer, max_prompt_length=1000)


def test_a_binary_config_file_a_directory_and_a_garbage_latest_are_named(tmp_path):
    """A binary config file gave a raw UnicodeDecodeError, a directory "does not exist", and a
    checkpoints/latest holding garbage a traceback about another file."""
    from lucidrl.config import ConfigError

    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256)))
    with pytest.raises(
        ConfigError, match=rf"config file '{binary}' is not text \(invalid start byte at byte 0\)"
    ):
        load_config(binary, [])
    with pytest.raises(
        ConfigError, match=rf"config file '{tmp_path}' is a directory; give the YAML file in it"
    ):
        load_config(tmp_path, [])
    root = tmp_path / "run" / "checkpoints"
    (root / "global_step_1").mkdir(parents=True)
    (root / "global_step_1" / "trainer_state.json").write_text("{}")
    for garbage in (b"\x00\xff\xfe garbage", b"../../etc"):
        (root / "latest").write_bytes(garbage)
        with pytest.raises(CheckpointError) as info:
            checkpoint.latest_checkpoint(tmp_path / "run")
        text = str(info.value)
        assert text.startswith(
            f"{root / 'latest'} should hold the name of the newest checkpoint (global_step_N)"
        )
        assert "['global_step_1']" in text and "delete it to have the newest found" in text


def _sft_config(tmp_path, kk_data, model, run: Path, *extra: str):
    from lucidrl.config import SFTConfig

    args = [
        f"model.path={model}",
        f"data.train_files=[{kk_data['train']}]",
        "data.batch_size=8",
        "micro_batch_size=4",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={run}",
        *extra,
    ]
    return load_config(None, args, schema=SFTConfig)


def test_a_cuda_device_this_machine_lacks_is_refused_before_anything_starts(
    tmp_path, kk_data, tiny_model, monkeypatch
):
    """trainer.device=cuda without CUDA said "Torch not compiled with CUDA enabled" when the model moved."""
    from lucidrl.config import ConfigError
    from lucidrl.config.validation import check_devices_here
    from lucidrl.trainer.sft import SFTTrainer

    run = tmp_path / "run"
    rl = load_config(
        None, _args(tmp_path, str(tiny_model["path"]), kk_data["train"], run, "trainer.device=cuda")
    )
    sft = _sft_config(tmp_path, kk_data, tiny_model["path"], run, "trainer.device=cuda")
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build of torch
    for start in (lambda: PPOTrainer(rl), lambda: SFTTrainer(sft)):
        with pytest.raises(ConfigError) as info:
            start()
        assert str(info.value).startswith("trainer.device='cuda' but torch ") and "is a CPU build" in str(
            info.value
        )
        assert "set trainer.device=cpu, or install a CUDA build of the same torch version" in str(info.value)
        assert not run.exists()  # nothing written, nothing loaded
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build on a machine without a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(
        ConfigError, match=r"no CUDA GPU is visible to this process \(CUDA_VISIBLE_DEVICES=''"
    ):
        PPOTrainer(rl)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one GPU, and cuda:1 asked for
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    rl.trainer.device = "cuda:1"
    with pytest.raises(ConfigError, match=r"trainer.device='cuda:1' but this machine has 1 CUDA GPU\(s\)"):
        check_devices_here(rl)
    # joining a cluster: the ranks may be on other hosts, with GPUs this one lacks
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rl.trainer.backend, rl.trainer.ray_address = "ray", "10.0.0.1:6379"
    check_devices_here(rl)
    rl.trainer.device = "cpu"
    rl.trainer.backend, rl.trainer.ray_address = "local", None
    check_devices_here(rl)


def _damaged_model(tmp_path, tiny_model, name: str, damage) -> Path:
    model = tmp_path / name
    shutil.copytree(tiny_model["path"], model)
    damage(model)
    return model


def _set_config(model: Path, **values) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **values}))


def test_a_truncated_or_random_weight_file_is_named_for_train_sft_and_export(tmp_path, kk_data, tiny_model):
    """transformers said "Error while deserializing header: invalid header length" with the folder only."""
    from lucidrl.models.loading import ModelLoadError
    from lucidrl.trainer.export import export_checkpoint
    from lucidrl.trainer.sft import SFTTrainer

    truncated = _damaged_model(
        tmp_path, tiny_model, "truncated", lambda m: _truncate(m / "model.safetensors", 1000)
    )
    random = _damaged_model(
        tmp_path, tiny_model, "random", lambda m: (m / "model.safetensors").write_bytes(os.urandom(5000))
    )
    for model, size in ((truncated, 1000), (random, 5000)):
        weights = model / "model.safetensors"
        said = rf"model.path='{model}': weight file '{weights}' is not a readable safetensors file \("
        run = tmp_path / f"run_{model.name}"
        with pytest.raises(ModelLoadError, match=said) as info:
            PPOTrainer(load_config(None, _args(tmp_path, str(model), kk_data["train"], run)))
        assert f"; {size} bytes): it was truncated" in str(info.value)
        assert "copy or download it again" in str(info.value)
        with pytest.raises(ModelLoadError, match=said):
            SFTTrainer(_sft_config(tmp_path, kk_data, model, tmp_path / f"sft_{model.name}"))
    # export: a checkpoint without a manifest (an older lucidrl's) whose actor weights were truncated
    run = tmp_path / "sft_run"
    SFTTrainer(
        _sft_config(
            tmp_path,
            kk_data,
            tiny_model["path"],
            run,
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
        )
    ).fit()
    ckpt = run / "checkpoints" / "global_step_1"
    (ckpt / "manifest.json").unlink()
    (shard,) = (ckpt / "actor" / "model").glob("*.safetensors")
    _truncate(shard, 1000)
    with pytest.raises(ModelLoadError) as info:
        export_checkpoint(ckpt, tmp_path / "out")
    text = str(info.value)
    assert f"weight file '{shard}' is not a readable safetensors file" in text
    assert f"(the actor weights of {ckpt}, a checkpoint without a manifest.json" in text


def test_a_config_json_that_does_not_fit_the_weights_names_the_key_and_both_sizes(
    tmp_path, kk_data, tiny_model
):
    """transformers said "You set `ignore_mismatched_sizes` to `False`" (the shapes in a log above)."""
    from lucidrl.models import load_model
    from lucidrl.models.loading import ModelLoadError

    vocab = _damaged_model(tmp_path, tiny_model, "vocab", lambda m: _set_config(m, vocab_size=900))
    rows = tiny_model["vocab_size"]
    with pytest.raises(ModelLoadError) as info:
        PPOTrainer(load_config(None, _args(tmp_path, str(vocab), kk_data["train"], tmp_path / "run")))
    assert str(info.value).startswith(
        f"model.path='{vocab}': config.json says vocab_size=900, but '{vocab / 'model.safetensors'}' holds "
        f"model.embed_tokens.weight of shape [{rows}, 64], so vocab_size is {rows} there"
    )
    assert f"set vocab_size to {rows} in {vocab / 'config.json'}" in str(info.value)
    inter = _damaged_model(tmp_path, tiny_model, "inter", lambda m: _set_config(m, intermediate_size=300))
    with pytest.raises(
        ModelLoadError,
        match=r"config.json says intermediate_size=300, but '.*model.safetensors' holds "
        r"model.layers.0.mlp.\w+_proj.weight of shape \[\d+, \d+\], so intermediate_size is 256 there",
    ):
        load_model(str(inter))


def test_a_data_file_that_is_a_directory_says_so_and_lists_its_parquet_files(
    tmp_path, kk_data, tiny_tokenizer
):
    """It said "file 'DIR' does not exist"."""
    from lucidrl.data.dataset import load_prompts
    from lucidrl.data.sft_dataset import load_sft_rows

    folder = Path(kk_data["train"]).parent
    with pytest.raises(DatasetError) as info:
        load_prompts([str(folder)], tiny_tokenizer, max_prompt_length=1000, what="data.val_files")
    assert str(info.value) == (
        f"data.val_files: '{folder}' is a directory, not a parquet file; give the parquet file(s) in it; it "
        f"holds 2 parquet file(s): data.val_files=[{folder / 'train.parquet'}, {folder / 'val.parquet'}]"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        DatasetError,
        match=r"is a directory, not a parquet file; give the parquet file\(s\) in it \(it holds no",
    ):
        load_sft_rows(
                [str(empty)], what="data.train_files", tokenizer=tiny_tokenizer, max_length=100,
                prompt_key="prompt", response_key="response",
            )  # fmt: skip


def test_a_critic_model_path_that_does_not_exist_is_named(tmp_path, kk_data, tiny_model):
    """It said "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"."""
    from lucidrl.models.loading import ModelLoadError

    nowhere = tmp_path / "nowhere"
    args = _args(
        tmp_path, str(tiny_model["path"]), kk_data["train"], tmp_path / "run",
        "algorithm.adv_estimator=gae", f"critic.model_path={nowhere}", "critic.ppo_micro_batch_size=2",
    )  # fmt: skip
    with pytest.raises(ModelLoadError) as info:
        PPOTrainer(load_config(None, args))
    assert str(info.value).startswith(f"critic.model_path='{nowhere}': model folder does not exist")
    assert "Repo id" not in str(info.value)


@pytest.fixture
def read_only():
    """Make a folder read-only: a read-only bind mount as root (root writes through chmod), chmod else."""
    undo = []

    def make(folder: Path) -> None:
        if os.geteuid() == 0:
            if subprocess.run(["mount", "--bind", str(folder), str(folder)]).returncode:
                pytest.skip("a read-only bind mount needs mount rights")
            undo.append(lambda: subprocess.run(["umount", str(folder)]))
            subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        else:
            folder.chmod(0o555)
            undo.append(lambda: folder.chmod(0o755))

    yield make
    for fn in reversed(undo):
        fn()


def test_a_run_dir_that_is_a_file_or_read_only_is_refused_before_training(
    tmp_path, kk_data, tiny_model, read_only
):
    """A file gave a raw NotADirectoryError; a read-only checkpoints folder failed the first save."""
    from lucidrl.trainer.setup import RunDirError

    def start(run: Path, *extra: str) -> PPOTrainer:
        return PPOTrainer(
            load_config(None, _args(tmp_path, str(tiny_model["path"]), kk_data["train"], run, *extra))
        )

    file = tmp_path / "notes.txt"
    file.write_text("not a run")
    with pytest.raises(RunDirError, match=rf"^trainer.run_dir='{file}' is a file, not a folder"):
        start(file)
    with pytest.raises(
        RunDirError, match=rf"^trainer.run_dir='{file}/run' is under '{file}', which is a file"
    ):
        start(file / "run")
    disk = tmp_path / "ro"
    disk.mkdir()
    read_only(disk)
    with pytest.raises(RunDirError) as info:
        start(disk / "run")
    assert str(info.value).startswith(f"cannot write in '{disk}' (")
    assert "set trainer.run_dir to a folder on a writable disk" in str(info.value)
    assert not (disk / "run").exists()
    # a run whose checkpoints folder became read-only: refused before the resume, not at its first save
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("{}")
    read_only(run / "checkpoints")
    with pytest.raises(RunDirError) as info:
        start(run)
    text = str(info.value)
    assert text.startswith(f"cannot write in '{run / 'checkpoints'}' (") and "writes the checkpoints" in text
    assert "make that folder writable again" in text


def test_eval_given_a_run_folder_or_a_checkpoint_says_which_model_folder_to_give(tmp_path):
    """It said "model.path='RUN' has no tokenizer files"."""
    from lucidrl.trainer.evaluation import EvaluationError, evaluate

    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "global_step_1"
    (ckpt / "actor").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    (run / "config.yaml").write_text("{}")
    with pytest.raises(EvaluationError) as info:
        evaluate(str(run), ["unused.parquet"])
    assert str(info.value) == (
        f"MODEL='{run}' is a run folder, not a model folder: it has no final model (the run has not ended, or "
        f"trainer.save_final_model=false): write a checkpoint's actor as one with `lucidrl export "
        f"{run / 'checkpoints' / 'global_step_N'} OUT`, then `lucidrl eval OUT ...`"
    )
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    with pytest.raises(
        EvaluationError, match=rf"evaluate the model it ended with: `lucidrl eval {run / 'final'} ...`"
    ):
        evaluate(str(run), ["unused.parquet"])
    with pytest.raises(
        EvaluationError, match=rf"is a training checkpoint, not a model folder: .*`lucidrl export {ckpt} OUT`"
    ):
        evaluate(str(ckpt), ["unused.parquet"])


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("=3", "nothing before '='"),
        (".lr=1", "an empty part in '.lr'"),
        ("actor..lr=1", "an empty part in 'actor..lr'"),
    ],
)
def test_an_empty_override_key_is_named_with_the_form_to_write(override, where):
    """'.lr=1' said "unknown config key ''"; '=3' said "has an empty key" and no more."""
    from lucidrl.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.path=m", override])
    value = override.split("=", 1)[1]
    assert str(info.value) == (
        f"override '{override}' has an empty key ({where}): write it as key=value with the whole dotted key, "
        f"e.g. actor.optim.lr={value} (--help-config lists every key)"
    )
