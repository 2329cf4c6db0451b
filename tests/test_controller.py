"""The controller: dispatch, placement, Ray worker groups, remote errors, dead workers."""

import os
import pickle
import signal
import subprocess
import sys

import pytest
import torch
from helpers import toy_train_args

from lucidrl.batch import Batch, BatchError
from lucidrl.config import ConfigError, load_config
from lucidrl.config.placement import plan_groups
from lucidrl.controller.dispatch import merge_from_ranks, split_for_ranks
from lucidrl.controller.errors import RemoteWorkerError, WorkerDiedError
from lucidrl.controller.worker_group import LocalWorkerGroup
from lucidrl.doctor.probe_worker import ProbeWorker
from lucidrl.workers.common.dispatch import Dispatch
from lucidrl.workers.training.rank_metrics import Combine, RankMetrics, combine_ranks


def test_dp_dispatch_pads_to_a_divisor_and_unpads():
    batch = Batch(tensors={"x": torch.arange(5)}, non_tensors={"id": list("abcde")})
    chunks, pad = split_for_ranks(batch, 2, Dispatch.DP, "m")
    assert pad == 1 and [c["id"] for c in chunks] == [["a", "b", "c"], ["d", "e", "a"]]
    back = merge_from_ranks(chunks, pad, Dispatch.DP)
    assert back["id"] == list("abcde") and back["x"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(BatchError, match="5 samples must divide evenly over 2"):
        split_for_ranks(batch, 2, Dispatch.DP_EXACT, "update_actor")


def test_mini_batch_order_gives_each_rank_its_part_of_every_global_mini_batch():
    from lucidrl.controller.dispatch import mini_batch_order

    batch = Batch(tensors={"x": torch.arange(12)})
    chunks, _ = split_for_ranks(mini_batch_order(batch, 6, 2), 2, Dispatch.DP_EXACT, "update_actor")
    per_rank = [c["x"].tolist() for c in chunks]
    assert per_rank == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    # rank r's k-th mini-batch (of 6 / 2 rows), over the ranks: one process's k-th mini-batch
    for k in range(2):
        assert sorted(x for rows in per_rank for x in rows[3 * k : 3 * k + 3]) == list(
            range(6 * k, 6 * k + 6)
        )
    for args in ((6, 1), (12, 2), (5, 2), (3, 2)):  # one rank, one mini-batch, sizes that do not divide
        assert mini_batch_order(batch, *args)["x"].tolist() == list(range(12))


def _ranks(*values: dict[str, tuple[float, Combine]]) -> list[RankMetrics]:
    out = []
    for v in values:
        m = RankMetrics()
        for k, (x, how) in v.items():
            m.put(k, x, how)
        out.append(m)
    return out


def test_rank_metrics_combine_as_each_says_and_undeclared_ones_are_refused(caplog):
    ranks = _ranks(
        {
            "loss": (1.0, Combine.MEAN),
            "n": (3, Combine.SUM),
            "hi": (2.0, Combine.MAX),
            "lo": (2.0, Combine.MIN),
            "lr": (0.1, Combine.SAME),
        },
        {
            "loss": (3.0, Combine.MEAN),
            "n": (4, Combine.SUM),
            "hi": (5.0, Combine.MAX),
            "lo": (-1.0, Combine.MIN),
            "lr": (0.1, Combine.SAME),
        },
    )
    merged = merge_from_ranks(ranks, 0, Dispatch.DP_EXACT, method="update_actor")
    assert merged == {"loss": 2.0, "n": 7.0, "hi": 5.0, "lo": -1.0, "lr": 0.1} and type(merged) is dict
    # what crosses to and from a Ray worker keeps how each metric combines
    back = pickle.loads(pickle.dumps(ranks[0]))
    assert isinstance(back, RankMetrics) and back == ranks[0] and back.how == ranks[0].how
    # one rank: its own metrics, whatever they are
    assert combine_ranks([{"a": 1.0}]) == {"a": 1.0}
    # a plain dict, or a key put without its Combine, from several ranks: refused, named
    with pytest.raises(
        BatchError, match="update_actor returned metrics from 2 ranks without saying how.*: a, b"
    ):
        merge_from_ranks([{"a": 1.0, "b": 2.0}, {"a": 3.0}], 0, Dispatch.DP_EXACT, method="update_actor")
    ranks[1]["extra_max"] = 9.0
    with pytest.raises(BatchError, match="without saying how they combine: extra_max"):
        combine_ranks(ranks)
    with pytest.raises(BatchError, match="metric x is missing on rank\\(s\\) \\[1\\]"):
        combine_ranks(_ranks({"x": (1.0, Combine.MEAN)}, {"y": (1.0, Combine.MEAN)}))
    with pytest.raises(BatchError, match="combines differently by rank"):
        combine_ranks(_ranks({"x": (1.0, Combine.MEAN)}, {"x": (1.0, Combine.SUM)}))
    # ranks that disagree on what must be the same: rank 0's value, and a warning that names them
    with caplog.at_level("WARNING"):
        assert combine_ranks(_ranks({"g": (1.0, Combine.SAME)}, {"g": (1.5, Combine.SAME)})) == {"g": 1.0}
    assert "g should be the same on every rank but is 1, 1.5 by rank" in caplog.text


def test_local_group_calls_in_process_and_checks_method_names():
    group = LocalWorkerGroup(ProbeWorker, "probe")
    out = group.where(Batch(tensors={"x": torch.arange(3)}))
    assert out["pid"] == [os.getpid()] * 3 and out["rank"] == [0, 0, 0]
    with pytest.raises(AttributeError, match="no worker method 'nope'.*where"):
        group.nope()


def _placement(*overrides):
    return load_config(None, ["model.path=m", *overrides])


def test_placement_default_colocates_everything_in_one_group():
    plans = plan_groups(_placement("actor.use_kl_loss=true", "algorithm.adv_estimator=gae"))
    assert len(plans) == 1 and plans[0].roles == {"actor", "rollout", "reference", "critic"}


def test_two_roles_on_one_device_without_colocation_is_an_error_naming_both():
    with pytest.raises(
        ConfigError, match=r"roles 'actor' and 'critic' are both placed on global:node0:device0"
    ):
        _placement("algorithm.adv_estimator=gae", "placement.colocate=[[actor, rollout, reference]]")
    with pytest.raises(ConfigError, match=r"roles 'actor' and 'critic' are both placed on cuda:1"):
        _placement(
            "algorithm.adv_estimator=gae",
            "placement.colocate=[[actor, rollout]]",
            "placement.actor.devices=[cuda:0, cuda:1]",
            "placement.rollout.devices=[cuda:0, cuda:1]",
            "placement.critic.devices=[cuda:1]",
        )
    # in one process a pool's rank uses trainer.device: `cuda` is cuda:0, which an explicit device may name
    on_gpu = ("trainer.device=cuda", "algorithm.adv_estimator=gae", "placement.colocate=[[actor, rollout]]")
    with pytest.raises(ConfigError, match=r"roles 'actor' and 'critic' are both placed on cuda:0"):
        _placement(*on_gpu, "placement.critic.devices=[cuda:0]")
    assert [p.device for p in plan_groups(_placement(*on_gpu, "placement.critic.devices=[cuda:1]"))] == [
        "cuda",
        "cuda:1",
    ]


def test_separate_pools_and_placement_errors():
    plans = plan_groups(
        _placement(
            "algorithm.adv_estimator=gae",
            "trainer.backend=ray",
            "placement.colocate=[[actor, rollout]]",
            "placement.pools={global: {nodes: 1, devices_per_node: 2}, critic_pool: {nodes: 2, devices_per_node: 1}}",
            "placement.critic.pool=critic_pool",
        )
    )
    assert {p.name: p.world_size for p in plans} == {"actor+rollout": 2, "critic": 2}
    with pytest.raises(ConfigError, match="rollout must be colocated with the actor"):
        _placement(
            "placement.colocate=[[actor]]",
            "placement.rollout.pool=other",
            "placement.pools={global: {}, other: {}}",
        )
    with pytest.raises(ConfigError, match="placed differently"):
        _placement("placement.actor.pool=other", "placement.pools={global: {}, other: {}}")
    with pytest.raises(ConfigError, match="trainer.backend=local runs one rank.*trainer.backend=ray"):
        _placement("placement.pools={global: {devices_per_node: 2}}")
    with pytest.raises(ConfigError, match=r"actor.head_chunk_tokens=256: .*one rank only.*placed on 2"):
        _placement(
            "trainer.backend=ray",
            "actor.head_chunk_tokens=256",
            "placement.pools={global: {nodes: 1, devices_per_node: 2}}",
        )
    with pytest.raises(
        ConfigError,
        match=r"actor.ppo_mini_batch_size: a mini-batch of 1 prompts x rollout.n=3 = 3 samples does not split evenly over the 2",
    ):
        _placement(
            "trainer.backend=ray",
            "actor.ppo_mini_batch_size=1",
            "actor.ppo_micro_batch_size=1",
            "rollout.n=3",
            "placement.pools={global: {nodes: 1, devices_per_node: 2}}",
        )
    with pytest.raises(ConfigError, match="placement.actor.pool='gpus' is not a pool"):
        _placement("placement.actor.pool=gpus")
    with pytest.raises(ConfigError, match="unknown role 'actr'"):
        _placement("placement.colocate=[[actr, rollout]]")


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from lucidrl.controller.worker_group import ensure_ray

    ensure_ray(None, num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture()
def probe_group(ray_cluster):
    from lucidrl.controller.worker_group import RayWorkerGroup

    group = RayWorkerGroup(ProbeWorker, "probe", world_size=2)
    yield group
    group.shutdown()


@pytest.mark.slow
def test_ray_group_dispatches_across_processes_and_reduces(probe_group):
    out = probe_group.where(Batch(tensors={"x": torch.arange(5)}))
    assert out["x"].tolist() == [0, 1, 2, 3, 4] and out["rank"] == [0, 0, 0, 1, 1]
    assert len(set(out["pid"])) == 2 and os.getpid() not in out["pid"]
    assert probe_group.all_reduce_sum(1.0) == 3.0  # (1+0) + (1+1) through gloo
    assert probe_group.train_like(Batch(tensors={"x": torch.arange(4)})) == {
        "samples": 4.0,  # summed, averaged, maximum, the same: each as it says, through Ray's pickling
        "rank": 0.5,
        "rank_max": 1.0,
        "world_size": 2.0,
    }


@pytest.mark.slow
def test_a_group_the_cluster_cannot_place_names_its_size_and_the_cluster(ray_cluster):
    from lucidrl.controller.worker_group import RayWorkerGroup

    with pytest.raises(RuntimeError, match=r"could not place 1 node\(s\) x \{'CPU': 200\}") as info:
        RayWorkerGroup(ProbeWorker, "too-big", world_size=2, cpus_per_rank=100, ready_timeout_s=1)
    assert "trainer.ray_address=auto" in str(info.value)  # a run may have started Ray of its own here


@pytest.mark.slow
def test_unpicklable_worker_exception_arrives_with_type_message_and_traceback(probe_group):
    with pytest.raises(RemoteWorkerError) as info:
        probe_group.fail("raise")
    text = str(info.value)
    assert "lucidrl.doctor.probe_worker.TwoArgError: worker-side detail (code 42)" in text
    assert "role=probe rank=0" in text and "host=" in text
    assert 'probe_worker.py", line' in text and "raise TwoArgError" in text  # the remote traceback
    assert info.value.type_name == "TwoArgError"


@pytest.mark.slow
def test_a_result_ray_cannot_pickle_names_the_worker_and_the_cause(probe_group):
    """Ray's own error around a worker method arrived raw, without role and rank."""
    with pytest.raises(RemoteWorkerError) as info:
        probe_group.fail("unpicklable")
    text = str(info.value)
    assert text.startswith("TypeError: cannot pickle '_thread.lock' object (raised by Ray around the worker")
    assert "role=probe rank=0" in text and "during 'fail'" in text and "\x1b[" not in text
    assert "cloudpickle" in text  # Ray's traceback of the failed pickling


@pytest.mark.slow
def test_a_user_error_in_a_worker_is_a_user_error_there_too(probe_group, monkeypatch, capsys):
    """Printed as one message with exit status 2 by the command line, as in-process: bad input raised
    in a Ray worker used to arrive as a plain RuntimeError with two tracebacks and status 1."""
    from lucidrl import cli
    from lucidrl.controller.errors import RemoteUserError
    from lucidrl.diagnostics.errors import UserError

    with pytest.raises(RemoteUserError) as info:
        probe_group.fail("user")
    assert isinstance(info.value, UserError) and isinstance(info.value, RemoteWorkerError)
    text = str(info.value)
    assert text.startswith("probe.value=-1 must be positive") and info.value.type_name == "ProbeInputError"
    assert "role=probe rank=0" in text and "traceback" not in text
    assert "raise ProbeInputError" in info.value.failure.traceback  # kept, and shown with LUCIDRL_DEBUG=1
    monkeypatch.setenv("LUCIDRL_DEBUG", "1")
    with pytest.raises(RemoteUserError, match="remote traceback"):
        probe_group.fail("user")
    monkeypatch.delenv("LUCIDRL_DEBUG")

    def run(args):
        probe_group.fail("user")

    from lucidrl.cli import version

    monkeypatch.setattr(version, "run", run)
    assert cli.main(["version"]) == 2
    assert capsys.readouterr().err.startswith("error (ProbeInputError): probe.value=-1 must be positive;")


@pytest.mark.slow
def test_a_killed_worker_is_named_not_a_hang(probe_group):
    pids = probe_group.call("pid")  # ALL returns rank 0's
    os.kill(pids, signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match=r"role=probe rank=0 died during 'where'") as info:
        probe_group.where(Batch(tensors={"x": torch.arange(2)}))
    assert "Worker exit type" in str(info.value)  # Ray's later lines: why it died


@pytest.mark.slow
def test_a_taken_rendezvous_port_is_a_user_error_naming_it_and_the_group_is_cleaned_up(ray_cluster):
    """It reached the trainer as Ray's own exception, without role or rank, and left the ranks running."""
    import socket

    from lucidrl.controller.errors import RemoteUserError
    from lucidrl.controller.worker_group import RayWorkerGroup

    before = {
        pg_id for pg_id, pg in ray_cluster.util.placement_group_table().items() if pg["state"] != "REMOVED"
    }
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RemoteUserError) as info:
            RayWorkerGroup(ProbeWorker, "probe", world_size=2, master_port=port)
    text = str(info.value)
    assert (
        f"trainer.master_port={port} is already in use" in text and "leave trainer.master_port unset" in text
    )
    assert "role=probe rank=0" in text and "during 'rendezvous'" in text
    assert info.value.type_name == "PortInUseError"
    after = {
        pg_id for pg_id, pg in ray_cluster.util.placement_group_table().items() if pg["state"] != "REMOVED"
    }
    assert after == before  # its placement group was removed (and its ranks killed) on the way out


@pytest.mark.slow
def test_a_trainer_whose_set_up_fails_leaves_no_ray_groups_behind(ray_cluster, tmp_path, kk_data, tiny_model):
    """An empty validation file is found after the groups have started; a missing reward file is found
    before any starts. Either way the error arrives and this process, which goes on, holds no placement
    group (nor its ranks) from the failed start."""
    import pyarrow.parquet as pq

    from lucidrl.data.dataset import DatasetError
    from lucidrl.rewards.custom import CustomFunctionError
    from lucidrl.trainer.ppo import PPOTrainer

    def placement_groups() -> set:
        table = ray_cluster.util.placement_group_table()
        return {pg_id for pg_id, pg in table.items() if pg["state"] != "REMOVED"}

    before = placement_groups()
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(kk_data["train"]).slice(0, 0), empty)
    args = [*toy_train_args(tmp_path, kk_data, tiny_model)[1:], "trainer.backend=ray"]
    with pytest.raises(DatasetError, match="holds no rows"):
        PPOTrainer(load_config(None, [*args, f"data.val_files=[{empty}]"]))
    assert placement_groups() == before
    missing = tmp_path / "no_such_reward.py"
    with pytest.raises(CustomFunctionError, match="no_such_reward.py.* does not exist"):
        PPOTrainer(load_config(None, [*args, f"reward.custom_function.path={missing}"]))
    assert placement_groups() == before


@pytest.mark.slow
def test_a_worker_that_fails_to_start_says_why(ray_cluster):
    """Its constructor's error is on the later lines of Ray's message; only the first was kept."""
    from types import SimpleNamespace

    from lucidrl.controller.worker_group import RayWorkerGroup, _RankHost

    host = ray_cluster.remote(_RankHost).options(num_cpus=0).remote("probe", 0, 0, ".")  # set_num_threads(0)
    with pytest.raises(WorkerDiedError) as info:
        RayWorkerGroup._get(SimpleNamespace(role="probe"), host.rendezvous.remote(None), 0, "rendezvous")
    text = str(info.value)
    assert "role=probe rank=0 failed to start (the trainer was calling 'rendezvous')" in text
    assert "set_num_threads expects a positive integer" in text and "out of memory" not in text
    assert "\x1b[" not in text


def test_local_cuda_index_picks_the_gpu_ray_assigned(monkeypatch):
    ray = pytest.importorskip("ray")
    from lucidrl.workers.common.distributed import local_cuda_index

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [3])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # Ray's default: the rank sees its GPU alone
    assert local_cuda_index() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
    assert local_cuda_index() == 3
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert local_cuda_index() == 3
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])  # no GPU asked for
    assert local_cuda_index() == 0


JOIN_PROBE = """
import os, sys
import ray
from lucidrl.controller.worker_group import ensure_ray
for env in ("", sys.argv[1]):
    os.environ["RAY_ADDRESS"] = env
    where = ensure_ray(None, num_cpus=2)
    print(where, "|", ray.get_runtime_context().gcs_address)
    ray.shutdown()
"""


@pytest.mark.slow
def test_an_unset_ray_address_starts_ray_here_beside_a_running_cluster_and_RAY_ADDRESS_joins(ray_head):
    """Bare ray.init() would join the cluster `ray start` left on this host and refuse num_cpus there
    (`lucidrl doctor` failed so); `ray job submit` hands its cluster over in RAY_ADDRESS."""
    from ray._private.utils import write_ray_address

    write_ray_address(ray_head)  # what `ray start --head` leaves for ray.init() to find
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-c", JOIN_PROBE, ray_head], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (here, here_gcs), (joined, joined_gcs) = (line.split(" | ") for line in proc.stdout.splitlines())
    assert here == "a Ray instance started here" and here_gcs != ray_head
    assert joined == f"the Ray cluster at {ray_head} (RAY_ADDRESS)" and joined_gcs == ray_head


def test_ranks_rollouts_of_different_lengths_are_padded_to_one_width_when_merged():
    """Each rank's rollout trims to its own longest response; before, joining them was torch.cat's
    'Sizes of tensors must match' on any multi-rank run whose ranks' longest responses differed."""
    from lucidrl.workers.rollout.engine import SamplingParams
    from lucidrl.workers.rollout.responses import batch_from_token_lists

    pad_id, eos = 0, 2
    prompts = Batch(
        tensors={"prompts": torch.tensor([[0, 5], [6, 7]]), "prompt_mask": torch.tensor([[0, 1], [1, 1]])},
        non_tensors={"uid": ["a", "b"]},
    )
    chunks, pad = split_for_ranks(prompts, 2, Dispatch.DP, "generate")
    params = SamplingParams(n=2, max_new_tokens=6)
    ids = [[[3, eos], [4]], [[3, 4, 5, 6, eos], [7, eos]]]  # rank 0's longest: 2 tokens, rank 1's: 5
    outs = [
        batch_from_token_lists(c, params, rows, [[-0.5] * len(r) for r in rows], pad_id=pad_id, eos_ids=[eos])
        for c, rows in zip(chunks, ids, strict=True)
    ]
    assert [o["responses"].shape[1] for o in outs] == [2, 5]
    merged = merge_from_ranks(outs, pad, Dispatch.DP)
    assert merged["responses"].tolist() == [
        [3, eos, 0, 0, 0],
        [4, 0, 0, 0, 0],
        [3, 4, 5, 6, eos],
        [7, eos, 0, 0, 0],
    ]
    assert merged["response_mask"].sum(1).tolist() == [2, 1, 5, 2]
    assert merged["rollout_log_probs"].sum(1).tolist() == [-1.0, -0.5, -2.5, -1.0]
    assert merged["uid"] == ["a", "a", "b", "b"]
    # 3 prompts on 2 ranks: one padding prompt, whose n=2 samples are both dropped (one was kept:
    # 7 samples, a copy of prompt a's first at the end, which validation averaged in)
    three = Batch(
        tensors={"prompts": torch.tensor([[0, 5], [6, 7], [8, 9]]), "prompt_mask": torch.ones(3, 2)},
        non_tensors={"uid": ["a", "b", "c"]},
    )
    chunks, pad3 = split_for_ranks(three, 2, Dispatch.DP, "generate")
    assert pad3 == 1 and [c["uid"] for c in chunks] == [["a", "b"], ["c", "a"]]
    outs3 = [
        batch_from_token_lists(c, params, [[3, eos]] * 4, [[-0.5] * 2] * 4, pad_id=pad_id, eos_ids=[eos])
        for c in chunks
    ]
    merged = merge_from_ranks(outs3, pad3, Dispatch.DP, sent=4)
    assert merged["uid"] == ["a", "a", "b", "b", "c", "c"]
    with pytest.raises(BatchError, match="returned 8 rows for the 3 they were sent"):
        merge_from_ranks(outs3, pad3, Dispatch.DP, sent=3)
    no_pad_id = [Batch(o.tensors, o.non_tensors, {}) for o in outs]
    with pytest.raises(BatchError, match="'responses' is 2 wide in one batch and 5 in another"):
        merge_from_ranks(no_pad_id, pad, Dispatch.DP)
