"""GRPO with multi-turn rollouts on the tiny model: the hf engine's turns, the calculator's replies in
the gaps of the loss mask, log-probs that match a training forward across the gaps, and the counts."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import make_stopping_model
from safetensors.torch import load_file

from lucidrl.config import load_config
from lucidrl.trainer.ppo import PPOTrainer
from lucidrl.workers.rollout.agent import ToolConfigError

pytestmark = pytest.mark.slow

# reads the whole trajectory: the conversation reaches compute_score in extra_info
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    replies = [m["content"] for m in extra_info["conversation"] if m["role"] == "tool"]
    return {"score": solution_str.count("e") / max(len(solution_str), 1),
            "right_reply": float(replies == [ground_truth])}
"""


def _rows(n: int, tools_kwargs=None) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = 12 + i, 34
        call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
        rows.append(
            {
                "data_source": "arithmetic",
                # the assistant turn starts pre-filled with the call: a random tiny model would never write one
                "prompt": [
                    {"role": "user", "content": f"What is {a} * {b}?"},
                    {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
                ],
                "reward_model": {"style": "rule", "ground_truth": str(a * b)},
                "extra_info": {"index": i, **({"tools_kwargs": tools_kwargs} if tools_kwargs else {})},
            }
        )
    return rows


def _config(tmp_path, model_path, rows, *extra):
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    return load_config(
        None,
        [
            f"model.path={model_path}",
            f"data.train_files=[{data}]",
            "data.max_prompt_length=960",  # the tiny model's 1024 positions
            "data.max_response_length=64",
            "data.train_batch_size=4",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=4",
            "actor.ppo_micro_batch_size=8",
            "actor.optim.lr=1e-3",
            f"reward.custom_function.path={reward}",
            f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.total_training_steps=3",
            "trainer.val_before_train=false",
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.tools=[calculator]",
            "rollout.multi_turn.max_tool_response_tokens=32",
            *extra,
        ],
    )


def test_grpo_trains_on_multi_turn_rollouts_with_the_tool_tokens_out_of_the_loss(tmp_path, tiny_model):
    # every third token id ends a turn: the tiny model's turns end after a few tokens, at varied lengths
    model = make_stopping_model(tiny_model["path"], tmp_path / "stopping")
    trainer = PPOTrainer(_config(tmp_path, model, _rows(8)))
    tok = trainer.workers.tokenizer
    batch, _ = trainer.collector.collect({})
    assert len(batch) == 16
    for i in range(len(batch)):
        attn, loss = batch["response_attention_mask"][i].bool(), batch["response_mask"][i].bool()
        gap = tok.decode(batch["responses"][i][attn & ~loss].tolist(), skip_special_tokens=False)
        truth = batch["ground_truth"][i]
        # the calculator's answer to the pre-filled call, between the model's two turns
        assert gap == f"<|im_end|>\n<|im_start|>tool\n{truth}<|im_end|>\n<|im_start|>assistant\n"
        first_loss, last_loss = loss.nonzero().min(), loss.nonzero().max()
        assert first_loss == 0 and not loss[first_loss : last_loss + 1].all()  # model | tool | model
    assert batch["multi_turn:turns"].tolist() == [2.0] * 16
    assert batch["reward_extra:right_reply"].tolist() == [1.0] * 16
    # the actor's forward over prompt + whole response, tool tokens attended, gives the sampling log-probs
    old = trainer.workers.actor.compute_log_prob(batch)["old_log_probs"]
    gap = ((old - batch["rollout_log_probs"]).abs() * batch["response_mask"]).max().item()
    assert gap < 1e-4
    trainer.fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "actor/pg_loss" in m]
    assert len(steps) == 3
    for m in steps:
        assert m["multi_turn/tool_call_rate"] == 1.0 and m["multi_turn/valid_call_rate"] == 1.0
        assert m["multi_turn/turns/mean"] == 2.0 and m["multi_turn/tool_errors/mean"] == 0.0
        assert m["multi_turn/cut/max_turns"] == 0.0 and m["multi_turn/cut/max_response_length"] == 0.0
        assert m["reward/right_reply/mean"] == 1.0
        # response_length counts the tool tokens too; the model wrote only part of them
        assert m["response_length/mean"] == pytest.approx(
            m["multi_turn/generated_tokens/mean"] + m["multi_turn/observation_tokens/mean"]
        )
        assert m["multi_turn/observation_tokens/mean"] > 0 and torch.isfinite(
            torch.tensor(m["actor/pg_loss"])
        )
    before = load_file(f"{model}/model.safetensors")
    after = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_row_naming_a_tool_the_run_lacks_is_refused_with_its_file_and_row(tmp_path, tiny_model):
    rows = _rows(4) + _rows(1, tools_kwargs={"search": {"create_kwargs": {"k": "v"}}})
    with pytest.raises(
        ToolConfigError, match=r"train\.parquet:4: extra_info.tools_kwargs names the tool 'search'"
    ):
        PPOTrainer(_config(tmp_path, tiny_model["path"], rows))
