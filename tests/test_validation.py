"""Validation metrics: each per-sample extra stays with its own samples across validation batches."""

from __future__ import annotations

import math

import pytest
import torch

from lucidrl.batch import Batch
from lucidrl.data.dataset import load_prompts
from lucidrl.trainer.validation import validate
from lucidrl.workers.rollout.engine import SamplingParams


class _Rollout:
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        n = len(prompts)
        prompts.set("responses", torch.ones((n, 2), dtype=torch.long))
        prompts.set("response_mask", torch.ones((n, 2), dtype=torch.long))
        return prompts


class _Reward:
    """Scores 1.0; its "bonus" extra only appears from the second batch on (a key a function returns late)."""

    score_is_accuracy = True

    def __init__(self):
        self.calls = 0

    def score(self, batch: Batch):
        self.calls += 1
        scores = torch.zeros(batch["response_mask"].shape)
        scores[:, -1] = 1.0
        extras = {"bonus": [5.0] * len(batch)} if self.calls > 1 else {}
        return Batch(tensors={"token_level_scores": scores}), extras


def test_an_extra_first_returned_by_a_later_batch_lands_on_that_batchs_samples(kk_data, tiny_tokenizer):
    samples, _ = load_prompts([str(kk_data["train"])], tiny_tokenizer, max_prompt_length=4096)
    samples = [s for s in samples if s.extra_info.get("n_people") == 2][:4]  # one group, 2 batches of 2
    out = validate(_Rollout(), _Reward(), samples, SamplingParams(n=1), pad_token_id=0, batch_size=2)
    ds = samples[0].data_source
    # the first two samples have no bonus (NaN, left out of the mean), the last two have 5.0
    assert out[f"val/{ds}/bonus"] == 5.0
    assert out[f"val/{ds}/acc"] == 1.0 and not math.isnan(out["val/acc"])


def test_verls_val_core_and_val_aux_names_carry_the_same_means(kk_data, tiny_tokenizer):
    samples, _ = load_prompts([str(kk_data["train"])], tiny_tokenizer, max_prompt_length=4096)
    samples = [s for s in samples if s.extra_info.get("n_people") == 2][:4]
    ds = samples[0].data_source
    out = validate(_Rollout(), _Reward(), samples, SamplingParams(n=1), pad_token_id=0, batch_size=4)
    assert out[f"val-core/{ds}/acc/mean@1"] == out[f"val/{ds}/acc"] == 1.0
    assert out[f"val-aux/{ds}/reward/mean@1"] == out[f"val/{ds}/score"] == 1.0
    no_acc = _Reward()
    no_acc.score_is_accuracy = False  # a reward model's score: verl's core metric is then the reward
    out = validate(_Rollout(), no_acc, samples, SamplingParams(n=1), pad_token_id=0, batch_size=4)
    assert out[f"val-core/{ds}/reward/mean@1"] == 1.0 and f"val-core/{ds}/acc/mean@1" not in out


class _TextRollout:
    """Answers every prompt with the text `answer(sample)`; each call is as wide as its longest answer."""

    def __init__(self, tokenizer, answer):
        self.tokenizer, self.answer = tokenizer, answer

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        rows = [
            self.tokenizer.encode(self.answer(ds), add_special_tokens=False) for ds in prompts["data_source"]
        ]
        width = max(len(r) for r in rows)
        responses = torch.full((len(rows), width), self.tokenizer.pad_token_id)
        for i, r in enumerate(rows):
            responses[i, : len(r)] = torch.tensor(r)
        prompts.set("responses", responses)
        prompts.set(
            "response_mask",
            (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long(),
        )
        return prompts


@pytest.mark.slow
def test_batches_of_other_widths_and_a_source_without_acc_are_reported_row_by_row(kk_data, tiny_tokenizer):
    """data.val_batch_size made validation crash (batches' prompts and responses are as wide as their
    longest); and a GSM8K row among K&K rows got the NaN that K&K's "acc" leaves for it, not its score."""
    from dataclasses import replace

    from lucidrl.rewards.manager import RuleRewardManager

    samples, _ = load_prompts([str(kk_data["train"])], tiny_tokenizer, max_prompt_length=4096)
    kk = [s for s in samples if s.extra_info.get("n_people") == 2][:2]
    long_kk = [s for s in samples if s.extra_info.get("n_people") == 3][:1]
    gsm = [replace(kk[0], data_source="openai/gsm8k", ground_truth="42", extra_info={})]
    mixed = [*kk, *gsm, *long_kk]  # batches of 2: prompt widths differ, and the answers' lengths
    assert len({len(s.input_ids) for s in mixed}) > 1

    def answer(ds):  # a right GSM8K answer; a K&K answer that fails the format
        return "so #### 42" if ds == "openai/gsm8k" else "no idea at all, none whatsoever"

    rollout = _TextRollout(tiny_tokenizer, answer)
    reward = RuleRewardManager(tiny_tokenizer)
    out = validate(rollout, reward, mixed, SamplingParams(n=1), pad_token_id=0, batch_size=2)
    whole = validate(rollout, reward, mixed, SamplingParams(n=1), pad_token_id=0, batch_size=None)
    assert out == whole
    ds = kk[0].data_source
    assert out["val/openai/gsm8k/acc"] == out["val/openai/gsm8k/score"] == 1.0
    assert out["val-core/openai/gsm8k/acc/mean@1"] == 1.0
    assert out[f"val/{ds}/acc"] == 0.0 and out["val/acc"] == 0.25  # 1 right of 4
    assert "val/openai/gsm8k/format_ok" not in out and out[f"val/{ds}/format_ok"] == 0.0
    length = len(tiny_tokenizer.encode(answer("openai/gsm8k"), add_special_tokens=False))
    assert out["val/openai/gsm8k/response_length"] == length
