"""`lucidrl sft`: checkpoints and resuming with the RL trainer's keys; a resumed run ends where an
uninterrupted one does."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lucidrl.cli import main
from lucidrl.config import ConfigError, SFTConfig, load_config
from lucidrl.trainer import checkpoint
from lucidrl.trainer.sft import SFTTrainer
from lucidrl.workers.train_state import CheckpointError


def _cfg(tmp_path, kk_data, tiny_model, run: str, *extra: str) -> SFTConfig:
    return load_config(
        None,
        [
            f"model.path={tiny_model['path']}",
            f"data.train_files=[{kk_data['train']}]",
            f"data.val_files=[{kk_data['val']}]",
            "data.batch_size=8",  # 32 rows: 4 steps an epoch, so 6 steps cross into a reshuffled epoch
            "micro_batch_size=4",
            "optim.lr=1e-3",
            "optim.warmup_steps=4",  # the LR schedule is part of the state
            "trainer.logger=[jsonl]",
            f"trainer.run_dir={tmp_path / run}",
            *extra,
        ],
        schema=SFTConfig,
    )


def _sft(tmp_path, kk_data, tiny_model, run: str, *extra: str) -> SFTTrainer:
    trainer = SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, run, *extra))
    trainer.fit()
    return trainer


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_stopped_and_resumed_sft_run_ends_where_an_uninterrupted_one_does(
    tmp_path, kk_data, tiny_model, capsys
):
    straight = _sft(tmp_path, kk_data, tiny_model, "straight", "trainer.total_training_steps=6")
    _sft(tmp_path, kk_data, tiny_model, "resumed", "trainer.total_training_steps=3", "trainer.save_freq=3")
    resumed = _sft(
        tmp_path, kk_data, tiny_model, "resumed", "trainer.total_training_steps=6", "trainer.save_freq=3"
    )
    assert resumed.resumed_from == tmp_path / "resumed" / "checkpoints" / "global_step_3"
    assert resumed.resume_changes == {"trainer.total_training_steps": (3, 6)}
    out = capsys.readouterr().out
    assert "resumed from" in out and "after step 3" in out and "global_step_6 (" in out

    a = load_file(straight.run_dir / "final" / "model.safetensors")
    b = load_file(resumed.run_dir / "final" / "model.safetensors")
    start = load_file(f"{tiny_model['path']}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
    assert any(not torch.equal(a[k], start[k]) for k in a)
    ra, rb = _records(straight.run_dir), _records(resumed.run_dir)
    assert [r["step"] for r in rb] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(ra, rb, strict=True):
        for key in ("sft/loss", "sft/grad_norm", "sft/lr", "perf/tokens"):
            assert x[key] == y[key], (x["step"], key, x[key], y[key])


def test_an_sft_checkpoint_is_a_model_folder_and_exports(tmp_path, kk_data, tiny_model, capsys):
    from transformers import AutoModelForCausalLM

    trainer = _sft(
        tmp_path,
        kk_data,
        tiny_model,
        "run",
        "trainer.total_training_steps=3",
        "trainer.save_freq=2",
        "trainer.max_ckpt_to_keep=1",
    )
    root = checkpoint.checkpoints_dir(trainer.run_dir)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_3", "latest"]  # the last step saves too
    assert json.loads((root / "global_step_3" / "trainer_state.json").read_text())["kind"] == "sft"
    final = load_file(trainer.run_dir / "final" / "model.safetensors")
    direct = AutoModelForCausalLM.from_pretrained(
        str(root / "global_step_3" / "actor" / "model"), local_files_only=True
    ).state_dict()
    assert all(torch.equal(final[k], direct[k]) for k in final)
    out = tmp_path / "exported"
    assert main(["export", str(trainer.run_dir), str(out)]) == 0
    exported = load_file(out / "model.safetensors")
    assert sorted(final) == sorted(exported) and all(torch.equal(final[k], exported[k]) for k in final)
    # more steps with the batch changed: refused, naming the key; an RL run cannot resume it either
    with pytest.raises(CheckpointError, match=r"data.batch_size: 8 in the checkpoint, 4 now"):
        SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, "run", "data.batch_size=4"))
    with pytest.raises(
        CheckpointError, match=r"is a checkpoint of `lucidrl sft`, and this is `lucidrl train`"
    ):
        checkpoint.resumable(root / "global_step_3", {}, kind="rl")


def test_the_old_sft_checkpoint_key_says_what_replaced_it():
    with pytest.raises(ConfigError, match=r"'trainer.checkpoint_freq' .* is gone: write trainer.save_freq"):
        load_config(
            None, ["model.path=/m", "data.train_files=[/t]", "trainer.checkpoint_freq=5"], schema=SFTConfig
        )
    with pytest.raises(ConfigError, match=r"trainer.save_freq=-1 must be >= 0"):
        load_config(
            None, ["model.path=/m", "data.train_files=[/t]", "trainer.save_freq=-1"], schema=SFTConfig
        )
