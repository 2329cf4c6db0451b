"""rollout.mode one_step_off / async (trainer/pipeline.py): batches made ahead in a thread, each token
stamped with the policy version that made it, the staleness bounded, and the invariants that make the
overlapped modes checkable: max_staleness 0 is sync bit for bit; one_step_off at lr 0 trains on exactly
sync's samples."""

from __future__ import annotations

import json
import threading

import pytest
import torch
import yaml
from helpers import write_train_config
from safetensors.torch import load_file

from lucidrl.batch import Batch
from lucidrl.cli import main
from lucidrl.config import ConfigError, config_from_dict
from lucidrl.trainer.pipeline import Supply


def _records(run):
    """The training steps' metrics (step 0 is the validation before training)."""
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["step"] >= 1]


def _cfg(tmp_path, kk_data, tiny_model, name, rollout, lr=1e-3, steps=3, **trainer):
    folder = tmp_path / name
    folder.mkdir()
    return write_train_config(
        folder,
        kk_data,
        tiny_model,
        data={"max_response_length": 8},
        # deterministic: each prompt's samples seeded by (seed, round, prompt), whatever thread or order
        rollout={"n": 2, "deterministic": True, **rollout},
        actor={
            "optim": {"lr": lr},
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size": 8,
            "use_kl_loss": False,
        },
        trainer={"total_training_steps": steps, "test_freq": -1, **trainer},
    )


def _rl(overrides: dict, tiny_model) -> dict:
    base = {"model": {"path": str(tiny_model["path"])}, "data": {"train_files": ["x.parquet"]}}
    for key, value in overrides.items():
        base.setdefault(key, {}).update(value)
    return base


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rollout": {"max_staleness": 2}}, r"rollout.max_staleness=2 with rollout.mode=sync"),
        ({"rollout": {"mode": "one_step_off", "max_staleness": 2}}, r"staleness 1 by definition"),
        (
            {"rollout": {"mode": "async"}, "trainer": {"backend": "ray"}},
            r"trainer.backend=ray.*rollout.mode=sync",
        ),
        ({"rollout": {"mode": "async", "name": "server"}}, r"rollout.name=server: the overlapped modes"),
        (
            {"rollout": {"mode": "one_step_off"}, "trainer": {"collapse": {"keep_last_healthy": True}}},
            r"keep_last_healthy=true: the guard keeps the weights a step starts from",
        ),
        (
            {"rollout": {"mode": "async"}, "algorithm": {"rollout_correction": {"bypass_mode": True}}},
            r"bypass_mode=true: bypass takes the engine's log-probs",
        ),
    ],
)
def test_what_the_overlapped_modes_do_not_run_is_refused(tiny_model, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(_rl(overrides, tiny_model))


def test_stale_samples_get_the_decoupled_correction_unless_turned_off(tiny_model):
    cfg = config_from_dict(_rl({"rollout": {"mode": "async", "max_staleness": 3}}, tiny_model))
    assert cfg.rollout.max_staleness == 3 and cfg.algorithm.rollout_correction.rollout_is == "token"
    off = config_from_dict(
        _rl({"rollout": {"mode": "one_step_off", "staleness_correction": False}}, tiny_model)
    )
    assert off.rollout.max_staleness == 1 and off.algorithm.rollout_correction.rollout_is is None
    sync = config_from_dict(_rl({}, tiny_model))
    assert sync.rollout.max_staleness == 0 and sync.algorithm.rollout_correction.rollout_is is None
    zero = config_from_dict(_rl({"rollout": {"mode": "async", "max_staleness": 0}}, tiny_model))
    assert zero.algorithm.rollout_correction.rollout_is is None  # staleness 0 needs no correction
    auto = config_from_dict(_rl({"rollout": {"mode": "one_step_off", "name": "auto"}}, tiny_model))
    assert auto.rollout.name == "hf"  # auto picks the engine the overlapped modes run


@pytest.mark.slow
def test_async_at_staleness_0_trains_bit_for_bit_like_sync(tmp_path, kk_data, tiny_model):
    runs = {}
    for name, rollout in (("sync", {}), ("async0", {"mode": "async", "max_staleness": 0})):
        assert main(["train", str(_cfg(tmp_path, kk_data, tiny_model, name, rollout))]) == 0
        runs[name] = tmp_path / name / "run"
    a, b = (_records(runs[n]) for n in ("sync", "async0"))
    keys = [k for k in a[-1] if not k.startswith(("timing_s/", "perf/"))]
    assert [{k: r.get(k) for k in keys} for r in a] == [{k: r.get(k) for k in keys} for r in b]
    wa, wb = (load_file(runs[n] / "final" / "model.safetensors") for n in ("sync", "async0"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_one_step_off_at_lr_0_trains_on_sync_samples(tmp_path, kk_data, tiny_model):
    """At lr 0 every policy version is the same policy: the batches made ahead must be the very ones sync
    makes, step by step (the pipeline takes prompts, rounds and seeds in sync's order)."""
    runs = {}
    for name, rollout in (("sync", {}), ("off", {"mode": "one_step_off", "staleness_correction": False})):
        assert main(["train", str(_cfg(tmp_path, kk_data, tiny_model, name, rollout, lr=0.0, steps=4))]) == 0
        runs[name] = _records(tmp_path / name / "run")
    sync, off = runs["sync"], runs["off"]
    same = ("critic/score/mean", "response_length/mean", "critic/advantages/mean", "prompt_length/mean")
    for a, b in zip(sync, off, strict=True):
        for key in same:
            assert a[key] == b[key], (a["step"], key)
    # what was stale: nothing at step 1, one update behind from step 2 on
    assert [r["async/staleness_max"] for r in off] == [0.0, 1.0, 1.0, 1.0]
    assert "async/staleness_max" not in sync[0]


@pytest.mark.slow
def test_one_step_off_trains_with_the_correction_and_resumes_from_the_batches_trained(
    tmp_path, kk_data, tiny_model
):
    config = _cfg(tmp_path, kk_data, tiny_model, "off", {"mode": "one_step_off"}, steps=3, save_freq=2)
    assert main(["train", str(config)]) == 0
    run = tmp_path / "off" / "run"
    records = _records(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert "timing_s/old_log_prob" in r  # stale samples: the actor's pass measures the trained policy
        assert "rollout_corr/rollout_is_mean" in r  # the decoupled correction is on by default
        assert r["async/staleness_max"] <= 1 and r["async/queue_depth"] <= 1
    assert records[1]["async/staleness_share/1"] == 1.0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["rollout"]["max_staleness"] == 1
    # the checkpoint of step 2 holds the data cursor of the 2 batches trained, not of the third made ahead
    state = json.loads((run / "checkpoints" / "global_step_2" / "trainer_state.json").read_text())
    assert state["batches_drawn"] == 2 and state["generation_rounds"] == 2


@pytest.mark.slow
def test_a_push_that_leaves_the_engine_on_old_weights_is_caught_within_one_step(
    tmp_path, kk_data, tiny_model, monkeypatch, capsys
):
    """one_step_off generates with a copy of the actor: a sync that copies nothing would sample from the
    start weights for the whole run. With rollout.check_weight_sync the first sync after an update
    compares the copy's log-probs of probe tokens with the actor's and names what differs."""
    import lucidrl.workers.rollout.hf_engine as hf_engine

    monkeypatch.setattr(hf_engine, "copy_full_parameters", lambda dst, src: None)  # a push that does nothing
    config = _cfg(
        tmp_path, kk_data, tiny_model, "broken", {"mode": "one_step_off", "check_weight_sync": True}, lr=1e-2
    )
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "WeightSyncError" in err and "after the weight push the rollout engine's log-probs" in err
    assert "pushed parameter(s) differ from what the engine holds: model." in err
    # caught at the first sync after an update: step 1 never finished (the start's sync passed: the
    # copy was the actor then)
    assert _records(tmp_path / "broken" / "run") == []


def test_closing_the_supply_aborts_a_generation_under_way():
    """A run that ends (its last step, a stop, an error) while the thread generates the next batch cuts
    that generation short instead of waiting for it."""
    gate, started, calls = threading.Event(), threading.Event(), []

    def collect(timings):
        calls.append(len(calls))
        if len(calls) == 2:  # the batch made ahead: a long generation, until aborted
            started.set()
            gate.wait(60)
        return Batch(tensors={"x": torch.zeros(1)}), {}

    supply = Supply(collect, dict, max_staleness=1, abort=gate.set)
    supply.start(0)
    supply.take(1)
    assert started.wait(30)
    supply.close()
    assert gate.is_set() and not supply._thread.is_alive()


@pytest.mark.slow
def test_one_step_off_with_a_warming_critic_moves_on(tmp_path, kk_data, tiny_model):
    """While the critic warms up the actor does not update: the next version must still come, or the
    batch made ahead would wait for it forever."""
    config = _cfg(tmp_path, kk_data, tiny_model, "gae", {"mode": "one_step_off"}, steps=4)
    cfg = yaml.safe_load(open(config))
    cfg["algorithm"] = {"adv_estimator": "gae"}
    cfg["critic"] = {"warmup_steps": 2, "ppo_micro_batch_size": 8, "optim": {"lr": 1e-3}}
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    assert main(["train", str(config)]) == 0
    records = _records(tmp_path / "gae" / "run")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert "timing_s/update_actor" not in records[1] and "timing_s/update_actor" in records[2]
    assert all(r["async/staleness_max"] <= 1 for r in records)
