"""reward_model: a one-output sequence classifier scores prompt + response, read at the response's last
token (also when pad and eos are one id), with the policy's token ids or re-rendered with its own chat
template; replace or add to the rule score; a folder that is not a reward model says so."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import lucidrl_train
from transformers import AutoConfig, AutoModelForSequenceClassification

from lucidrl.batch import Batch
from lucidrl.config import ConfigError, load_config
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_tokenizer
from lucidrl.models.loading import ModelLoadError
from lucidrl.trainer.ppo import PPOTrainer
from lucidrl.trainer.rewards import ModelRewardScorer
from lucidrl.workers.training.reward_model import RewardModelWorker, load_reward_model

OTHER_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"


def _save_reward_model(tiny_model, out, *, template: str | None = None, num_labels: int = 1):
    config = AutoConfig.from_pretrained(tiny_model["path"])
    config.num_labels = num_labels
    torch.manual_seed(7)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model["path"], config=config)
    torch.nn.init.normal_(model.score.weight, std=0.5)  # a head that tells sequences apart
    model.save_pretrained(out)
    tokenizer = load_tokenizer(str(tiny_model["path"]))
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tiny_model):
    return _save_reward_model(tiny_model, tmp_path_factory.mktemp("rm") / "rm")


def _rollout_batch(kk_data, tokenizer, responses: list[list[int]]) -> Batch:
    samples, _ = load_prompts([str(kk_data["train"])], tokenizer, max_prompt_length=4096)
    batch = collate(samples[: len(responses)], tokenizer.pad_token_id)
    width = max(len(r) for r in responses)
    ids = torch.full((len(responses), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.long)
    for i, r in enumerate(responses):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    batch.set("responses", ids)
    batch.set("response_mask", mask)
    return batch


def _reference_score(path, ids: list[int]) -> float:
    """HuggingFace's own forward on one unpadded sequence, told there is no pad token: its last token."""
    model = AutoModelForSequenceClassification.from_pretrained(path)
    model.config.pad_token_id = None
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def test_scores_are_read_at_the_last_response_token_also_when_eos_is_the_pad_id(
    reward_model_dir, kk_data, tiny_tokenizer
):
    pad = tiny_tokenizer.pad_token_id
    responses = [[5, 6, 7, pad], [8, 9], [10, 11, 12, 13, 14]]  # the first ends in eos == pad
    batch = _rollout_batch(kk_data, tiny_tokenizer, responses)
    worker = RewardModelWorker.from_config(
        load_config(
            None,
            [
                "model.path=/m",
                "data.train_files=[/t]",
                "reward_model.enable=true",
                f"reward_model.model.path={reward_model_dir}",
                "reward_model.micro_batch_size=2",
            ],
        ).reward_model,
        tiny_tokenizer,
        "cpu",
    )
    assert worker.reuse_ids  # the same tokenizer: the rollout's ids go in as they are
    out = worker.compute_rm_score(batch)
    rm = out["rm_scores"]
    assert rm.shape == batch["response_mask"].shape
    for i, r in enumerate(responses):
        prompt = batch["prompts"][i][batch["prompt_mask"][i].bool()].tolist()
        expected = _reference_score(reward_model_dir, prompt + r)
        assert rm[i, len(r) - 1].item() == pytest.approx(expected, abs=1e-5)
        assert rm[i].count_nonzero() == 1
    assert out["rm_truncated"].tolist() == [0.0, 0.0, 0.0]
    # HuggingFace's padded batch picks the last non-pad token: the wrong one for the first sequence
    prompt0 = batch["prompts"][0][batch["prompt_mask"][0].bool()].tolist()
    hf = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    with torch.no_grad():
        picked_by_hf = hf(input_ids=torch.tensor([prompt0 + responses[0]])).logits[0, 0].item()
    assert picked_by_hf != pytest.approx(rm[0, 3].item(), abs=1e-4)


def test_another_chat_template_renders_the_conversation_again_and_long_ones_are_cut_and_counted(
    tmp_path, tiny_model, kk_data, tiny_tokenizer
):
    path = _save_reward_model(tiny_model, tmp_path / "rm_other", template=OTHER_TEMPLATE)
    rm_tokenizer = load_tokenizer(str(path))
    worker = RewardModelWorker(
        load_reward_model(str(path)), rm_tokenizer, tiny_tokenizer, micro_batch_size=4, max_length=None
    )
    assert not worker.reuse_ids
    response = tiny_tokenizer("Henry is a knight", add_special_tokens=False)["input_ids"]
    batch = _rollout_batch(kk_data, tiny_tokenizer, [response])
    messages = [dict(m) for m in batch["raw_prompt"][0]]
    if messages[-1]["role"] == "assistant":  # K&K rows pre-fill the answer's start
        messages[-1]["content"] += "Henry is a knight"
    else:
        messages.append({"role": "assistant", "content": "Henry is a knight"})
    text = rm_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text.endswith("Henry is a knight\n") and text.startswith("<")
    ids = rm_tokenizer(text, add_special_tokens=False)["input_ids"]
    score = worker.compute_rm_score(batch)["rm_scores"][0, len(response) - 1].item()
    assert score == pytest.approx(_reference_score(path, ids), abs=1e-5)
    # max_length keeps the end, where the score is read, and says it cut
    short = RewardModelWorker(
        load_reward_model(str(path)), rm_tokenizer, tiny_tokenizer, micro_batch_size=4, max_length=12
    )
    out = short.compute_rm_score(batch)
    assert out["rm_truncated"].tolist() == [1.0]
    # with no max_length, the reward model's own positions are the limit
    model = load_reward_model(str(path))
    model.config.max_position_embeddings = 12
    capped = RewardModelWorker(model, rm_tokenizer, tiny_tokenizer, micro_batch_size=4, max_length=None)
    assert capped.compute_rm_score(batch)["rm_truncated"].tolist() == [1.0]
    assert out["rm_scores"][0, len(response) - 1].item() == pytest.approx(
        _reference_score(path, ids[-12:]), abs=1e-5
    )


def test_a_folder_that_is_not_a_reward_model_says_what_it_is(tmp_path, tiny_model):
    with pytest.raises(
        ModelLoadError, match=r"has no trained scoring head \(missing: score.weight\).*not a causal LM"
    ):
        load_reward_model(str(tiny_model["path"]))
    two = _save_reward_model(tiny_model, tmp_path / "two", num_labels=2)
    with pytest.raises(ModelLoadError, match="has num_labels=2: a reward model gives one score"):
        load_reward_model(str(two))
    base = ["model.path=/m", "data.train_files=[/t]"]
    with pytest.raises(ConfigError, match="reward_model.enable=true needs reward_model.model.path"):
        load_config(None, [*base, "reward_model.enable=true"])
    with pytest.raises(ConfigError, match="is only read with reward_model.enable=true"):
        load_config(None, [*base, "reward_model.model.path=/rm"])


class _FakeGroup:
    def compute_rm_score(self, batch):
        rm = torch.zeros(batch["response_mask"].shape)
        rm[:, 0] = torch.tensor([0.5, -1.0])
        return Batch(tensors={"rm_scores": rm, "rm_truncated": torch.zeros(2)})


class _FakeRule:
    def score(self, batch):
        s = torch.zeros(batch["response_mask"].shape)
        s[:, 0] = torch.tensor([1.0, 0.0])
        return Batch(tensors={"token_level_scores": s}), {}


def test_add_puts_the_rule_score_and_the_model_score_together_replace_keeps_the_model_score():
    batch = Batch(tensors={"response_mask": torch.ones(2, 3, dtype=torch.long)})
    added, extras = ModelRewardScorer(_FakeGroup(), _FakeRule(), "add").score(batch)
    assert added["token_level_scores"].sum(-1).tolist() == [1.5, -1.0]
    assert (
        extras["rule_score"] == [1.0, 0.0]
        and extras["acc"] == [1.0, 0.0]
        and extras["rm_score"] == [0.5, -1.0]
    )
    replaced, extras = ModelRewardScorer(_FakeGroup(), _FakeRule(), "replace").score(batch)
    assert replaced["token_level_scores"].sum(-1).tolist() == [0.5, -1.0] and "acc" not in extras


@pytest.mark.slow
def test_grpo_trains_on_the_reward_model(tmp_path, kk_data, tiny_model, reward_model_dir):
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model['path']}",
            f"data.train_files=[{kk_data['train']}]",
            f"data.val_files=[{kk_data['val']}]",
            "data.max_prompt_length=512",
            "data.max_response_length=8",
            "data.train_batch_size=4",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=4",
            "reward_model.enable=true",
            f"reward_model.model.path={reward_model_dir}",
            "trainer.total_training_steps=2",
            "trainer.logger=[jsonl]",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )
    trainer = PPOTrainer(cfg)
    trainer.fit()
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0 and "critic/score/mean" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["critic/score/mean"] == pytest.approx(r["reward/rm_score/mean"], abs=1e-6)
        assert r["reward/rm_score/mean"] != 0.0 and r["actor/grad_norm"] > 0
    last = records[-1]
    assert last["val/kk_logic/rm_score"] is not None
    assert last["val/kk_logic/acc"] is None  # a reward model's score is not called accuracy


@pytest.mark.slow
def test_the_reward_model_scores_the_same_on_two_ray_ranks_as_in_process(
    tmp_path, kk_data, stopping_model, reward_model_dir, ray_head
):
    """The role is placed like the critic: colocated with the actor, data-parallel across ranks. The
    policy stops early (conftest.py::stopping_model), so the ranks score responses of their own widths."""

    def run(name, *extra):
        args = [
            f"model.path={stopping_model['path']}",
            f"data.train_files=[{kk_data['train']}]",
            "data.val_files=[]",
            "data.max_prompt_length=512",
            "data.max_response_length=8",
            "data.train_batch_size=4",
            "rollout.n=4",
            "rollout.deterministic=true",
            "actor.ppo_mini_batch_size=4",
            "reward_model.enable=true",
            f"reward_model.model.path={reward_model_dir}",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            f"trainer.run_dir={tmp_path / name}",
            *extra,
        ]
        lucidrl_train(args)
        return json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])

    local = run("local")
    ray = run(
        "ray",
        "trainer.backend=ray",
        f"trainer.ray_address={ray_head}",
        "trainer.strategy=ddp",
        "placement.pools={global: {nodes: 1, devices_per_node: 2}}",
    )
    assert local["response_length/min"] < local["response_length/max"]  # varied lengths
    assert ray["reward/rm_score/mean"] == pytest.approx(local["reward/rm_score/mean"], abs=1e-5)
    assert ray["critic/score/mean"] == pytest.approx(local["critic/score/mean"], abs=1e-5)


def test_doctor_checks_the_reward_model_from_its_headers(
    tmp_path, tiny_model, tiny_tokenizer, reward_model_dir
):
    from lucidrl.doctor import checks, run_checks

    def check(path, *extra):
        cfg = load_config(
            None,
            [
                "model.path=/m",
                "data.train_files=[/t]",
                "reward_model.enable=true",
                f"reward_model.model.path={path}",
                *extra,
            ],
        )
        return checks.run_check("reward model", lambda: run_checks.check_reward_model(cfg, tiny_tokenizer))[0]

    ok = check(reward_model_dir)
    assert ok.status == "ok" and "Qwen2ForSequenceClassification, score head 1 x 64" in ok.detail
    assert "the rollout's token ids are scored as they are" in ok.detail
    lm = check(tiny_model["path"])
    assert lm.status == "fail" and "no score.weight" in lm.detail and "num_labels=1" in lm.fix
    other = _save_reward_model(tiny_model, tmp_path / "other", template=OTHER_TEMPLATE)
    assert "rendered again with its chat template" in check(other).detail


def test_non_finite_scores_are_refused_and_a_trained_head_seeds_the_critic(
    tmp_path, reward_model_dir, kk_data, tiny_model, tiny_tokenizer
):
    from lucidrl.rewards.custom import RewardOutputError
    from lucidrl.workers.training.critic import load_value_model

    model = load_reward_model(str(reward_model_dir))
    with torch.no_grad():
        model.score.weight[0, 0] = float("nan")  # as a bfloat16 overflow would leave it
    worker = RewardModelWorker(model, tiny_tokenizer, tiny_tokenizer, micro_batch_size=2, max_length=None)
    batch = _rollout_batch(kk_data, tiny_tokenizer, [[5, 6], [7, 8, 9]])
    with pytest.raises(RewardOutputError, match=r"scored 2 of 2 samples nan \(non-finite; first: sample 0\)"):
        worker.compute_rm_score(batch)
    # a critic started from a reward model keeps its trained head (OpenRLHF's rule); from a causal LM, zeros
    trained = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).score.weight
    assert torch.equal(load_value_model(str(reward_model_dir)).score.weight, trained)
    assert load_value_model(str(tiny_model["path"])).score.weight.abs().sum() == 0
    # a head of another size without architectures to say so: a ModelLoadError, not transformers' RuntimeError
    two = _save_reward_model(tiny_model, tmp_path / "two", num_labels=2)
    config = json.loads((two / "config.json").read_text())
    config.pop("architectures")
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="cannot be loaded as a sequence classifier: RuntimeError"):
        load_reward_model(str(two))


def test_a_raw_prompt_is_refused_by_a_reward_model_with_another_template(
    tmp_path, tiny_model, tiny_tokenizer
):
    """A prompt fed as raw text carries the policy's chat markup: re-rendered as a user message in the reward
    model's template it would be another conversation, so it is an error that says what to do; with the
    policy's tokenizer the ids are scored as they are."""
    from verl_formats import write_logic_rl_kk

    write_logic_rl_kk(tmp_path / "kk.parquet", people=(3,), per_size=1)
    samples, report = load_prompts([str(tmp_path / "kk.parquet")], tiny_tokenizer, max_prompt_length=4096)
    assert report.raw_prompts == 1
    batch = collate(samples, tiny_tokenizer.pad_token_id)
    batch.set("responses", torch.tensor([[5, 6, 7]]))
    batch.set("response_mask", torch.ones(1, 3, dtype=torch.long))
    other = _save_reward_model(tiny_model, tmp_path / "rm_other", template=OTHER_TEMPLATE)
    worker = RewardModelWorker(
        load_reward_model(str(other)),
        load_tokenizer(str(other)),
        tiny_tokenizer,
        micro_batch_size=4,
        max_length=None,
    )
    with pytest.raises(ModelLoadError, match=r"fed as raw text .*reward_model.model.tokenizer_path"):
        worker.compute_rm_score(batch)
    same = _save_reward_model(tiny_model, tmp_path / "rm_same")
    worker = RewardModelWorker(
        load_reward_model(str(same)),
        load_tokenizer(str(same)),
        tiny_tokenizer,
        micro_batch_size=4,
        max_length=None,
    )
    assert worker.reuse_ids and worker.compute_rm_score(batch)["rm_scores"].shape == (1, 3)
