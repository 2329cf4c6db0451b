"""Helpers shared by several test files (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch

# a dense toy reward the random tiny model can improve on: the share of the letter 'e' in the response
TOY_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str[len("<think>"):]
    return {"score": text.count("e") / max(len(text), 1), "acc": float("e" in text)}
"""


def outcome_rewards(scores: list[float], lengths: list[int], T: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with each score on the last valid token, and the matching response mask."""
    rewards = torch.zeros(len(scores), T)
    mask = torch.zeros(len(scores), T)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask
