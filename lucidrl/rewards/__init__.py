"""Rule rewards (Knights & Knaves, GSM8K, MATH, DAPO math, Countdown), dispatch by data_source, and
user-supplied reward functions."""

from lucidrl.rewards.custom import (
    CustomFunctionError,
    RewardOutputError,
    load_custom_function,
    normalize_reward_output,
)
from lucidrl.rewards.registry import (
    UnknownDataSourceError,
    default_compute_score,
    get_reward_function,
    known_data_sources,
    register_reward,
)

__all__ = [
    "CustomFunctionError",
    "RewardOutputError",
    "UnknownDataSourceError",
    "default_compute_score",
    "get_reward_function",
    "known_data_sources",
    "load_custom_function",
    "normalize_reward_output",
    "register_reward",
]
