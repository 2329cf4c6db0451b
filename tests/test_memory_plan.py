"""The memory plan (lucidrl.config.memory_plan): shapes from config.json, auto keys chosen to fit, fixed
settings that cannot fit refused with the numbers, estimates against measured peaks, and the activation
checkpointing it can turn on."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lucidrl.config import config_from_dict
from lucidrl.config.errors import ConfigError
from lucidrl.config.memory_plan import ModelShape

ROOT = Path(__file__).resolve().parents[1]

# Qwen2.5-0.5B's and 1.5B's config.json fields (the plan reads no weights)
QWEN_05B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768,
}  # fmt: skip
QWEN_15B = {
    **QWEN_05B, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
    "num_attention_heads": 12,
}  # fmt: skip


def _folder(tmp_path: Path, config: dict) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def _cfg(path: str, budget: float | None = 24.0, **sections) -> dict:
    cfg = {
        "model": {"path": path, "compute_dtype": "bfloat16"},
        "data": {"train_files": ["unused.parquet"], "max_prompt_length": 128, "max_response_length": 256,
                 "train_batch_size": 8},
        "rollout": {"n": 4},
        "actor": {"ppo_mini_batch_size": 8},
        "trainer": {"memory_budget_gib": budget},
    }  # fmt: skip
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def test_the_shape_counts_the_parameters_the_model_has(tiny_model):
    from lucidrl.models import load_model

    shape = ModelShape.from_path(str(tiny_model["path"]))
    model = load_model(str(tiny_model["path"]))
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert ModelShape.from_config(QWEN_05B).params == 494_032_768  # Qwen2.5-0.5B's own count


def test_lora_parameters_are_counted_as_peft_makes_them(tiny_model):
    from lucidrl.config.schema import ModelConfig
    from lucidrl.models import load_model
    from lucidrl.models.lora import apply_lora

    model = apply_lora(load_model(str(tiny_model["path"])), ModelConfig(path="x", lora_rank=4))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert ModelShape.from_path(str(tiny_model["path"])).lora_params(4) == trainable


def test_auto_keys_take_the_plain_speed_choice_where_memory_is_plenty(tiny_model):
    cfg = config_from_dict(_cfg(str(tiny_model["path"])), source="t")
    a = cfg.actor
    # 4096 tokens of 384: 10 samples at most, of which 8 divides the mini-batch's 32; twice that to log-probs
    assert a.ppo_micro_batch_size == 8 and a.log_prob_micro_batch_size == 16
    assert a.head_chunk_tokens == 0  # a vocabulary of a thousand words: no chunks
    assert cfg.model.enable_gradient_checkpointing is False
    plan = cfg._memory_plan
    assert {"actor.ppo_micro_batch_size", "actor.head_chunk_tokens"} <= set(plan.choices)
    assert [p.name.split(" ")[0] for p in plan.phases] == ["update", "log-prob", "rollout"]


def test_a_large_vocabulary_gets_the_chunked_head_and_a_tight_budget_checkpointing(tmp_path):
    path = _folder(tmp_path / "q05", QWEN_05B)
    roomy = config_from_dict(_cfg(path, budget=64), source="t")
    assert roomy.actor.head_chunk_tokens == 256  # 256 x 151,936 float32 logits: within 64M entries
    assert roomy.model.enable_gradient_checkpointing is False
    tight = config_from_dict(_cfg(path, budget=13), source="t")
    assert tight.model.enable_gradient_checkpointing is True
    assert tight._memory_plan.peak.total <= tight._memory_plan.budget
    # without checkpointing every micro-batch of at least 512 tokens needed more than 13 GiB allows
    assert roomy._memory_plan.peak.total > tight._memory_plan.budget


def test_the_issue_sizes_fit_24_gib_with_the_defaults(tmp_path):
    """Qwen2.5-0.5B full fine-tuning and 1.5B LoRA, 8 prompts x 4 samples x 256 new tokens."""
    full = config_from_dict(_cfg(_folder(tmp_path / "q05", QWEN_05B), budget=24), source="t")
    lora = config_from_dict(
        _cfg(
            _folder(tmp_path / "q15", QWEN_15B),
            budget=24,
            model={"lora_rank": 16, "compute_dtype": "bfloat16"},
        ),
        source="t",
    )
    for cfg in (full, lora):
        assert cfg._memory_plan.peak.total <= cfg._memory_plan.budget


def test_fixed_settings_that_cannot_fit_are_refused_with_the_numbers_and_the_fix(tmp_path):
    path = _folder(tmp_path / "q05", QWEN_05B)
    fixed = _cfg(path, budget=12, actor={"ppo_mini_batch_size": 8, "ppo_micro_batch_size": 32},
                 model={"enable_gradient_checkpointing": False, "compute_dtype": "bfloat16"})  # fmt: skip
    with pytest.raises(ConfigError) as e:
        config_from_dict(fixed, source="t")
    text = str(e.value)
    assert "memory plan: the update needs about" in text and "GiB" in text
    assert "10.20 GiB are usable here (85% of 12.00 GiB, trainer.memory_budget_gib)" in text
    assert "actor.ppo_micro_batch_size=auto" in text and "model.enable_gradient_checkpointing=auto" in text
    assert "activations" in text and "optimizer" in text
    # no setting fits 3 GiB for a 0.5B model's full fine-tuning: refused even with every key auto
    with pytest.raises(ConfigError, match="model.lora_rank=16"):
        config_from_dict(_cfg(path, budget=3), source="t")


def test_a_config_without_a_readable_model_folder_gets_the_plain_values(tmp_path):
    cfg = config_from_dict(_cfg(str(tmp_path / "missing")), source="t")
    assert cfg._memory_plan is None
    assert (cfg.actor.ppo_micro_batch_size, cfg.actor.log_prob_micro_batch_size) == (8, 16)
    assert cfg.actor.head_chunk_tokens == 0 and cfg.model.enable_gradient_checkpointing is False


def test_verl_gradient_checkpointing_key_is_translated():
    from lucidrl.config.verl import translate

    out = translate(["actor_rollout_ref.model.enable_gradient_checkpointing=True"], cuda=False)
    assert ("model.enable_gradient_checkpointing", True) in [(k, v) for k, v, _ in out.assignments]


@pytest.mark.parametrize("bf16", [False, True])
def test_checkpointing_gives_the_same_update(tiny_model, bf16):
    """Activation checkpointing recomputes, it does not change: the same log-probs and gradients, with
    the shared-prompt forward (which checkpointing turns off for the update) and under bf16 compute
    (whose float32 attention the recompute must run under too)."""
    from lucidrl.batch import Batch
    from lucidrl.config.schema import ActorConfig, OptimConfig
    from lucidrl.models import load_model
    from lucidrl.workers.common.model_support import enable_activation_checkpointing
    from lucidrl.workers.training.actor import ActorWorker

    torch.manual_seed(0)
    model = load_model(str(tiny_model["path"]))
    vocab, rows = model.config.vocab_size, 8
    batch = Batch(
        tensors={
            "prompts": torch.randint(5, vocab, (2, 12)).repeat_interleave(4, 0),
            "prompt_mask": torch.ones(rows, 12, dtype=torch.long),
            "responses": torch.randint(5, vocab, (rows, 10)),
            "response_mask": (torch.arange(10)[None, :] < torch.randint(3, 11, (rows, 1))).long(),
            "advantages": torch.randn(rows, 1).expand(rows, 10).contiguous(),
        },
        non_tensors={"uid": [f"p{i // 4}" for i in range(rows)]},
    )
    cfg = ActorConfig(optim=OptimConfig(lr=1e-3), ppo_mini_batch_size=2, ppo_micro_batch_size=4)
    kw = {"temperature": 1.0, "samples_per_prompt": 4, "compute_dtype": torch.bfloat16 if bf16 else None}
    plain = ActorWorker(copy.deepcopy(model), cfg, **kw)
    ckpt_model = copy.deepcopy(model)
    enable_activation_checkpointing(ckpt_model)
    ckpt = ActorWorker(ckpt_model, cfg, **kw)
    assert any(getattr(m, "gradient_checkpointing", False) for m in ckpt_model.modules())  # it is on
    m_plain, m_ckpt = plain.update(batch), ckpt.update(batch)
    tol = {"atol": 2e-3, "rtol": 2e-2} if bf16 else {"atol": 1e-6, "rtol": 1e-4}
    for (name, a), (_, b) in zip(plain.model.named_parameters(), ckpt.model.named_parameters(), strict=True):
        assert a.grad is not None and torch.allclose(a.grad, b.grad, **tol), name
    assert m_ckpt["actor/pg_loss"] == pytest.approx(m_plain["actor/pg_loss"], abs=1e-3 if bf16 else 1e-6)


def test_doctor_prints_the_plan(tiny_model, kk_data, tmp_path):
    from lucidrl.doctor.run_checks import check_memory_plan

    cfg = config_from_dict(
        _cfg(str(tiny_model["path"]), data={"train_files": [kk_data["train"]]}), source="t"
    )
    check = check_memory_plan(cfg)
    assert check.status == "ok"
    assert "update (8 x 384 tokens)" in check.detail and "actor.ppo_micro_batch_size=8" in check.detail
    assert "usable 20.40 GiB of 24.00 GiB (trainer.memory_budget_gib)" in check.detail


@pytest.mark.slow
def test_estimates_are_within_a_quarter_of_the_measured_peaks(tmp_path):
    """benchmarks/memory_plan.py on a 40M-parameter Qwen2 shape: the update (with the log-prob pass
    before it) and the rollout, each in a process of its own, against the plan's estimate."""
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_plan.py"), "--cases", "ci,ci-ckpt",
         "--work", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 6
    for r in rows:
        assert 0.75 <= r["estimate_mb"] / r["peak_mb"] <= 1.25, r
