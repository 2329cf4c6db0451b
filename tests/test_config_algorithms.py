"""The config loader on the algorithm keys verl 0.9.1 added: a key set for a loss that does not read
it, an aggregation a loss overrides, GDPO's components, loss_scale_factor; and GDPO's components read
from the reward function's dict."""

from __future__ import annotations

import pytest
import torch

from lucidrl.batch import Batch
from lucidrl.config import load_config
from lucidrl.config.errors import ConfigError
from lucidrl.trainer.advantage import RewardComponentError, reward_components

BASE = ["model.path=unused", "data.train_files=[unused.parquet]", "rollout.n=4"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor.tau_pos=2.0"], "actor.tau_pos=2.0 is read only by actor.policy_loss=sapo.*vanilla"),
        (["actor.policy_loss=sapo", "actor.clip_cov_ratio=0.01"], "read only by actor.policy_loss=clip_cov"),
        (["actor.policy_loss=dro"], "needs actor.dro_beta"),
        (["actor.policy_loss=sapo"], "aggregates its loss seq-mean-token-mean.*set actor.loss_agg_mode"),
        (["actor.policy_loss=geo_mean", "actor.loss_agg_mode=token-sum"], "geo_mean aggregates"),
        (["actor.loss_scale_factor=512"], "seq-mean-token-sum-norm only"),
        (["actor.loss_agg_mode=token-summ"], "Unknown loss_agg_mode 'token-summ'.*'token-sum'"),
        (["actor.kl_loss_type=k5+", "actor.use_kl_loss=true"], "k5\\+"),
        (["algorithm.gdpo_reward_keys=[acc]"], "read only with algorithm.adv_estimator=gdpo"),
        (["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,fmt]",
          "algorithm.gdpo_reward_weights=[1.0]"], "1 weight\\(s\\) for 2 reward component"),
        (["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,acc]"], "twice"),
        (["algorithm.adv_estimator=gpg", "rollout.n=1"], "rollout.n must be >= 2"),
        (["algorithm.adv_estimator=optimal_token_baseline", "rollout.n=1"], "rollout.n must be >= 2"),
    ],
)  # fmt: skip
def test_config_refuses_algorithm_keys_that_mean_nothing_together(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, *overrides])


def test_config_accepts_each_new_loss_with_its_keys():
    for overrides in (
        ["actor.policy_loss=sapo", "actor.loss_agg_mode=seq-mean-token-mean", "actor.tau_neg=2.0"],
        ["actor.policy_loss=kl_cov", "actor.kl_cov_ratio=0.01", "actor.ppo_kl_coef=1.0"],
        ["actor.policy_loss=dro", "actor.dro_beta=0.05"],
        ["actor.loss_agg_mode=seq-mean-token-sum-norm", "actor.loss_scale_factor=512"],
        ["actor.loss_agg_mode=token-sum", "actor.use_kl_loss=true", "actor.kl_loss_type=low_var_kl+"],
        ["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[score,acc]", "algorithm.gdpo_reward_weights=[1,0.5]"],
    ):  # fmt: skip
        load_config(None, [*BASE, *overrides])


def test_gdpo_components_come_from_the_reward_functions_dict():
    batch = Batch(tensors={
        "token_level_scores": torch.tensor([[0.0, 1.0], [0.5, 0.0]]),
        "reward_extra:acc": torch.tensor([1.0, 0.0]),
        "reward_extra:fmt": torch.tensor([1.0, float("nan")]),
    })  # fmt: skip
    assert torch.equal(reward_components(batch, ["score", "acc"]), torch.tensor([[1.0, 1.0], [0.5, 0.0]]))
    with pytest.raises(
        RewardComponentError, match="'length', which the reward function did not return.*acc, fmt"
    ):
        reward_components(batch, ["length"])
    with pytest.raises(RewardComponentError, match="'fmt', but 1 of 2 samples have none"):
        reward_components(batch, ["fmt"])
