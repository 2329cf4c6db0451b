"""Dropout off in what an RL update trains: the update's forward computes what the log-prob pass did."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from test_architectures import CONFIGS, V, _model_folder

from lucidrl.config import ConfigError, config_from_dict, load_config
from lucidrl.models.dropout import disable_dropout
from lucidrl.workers.policy import PolicyWorker

ARCHITECTURES = dict(CONFIGS)
ARCHITECTURES["opt"] = (  # LayerDrop: whole layers skipped in train mode
    T.OPTConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        word_embed_proj_dim=32,
        pad_token_id=0,
    ),  # fmt: skip
    T.OPTForCausalLM,
)


def _random_in_training(config):
    config = config.__class__.from_dict(config.to_dict())
    for key, value in config.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key or key == "layerdrop"):
            setattr(config, key, 0.3)
    return config


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_a_model_in_train_mode_computes_what_it_does_in_eval_mode(name):
    config, cls = ARCHITECTURES[name]
    config = _random_in_training(config)
    torch.manual_seed(0)
    model = cls(config)
    x = torch.randint(3, V, (2, 12))
    with torch.no_grad():
        reference = model.eval()(x).logits
        noisy = model.train()(x).logits
        assert (noisy - reference).abs().max() > 1e-2  # the configured dropout is live
        changed = disable_dropout(model)
        assert changed and all("=0.3" in c for c in changed), changed
        for _ in range(3):
            assert torch.equal(model(x).logits, reference)
    assert all(v == 0.3 for k, v in model.config.to_dict().items() if "dropout" in k and isinstance(v, float))


def _update_at_lr_zero(folder: str, *overrides: str) -> dict[str, float]:
    """One actor update straight after the old-log-prob pass, at lr 0: the ratio must be exactly 1."""
    cfg = load_config(
        None,
        [f"model.path={folder}", "data.train_files=[x.parquet]", "actor.optim.lr=0", "actor.ppo_mini_batch_size=2",
         "data.train_batch_size=2", "rollout.n=2", "actor.ppo_micro_batch_size=4", *overrides],
    )  # fmt: skip
    worker = PolicyWorker(cfg, frozenset({"actor", "rollout"}))
    actor = worker.actor
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (4, 14))
    from lucidrl.batch import Batch

    batch = Batch(
        tensors={
            "prompts": ids[:, :6],
            "prompt_mask": torch.ones(4, 6, dtype=torch.long),
            "responses": ids[:, 6:],
            "response_mask": torch.ones(4, 8, dtype=torch.long),
        },
        non_tensors={"uid": ["a", "a", "b", "b"]},
    )
    batch.update(actor.compute_log_prob(batch))
    batch.set("advantages", torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(4, 8).contiguous())
    return actor.update(batch)


def test_the_actors_first_update_has_ratio_one_on_a_model_that_ships_dropout(tiny_model, tmp_path):
    """GPT-2 checkpoints ship dropout 0.1: the update ran it (train mode) and the old log-probs did not
    (eval mode), so at lr 0 ppo_kl and the clip fraction were not 0 (ratios 0.87-1.11 in the review)."""
    folder = _model_folder(
        tiny_model, tmp_path, "gpt2", T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64)
    )
    on = _update_at_lr_zero(folder)
    assert on["actor/ppo_kl"] == 0.0 and on["actor/pg_clipfrac"] == 0.0
    off = _update_at_lr_zero(folder, "actor.disable_dropout=false")
    assert off["actor/ppo_kl"] != 0.0  # so the test can tell


def test_the_critics_backbone_dropout_is_off_too(tiny_model, tmp_path):
    folder = _model_folder(
        tiny_model, tmp_path, "gpt2", T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64)
    )
    cfg = config_from_dict(
        {
            "model": {"path": folder},
            "data": {"train_files": ["x.parquet"]},
            "algorithm": {"adv_estimator": "gae"},
        }
    )
    critic = PolicyWorker(cfg, frozenset({"critic"})).critic.model
    x = torch.randint(3, 100, (2, 10))
    with torch.no_grad():
        assert torch.equal(critic.train()(x).logits, critic.eval()(x).logits)


def test_lora_dropout_with_dropout_disabled_is_refused_naming_both_keys():
    with pytest.raises(
        ConfigError,
        match=r"model.lora_dropout=0.1 with actor.disable_dropout=true.*actor.disable_dropout=false",
    ):
        load_config(None, ["model.path=x", "model.lora_rank=4", "model.lora_dropout=0.1"])
    cfg = load_config(
        None, ["model.path=x", "model.lora_rank=4", "model.lora_dropout=0.1", "actor.disable_dropout=false"]
    )
    assert cfg.model.lora_dropout == 0.1
