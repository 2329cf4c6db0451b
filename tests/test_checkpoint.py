"""Checkpoints: a run stopped and resumed ends where an uninterrupted run ends; saves are atomic; export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import TOY_REWARD
from safetensors.torch import load_file

from lucidrl.cli import main
from lucidrl.config import ConfigError, load_config
from lucidrl.trainer import checkpoint
from lucidrl.trainer.ppo import PPOTrainer
from lucidrl.workers.training.checkpoint_files import write_manifest
from lucidrl.workers.training.train_state import CheckpointError


def _args(tmp_path, kk_data, tiny_model, run: str, *extra: str) -> list[str]:
    reward = tmp_path / "reward.py"
    reward.write_text(TOY_REWARD)
    return [
        f"model.path={tiny_model['path']}",
        f"data.train_files=[{kk_data['train']}]",
        "data.val_files=[]",
        "data.max_prompt_length=512",
        "data.max_response_length=8",
        "data.train_batch_size=4",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=2",  # two optimizer steps per RL step
        "actor.ppo_micro_batch_size=8",
        "actor.optim.lr=1e-3",
        "actor.optim.warmup_steps=5",  # the LR schedule is part of the state
        # a critic and an adaptive KL coefficient: more state that a resume has to bring back
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.05",
        "critic.optim.lr=1e-3",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={tmp_path / run}",
        f"reward.custom_function.path={reward}",
        *extra,
    ]


def _train(tmp_path, kk_data, tiny_model, run, *extra) -> PPOTrainer:
    trainer = PPOTrainer(load_config(None, _args(tmp_path, kk_data, tiny_model, run, *extra)))
    trainer.announce()
    trainer.fit()
    return trainer


def _steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_stopped_and_resumed_run_ends_where_an_uninterrupted_one_does(
    tmp_path, kk_data, tiny_model, capsys
):
    watch = (
        "trainer.collapse.enable=true",
        "trainer.collapse.action=warn",
        "trainer.collapse.max_score_drop=5",
    )
    straight = _train(tmp_path, kk_data, tiny_model, "straight", "trainer.total_training_steps=4", *watch)
    # the same run, stopped after 2 steps (checkpoint every 2) and started again with the full length
    _train(
        tmp_path,
        kk_data,
        tiny_model,
        "resumed",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        *watch,
    )
    resumed = _train(
        tmp_path,
        kk_data,
        tiny_model,
        "resumed",
        "trainer.total_training_steps=4",
        "trainer.save_freq=2",
        *watch,
    )
    assert resumed.monitor.state_dict() == straight.monitor.state_dict()  # its windows came back too
    assert len(straight.monitor.first_scores) == 3  # baseline_steps: a window still filling at the save
    assert resumed.resumed_from == tmp_path / "resumed" / "checkpoints" / "global_step_2"
    assert resumed.resume_changes == {"trainer.total_training_steps": (2, 4)}
    out = capsys.readouterr().out
    assert "resumed from" in out and "after step 2 (2 batches into the data)" in out
    assert "checkpoint " in out and "global_step_4 (" in out and " MiB) in " in out

    a = load_file(straight.run_dir / "final" / "model.safetensors")
    b = load_file(resumed.run_dir / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
    ra = [json.loads(x) for x in (straight.run_dir / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    for x, y in zip(ra, rb, strict=True):
        for key in (
            "actor/pg_loss",
            "actor/grad_norm",
            "critic/vf_loss",
            "actor/reward_kl_penalty_coeff",
            "actor/lr",
        ):
            assert x[key] == y[key], (x["step"], key, x[key], y[key])
    # a changed trainer.collapse gives the saved windows another meaning: the monitor starts afresh
    again = _train(
        tmp_path,
        kk_data,
        tiny_model,
        "resumed",
        "trainer.total_training_steps=5",
        *watch,
        "trainer.collapse.baseline_steps=2",
    )
    assert again.resumed_from.name == "global_step_4" and len(again.monitor.first_scores) == 1
    assert "the collapse monitor starts afresh: trainer.collapse changed" in " ".join(
        capsys.readouterr().out.split()
    )


@pytest.mark.slow
def test_saving_during_the_critic_warm_up_changes_nothing_and_resumes_exactly(tmp_path, kk_data, tiny_model):
    """The actor's AdamW has no state before its first update: saving must not create one."""
    warm = ("algorithm.adv_estimator=gae", "critic.warmup_steps=1", "trainer.total_training_steps=2")
    straight = _train(tmp_path, kk_data, tiny_model, "straight", *warm)
    saving = _train(tmp_path, kk_data, tiny_model, "saving", *warm, "trainer.save_freq=1")
    _train(
        tmp_path,
        kk_data,
        tiny_model,
        "resumed",
        *warm[:2],
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
    )
    resumed = _train(tmp_path, kk_data, tiny_model, "resumed", *warm, "trainer.save_freq=1")
    a = load_file(straight.run_dir / "final" / "model.safetensors")
    for other in (saving, resumed):
        b = load_file(other.run_dir / "final" / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), (
            other.run_dir,
            max((a[k] - b[k]).abs().max() for k in a),
        )


def test_pruning_keeps_the_new_checkpoint_and_drops_an_abandoned_continuation(tmp_path):
    root = checkpoint.checkpoints_dir(tmp_path)
    for step in (2, 4, 6, 8):
        (root / f"global_step_{step}").mkdir(parents=True)
        (root / f"global_step_{step}" / "trainer_state.json").write_text("{}")
    # resumed from step 2 and saving step 4 again: steps 6 and 8 belong to the run that was abandoned
    tmp = checkpoint.begin(tmp_path, 4)
    (tmp / "trainer_state.json").write_text("{}")
    checkpoint.commit(tmp, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_2", "global_step_4", "latest"]
    assert checkpoint.latest_checkpoint(tmp_path) == root / "global_step_4"


def test_a_checkpoint_is_on_disk_before_its_name_is(tmp_path, monkeypatch):
    """The renames that make a checkpoint (and an exported model folder) final came with no fsync: after a
    power loss the folder could be complete by name and empty inside, and `latest` empty."""
    import os

    from lucidrl.models.saving import save_hf_folder

    events: list[tuple[str, str]] = []
    fsync, rename, replace = os.fsync, os.rename, os.replace

    def record_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorder(kind, real):
        def call(src, dst):
            events.append((kind, str(Path(dst).resolve())))
            real(src, dst)

        return call

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "rename", recorder("rename", rename))
    monkeypatch.setattr(os, "replace", recorder("replace", replace))
    tmp = checkpoint.begin(tmp_path, 3)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model.safetensors").write_bytes(b"weights")
    (tmp / "trainer_state.json").write_text("{}")
    final = checkpoint.commit(tmp, keep=None).resolve()
    at = {e: i for i, e in enumerate(events)}
    moved = at[("rename", str(final))]
    for name in ("actor/model.safetensors", "trainer_state.json", "actor"):
        assert at[("fsync", str(tmp.resolve() / name))] < moved, (name, events)
    latest = final.parent / "latest"
    assert at[("fsync", str(latest.with_suffix(".tmp")))] < at[("replace", str(latest))]
    assert at[("fsync", str(final.parent))] > at[("replace", str(latest))]  # the names themselves
    # a model folder written by save_pretrained: the same order
    events.clear()

    class Saves:
        def __init__(self, name):
            self.name = name

        def save_pretrained(self, path):
            Path(path).mkdir(exist_ok=True)
            (Path(path) / self.name).write_text("x")

    out = save_hf_folder(Saves("model.safetensors"), Saves("tokenizer.json"), tmp_path / "export")
    at = {e: i for i, e in enumerate(events)}
    tmp_out = str(out) + ".tmp"
    for name in ("/model.safetensors", "/tokenizer.json", ""):
        assert at[("fsync", tmp_out + name)] < at[("rename", str(out))] < at[("fsync", str(out.parent))]


def test_saving_a_step_again_never_leaves_latest_naming_a_missing_folder(tmp_path, monkeypatch):
    """commit deleted the old folder of the same step, then renamed the new one in: a kill in between
    left `latest` naming nothing. Now the old one is moved aside and comes back if the save dies."""
    import os

    root = checkpoint.checkpoints_dir(tmp_path)
    first = checkpoint.begin(tmp_path, 4)
    (first / "trainer_state.json").write_text('{"which": "first"}')
    checkpoint.commit(first, keep=None)
    second = checkpoint.begin(tmp_path, 4)
    (second / "trainer_state.json").write_text('{"which": "second"}')
    rename = os.rename

    def killed(src, dst):
        if str(src).endswith(".tmp"):
            raise KeyboardInterrupt("killed")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.commit(second, keep=None)
    monkeypatch.setattr(os, "rename", rename)
    path = checkpoint.latest_checkpoint(tmp_path)
    assert path == root / "global_step_4" and "first" in (path / "trainer_state.json").read_text()
    # a first save killed after its rename, before `latest` was written: the complete folder is found
    fresh = tmp_path / "fresh"
    five = checkpoint.begin(fresh, 5)
    (five / "trainer_state.json").write_text("{}")
    checkpoint.commit(five, keep=None)
    (checkpoint.checkpoints_dir(fresh) / "latest").unlink()
    (checkpoint.begin(fresh, 6) / "actor").mkdir()  # and a save that died half-way
    assert checkpoint.latest_checkpoint(fresh) == checkpoint.checkpoints_dir(fresh) / "global_step_5"
    assert (checkpoint.checkpoints_dir(fresh) / "latest").read_text().strip() == "global_step_5"
    third = checkpoint.begin(tmp_path, 4)
    (third / "trainer_state.json").write_text('{"which": "third"}')
    checkpoint.commit(third, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_4", "latest"]
    assert "third" in (checkpoint.latest_checkpoint(tmp_path) / "trainer_state.json").read_text()


def test_a_torn_metrics_line_is_dropped_with_a_warning(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "actor/pg')
    assert checkpoint.drop_metrics_after(tmp_path, 2) == 1
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert "dropped 1 unreadable line(s)" in caplog.text


@pytest.mark.slow
def test_no_checkpoint_is_saved_at_a_collapsed_step(tmp_path, kk_data, tiny_model, monkeypatch, capsys):
    from lucidrl.trainer.collapse import CollapseReport

    trainer = PPOTrainer(
        load_config(
            None,
            _args(
                tmp_path, kk_data, tiny_model, "run", "trainer.total_training_steps=3", "trainer.save_freq=1"
            ),
        )
    )
    real = trainer.monitor.update
    monkeypatch.setattr(
        trainer.monitor,
        "update",
        lambda step, metrics: (
            CollapseReport(step, step, ["forced by the test"]) if step == 2 else real(step, metrics)
        ),
    )
    trainer.fit()
    root = checkpoint.checkpoints_dir(trainer.run_dir)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "latest"]
    assert "no checkpoint at step 2, which collapsed" in capsys.readouterr().out


@pytest.mark.slow
def test_saves_are_atomic_pruned_and_the_latest_is_resumed(tmp_path, kk_data, tiny_model):
    run = tmp_path / "run"
    _train(
        tmp_path,
        kk_data,
        tiny_model,
        "run",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.max_ckpt_to_keep=2",
        "trainer.save_final_model=false",
    )
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["global_step_2", "global_step_3", "latest"]
    assert (root / "latest").read_text().strip() == "global_step_3"
    step3 = root / "global_step_3"
    assert json.loads((step3 / "trainer_state.json").read_text())["global_step"] == 3
    assert (step3 / "actor" / ".metadata").is_file() and (step3 / "critic" / ".metadata").is_file()
    # each role's weights are a HuggingFace folder in the checkpoint, loadable as it is
    from transformers import AutoModelForTokenClassification

    critic = AutoModelForTokenClassification.from_pretrained(
        str(step3 / "critic" / "model"), local_files_only=True
    )
    assert critic.config.num_labels == 1 and critic.score.weight.abs().sum() > 0  # trained from a zero head
    assert critic.config.architectures == ["Qwen2ForTokenClassification"]  # what loads it, not the LM's class
    base = json.loads(open(f"{tiny_model['path']}/generation_config.json").read())
    saved = json.loads((step3 / "actor" / "model" / "generation_config.json").read_text())
    assert saved["eos_token_id"] == base["eos_token_id"]  # the base model's stop ids travel with the weights
    assert sorted(p.name for p in (step3 / "critic" / "model").glob("*.safetensors")) == [
        "model-00001-of-00001.safetensors"
    ]
    # a save killed half-way leaves a .tmp folder: the resume ignores it, the next save replaces it
    (root / "global_step_4.tmp" / "actor").mkdir(parents=True)
    cfg = load_config(None, _args(tmp_path, kk_data, tiny_model, "run"))
    assert checkpoint.resume_point(cfg, run) == step3
    fresh = checkpoint.begin(run, 4)
    assert fresh.is_dir() and not any(fresh.iterdir())
    # a latest that names a missing folder is an error, not a silent fresh start
    (root / "latest").write_text("global_step_9\n")
    with pytest.raises(CheckpointError, match="names 'global_step_9', which is not a complete checkpoint"):
        checkpoint.resume_point(cfg, run)
    # resume_mode=disable does not look; with overwrite the run starts over
    no = load_config(None, _args(tmp_path, kk_data, tiny_model, "run", "trainer.resume_mode=disable"))
    assert checkpoint.resume_point(no, run) is None
    # a checkpoint without its weights folder (written by an earlier version, or damaged) says so
    (root / "latest").write_text("global_step_3\n")
    shutil.rmtree(step3 / "actor" / "model")
    with pytest.raises(CheckpointError, match=r"actor/model/\S+ \(listed in manifest.json\) is missing"):
        PPOTrainer(cfg).fit()
    (step3 / "manifest.json").unlink()  # as an earlier version wrote it: the readers' own check
    with pytest.raises(CheckpointError, match=r"needs .metadata \(optimizer state\) and model/"):
        PPOTrainer(cfg).fit()


@pytest.mark.slow
def test_resuming_from_an_earlier_checkpoint_points_latest_at_it(tmp_path, kk_data, tiny_model):
    """The metrics after it are cut at once: `latest` must follow, or a run killed before its next save
    resumes the abandoned later checkpoint with that branch's metrics gone."""
    _train(tmp_path, kk_data, tiny_model, "run", "trainer.total_training_steps=2", "trainer.save_freq=1")
    root = tmp_path / "run" / "checkpoints"
    assert (root / "latest").read_text().strip() == "global_step_2"
    PPOTrainer(
        load_config(
            None,
            _args(
                tmp_path,
                kk_data,
                tiny_model,
                "run",
                "trainer.total_training_steps=2",
                "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={root / 'global_step_1'}",
            ),
        )
    )  # built, never trained: killed before its first save
    assert _steps(tmp_path / "run") == [1]
    cfg = load_config(None, _args(tmp_path, kk_data, tiny_model, "run"))
    assert checkpoint.resume_point(cfg, tmp_path / "run") == root / "global_step_1"


def test_a_key_only_one_config_has_is_named_as_such_not_as_none():
    saved = {"data": {"batch_size": 8, "seed": None, "old_key": 1}}
    now = {"data": {"batch_size": 8, "seed": None, "max_token_len_per_gpu": 8192}, "length_sorted": None}
    changes = checkpoint.config_changes(saved, now)
    assert changes == {
        "data.max_token_len_per_gpu": (checkpoint.NOT_IN_CHECKPOINT, 8192),
        "data.old_key": (1, checkpoint.NO_LONGER_A_KEY),
        # absent against None is a change too (None is a value), and says so
        "length_sorted": (checkpoint.NOT_IN_CHECKPOINT, None),
    }
    assert "before the key existed" in repr(changes["data.max_token_len_per_gpu"][0])


@pytest.mark.slow
def test_resume_refuses_a_changed_key_that_the_saved_state_depends_on(tmp_path, kk_data, tiny_model):
    _train(tmp_path, kk_data, tiny_model, "run", "trainer.total_training_steps=1", "trainer.save_freq=1")
    with pytest.raises(CheckpointError, match=r"data.train_batch_size: 4 in the checkpoint, 8 now"):
        PPOTrainer(load_config(None, _args(tmp_path, kk_data, tiny_model, "run", "data.train_batch_size=8")))
    # a run directory that holds a run but no checkpoint is still refused
    _train(tmp_path, kk_data, tiny_model, "plain", "trainer.total_training_steps=1")
    with pytest.raises(ValueError, match="already holds a run \\(with no checkpoint to resume from\\)"):
        PPOTrainer(load_config(None, _args(tmp_path, kk_data, tiny_model, "plain")))


@pytest.mark.slow
def test_changed_hyperparameters_take_effect_on_resume_as_announced(tmp_path, kk_data, tiny_model, capsys):
    """The optimizer's and schedule's saved state put the old lr, betas and weight decay back, and a fixed KL
    coefficient came from the checkpoint, while the resume said "changed since: actor.optim.lr ...". Now
    the config's values apply, at the schedule's saved position; an adaptive coefficient is restored."""
    fixed = ("algorithm.kl_ctrl.type=fixed", "trainer.save_freq=1")
    run = "run[/x]"  # rich read "[/x]" in a printed path as markup: MarkupError
    _train(tmp_path, kk_data, tiny_model, run, "trainer.total_training_steps=1", *fixed)
    resumed = _train(
        tmp_path,
        kk_data,
        tiny_model,
        run,
        "trainer.total_training_steps=2",
        *fixed,
        "actor.optim.lr=1e-2",
        "actor.optim.weight_decay=0.25",
        "actor.optim.betas=[0.5,0.75]",
        "critic.optim.lr=1e-4",
        "algorithm.kl_ctrl.kl_coef=0.5",
    )
    out = "".join(capsys.readouterr().out.split())  # the console wraps long paths anywhere
    assert "changedsince:" in out and f"resumedfrom{tmp_path / run / 'checkpoints'}" in out
    rows = [json.loads(x) for x in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["actor/lr"] == pytest.approx(1e-3 / 5)  # step 1 of a 5-step warm-up
    assert rows[1]["actor/lr"] == pytest.approx(1e-2 * 2 / 5)  # step 2, at the new rate
    assert rows[1]["critic/lr"] == pytest.approx(1e-4)  # no warm-up for the critic
    assert rows[1]["actor/reward_kl_penalty_coeff"] == 0.5
    (group,) = resumed.workers.actor.worker.actor.optimizer.param_groups
    assert (group["lr"], group["betas"], group["weight_decay"]) == (
        pytest.approx(1e-2 * 3 / 5),
        (0.5, 0.75),
        0.25,
    )
    # an adaptive coefficient continues from the checkpoint's value (test above), unless kl_ctrl changed
    _train(tmp_path, kk_data, tiny_model, "adaptive", "trainer.total_training_steps=1", "trainer.save_freq=1")
    again = _train(
        tmp_path,
        kk_data,
        tiny_model,
        "adaptive",
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "algorithm.kl_ctrl.kl_coef=0.5",
    )
    assert "the adaptive KL coefficient starts afresh" in " ".join(capsys.readouterr().out.split())
    rows = [json.loads(x) for x in (again.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (
        rows[0]["actor/reward_kl_penalty_coeff"] == 0.05 and rows[1]["actor/reward_kl_penalty_coeff"] == 0.5
    )


@pytest.mark.slow
def test_export_writes_the_checkpoint_actor_as_a_huggingface_folder(
    tmp_path, kk_data, tiny_model, capsys, monkeypatch
):
    from transformers import AutoModelForCausalLM

    trainer = _train(
        tmp_path, kk_data, tiny_model, "run", "trainer.total_training_steps=1", "trainer.save_freq=1"
    )
    out = tmp_path / "exported"
    assert main(["export", str(trainer.run_dir), str(out)]) == 0  # a run directory means its latest
    assert f"wrote a HuggingFace model folder to {out}" in capsys.readouterr().out
    final = load_file(trainer.run_dir / "final" / "model.safetensors")
    exported = load_file(out / "model.safetensors")
    start = load_file(f"{tiny_model['path']}/model.safetensors")
    assert sorted(final) == sorted(exported)
    assert all(torch.equal(final[k], exported[k]) for k in final)
    assert any(not torch.equal(final[k], start[k]) for k in final)  # it is the trained actor
    AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2
    assert "CHECKPOINT=" in capsys.readouterr().err
    # OUT is never a folder export would have to delete to write
    assert main(["export", str(trainer.run_dir), str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["export", str(trainer.run_dir), str(trainer.run_dir), "--overwrite"]) == 2
    assert "is not a HuggingFace model folder" in capsys.readouterr().err
    assert (trainer.run_dir / "checkpoints" / "latest").is_file()
    assert main(["export", str(trainer.run_dir), str(out), "--overwrite"]) == 0
    # the checkpoint carries the architecture: a run whose model.path no longer resolves still exports
    state = trainer.run_dir / "checkpoints" / "global_step_1" / "config.yaml"
    state.write_text(state.read_text().replace(str(tiny_model["path"]), "moved/away"))
    assert main(["export", str(trainer.run_dir), str(tmp_path / "x2")]) == 2  # not as its save wrote it
    err = capsys.readouterr().err
    assert f"checkpoint file {state} is " in err and "its save wrote" in err
    write_manifest(state.parent)  # as a run started from a folder since moved would have saved it
    assert main(["export", str(trainer.run_dir), str(tmp_path / "x2")]) == 0
    again = load_file(tmp_path / "x2" / "model.safetensors")
    assert all(torch.equal(final[k], again[k]) for k in final)
    # into the current directory, new and empty ("." was a ValueError: it has no name to put .tmp after)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["export", str(trainer.run_dir), "."]) == 0
    assert Path.cwd() == here and (here / "config.json").is_file() and not (tmp_path / "here.tmp").exists()
    # and the checkpoint's own actor/model loads without export, tied embedding included
    direct = AutoModelForCausalLM.from_pretrained(
        str(trainer.run_dir / "checkpoints" / "global_step_1" / "actor" / "model"), local_files_only=True
    )
    weights = direct.state_dict()
    assert all(torch.equal(final[k], weights[k]) for k in final)
    assert direct.lm_head.weight is direct.model.embed_tokens.weight


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["trainer.save_freq=-2"],
            "'trainer.save_freq' .* must be >= -1 .0 or -1 .verl.s never.: no checkpoints.",
        ),
        (["trainer.max_ckpt_to_keep=0"], "'trainer.max_ckpt_to_keep' .* must be >= 1, got 0"),
        (["trainer.resume_mode=resume_path"], "needs trainer.resume_from_path"),
        (["trainer.resume_from_path=/x"], "only read with trainer.resume_mode=resume_path"),
        (
            ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/x", "trainer.overwrite=true"],
            "choose one",
        ),
    ],
)
def test_checkpoint_keys_that_contradict_each_other_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.path=/m", "data.train_files=[/t]", *overrides])


@pytest.mark.slow
def test_doctor_says_whether_a_run_resumes_and_what_training_would_refuse(tmp_path, kk_data, tiny_model):
    from lucidrl.doctor import checks, run_checks

    def run_dir_check(*extra):
        cfg = load_config(None, _args(tmp_path, kk_data, tiny_model, "run", *extra))
        return checks.run_check("run dir", lambda: run_checks.check_run_dir(cfg))[0]

    assert run_dir_check().detail.endswith("run: a new run")
    _train(tmp_path, kk_data, tiny_model, "run", "trainer.total_training_steps=1", "trainer.save_freq=1")
    check = run_dir_check("actor.optim.lr=0.01")
    assert check.status == "ok" and "resumes from" in check.detail and "after step 1" in check.detail
    assert "changed since: actor.optim.lr" in check.detail
    check = run_dir_check("data.train_batch_size=8")
    assert check.status == "fail" and "data.train_batch_size: 4 in the checkpoint, 8 now" in check.detail
    check = run_dir_check("trainer.resume_mode=disable")
    assert (
        check.status == "fail"
        and "trainer.resume_mode=disable does not continue from its checkpoints" in (check.detail)
    )
    check = run_dir_check("trainer.resume_mode=disable", "trainer.overwrite=true")
    assert check.status == "warn" and "will delete" in check.detail
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "global_step_1" / "critic" / "model")
    check = run_dir_check()
    assert check.status == "fail" and "critic/model/" in check.detail
    assert "(listed in manifest.json) is missing" in check.detail


def test_overwrite_replaces_runs_only_and_a_failed_start_is_no_run(tmp_path, monkeypatch):
    """trainer.overwrite=true deleted whatever folder the run dir named: `trainer.experiment_name=` deleted
    runs/ with every run in it, and `../x` a folder outside it. And a start that failed before training
    (config.yaml written, then a bad model path) blocked the corrected rerun as "already holds a run"."""
    from lucidrl.trainer.setup import RunDirError, prepare_run_dir

    monkeypatch.chdir(tmp_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    cfg = load_config(None, [f"trainer.run_dir={precious}", "trainer.overwrite=true"])
    with pytest.raises(
        RunDirError, match="holds no lucidrl run .*thesis.txt.*not replaced, even with trainer.overwrite=true"
    ):
        prepare_run_dir(cfg)
    assert (precious / "thesis.txt").read_text() == "years of work"
    # a start that failed: config.yaml only; the next start (no overwrite) takes the folder
    cfg = load_config(None, ["trainer.experiment_name=exp"])
    run = prepare_run_dir(cfg)
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
    assert prepare_run_dir(cfg) == run
    # one that logged a step is a run: refused without overwrite, replaced with it
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="already holds a run"):
        prepare_run_dir(cfg)
    prepare_run_dir(load_config(None, ["trainer.experiment_name=exp", "trainer.overwrite=true"]))
    assert not (run / "metrics.jsonl").exists()
    # trainer.run_dir with ~ goes to the home folder, not to a folder named "~"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    got = prepare_run_dir(load_config(None, ["trainer.run_dir=~/runs/x"]))
    assert got == tmp_path / "home" / "runs" / "x" and not (tmp_path / "~").exists()
