"""DAPO dynamic sampling through the real collector: tied groups dropped, counted, refilled."""

import pytest
import torch

from lucidrl.batch import Batch, align_widths
from lucidrl.config import config_from_dict
from lucidrl.data.dataset import PromptLoader, load_prompts
from lucidrl.models import load_model
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.trainer.collect import BatchCollector
from lucidrl.workers.rollout.hf_engine import HFRollout


def half_tied(data_source, solution_str, ground_truth, extra_info):
    # prompts with an even index tie (every sample scores 0); odd ones vary with the text
    return 0.0 if extra_info["index"] % 2 == 0 else float(len(solution_str) % 3)


def late_extra(data_source, solution_str, ground_truth, extra_info):
    # three of the first round's four prompts tie, and only prompts from the second round on return an
    # extra metric: the rounds' reward_extra fields differ
    i = extra_info["index"]
    score = 0.0 if i < 3 else float(sum(map(ord, solution_str)) % 97)
    return {"score": score, "late": 1.0} if i >= 4 else score


def wrong_but_uneven(data_source, solution_str, ground_truth, extra_info):
    # every answer wrong (acc 0), scores that differ by the text alone (as an overlong penalty makes them)
    return {"score": -float(len(solution_str) % 3) / 10, "acc": 0.0}


def _collector(kk_data, tiny_model, tok, rounds, reward=half_tied, metric="score"):
    cfg = config_from_dict(
        {
            "model": {"path": tiny_model["path"]},
            "data": {"train_batch_size": 4, "max_response_length": 8},
            "rollout": {"n": 4},
            "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 16},
            "algorithm": {"filter_groups": {"enable": True, "max_num_gen_batches": rounds, "metric": metric}},
        }
    )
    samples, _ = load_prompts([kk_data["train"]], tok, max_prompt_length=2048)
    loader = PromptLoader(samples, 4, tok.pad_token_id, shuffle=False, seed=0)

    def prompts():
        epoch = 0
        while True:
            yield from loader.epoch(epoch)
            epoch += 1

    rollout = HFRollout(load_model(tiny_model["path"]), tok)
    return BatchCollector(
        cfg, rollout, RuleRewardManager(tok, reward), prompts(), pad_token_id=tok.pad_token_id
    )


@pytest.mark.slow
def test_dynamic_sampling_keeps_only_mixed_groups(kk_data, tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    batch, metrics = _collector(kk_data, tiny_model, tiny_tokenizer, rounds=8).collect({})
    assert len(batch) == 16
    assert metrics["dapo/groups_dropped_all_same"] >= 2 * metrics["dapo/gen_rounds"] - 2
    scores = batch["token_level_scores"].sum(-1).view(4, 4)
    if metrics["dapo/filled_with_tied_groups"] == 0:
        assert all(len(set(row.tolist())) > 1 for row in scores)
    assert all(len(set(batch["uid"][i * 4 : i * 4 + 4])) == 1 for i in range(4))  # groups stay contiguous


def test_cap_on_rounds_fills_with_tied_groups_and_counts_them(kk_data, tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    batch, metrics = _collector(kk_data, tiny_model, tiny_tokenizer, rounds=1).collect({})
    assert len(batch) == 16 and metrics["dapo/gen_rounds"] == 1
    assert metrics["dapo/filled_with_tied_groups"] >= 2  # the two even-index prompts tie
    # one round, all of it trained on: the generated figures are the batch's
    scores = batch["token_level_scores"].sum(-1)
    assert metrics["dapo/generated/score/mean"] == scores.mean().item()
    mixed = sum(len(set(row.tolist())) > 1 for row in scores.view(4, 4)) / 4
    assert metrics["dapo/generated/groups_with_mixed_scores"] == mixed


def test_rounds_with_different_reward_extras_concatenate_and_surplus_groups_are_counted(
    kk_data, tiny_model, tiny_tokenizer
):
    torch.manual_seed(0)
    batch, metrics = _collector(kk_data, tiny_model, tiny_tokenizer, rounds=4, reward=late_extra).collect({})
    assert len(batch) == 16 and metrics["dapo/gen_rounds"] == 2  # before: BatchError on the fields
    kept = 4 * metrics["dapo/gen_rounds"] - metrics["dapo/groups_dropped_all_same"]
    assert kept > 4 and metrics["dapo/groups_surplus_unused"] == kept - 4
    # the policy's own figures, before the filter: every generated group and sample counts
    assert metrics["dapo/generated/groups_with_mixed_scores"] == kept / 8
    late = batch["reward_extra:late"].view(4, 4)[:, 0].tolist()
    assert late[0] != late[0] and late[1:] == [1.0, 1.0, 1.0]  # NaN for the first round's group


@pytest.mark.slow
def test_the_filter_metric_can_be_the_rewards_accuracy_as_in_verl_and_the_paper(
    kk_data, tiny_model, tiny_tokenizer
):
    """Groups of all-wrong answers whose scores differ by a penalty alone were kept (filtering on the
    score): with metric=acc they are tied, as DAPO's accuracy filter has them."""
    torch.manual_seed(0)
    _, by_score = _collector(kk_data, tiny_model, tiny_tokenizer, rounds=1, reward=wrong_but_uneven).collect(
        {}
    )
    assert by_score["dapo/groups_dropped_all_same"] < 4  # the scores differ
    torch.manual_seed(0)
    collector = _collector(
        kk_data, tiny_model, tiny_tokenizer, rounds=2, reward=wrong_but_uneven, metric="acc"
    )
    batch, by_acc = collector.collect({})
    assert by_acc["dapo/groups_dropped_all_same"] == 8 and by_acc["dapo/filled_with_tied_groups"] == 4
    assert by_acc["dapo/generated/groups_with_mixed_scores"] == 0.0 and len(batch) == 16
    from lucidrl.trainer.collect import FilterMetricError

    with pytest.raises(
        FilterMetricError,
        match=r"metric='pass': the reward function returned no 'pass' .*metrics: acc\); name one",
    ):
        _collector(
            kk_data, tiny_model, tiny_tokenizer, rounds=1, reward=wrong_but_uneven, metric="pass"
        ).collect({})


def test_align_widths_pads_prompts_left_and_responses_right():
    a = Batch(
        tensors={
            "prompts": torch.tensor([[5, 6]]),
            "prompt_mask": torch.tensor([[1, 1]]),
            "responses": torch.tensor([[7]]),
            "response_mask": torch.tensor([[1]]),
        }
    )
    b = Batch(
        tensors={
            "prompts": torch.tensor([[4, 5, 6]]),
            "prompt_mask": torch.tensor([[1, 1, 1]]),
            "responses": torch.tensor([[7, 8, 9]]),
            "response_mask": torch.tensor([[1, 1, 1]]),
        }
    )
    out = Batch.concat(align_widths([a, b], pad_token_id=0))
    assert out["prompts"].tolist() == [[0, 5, 6], [4, 5, 6]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["responses"].tolist() == [[7, 0, 0], [7, 8, 9]]
