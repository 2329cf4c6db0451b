"""End-to-end: `lucidrl train` on the tiny model, through the CLI, as a user runs it."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers import write_train_config
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lucidrl.cli import main


def _config(tmp_path, kk_data, tiny_model, **extra):
    return write_train_config(tmp_path, kk_data, tiny_model, **extra)


@pytest.mark.slow
def test_two_step_grpo_run_writes_metrics_and_a_loadable_changed_model(tmp_path, kk_data, tiny_model, capsys):
    config = _config(tmp_path, kk_data, tiny_model)
    assert main(["train", str(config), "trainer.seed=3", "rollout.temperature=1.0"]) == 0
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for key in [
        "critic/score/mean",
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/entropy",
        "actor/kl_loss",
        "actor/grad_norm",
        "response_length/mean",
        "response_length/clip_ratio",
        "timing_s/gen",
        "timing_s/update_actor",
        "timing_s/step",
        "perf/throughput",
        "val/kk_logic/acc",
        "val/kk_logic/score",
    ]:
        assert key in records[1], key
    assert records[1]["actor/grad_norm"] > 0
    assert records[1]["critic/groups_with_mixed_scores"] > 0
    # validation reports accuracy per number of people (the kk data has 2 and 3)
    assert {"val/kk_logic/acc/2_people", "val/kk_logic/acc/3_people"} <= set(records[0])
    # the final model is a HuggingFace folder whose weights moved away from the initial ones
    final = AutoModelForCausalLM.from_pretrained(run / "final", local_files_only=True)
    start = load_file(f"{tiny_model['path']}/model.safetensors")
    moved = max((final.state_dict()[k] - v).abs().max().item() for k, v in start.items())
    assert moved > 0
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["seed"] == 3
    out = capsys.readouterr().out
    assert "step 2" in out and "validation @ step 2" in out


@pytest.mark.slow
def test_grpo_increases_a_learnable_reward(tmp_path, kk_data, tiny_model):
    """Real learning, not just motion: the toy reward's training mean rises over 12 steps."""
    config = _config(
        tmp_path,
        kk_data,
        tiny_model,
        data={"train_batch_size": 8},
        actor={"ppo_mini_batch_size": 8, "ppo_micro_batch_size": 32, "use_kl_loss": False},
        trainer={
            "total_training_steps": 12,
            "test_freq": 0,
            "val_before_train": False,
            "save_final_model": False,
        },
    )
    assert (
        main(["train", str(config), "actor.optim.lr=1e-2", "rollout.n=8", "data.max_response_length=12"]) == 0
    )
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    scores = [r["critic/score/mean"] for r in records if "critic/score/mean" in r]
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    assert last > first + 0.05, scores


def test_cli_reports_config_errors_without_traceback(tmp_path, capsys):
    assert main(["train", "rollout.temprature=0.5"]) == 2
    err = capsys.readouterr().err
    assert "rollout.temperature" in err and "Traceback" not in err


def test_run_dir_is_never_silently_overwritten(tmp_path, kk_data, tiny_model, capsys):
    config = _config(tmp_path, kk_data, tiny_model)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    assert main(["train", str(config)]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_version(capsys):
    from lucidrl import __version__

    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"lucidrl {__version__}"
    torch.manual_seed(0)


def _weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow
def test_collapse_stops_the_run_and_restores_the_last_healthy_weights(tmp_path, kk_data, tiny_model, capsys):
    """A sign that holds from step 1 (entropy is always under 1000) fires at step `patience`; the
    run stops there and its final model is the snapshot from before the sign: the starting weights."""
    config = _config(tmp_path, kk_data, tiny_model)
    overrides = [
        "trainer.total_training_steps=5",
        "trainer.collapse.min_entropy=1000",
        "trainer.collapse.patience=2",
        "trainer.collapse.keep_last_healthy=true",
    ]
    assert main(["train", str(config), *overrides]) == 0
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # stopped at step 2 of 5
    assert records[-1]["collapse/detected"] == 1.0 and "val/kk_logic/acc" in records[-1]
    report = (run / "COLLAPSE.txt").read_text()
    assert "at step 2 (signs since step 1)" in report and "min_entropy 1000" in report
    out = capsys.readouterr().out
    assert "policy collapse detected" in out and "restored the starting weights (step 0)" in out
    start, final = _weights(Path(tiny_model["path"])), _weights(run / "final")
    assert start.keys() == final.keys()
    for key in start:
        assert torch.equal(start[key], final[key]), key
    # the same validation numbers as before training: validation ran on the restored weights
    assert records[-1]["val/kk_logic/score"] == pytest.approx(records[0]["val/kk_logic/score"], abs=1e-9)


@pytest.mark.slow
def test_collapse_warn_reports_once_and_trains_on(tmp_path, kk_data, tiny_model, capsys):
    config = _config(tmp_path, kk_data, tiny_model)
    overrides = [
        "trainer.total_training_steps=3",
        "trainer.collapse.min_entropy=1000",
        "trainer.collapse.patience=1",
        "trainer.collapse.action=warn",
    ]
    assert main(["train", str(config), *overrides]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r.get("collapse/detected") for r in records] == [None, 1.0, None, None]
    assert capsys.readouterr().out.count("policy collapse detected") == 1


@pytest.mark.slow
def test_a_run_that_raises_stops_its_workers(tmp_path, kk_data, tiny_model, ray_head):
    """Ray actors and placement groups go with a failed run too, not only a finished one: a run on the
    session's Ray head whose reward raises leaves its rank actors dead and its placement group removed."""
    import ray

    from lucidrl.config import load_config
    from lucidrl.rewards.manager import RewardFunctionError
    from lucidrl.trainer.ppo import PPOTrainer

    reward = tmp_path / "broken.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    raise OSError('down')\n"
    )
    config = _config(tmp_path, kk_data, tiny_model)
    overrides = [
        f"reward.custom_function.path={reward}",
        "trainer.backend=ray",
        f"trainer.ray_address={ray_head}",
    ]
    try:
        trainer = PPOTrainer(load_config(str(config), overrides))
        hosts = [h for g in trainer.workers.groups for h in g.hosts]
        groups = [g.pg for g in trainer.workers.groups if g.pg is not None]
        assert hosts and groups
        assert ray.get([h.__ray_ready__.remote() for h in hosts], timeout=60) == [True] * len(hosts)  # alive
        with pytest.raises(RewardFunctionError, match="raised OSError: down"):
            trainer.fit()
        for h in hosts:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(h.__ray_ready__.remote(), timeout=60)
        assert [ray.util.placement_group_table(pg)["state"] for pg in groups] == ["REMOVED"] * len(groups)
    finally:
        ray.shutdown()  # this process's connection only: the session's head stays up for the other tests


@pytest.mark.slow
def test_loader_drawn_is_what_the_trainer_generated_from_across_epochs(
    tmp_path, kk_data, tiny_model, monkeypatch
):
    """The demo measures GRPO's pool accuracy on PromptLoader.drawn(trainer.batches_drawn): it must be
    the prompts the run's steps generated from, in order, over epoch boundaries (32 prompts, 12 a step:
    2 steps an epoch, 8 prompts left out of each)."""
    from lucidrl.config import load_config
    from lucidrl.trainer.ppo import PPOTrainer
    from lucidrl.workers.rollout.hf_engine import HFRollout

    seen, generate = [], HFRollout.generate

    def spy(self, batch, params):
        seen.extend(batch["ground_truth"])
        return generate(self, batch, params)

    monkeypatch.setattr(HFRollout, "generate", spy)
    config = _config(
        tmp_path, kk_data, tiny_model,
        data={"train_batch_size": 12, "val_files": []},
        actor={"ppo_mini_batch_size": 12, "ppo_micro_batch_size": 16},
        trainer={"total_training_steps": 5, "test_freq": 0},
    )  # fmt: skip
    trainer = PPOTrainer(load_config(str(config)))
    trainer.fit()
    assert trainer.batches_drawn == 5 and trainer.data_epoch == 2
    drawn = [s.ground_truth for s in trainer.loader.drawn(trainer.batches_drawn)]
    assert len(seen) == 60 and drawn == seen
