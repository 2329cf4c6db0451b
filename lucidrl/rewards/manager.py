"""Score a batch of responses with rule functions: token-level scores plus per-sample metrics."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

import torch

from lucidrl.batch import Batch, last_loss_index
from lucidrl.diagnostics.errors import UserError
from lucidrl.rewards.custom import CustomFunctionError, load_custom_function, normalize_reward_output
from lucidrl.rewards.registry import default_compute_score

ComputeScore = Callable[[str, str, Any, dict | None], Any]


log = logging.getLogger(__name__)


class RewardFunctionError(UserError, RuntimeError):
    """A reward function raised: which function, data_source and sample, with the original error."""


class RuleRewardManager:
    """Decodes each response, calls `compute_score`, and puts the score on its last response token."""

    def __init__(
        self, tokenizer, compute_score: ComputeScore | None = None, name: str = "default_compute_score"
    ):
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.name = name
        self.text_extras: set[str] = set()  # extras returned as text (not metrics), announced once each
        # a custom function's score may be a format bonus or +-1: only the built-in rules' 0/1 scores of
        # sources without an "acc" metric are their accuracy (verl then reports the reward, as here)
        self.score_is_accuracy = compute_score is None

    @classmethod
    def from_config(
        cls, tokenizer, path: str | None, name: str, reward_kwargs: dict[str, Any] | None = None
    ) -> RuleRewardManager:
        if path:
            fn = load_custom_function(path, name, reward_kwargs)
            return cls(
                tokenizer, fn, name=f"{path}:{name}" + (f" with {reward_kwargs}" if reward_kwargs else "")
            )
        if reward_kwargs:
            raise CustomFunctionError(
                f"reward.custom_function.reward_kwargs={reward_kwargs} is set but reward.custom_function.path "
                "is not: the keywords go to a custom function only (the built-in rules take none); set the "
                "path, or remove reward_kwargs"
            )
        return cls(tokenizer)

    def decode_responses(self, batch: Batch) -> list[str]:
        """The assistant's text per sample: the pre-filled prefix plus the generated tokens. A multi-turn
        rollout gives it as `solution_text`: the assistant's turns alone, so that a tool's output cannot
        stand in for the model's answer (the whole conversation is in extra_info)."""
        if "solution_text" in batch:
            return list(batch["solution_text"])
        texts = []
        for i, (ids, mask) in enumerate(zip(batch["responses"], batch["response_mask"], strict=True)):
            text = self.tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
            texts.append(batch["assistant_prefix"][i] + text)
        return texts

    def score(self, batch: Batch) -> tuple[Batch, dict[str, list[float]]]:
        """Batch with `token_level_scores (bs, R)`, and each extra metric the functions returned, per sample."""
        texts = self.decode_responses(batch)
        mask = batch["response_mask"]
        scores = torch.zeros(mask.shape, dtype=torch.float32)
        last_tokens = last_loss_index(mask).tolist()  # the model's last token (a gap may follow it)
        extras: dict[str, list[float]] = {}
        for i, text in enumerate(texts):
            ds = batch["data_source"][i]
            try:
                raw = self.compute_score(
                    data_source=ds,
                    solution_str=text,
                    ground_truth=batch["ground_truth"][i],
                    extra_info=batch["extra_info"][i],
                )
            except Exception as e:
                raise RewardFunctionError(
                    f"reward function {self.name} raised {type(e).__name__}: {e}\n"
                    f"  data_source={ds!r}, sample {i}, response starts {text[:120]!r}\n"
                    f"  original traceback:\n{traceback.format_exc()}"
                ) from e
            text: set[str] = set()
            value, extra = normalize_reward_output(raw, data_source=ds, index=i, text_extras=text)
            for key in text - self.text_extras:  # said once per key, not per sample
                log.warning(
                    "reward function %s returned %r=%r for data_source %r: text, not a number, so not a "
                    "metric; left out of the metrics (numbers and booleans are averaged)",
                    self.name,
                    key,
                    raw[key],
                    ds,
                )
            self.text_extras |= text
            scores[i, last_tokens[i]] = value
            for k, v in extra.items():
                extras.setdefault(k, [float("nan")] * len(texts))[i] = v
        out = Batch(tensors={"token_level_scores": scores})
        out.set("response_text", texts)
        return out, extras
