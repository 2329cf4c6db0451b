"""The same 2-step training in-process and on Ray with 2 CPU ranks (FSDP2 and DDP over gloo), and across
two Ray node processes on loopback joined through trainer.ray_address. The model stops early
(conftest.py::stopping_model), so each rank's responses end at lengths of their own: merging ranks
whose rollouts differ in width crashed every multi-rank run once, unseen while tests ran to the limit."""

import json
import os
import time
from pathlib import Path

import pytest
from helpers import TOY_REWARD, lucidrl_train
from safetensors.torch import load_file

# stated tolerances: float32 sums run in another order across ranks; Adam divides by sqrt(v), so a
# rounding difference on a near-zero gradient can move a weight by a sizeable part of one step (lr 1e-3).
# Measured: 3e-7 to 1.3e-5 on weights, < 1e-6 on losses; 5.8e-5 on weights on an AVX-512 host without
# AMX (AMD EPYC, 2026-12-02) in the stop-and-resume run, the same before and after that day's changes.
# 1e-4 is a tenth of one Adam step at this lr; the resumed run must still differ from the start by 20x it.
WEIGHT_TOL = 1e-4
LOSS_TOL = 1e-6


def _train(tmp_path, kk_data, model, name, *extra):
    """(metrics records, final weights) of a 2-step run."""
    return _run(tmp_path, kk_data, model, name, *extra)[:2]


def _run(tmp_path, kk_data, model, name, *extra, reward_source=TOY_REWARD):
    """(metrics records, final weights, the command's output) of a 2-step run."""
    reward = tmp_path / "reward.py"
    reward.write_text(reward_source)
    run = tmp_path / name
    args = [
        f"model.path={model['path']}",
        f"data.train_files=[{kk_data['train']}]",
        "data.val_files=[]",
        "data.max_prompt_length=1000",
        "data.max_response_length=10",
        "data.train_batch_size=4",
        "rollout.n=4",
        "rollout.deterministic=true",
        # two mini-batches: each rank's k-th must be its part of the one-process run's k-th
        "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size=8",
        "actor.optim.lr=1e-3",
        "actor.use_kl_loss=true",
        "actor.kl_loss_coef=0.01",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        f"trainer.run_dir={run}",
        f"reward.custom_function.path={reward}",
        *extra,
    ]
    proc = lucidrl_train(args)
    # grad_norm, lr, nonfinite_skipped come from one all-reduced gradient: the same on every rank
    assert "should be the same on every rank" not in proc.stderr, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # responses end early and at different lengths, so ranks' rollouts differ in width (conftest.py)
    assert all(r["response_length/min"] < r["response_length/max"] for r in records), records
    return records, load_file(run / "final" / "model.safetensors"), proc.stdout + proc.stderr


def _compare(a, b):
    (ra, wa), (rb, wb) = a, b
    for x, y in zip(ra, rb, strict=True):
        for key in ("actor/pg_loss", "actor/kl_loss", "critic/score/mean"):
            assert abs(x[key] - y[key]) <= LOSS_TOL, (key, x[key], y[key])
        for key in ("actor/grad_norm", "actor/entropy", "actor/pg_clipfrac"):  # a rank's share, averaged
            assert abs(x[key] - y[key]) <= 1e-5 * max(abs(x[key]), 1e-2), (key, x[key], y[key])
    assert sorted(wa) == sorted(wb)
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert diff <= WEIGHT_TOL, diff
    return diff


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, kk_data, stopping_model):
    return _train(tmp_path_factory.mktemp("local"), kk_data, stopping_model, "local")


def _moved(local_run, model) -> float:
    start = load_file(f"{model['path']}/model.safetensors")
    return max((local_run[1][k] - start[k]).abs().max().item() for k in start)


DDP = ("trainer.strategy=ddp", "placement.pools={global: {nodes: 1, devices_per_node: 2}}")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, kk_data, stopping_model, ray_head):
    """The 2-step run on two Ray DDP ranks, uninterrupted."""
    ray = ("trainer.backend=ray", f"trainer.ray_address={ray_head}", *DDP)
    return _train(tmp_path_factory.mktemp("ddp"), kk_data, stopping_model, "ddp", *ray)


@pytest.mark.slow
def test_ray_two_ddp_ranks_match_local(local_run, ddp_run, stopping_model):
    """FSDP2 on two ranks is compared with the same local run by the resume test below, step by step."""
    ray_run = ddp_run
    diff = _compare(local_run, ray_run)
    assert _moved(local_run, stopping_model) > 20 * diff  # the runs trained, and agree far more closely


@pytest.mark.slow
def test_fsdp2_on_ray_stopped_and_resumed_matches_the_uninterrupted_local_run(
    local_run, tmp_path, kk_data, stopping_model, ray_head
):
    """Each rank saves and loads its own shards (weights and AdamW state) through torch.distributed.checkpoint."""
    ray = (
        "trainer.backend=ray",
        f"trainer.ray_address={ray_head}",
        "trainer.strategy=fsdp2",
        "placement.pools={global: {nodes: 1, devices_per_node: 2}}",
    )
    _train(
        tmp_path,
        kk_data,
        stopping_model,
        "resumed",
        *ray,
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
    )
    step1 = tmp_path / "resumed" / "checkpoints" / "global_step_1"
    assert sorted(p.name for p in (step1 / "actor").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # the weights' shards are joined into one HuggingFace folder of whole tensors
    weights = step1 / "actor" / "model"
    assert sorted(p.name for p in weights.iterdir() if "safetensors" in p.name) == [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]
    start = load_file(f"{stopping_model['path']}/model.safetensors")
    saved = load_file(weights / "model-00001-of-00001.safetensors")
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in start.items()}
    assert any(not saved[k].equal(start[k]) for k in start)
    resumed = _train(
        tmp_path, kk_data, stopping_model, "resumed", *ray, "trainer.save_freq=1"
    )  # on to step 2
    assert [r["step"] for r in resumed[0]] == [1, 2]
    # two FSDP2 ranks, each step (the first run's, then the resumed one's) as in one process
    assert _moved(local_run, stopping_model) > 20 * _compare(local_run, resumed)
    # the same 2-rank checkpoint resumed in one process: each tensor is read whole instead of by halves
    local = _train(
        tmp_path,
        kk_data,
        stopping_model,
        "resumed_locally",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={step1}",
    )
    assert [r["step"] for r in local[0]] == [2]
    _compare((local_run[0][1:], local_run[1]), local)


@pytest.mark.slow
def test_a_resumed_ray_run_samples_what_the_uninterrupted_one_did(
    tmp_path, kk_data, stopping_model, ray_head
):
    """rollout.deterministic=false draws from each rank's process RNG: the checkpoint carries every rank's."""
    ray = (
        "trainer.backend=ray",
        f"trainer.ray_address={ray_head}",
        "trainer.strategy=ddp",
        "placement.pools={global: {nodes: 1, devices_per_node: 2}}",
        "rollout.deterministic=false",
    )
    straight = _train(tmp_path, kk_data, stopping_model, "straight", *ray)
    _train(
        tmp_path,
        kk_data,
        stopping_model,
        "resumed",
        *ray,
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
    )
    step1 = tmp_path / "resumed" / "checkpoints" / "global_step_1"
    assert sorted(p.name for p in (step1 / "rng").iterdir()) == [
        "actor+reference+rollout_rank_0.pt",  # per group: separately placed roles are other processes
        "actor+reference+rollout_rank_1.pt",
    ]
    resumed = _train(tmp_path, kk_data, stopping_model, "resumed", *ray, "trainer.save_freq=1")
    _compare(straight, resumed)


@pytest.mark.slow
def test_relative_paths_on_a_joined_cluster_are_the_drivers(tmp_path, kk_data, stopping_model, ray_head):
    """The head (and so its workers) started in another folder than the run: model.path, run_dir and the
    checkpoints and model they write are relative to where `lucidrl train` runs, on every rank."""
    import shutil

    shutil.copytree(stopping_model["path"], tmp_path / "models" / "m")
    reward = tmp_path / "reward.py"
    reward.write_text(TOY_REWARD)
    here = {p.name for p in Path.cwd().iterdir()}
    args = [
        "model.path=models/m",
        f"data.train_files=[{kk_data['train']}]",
        "data.val_files=[]",
        "data.max_prompt_length=1000",
        "data.max_response_length=10",
        "data.train_batch_size=4",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.save_freq=1",
        "trainer.run_dir=relative_run",
        "reward.custom_function.path=reward.py",
        "trainer.backend=ray",
        f"trainer.ray_address={ray_head}",
        *DDP,
    ]
    lucidrl_train(args, cwd=tmp_path)
    run = tmp_path / "relative_run"
    assert (run / "checkpoints" / "global_step_1" / "actor" / "model" / "config.json").is_file()
    assert sorted(p.name for p in (run / "checkpoints" / "global_step_1" / "rng").iterdir()) == [
        "actor+rollout_rank_0.pt",
        "actor+rollout_rank_1.pt",
    ]
    assert (run / "final" / "model.safetensors").is_file()
    # and resumed from there: every rank loads its state from the relative checkpoint
    lucidrl_train([*args, "trainer.total_training_steps=2"], cwd=tmp_path)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert (run / "checkpoints" / "global_step_2").is_dir()
    assert {p.name for p in Path.cwd().iterdir()} == here  # nothing written where the head runs


@pytest.mark.slow
def test_two_node_processes_joined_by_ray_address(local_run, tmp_path, kk_data, stopping_model):
    """A head and a second node process on loopback (Ray's own multi-node test harness), one rank on each."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray_run = _train(
            tmp_path,
            kk_data,
            stopping_model,
            "two_nodes",
            "trainer.backend=ray",
            f"trainer.ray_address={cluster.address}",
            "placement.pools={global: {nodes: 2, devices_per_node: 1}}",
        )
    finally:
        cluster.shutdown()
    _compare(local_run, ray_run)


# kills one of this run's Ray ranks while step 2's rewards are scored (in the trainer's process): the
# ranks are the _RankHost processes whose environment holds this test's folder (Ray hands the trainer's
# PYTHONPATH to its workers), so no other run's workers on the machine are touched
KILL_A_RANK = (
    TOY_REWARD
    + """
import os, pathlib, signal

_toy = compute_score
TOKEN = os.environ["LUCIDRL_TEST_TOKEN"]

def _ranks():
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        try:
            if b"_RankHost" in (proc / "cmdline").read_bytes() and TOKEN.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return sorted(found)

def compute_score(data_source, solution_str, ground_truth, extra_info):
    marker = pathlib.Path(TOKEN) / "killed"
    if (pathlib.Path(TOKEN) / "restart" / "checkpoints" / "global_step_1").is_dir() and not marker.exists():
        ranks = _ranks()
        marker.write_text(str(ranks))
        os.kill(ranks[-1], signal.SIGKILL)
    return _toy(data_source, solution_str, ground_truth, extra_info)
"""
)


@pytest.mark.slow
def test_a_killed_ray_rank_restarts_the_run_from_its_checkpoint_to_the_same_weights(
    ddp_run, tmp_path, kk_data, stopping_model, ray_head, monkeypatch
):
    """trainer.max_restarts=1: SIGKILL one of two DDP ranks in step 2; the controller notices the death,
    tears the group down, starts it again and resumes from step 1's checkpoint. The run finishes with
    the weights the uninterrupted run has (deterministic sampling; the same ranks, so bit for bit)."""
    monkeypatch.setenv("LUCIDRL_TEST_TOKEN", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{os.environ.get('PYTHONPATH', '')}{os.pathsep}{tmp_path}")
    began = time.perf_counter()
    records, weights, out = _run(
        tmp_path,
        kk_data,
        stopping_model,
        "restart",
        "trainer.backend=ray",
        f"trainer.ray_address={ray_head}",
        *DDP,
        "trainer.save_freq=1",
        "trainer.max_restarts=1",
        reward_source=KILL_A_RANK,
    )
    seconds = time.perf_counter() - began
    killed = json.loads((tmp_path / "killed").read_text())
    assert len(killed) == 2  # both ranks were found, one was killed
    assert (
        "restart 1 of 1" in out and "died during" in out and "resuming from" in out and "global_step_1" in out
    )
    assert [r["step"] for r in records] == [1, 2]
    diff = max((ddp_run[1][k] - weights[k]).abs().max().item() for k in weights)
    print(f"restart test: max weight difference {diff}, 1 restart, {seconds:.0f} s")
    assert diff == 0.0 and _moved((records, weights), stopping_model) > 0  # equal, and trained


# every sample of about half the prompts scores 0 (a tied group: advantage 0), the others' almost never tie
HALF_TIED_REWARD = """
import zlib
def compute_score(data_source, solution_str, ground_truth, extra_info):
    if zlib.crc32(str(ground_truth).encode()) % 2:
        return 0.0
    text = solution_str[len("<think>"):]
    return text.count("e") / max(len(text), 1)
"""


@pytest.mark.slow
def test_skipping_tied_groups_on_two_fsdp2_ranks_matches_the_local_run_without_it(
    tmp_path, kk_data, stopping_model, ray_head
):
    """actor.skip_zero_advantage on two ranks, each keeping the samples of its own prompts (one prompt per
    rank per mini-batch here: 4 samples or none), against the full update in one process.
    tests/test_data_parallel_cuts.py checks the matching forwards at the worker."""
    no_kl = "actor.use_kl_loss=false"
    local = _run(tmp_path, kk_data, stopping_model, "local", no_kl, reward_source=HALF_TIED_REWARD)
    ray = _run(
        tmp_path, kk_data, stopping_model, "ray", no_kl, "actor.skip_zero_advantage=true",
        "trainer.backend=ray", f"trainer.ray_address={ray_head}", "trainer.strategy=fsdp2",
        "placement.pools={global: {nodes: 1, devices_per_node: 2}}", reward_source=HALF_TIED_REWARD,
    )  # fmt: skip
    skipped = [r["actor/zero_advantage_skipped"] for r in ray[0]]
    assert any(0 < s < 1 for s in skipped), skipped  # tied and untied prompts in one step
    for x, y in zip(local[0], ray[0], strict=True):
        for key in ("actor/pg_loss", "critic/score/mean"):
            assert abs(x[key] - y[key]) <= LOSS_TOL, (key, x[key], y[key])
        for key in ("actor/grad_norm", "actor/entropy"):  # entropy: from the old-log-prob pass, every sample
            assert abs(x[key] - y[key]) <= 1e-5 * max(abs(x[key]), 1e-2), (key, x[key], y[key])
    diff = max((local[1][k] - ray[1][k]).abs().max().item() for k in local[1])
    assert diff <= WEIGHT_TOL and _moved(local[:2], stopping_model) > 20 * diff, diff
