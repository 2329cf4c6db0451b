"""model.compute_dtype=bfloat16: bf16 matrix products in every forward, float32 master weights,
gradients and optimizer state; the old log-probs then come from the actor's forward, not the rollout."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import toy_train_args

from lucidrl.cli import main
from lucidrl.config import ConfigError, config_from_dict
from lucidrl.config.schema import ActorConfig, CriticConfig, OptimConfig, SFTConfig
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models.precision import autocast_dtype, cpu_has_native_bf16, float32_attention_wanted
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.training.actor import ActorWorker, ReferenceWorker
from lucidrl.workers.training.critic import CriticWorker, load_value_model
from tests.test_micro_batches import _rollout_with_varied_lengths


class LinearDtypes:
    """Records the dtype of every nn.Linear output while active."""

    def __init__(self, model: torch.nn.Module):
        self.seen: set[torch.dtype] = set()
        self.handles = [
            m.register_forward_hook(lambda m, a, o: self.seen.add(o.dtype))
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        ]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def _update_batch(kk_data, tiny_model, tiny_tokenizer):
    model, out = _rollout_with_varied_lengths(kk_data, tiny_model, tiny_tokenizer)
    ref = ReferenceWorker(copy.deepcopy(model), micro_batch_size=16, temperature=1.0)
    out.set("old_log_probs", ref.compute_log_prob(out)["ref_log_probs"])
    torch.manual_seed(1)
    out.set("advantages", torch.randn(len(out), 1).expand_as(out["response_mask"]) * out["response_mask"])
    return model, out


@pytest.mark.slow
def test_bf16_compute_runs_the_update_in_bf16_and_keeps_float32_master_weights(
    kk_data, tiny_model, tiny_tokenizer
):
    model, out = _update_batch(kk_data, tiny_model, tiny_tokenizer)
    cfg = ActorConfig(optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=16)
    actor = ActorWorker(
        copy.deepcopy(model).train(), cfg, temperature=1.0, samples_per_prompt=4, compute_dtype=torch.bfloat16
    )
    before = {n: p.detach().clone() for n, p in actor.model.named_parameters()}
    with LinearDtypes(actor.model) as linear:
        old = actor.compute_log_prob(out)
        metrics = actor.update(out)
    assert linear.seen == {torch.bfloat16}  # every matrix product of both passes ran in bf16
    assert old["old_log_probs"].dtype == torch.float32 and metrics["actor/grad_norm"] > 0
    for name, p in actor.model.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
        state = actor.optimizer.state[p]
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    # and the optimizer step did update those float32 weights
    moved = sum(int((p.detach() != before[n]).sum()) for n, p in actor.model.named_parameters())
    assert moved > 0

    # the same forward without autocast: all float32, and the log-probs are close, not equal
    fp32 = ActorWorker(copy.deepcopy(model), cfg, temperature=1.0, samples_per_prompt=4)
    with LinearDtypes(fp32.model) as linear:
        exact = fp32.compute_log_prob(out)["old_log_probs"]
    assert linear.seen == {torch.float32}
    mask = out["response_mask"].bool()
    diff = (exact - old["old_log_probs"])[mask].abs()
    assert 0 < diff.max() < 0.5, diff.max()


@pytest.mark.slow
def test_rollout_reference_and_critic_forwards_follow_the_compute_dtype(kk_data, tiny_model, tiny_tokenizer):
    model, out = _update_batch(kk_data, tiny_model, tiny_tokenizer)
    samples, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=2048)
    prompts = collate(samples[:2], tiny_tokenizer.pad_token_id)
    for loop in ("lucidrl", "transformers"):
        rollout = HFRollout(model, tiny_tokenizer, decode_loop=loop, compute_dtype=torch.bfloat16)
        with LinearDtypes(model) as linear:
            got = rollout.generate(prompts, SamplingParams(n=2, max_new_tokens=6))
        assert linear.seen == {torch.bfloat16}, loop
        assert got["rollout_log_probs"].dtype == torch.float32 and got["responses"].shape[0] == 4
    ref = ReferenceWorker(
        copy.deepcopy(model), micro_batch_size=16, temperature=1.0, compute_dtype=torch.bfloat16
    )
    with LinearDtypes(ref.model) as linear:
        ref.compute_log_prob(out)
    assert linear.seen == {torch.bfloat16}
    critic = CriticWorker(
        load_value_model(str(tiny_model["path"])),
        CriticConfig(ppo_micro_batch_size=16),
        mini_batch_prompts=4,
        samples_per_prompt=4,
        compute_dtype=torch.bfloat16,
    )
    out.set("values", torch.zeros_like(out["response_mask"]))
    out.set("returns", out["advantages"])
    with LinearDtypes(critic.model) as linear:
        values = critic.compute_values(out)["values"]
        critic.update(out)
    assert linear.seen == {torch.bfloat16} and values.dtype == torch.float32
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in critic.model.parameters())


def test_precision_settings_that_mean_nothing_are_refused():
    assert autocast_dtype("float32", None) is None and autocast_dtype("float32", "float32") is None
    assert autocast_dtype("float32", "bfloat16") is torch.bfloat16
    assert autocast_dtype("bfloat16", "bfloat16") is None  # bf16 weights already compute in bf16
    with pytest.raises(
        ConfigError, match=r"compute_dtype=float32 over model.dtype=bfloat16.*model.dtype=float32"
    ):
        config_from_dict({"model": {"dtype": "bfloat16", "compute_dtype": "float32"}})
    with pytest.raises(ConfigError, match=r"'float32' \| 'bfloat16' \| null, got 'float16'"):
        config_from_dict({"model": {"compute_dtype": "float16"}})
    with pytest.raises(ConfigError, match=r"bf16_autocast=true .* model.compute_dtype=float32"):
        config_from_dict({"bf16_autocast": True, "model": {"compute_dtype": "float32"}}, schema=SFTConfig)


@pytest.mark.slow
@pytest.mark.parametrize("mini_batch", [4, 2])
def test_training_with_bf16_compute_never_takes_the_rollouts_log_probs(
    tmp_path, kk_data, tiny_model, capsys, mini_batch
):
    """The rollout's bf16 decode rounds differently from the update's forward: on-policy (one mini-batch)
    the old log-probs are the update's own, with two mini-batches the actor's old-log-prob pass makes
    them; either way rollout/logprob_diff_max shows the gap (float rounding, 5e-7 to 3e-5, where the
    attention runs in float32 on both sides, precision.float32_attention; ~1e-3 where the update's
    runs in bf16)."""
    args = [
        *toy_train_args(tmp_path, kk_data, tiny_model),
        "model.compute_dtype=bfloat16",
        "data.max_prompt_length=1000",
        "data.max_response_length=12",
        "data.train_batch_size=4",
        "rollout.n=4",
        f"actor.ppo_mini_batch_size={mini_batch}",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.save_final_model=false",
        "data.val_files=[]",
    ]
    assert main(args) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert ("emulated, several times slower" in said) == (cpu_has_native_bf16() is False)
    attention_in_float32 = float32_attention_wanted(torch.device("cpu"), torch.bfloat16)
    assert ("the attention (transformers' SDPA) runs in float32" in said) == attention_in_float32
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        assert ("timing_s/old_log_prob" in r) == (mini_batch == 2), r
        assert r["rollout/logprob_diff_max"] > 0, r  # float rounding apart, never the same numbers
        assert 0 < r["rollout/logprob_diff_mean"] < r["rollout/logprob_diff_max"], r
        assert r["actor/grad_norm"] > 0
        assert (r["actor/ppo_kl"] == 0) == (mini_batch == 4), r  # ratio exactly 1 on-policy


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n\nprocessor\t: 1\n")
    assert cpu_has_native_bf16(str(info)) is False
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16(str(info)) is True
    info.write_text("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert cpu_has_native_bf16(str(info)) is True
    info.write_text("Processor\t: ARMv8\n")  # no flags line: cannot tell
    assert cpu_has_native_bf16(str(info)) is None
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is None


def test_the_start_says_what_will_not_work_as_expected(tmp_path, kk_data, tiny_model, capsys):
    """bf16 weights have no float32 master copy: AdamW's steps at lr 1e-6 mostly round to nothing (one
    review's update changed 2.3% of the weights, against 94.7% in float32), and nothing said so."""
    from lucidrl.config import load_config
    from lucidrl.trainer.ppo import PPOTrainer

    args = toy_train_args(tmp_path, kk_data, tiny_model)[1:]
    for dtype, said in (("bfloat16", True), ("float32", False)):
        run = tmp_path / dtype
        cfg = load_config(
            None,
            [*args, f"model.dtype={dtype}", f"trainer.run_dir={run}", "trainer.logger=[console]",
             "algorithm.adv_estimator=reinforce_plus_plus", f"rollout.n={1 if said else 2}"],
        )  # fmt: skip
        trainer = PPOTrainer(cfg)
        capsys.readouterr()
        trainer.announce()
        out = " ".join(capsys.readouterr().out.split())
        assert (
            "no float32 master copy, so an update smaller than about 1/256 of a weight rounds away" in out
        ) == said
        if said:
            assert "set model.dtype=float32 model.compute_dtype=bfloat16" in out
        # and with one sample per prompt, that collapse detection's default sign cannot fire
        assert ("trainer.collapse watches nothing in this run" in out) == said


@pytest.mark.slow
def test_the_old_log_prob_pass_still_runs_where_the_update_cannot_replace_it(tmp_path, kk_data, tiny_model):
    """On-policy steps skip it; a step where the critic's warm-up holds the actor back runs it (the rollout
    gap is reported from it), and so does every step with dropout left on (its eval-mode forward gives
    the old log-probs, not a dropped-out one)."""
    base = [
        *toy_train_args(tmp_path, kk_data, tiny_model),
        "data.max_prompt_length=1000",
        "data.max_response_length=8",
        "data.train_batch_size=4",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=false",
        "trainer.save_final_model=false",
        "data.val_files=[]",
    ]

    def passes(*extra: str, run: str) -> list[bool]:
        assert main([*base, f"trainer.run_dir={tmp_path / run}", *extra]) == 0
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(x) for x in lines]
        assert all("rollout/logprob_diff_max" in r for r in records), records
        return ["timing_s/old_log_prob" in r for r in records]

    assert passes(run="plain") == [False, False, False]
    assert passes("algorithm.adv_estimator=gae", "critic.warmup_steps=2", run="warmup") == [True, True, False]
    assert passes("actor.disable_dropout=false", run="dropout") == [True, True, True]
