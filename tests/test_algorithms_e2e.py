"""Every estimator, loss, KL mode and DAPO refinement, selected purely from config, for 2 real steps."""

import json
import math

import pytest
from helpers import toy_train_args

from lucidrl.cli import main

BASE = [
    "data.max_prompt_length=1024",
    "data.max_response_length=12",
    "data.train_batch_size=4",
    "rollout.n=4",
    "actor.optim.lr=1e-3",
    "actor.ppo_mini_batch_size=2",
    "actor.ppo_micro_batch_size=8",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.save_final_model=false",
    "data.val_files=[]",
]

CASES = {
    "grpo": [],
    "dr_grpo": ["algorithm.norm_adv_by_std_in_grpo=false", "actor.loss_agg_mode=seq-mean-token-sum-norm"],
    "rloo": ["algorithm.adv_estimator=rloo", "actor.loss_agg_mode=seq-mean-token-mean"],
    "reinforce_plus_plus": [
        "algorithm.adv_estimator=reinforce_plus_plus",
        "algorithm.gamma=0.99",
        "actor.use_kl_loss=true",
        "actor.kl_loss_type=low_var_kl",
        "actor.kl_loss_coef=0.001",
    ],
    "reinforce_plus_plus_baseline": ["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
    "remax": ["algorithm.adv_estimator=remax"],
    "opo": ["algorithm.adv_estimator=opo"],
    "grpo_passk": ["algorithm.adv_estimator=grpo_passk"],
    "gae_critic": [
        "algorithm.adv_estimator=gae",
        "algorithm.lam=0.95",
        "critic.optim.lr=1e-3",
        "critic.ppo_micro_batch_size=8",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_penalty=kl",
    ],
    "gspo": [
        "actor.policy_loss=gspo",
        "actor.clip_ratio_low=0.0003",
        "actor.clip_ratio_high=0.0004",
        "actor.loss_agg_mode=seq-mean-token-mean",
    ],
    "cispo": ["actor.policy_loss=cispo", "actor.clip_ratio_high=4.0"],
    "reinforce_loss": ["actor.policy_loss=reinforce", "actor.ppo_mini_batch_size=4"],
    "kl_reward_adaptive": [
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.05",
        "algorithm.kl_penalty=low_var_kl",
    ],
    "dynamic_bsz": [  # token-budget micro-batches: actor update, old-log-prob, reference and critic passes
        "algorithm.adv_estimator=gae",
        "critic.optim.lr=1e-3",
        "critic.use_dynamic_bsz=true",
        "critic.ppo_max_token_len_per_gpu=2500",
        "actor.use_dynamic_bsz=true",
        "actor.ppo_max_token_len_per_gpu=2100",
        "actor.log_prob_max_token_len_per_gpu=3200",
        "actor.on_policy_skip_old_log_prob=false",
        "actor.use_kl_loss=true",
    ],
    "head_chunks": [  # the LM head in 16-token chunks: update (entropy in the loss), old-log-prob, reference
        "actor.head_chunk_tokens=16",
        "actor.on_policy_skip_old_log_prob=false",
        "actor.use_kl_loss=true",
        "actor.entropy_coeff=0.001",
    ],
    "torch_compile": [  # fused, compiled log-prob and entropy in update, old-log-prob and reference passes
        "actor.use_torch_compile=true",
        "actor.on_policy_skip_old_log_prob=false",
        "actor.use_kl_loss=true",
        "actor.entropy_coeff=0.001",
    ],
    "dapo": [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "reward.overlong_buffer.enable=true",
        "reward.overlong_buffer.len=4",
        "actor.clip_ratio_high=0.28",
        "actor.entropy_coeff=0.001",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_two_steps_from_config(name, tmp_path, kk_data, tiny_model):
    assert main([*toy_train_args(tmp_path, kk_data, tiny_model), *BASE, *CASES[name]]) == 0
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    drawn = 0  # prompt batches taken from the loader: 32 train prompts in batches of 4, 8 per epoch
    for r in records:
        assert math.isfinite(r["actor/pg_loss"]) and r["actor/grad_norm"] > 0, r
        assert r["critic/advantages/max"] > r["critic/advantages/min"]
        assert r["actor/entropy"] > 0
        drawn += int(r.get("dapo/gen_rounds", 1))
        assert r["training/epoch"] == (drawn - 1) // 8, (drawn, r["training/epoch"])
    if name == "gae_critic":
        assert math.isfinite(records[-1]["critic/vf_loss"]) and "critic/vf_explained_var" in records[-1]
        assert records[-1]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.001)
    if name == "kl_reward_adaptive":
        assert records[-1]["actor/reward_kl_penalty_coeff"] != pytest.approx(0.05)  # the controller moved it
    if name == "dapo":
        assert records[0]["dapo/gen_rounds"] >= 1 and "reward/overlong_penalty/mean" in records[0]
        for r in records:  # 4 prompts a round; the mixed groups beyond the batch's 4 are the surplus
            generated = 4 * r["dapo/gen_rounds"]
            mixed = generated - r["dapo/groups_dropped_all_same"]
            assert r["dapo/groups_surplus_unused"] == max(0, mixed - 4)
            assert r["dapo/filled_with_tied_groups"] == max(0, 4 - mixed)
        assert (
            records[0]["critic/groups_with_mixed_scores"] == 1.0
            or records[0]["dapo/filled_with_tied_groups"] > 0
        )
