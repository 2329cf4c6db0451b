"""The exception types that mean "the user gave us something we cannot use": printed without a traceback."""

from __future__ import annotations


class UsageError(ValueError):
    """A command-line argument that cannot mean what was asked."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from lucidrl.batch import BatchError
    from lucidrl.config import ConfigError
    from lucidrl.data.dataset import DatasetError
    from lucidrl.models.loading import ModelLoadError
    from lucidrl.rewards import RewardOutputError, UnknownDataSourceError
    from lucidrl.rewards.custom import CustomFunctionError
    from lucidrl.rewards.manager import RewardFunctionError
    from lucidrl.trainer.setup import RunDirError
    from lucidrl.workers.actor import NonFiniteLossError
    from lucidrl.workers.rollout_server import RolloutServerError
    from lucidrl.workers.train_state import CheckpointError

    return (
        UsageError,
        BatchError,
        ConfigError,
        DatasetError,
        ModelLoadError,
        RewardOutputError,
        UnknownDataSourceError,
        CustomFunctionError,
        RewardFunctionError,
        RunDirError,
        NonFiniteLossError,
        RolloutServerError,
        CheckpointError,
    )


USER_ERRORS = _user_errors()
