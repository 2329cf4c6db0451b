"""reward.on_error=mask in the trainer: a sample whose reward failed gets no gradient, and its group's
baseline is its other samples'; reward.on_error=zero trains it as a 0."""

import json

import pytest
import torch
from safetensors.torch import load_file

from lucidrl.batch import Batch
from lucidrl.config import load_config
from lucidrl.trainer.metrics import step_metrics
from lucidrl.trainer.ppo import PPOTrainer, compute_advantage
from lucidrl.trainer.rewards import leave_out_failed

# two prompts x 4 samples; in p0 sample 1 failed, in p1 all but sample 4
SCORES = [1.0, 0.0, 0.0, 3.0, 2.0, 0.0, 0.0, 0.0]
FAILED = [False, True, False, False, False, True, True, True]


def _scored(failed=FAILED):
    n, width = len(SCORES), 3
    mask = torch.ones(n, width, dtype=torch.long)
    scores = torch.zeros(n, width)
    scores[:, -1] = torch.tensor(SCORES)
    return Batch(
        tensors={
            "token_level_scores": scores,
            "token_level_rewards": scores,
            "response_mask": mask,
            "prompt_mask": torch.ones(n, 2, dtype=torch.long),
            "reward_failed": torch.tensor(failed),
            "reward_timed_out": torch.tensor([i == 5 for i in range(n)]),
        },
        non_tensors={"uid": ["p0"] * 4 + ["p1"] * 4},
    )


def test_failed_samples_leave_the_update_and_their_groups_baseline():
    cfg = load_config(None, ["algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false"])
    batch = leave_out_failed(_scored())
    assert batch["response_mask"].sum(-1).tolist() == [3, 0, 3, 3, 3, 0, 0, 0]  # no token of theirs counts
    batch.update(compute_advantage(batch, cfg))
    adv = batch["advantages"][:, 0]
    # p0's baseline is the mean of its three scored samples (1, 0, 3), not of four with the failed 0
    assert adv.tolist() == pytest.approx([1 - 4 / 3, 0.0, -4 / 3, 3 - 4 / 3, 0.0, 0.0, 0.0, 0.0])
    # p1's one scored sample has nothing to be compared with: 0, as a tied group (not its raw score 2)
    metrics = step_metrics(batch, max_response_length=3)
    assert metrics["reward/failed"] == 4.0 and metrics["reward/timed_out"] == 1.0
    assert metrics["critic/score/mean"] == pytest.approx((1 + 0 + 3 + 2) / 4)  # the scored samples only
    assert metrics["response_length/mean"] == 3.0  # what was generated, masked or not


def test_without_failures_nothing_changes():
    cfg = load_config(None, ["algorithm.adv_estimator=rloo"])
    plain = _scored([False] * 8)
    kept = leave_out_failed(_scored([False] * 8))
    assert "generated_mask" not in kept
    assert torch.equal(
        compute_advantage(kept, cfg)["advantages"], compute_advantage(plain, cfg)["advantages"]
    )


ALL_FAIL = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    raise RuntimeError("the judge is down")
"""


@pytest.mark.slow
def test_a_run_whose_every_reward_fails_under_mask_trains_nothing_and_says_so(
    tmp_path, kk_data, tiny_model, caplog
):
    """With a KL loss and an entropy bonus on, a sample's tokens would move the weights whatever its
    advantage: unchanged weights mean none of them reached any loss term."""
    reward = tmp_path / "reward.py"
    reward.write_text(ALL_FAIL)
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model['path']}",
            f"data.train_files=[{kk_data['train']}]",
            "data.max_prompt_length=1000",
            "data.max_response_length=6",
            "data.train_batch_size=2",
            "rollout.n=2",
            "actor.ppo_mini_batch_size=2",
            "actor.ppo_micro_batch_size=4",
            "actor.optim.lr=1e-2",
            "actor.use_kl_loss=true",
            "actor.entropy_coeff=0.1",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            f"trainer.run_dir={tmp_path / 'run'}",
            f"reward.custom_function.path={reward}",
            "reward.on_error=mask",
        ],
    )
    trainer = PPOTrainer(cfg)
    trainer.fit()
    start = load_file(f"{tiny_model['path']}/model.safetensors")
    final = load_file(tmp_path / "run" / "final" / "model.safetensors")
    assert all(torch.equal(start[k], final[k]) for k in start)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/failed"] for r in records] == [4.0, 4.0]
    assert all(r["critic/score/mean"] is None for r in records)  # no score to report: null, not 0
    assert caplog.text.count("raised RuntimeError: the judge is down") == 1  # 8 failures, shown once
