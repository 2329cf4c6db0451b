"""The rollout-engine contract (workers/rollout/engine.py): every engine provides it, the policy worker
uses nothing else, training syncs weights through the same `sync_from` these tests call, and `abort`
cuts a running generation short with the tokens made so far."""

from __future__ import annotations

import inspect
import json
import threading

import pytest
import torch
from helpers import write_train_config

from lucidrl.cli import main
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model
from lucidrl.workers.rollout import engine as engine_module
from lucidrl.workers.rollout.engine import (
    ABORTED_FIELD,
    ENGINES,
    AbortUnsupported,
    RolloutEngine,
    SamplingParams,
    engine_class,
)
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.rollout.server_engine import ServerRollout
from lucidrl.workers.rollout.vllm_engine import VLLMRollout

MEMBERS = ("from_config", "generate", "sync_from", "abort", "full_model")


@pytest.mark.parametrize("name", sorted(ENGINES), ids=lambda name: f"{name}-engine")
def test_every_engine_provides_the_contract(name):
    cls = engine_class(name)
    assert cls.name == name
    for member in MEMBERS:
        ours = inspect.signature(getattr(RolloutEngine, member))
        theirs = inspect.signature(getattr(cls, member))
        assert list(theirs.parameters) == list(ours.parameters), (name, member)
    for flag in ("runs_actor_module", "can_abort"):
        assert isinstance(getattr(cls, flag), bool), (name, flag)


def test_an_unknown_engine_names_the_choices():
    with pytest.raises(ValueError, match=r"rollout.name='sglang' is not an engine: use hf, vllm, server"):
        engine_class("sglang")


def test_the_policy_worker_does_not_ask_which_engine_it_has():
    """No isinstance of an engine class or comparison of rollout.name in the policy worker: what differs
    between engines is behind the contract (engine_class is the one place the name is read)."""
    source = inspect.getsource(inspect.getmodule(engine_module.engine_class))
    policy = inspect.getsource(__import__("lucidrl.workers.policy", fromlist=["x"]))
    for engine in ("HFRollout", "VLLMRollout", "ServerRollout"):
        assert engine not in policy, engine
    assert "rollout.name ==" not in policy and "rollout.name !=" not in policy
    assert "def engine_class" in source


@pytest.mark.parametrize("cls", [VLLMRollout, ServerRollout])
def test_engines_that_cannot_abort_say_so(cls):
    engine = cls.__new__(cls)  # abort refuses before it touches any state
    engine.base_url = "http://127.0.0.1:1"
    with pytest.raises(AbortUnsupported, match=rf"rollout.name={cls.name} cannot cut .*rollout.name=hf"):
        engine.abort()


def _prompts(kk_data, tok, k):
    samples, _ = load_prompts([kk_data["train"]], tok, max_prompt_length=2048)
    return collate(samples[:k], tok.pad_token_id)


class _AbortAfter:
    """A forward hook that calls engine.abort() at the model's `calls`-th forward (prefill included)."""

    def __init__(self, engine: HFRollout, calls: int):
        self.engine, self.calls, self.seen = engine, calls, 0

    def __call__(self, module, args, output):
        self.seen += 1
        if self.seen == self.calls:
            self.engine.abort()


@pytest.mark.parametrize("loop", ["lucidrl", "transformers"])
def test_abort_cuts_rows_short_with_the_tokens_made_so_far(kk_data, tiny_model, tiny_tokenizer, loop):
    model = load_model(tiny_model["path"])
    engine = HFRollout(model, tiny_tokenizer, micro_batch_size=4, decode_loop=loop)
    prompts = _prompts(kk_data, tiny_tokenizer, 4)
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=24)  # greedy: a cut row is a prefix
    whole = engine.generate(prompts, params)
    assert ABORTED_FIELD not in whole.tensors  # nothing aborted, no field
    hook = model.register_forward_hook(_AbortAfter(engine, calls=6))  # a few tokens in
    try:
        cut = engine.generate(prompts, params)
    finally:
        hook.remove()
    aborted = cut[ABORTED_FIELD]
    # the first micro-batch (2 prompts x 2) was cut a few tokens in; the second never began
    lengths = cut["response_mask"].sum(-1)
    assert aborted.tolist() == [True] * 8, (aborted, lengths)  # the random tiny model never ends by 24
    made = int(lengths[0])
    assert 0 < made < 24 and lengths[:4].tolist() == [made] * 4 and lengths[4:].tolist() == [0] * 4
    for i in range(4):  # the tokens made before the abort are the unaborted run's
        assert torch.equal(cut["responses"][i, :made], whole["responses"][i, :made])
    # the next call is not aborted: abort only reaches a generation running when it is called
    again = engine.generate(prompts, params)
    assert torch.equal(again["responses"], whole["responses"]) and ABORTED_FIELD not in again.tensors


def test_abort_from_another_thread_stops_a_long_generation(kk_data, tiny_model, tiny_tokenizer):
    model = load_model(tiny_model["path"])
    engine = HFRollout(model, tiny_tokenizer, micro_batch_size=64)
    prompts = _prompts(kk_data, tiny_tokenizer, 2)
    started = threading.Event()
    model.register_forward_hook(lambda *_: started.set())
    result = {}
    worker = threading.Thread(
        target=lambda: result.setdefault(
            "batch", engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4000))
        )
    )
    worker.start()
    assert started.wait(60)
    engine.abort()
    worker.join(120)
    assert not worker.is_alive()
    out = result["batch"]
    assert out[ABORTED_FIELD].all() and out["response_mask"].sum(-1).max() < 4000
    # the sampled tokens' log-probs come back for the part that was made
    assert (out["rollout_log_probs"][out["response_mask"] == 1] < 0).all()


class _Recording(HFRollout):
    calls: list[tuple[int, str]] = []

    def sync_from(self, actor, *, rank=0, world_size=1):
        result = super().sync_from(actor, rank=rank, world_size=world_size)
        _Recording.calls.append((rank, result))
        return result


def test_training_syncs_weights_through_the_contract(tmp_path, kk_data, tiny_model, monkeypatch):
    """The trainer reaches the engine's weights only through sync_from: at start and after every update."""
    monkeypatch.setitem(ENGINES, "hf", (__name__, "_Recording"))
    _Recording.calls = []
    config = write_train_config(
        tmp_path,
        kk_data,
        tiny_model,
        data={"max_response_length": 8},
        rollout={"n": 2},
        actor={"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 8},
        trainer={"total_training_steps": 2},
    )
    assert main(["train", str(config)]) == 0
    steps = [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2
    assert _Recording.calls == [(0, "shared")] * 3  # at start, after step 1, after step 2
