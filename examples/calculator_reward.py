"""The reward of examples/grpo_calculator.yaml: the arithmetic answer, plus a little for using the tool.

It reads the whole trajectory: a multi-turn run puts the conversation in extra_info, and a tool message
that is not an error means the model wrote a call the calculator could run. That bonus gives GRPO a
signal while the model is still wrong about every answer in a group (all-zero groups teach nothing).
"""

from lucidrl.rewards.arithmetic import compute_score as answer_score

TOOL_BONUS = 0.2


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    result = answer_score(solution_str, ground_truth)
    conversation = (extra_info or {}).get("conversation") or []
    ran = any(m["role"] == "tool" and not str(m["content"]).startswith("Error:") for m in conversation)
    result["ran_tool"] = float(ran)
    result["score"] = result["acc"] + TOOL_BONUS * ran
    return result
