"""The reward of examples/grpo_calculator.yaml: the arithmetic answer, plus a little for using the tool.

It reads the whole trajectory: a multi-turn run puts the conversation in extra_info, its first
`prompt_messages` messages the prompt's (the worked example's tool reply among them). A later tool
message that is not an error means the model wrote a call the calculator could run. That bonus gives
GRPO a signal while the model is still wrong about every answer in a group (all-zero groups teach
nothing).
"""

from lucidrl.rewards.arithmetic import compute_score as answer_score

TOOL_BONUS = 0.2


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    result = answer_score(solution_str, ground_truth)
    info = extra_info or {}
    written = (info.get("conversation") or [])[info.get("prompt_messages", 0) :]  # not the worked example's
    ran = any(m["role"] == "tool" and not str(m["content"]).startswith("Error:") for m in written)
    result["ran_tool"] = float(ran)
    result["score"] = result["acc"] + TOOL_BONUS * ran
    return result
