"""model.lora_rank: peft adapters on the actor; the base weights and the reference stay as loaded; checkpoints
hold the adapters and resume exactly; the final model and export are merged plain models."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TOY_REWARD, lucidrl_train
from safetensors.torch import load_file

from lucidrl.cli import main
from lucidrl.config import ConfigError, load_config
from lucidrl.trainer.ppo import PPOTrainer


def _train(tmp_path, kk_data, tiny_model, run: str, *extra: str) -> PPOTrainer:
    reward = tmp_path / "reward.py"
    reward.write_text(TOY_REWARD)
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model['path']}",
            "model.lora_rank=8",
            "model.lora_alpha=16",
            f"data.train_files=[{kk_data['train']}]",
            "data.val_files=[]",
            "data.max_prompt_length=512",
            "data.max_response_length=8",
            "data.train_batch_size=4",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=2",
            "actor.optim.lr=1e-2",  # adapters start at zero (lora_B): a large step shows they moved
            "actor.optim.warmup_steps=3",
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef=0.1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            f"trainer.run_dir={tmp_path / run}",
            f"reward.custom_function.path={reward}",
            *extra,
        ],
    )
    trainer = PPOTrainer(cfg)
    trainer.fit()
    return trainer


@pytest.mark.slow
def test_lora_trains_the_adapters_only_and_saves_a_merged_model(tmp_path, kk_data, tiny_model):
    trainer = _train(
        tmp_path, kk_data, tiny_model, "run", "trainer.total_training_steps=3", "trainer.save_freq=3"
    )
    actor = trainer.workers.actor.worker.actor.model
    base = load_file(f"{tiny_model['path']}/model.safetensors")
    trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    weights = dict(actor.named_parameters())
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    assert torch.equal(weights[f"{q}.base_layer.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert weights[f"{q}.lora_B.default.weight"].abs().sum() > 0  # the adapter moved from its zero start
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["actor/kl_loss"] > 0  # the reference is the base model, the actor moved away from it
    final = load_file(trainer.run_dir / "final" / "model.safetensors")
    assert sorted(final) == sorted(base)  # a plain model: no peft names
    assert not torch.equal(
        final["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert (trainer.run_dir / "final" / "adapter" / "adapter_config.json").is_file()
    step = trainer.run_dir / "checkpoints" / "global_step_3" / "actor"
    assert (step / "adapter" / "adapter_model.safetensors").is_file() and not (step / "model").exists()
    # export merges the checkpoint's adapters into the base: the final model
    out = tmp_path / "exported"
    assert main(["export", str(trainer.run_dir), str(out)]) == 0
    exported = load_file(out / "model.safetensors")
    assert all(torch.allclose(final[k], exported[k], atol=1e-6) for k in final)


@pytest.mark.slow
def test_a_lora_run_resumes_where_an_uninterrupted_one_ends(tmp_path, kk_data, tiny_model):
    straight = _train(tmp_path, kk_data, tiny_model, "straight", "trainer.total_training_steps=4")
    _train(tmp_path, kk_data, tiny_model, "resumed", "trainer.total_training_steps=2", "trainer.save_freq=2")
    resumed = _train(
        tmp_path, kk_data, tiny_model, "resumed", "trainer.total_training_steps=4", "trainer.save_freq=2"
    )
    assert resumed.resumed_from is not None
    a = load_file(straight.run_dir / "final" / "model.safetensors")
    b = load_file(resumed.run_dir / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
    # the same folder resumed without LoRA: refused, naming the key
    with pytest.raises(ValueError, match="model.lora_rank: 8 in the checkpoint, 0 now"):
        _train(
            tmp_path, kk_data, tiny_model, "resumed", "model.lora_rank=0", "trainer.total_training_steps=5"
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.lora_rank=-1"], "'model.lora_rank' .* must be >= 0 .0: train every weight."),
        (["model.lora_rank=8", "trainer.backend=ray"], "trainer.strategy=ddp"),
        (["model.lora_rank=8", "model.target_modules=[]"], "model.target_modules is empty"),
        (["model.lora_rank=8", "model.target_modules=[all-linear,q_proj]"], "'all-linear' stands alone"),
        (
            ["model.lora_rank=8", "model.lora_dropout=1.5"],
            r"'model.lora_dropout' .* must be in \[0, 1\), got 1.5",
        ),
    ],
)
def test_lora_settings_it_cannot_honour_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.path=/m", "data.train_files=[/t]", *overrides])


def test_target_modules_that_match_nothing_or_share_a_tied_weight_are_refused(tiny_model):
    """peft drops a name that matches nothing when another one matches ([q_proj, nonexistent] adapted
    q_proj alone); an adapter on a tied lm_head, merged, changed the input embedding too (the saved
    model's logits were up to 24 away from the trained one's)."""
    from types import SimpleNamespace

    from lucidrl.models import load_model
    from lucidrl.models.lora import apply_lora

    def lora(*targets):
        m = SimpleNamespace(lora_rank=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets))
        return apply_lora(load_model(tiny_model["path"]), m)

    assert load_model(tiny_model["path"]).config.tie_word_embeddings
    with pytest.raises(ConfigError, match=r"\['nonexistent'\] match no module of the model"):
        lora("q_proj", "nonexistent")
    with pytest.raises(ConfigError, match=r"\['lm_head'\] share one weight \(tie_word_embeddings=true\)"):
        lora("q_proj", "lm_head")
    adapted = {n.rsplit(".", 1)[-1] for n in lora("q_proj", "v_proj").targeted_module_names}
    assert adapted == {"q_proj", "v_proj"}


def test_sft_refuses_lora_rather_than_training_every_weight():
    from lucidrl.config import SFTConfig

    with pytest.raises(ConfigError, match="`lucidrl sft` trains every weight for now"):
        load_config(None, ["model.path=/m", "data.train_files=[/t]", "model.lora_rank=8"], schema=SFTConfig)


@pytest.mark.slow
def test_lora_on_two_ray_ranks_matches_one_process(tmp_path, kk_data, stopping_model, ray_head):
    """DDP averages the adapters' gradients; the rollout copy on each rank gets the adapters after each step.
    The model stops early (conftest.py::stopping_model): each rank's responses end at lengths of their own."""
    reward = tmp_path / "reward.py"
    reward.write_text(TOY_REWARD)

    def run(name, *extra):
        args = [
            f"model.path={stopping_model['path']}",
            "model.lora_rank=8",
            f"data.train_files=[{kk_data['train']}]",
            "data.val_files=[]",
            "data.max_prompt_length=1000",
            "data.max_response_length=10",
            "data.train_batch_size=4",
            "rollout.n=4",
            "rollout.deterministic=true",
            "actor.ppo_mini_batch_size=4",
            "actor.optim.lr=1e-2",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            f"trainer.run_dir={tmp_path / name}",
            f"reward.custom_function.path={reward}",
            *extra,
        ]
        lucidrl_train(args)
        records = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return records, load_file(tmp_path / name / "final" / "model.safetensors")

    local = run("local")
    ray = run(
        "ray",
        "trainer.backend=ray",
        f"trainer.ray_address={ray_head}",
        "trainer.strategy=ddp",
        "placement.pools={global: {nodes: 1, devices_per_node: 2}}",
    )
    assert all(r["response_length/min"] < r["response_length/max"] for r in local[0])  # varied widths
    for x, y in zip(local[0], ray[0], strict=True):
        # step 2 scores responses sampled after the first update: equal only if the rollout got the adapters
        assert abs(x["critic/score/mean"] - y["critic/score/mean"]) <= 1e-6, (x["step"], x, y)
        assert abs(x["actor/pg_loss"] - y["actor/pg_loss"]) <= 1e-5
    base = load_file(f"{stopping_model['path']}/model.safetensors")
    diff = max((local[1][k] - ray[1][k]).abs().max().item() for k in base)
    moved = max((local[1][k] - base[k]).abs().max().item() for k in base)
    assert diff <= 5e-5 and moved > 20 * diff, (diff, moved)
