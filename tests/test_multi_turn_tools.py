"""Tools, tool-call parsing, the calculator and the rollout.multi_turn config section."""

from __future__ import annotations

import pytest

from lucidrl.config import load_config
from lucidrl.config.errors import ConfigError
from lucidrl.workers.rollout.agent.calculator import calculator
from lucidrl.workers.rollout.agent.environments import GuessNumber, resolve_environment
from lucidrl.workers.rollout.agent.parsers import get_tool_call_format, parse_hermes, parse_json
from lucidrl.workers.rollout.agent.sandbox import SandboxLimits
from lucidrl.workers.rollout.agent.toolbox import resolve_tools
from lucidrl.workers.rollout.agent.tools import ToolConfigError, ToolError, row_tools, tool_from_function


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("4821 * 37", "178377"),
        ("(1234 * 56) - 789", "68315"),
        ("1/3*3", "1"),
        ("10 / 4", "2.5"),
        ("2 / 3", "0.6666666667"),
        ("-7 // 2", "-4"),
        ("2 ** 10", "1024"),
        ("1,234 + 1", "1235"),
        ("3 × 4 ÷ 2", "6"),
        ("2^8", "256"),
    ],
)
def test_the_calculator_evaluates_exactly(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    "expression, problem",
    [
        ("__import__('os').system('true')", "function call"),
        ("x + 1", "the name 'x'"),
        ("(1).__class__", "Attribute"),
        ("1 / 0", "division by zero"),
        ("9 ** 9 ** 9", "exponent"),
        ("(10 ** 4000) ** 4000", "more than"),
        ("2 ** 0.5", "whole-number exponents"),
        ("1 +", "cannot parse"),
        ("'a' * 3", "not a number"),
        ("1 << 2", "<<"),
        ("", "empty"),
    ],
)
def test_the_calculator_refuses_what_is_not_arithmetic(expression, problem):
    with pytest.raises(ToolError, match=problem):
        calculator(expression)


def test_hermes_calls_and_malformed_calls_are_told_apart():
    text = (
        'Let me see. <tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>\n'
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "calculator"'
    )
    parsed = parse_hermes(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("calculator", {"expression": "1+1"}),
        ("calculator", {"expression": "2*3"}),  # arguments as a JSON string, as OpenAI's API returns them
    ]
    assert len(parsed.errors) == 4 and parsed.attempted == 6
    assert "not valid JSON" in parsed.errors[0]
    assert 'no "name"' in parsed.errors[1]
    assert "must be a JSON object" in parsed.errors[2]
    assert "without its closing" in parsed.errors[3]
    assert parse_hermes("The answer is 2.").attempted == 0


def test_json_format_reads_a_whole_turn_object_or_list():
    assert parse_json("The answer is 4").attempted == 0
    parsed = parse_json('[{"name": "a", "parameters": {"x": 1}}, {"name": "b"}]')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("a", {"x": 1}), ("b", {})]
    assert "not valid JSON" in parse_json('{"name": "a", ').errors[0]
    with pytest.raises(ToolConfigError, match="not a tool-call format"):
        get_tool_call_format("xml")


def test_a_tool_schema_comes_from_signature_and_docstring_and_hides_keyword_only_parameters():
    from helpers import shout

    tool = tool_from_function(shout, "test")
    fn = tool.schema["function"]
    assert fn["name"] == "shout" and fn["description"] == "Repeat a text in capitals."
    assert fn["parameters"] == {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "what to repeat"}},
        "required": ["text"],
    }
    assert tool.hidden == {"times"}
    assert tool.check_arguments({"text": "a"}) is None
    assert "missing required" in tool.check_arguments({})
    assert "unexpected argument(s) times" in tool.check_arguments({"text": "a", "times": 3})
    assert "expected string" in tool.check_arguments({"text": 3})
    assert "JSON object" in tool.check_arguments([1])


def test_configured_tools_resolve_by_name_module_path_and_file(tmp_path):
    f = tmp_path / "mytools.py"
    f.write_text(
        "def lookup(key: str) -> str:\n    '''Look a key up.\n\n    Args:\n        key: the key\n    '''\n"
        "    return key\n"
    )
    tools = resolve_tools(["calculator", "helpers:shout", f"{f}:lookup"], SandboxLimits())
    assert list(tools) == ["calculator", "shout", "lookup"]
    with pytest.raises(ToolConfigError, match=r"rollout.multi_turn.tools\[0\]='calc' is not a built-in tool"):
        resolve_tools(["calc"], SandboxLimits())
    with pytest.raises(ToolConfigError, match="cannot import 'no_such_module'"):
        resolve_tools(["no_such_module:f"], SandboxLimits())
    with pytest.raises(ToolConfigError, match="defines no 'nope'"):
        resolve_tools([f"{f}:nope"], SandboxLimits())


def test_rows_name_their_tools_and_hidden_arguments_in_verls_tools_kwargs():
    tools = resolve_tools(["calculator", "helpers:shout"], SandboxLimits())
    assert set(row_tools(tools, {}, "row")) == {"calculator", "shout"}
    picked = row_tools(
        tools, {"tools_kwargs": {"shout": {"create_kwargs": {"times": 2}}, "calculator": None}}, "row"
    )
    assert list(picked) == ["shout"] and picked["shout"][1] == {"times": 2}
    with pytest.raises(
        ToolConfigError, match="names the tool 'search', which rollout.multi_turn.tools does not"
    ):
        row_tools(tools, {"tools_kwargs": {"search": {}}}, "data.parquet:3")
    with pytest.raises(ToolConfigError, match="passes loud, which shout's function does not take"):
        row_tools(tools, {"tools_kwargs": {"shout": {"create_kwargs": {"loud": True}}}}, "row")
    with pytest.raises(ToolConfigError, match="calc_reward_kwargs is set"):
        row_tools(tools, {"tools_kwargs": {"shout": {"calc_reward_kwargs": {"a": 1}}}}, "row")


def test_the_guess_number_environment_answers_higher_lower_correct():
    env = resolve_environment("guess_number", "test")()
    prompt = env.reset({"prompt": [], "ground_truth": "42", "interaction_kwargs": {}})
    assert "between 1 and 100" in prompt[0]["content"]
    assert env.step([{"role": "assistant", "content": "Is it 50?"}]) == ("Lower.", False, 0.0)
    assert env.step([{"role": "assistant", "content": "30"}]) == ("Higher.", False, 0.0)
    assert env.step([{"role": "assistant", "content": "hmm"}])[1:] == (False, 0.0)
    assert env.step([{"role": "assistant", "content": "42"}]) == ("Correct! The number is 42.", True, 1.0)
    with pytest.raises(ValueError, match="outside"):
        GuessNumber().reset({"ground_truth": 500})
    with pytest.raises(ToolConfigError, match="not an environment class"):
        resolve_environment("helpers:shout", "rollout.multi_turn.environment")


def _load(*overrides):
    return load_config(None, ["model.path=m", "data.train_files=[x.parquet]", *overrides])


def test_the_multi_turn_section_is_checked_for_what_can_run():
    cfg = _load("rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[calculator]")
    assert cfg.rollout.multi_turn.tools == ["calculator"] and cfg.rollout.multi_turn.max_turns == 4
    with pytest.raises(
        ConfigError, match="no rollout.multi_turn.tools and no rollout.multi_turn.environment"
    ):
        _load("rollout.multi_turn.enable=true")
    with pytest.raises(ConfigError, match=r"is only read with rollout.multi_turn.enable=true"):
        _load("rollout.multi_turn.tools=[calculator]")
    with pytest.raises(ConfigError, match="max_turns=1 with tools"):
        _load(
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.tools=[calculator]",
            "rollout.multi_turn.max_turns=1",
        )
    with pytest.raises(ConfigError, match="names calculator more than once"):
        _load("rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[calculator,calculator]")
    with pytest.raises(ConfigError, match="not below data.max_response_length"):
        _load(
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.environment=guess_number",
            "rollout.multi_turn.max_tool_response_tokens=300",
        )
    with pytest.raises(ConfigError, match="is verl's; lucidrl's is rollout.multi_turn.max_turns"):
        _load("rollout.multi_turn.max_assistant_turns=3")
    with pytest.raises(ConfigError, match="verl counts characters"):
        _load("rollout.multi_turn.max_tool_response_length=100")


def test_arithmetic_rows_carry_the_calculator_and_score_the_final_answer(tmp_path):
    import pyarrow.parquet as pq

    from lucidrl.data.arithmetic import write_arithmetic_parquet
    from lucidrl.rewards.registry import default_compute_score

    info = write_arithmetic_parquet(tmp_path, n_train=40, n_val=10, few_shot=True, words=True, ops=("*", "+"))
    train, val = pq.read_table(info["train"]).to_pylist(), pq.read_table(info["val"]).to_pylist()
    assert len(train) == 40 and len(val) == 10
    assert not {r["extra_info"]["expression"] for r in train} & {r["extra_info"]["expression"] for r in val}
    row = train[0]
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "tool", "assistant", "user"]
    assert "<tool_call>" in row["prompt"][1]["content"] and row["prompt"][-1]["content"].endswith(
        "The answer is N."
    )
    a, op, b = row["extra_info"]["expression"].split()
    assert str(int(a) * int(b) if op == "*" else int(a) + int(b)) == row["reward_model"]["ground_truth"]
    assert set(row["extra_info"]["tools_kwargs"]) == {"calculator"}
    score = lambda text: default_compute_score("arithmetic", text, "178377")  # noqa: E731
    assert score("The answer is 178,377.") == {"score": 1.0, "acc": 1.0, "format": 1.0}
    assert score("4821 * 37 = 178377") == {"score": 1.0, "acc": 1.0, "format": 0.0}
    assert score("The answer is 178378. Or 178377?")["score"] == 0.0
    assert score("no idea")["score"] == 0.0
    guess = lambda text, info: default_compute_score("guess_number", text, 37, info)  # noqa: E731
    won = {"conversation": [{"role": "assistant", "content": "50"}, {"role": "assistant", "content": "37"}]}
    assert guess("", won) == {"score": 1.0, "acc": 1.0, "guesses": 2.0}
    assert guess("I guess 36", None)["score"] == 0.0


def test_a_python_tool_on_a_host_missing_sandbox_layers_is_warned_about(monkeypatch):
    from lucidrl.trainer.config_warnings import config_warnings
    from lucidrl.workers.rollout.agent import sandbox

    cfg = _load("rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[python]")
    monkeypatch.setattr(sandbox, "layers", lambda: (("rlimits",), (("landlock", "not available"),)))
    assert any("whose sandbox on this host lacks landlock (not available)" in w for w in config_warnings(cfg))
    monkeypatch.setattr(sandbox, "layers", lambda: (("rlimits", "landlock"), ()))
    assert not any("sandbox" in w for w in config_warnings(cfg))


def test_rows_are_checked_at_loading_with_their_file_and_row(tiny_tokenizer):
    from lucidrl.config.schema import MultiTurnConfig
    from lucidrl.data.dataset import PromptSample
    from lucidrl.workers.rollout.agent import MultiTurnError
    from lucidrl.workers.rollout.agent.rows import check_rows

    def row(i, extra):
        messages = [{"role": "user", "content": "What is 2 * 3?"}]
        ids = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return PromptSample(ids, "arithmetic", "6", extra, "", f"train.parquet:{i}", messages)

    cfg = MultiTurnConfig(enable=True, tools=["calculator"])
    check_rows([row(0, {}), row(1, {"tools_kwargs": {"calculator": {}}})], tiny_tokenizer, cfg, 2048)
    with pytest.raises(
        MultiTurnError, match=r"train.parquet:0: the prompt with its tools described is \d+ tokens"
    ):
        check_rows([row(0, {})], tiny_tokenizer, cfg, 100)
    with pytest.raises(ToolConfigError, match=r"train.parquet:1: extra_info.interaction_kwargs.name='chess'"):
        check_rows([row(0, {}), row(1, {"interaction_kwargs": {"name": "chess"}})], tiny_tokenizer, cfg, 2048)


def test_the_calculator_examples_reward_reads_the_conversation():
    from pathlib import Path

    from lucidrl.rewards.custom import load_custom_function

    path = Path(__file__).parent.parent / "examples" / "calculator_reward.py"
    score = load_custom_function(str(path), "compute_score")
    ran = {"conversation": [{"role": "tool", "content": "27375"}]}
    failed = {"conversation": [{"role": "tool", "content": "Error: missing required argument(s) expression"}]}
    assert score("arithmetic", "The answer is 27375.", "27375", ran)["score"] == 1.2
    assert score("arithmetic", "The answer is 1.", "27375", ran) == {
        "score": 0.2,
        "acc": 0.0,
        "format": 1.0,
        "ran_tool": 1.0,
    }
    assert score("arithmetic", "The answer is 1.", "27375", failed)["score"] == 0.0
