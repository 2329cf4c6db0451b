"""Score a batch of responses with rule functions: token-level scores plus per-sample metrics.

A sample whose function raises, runs past reward.timeout_s (then its worker process is killed:
deadline.py) or returns no usable score stops the run
(reward.on_error=raise, the default), or is marked failed in the output (`reward_failed`, and
`reward_timed_out` for the timeouts) with score 0 (mask, zero): the trainer then leaves it out of the
update or trains it as 0 (trainer/rewards.py). The first error of each kind is logged with its
traceback, once per run; the rest are counted."""

from __future__ import annotations

import functools
import logging
import os
import traceback
from collections.abc import Callable
from typing import Any

import torch

from lucidrl.batch import Batch, last_loss_index
from lucidrl.diagnostics.errors import UserError
from lucidrl.rewards.custom import (
    CustomFunctionError,
    RewardOutputError,
    load_custom_function,
    normalize_reward_output,
)
from lucidrl.rewards.deadline import RemoteError, RewardTimeout, RewardWorkerError, make_caller
from lucidrl.rewards.registry import default_compute_score

ComputeScore = Callable[[str, str, Any, dict | None], Any]


log = logging.getLogger(__name__)


class RewardFunctionError(UserError, RuntimeError):
    """A reward function raised: which function, data_source and sample, with the original error."""


class RewardTimeoutError(UserError, RuntimeError):
    """A reward function ran past reward.timeout_s on a sample: which function, data_source and sample."""


ON_ERROR = ("raise", "mask", "zero")  # reward.on_error


class RuleRewardManager:
    """Decodes each response, calls `compute_score`, and puts the score on its last response token."""

    def __init__(
        self,
        tokenizer,
        compute_score: ComputeScore | None = None,
        name: str = "default_compute_score",
        *,
        on_error: str = "raise",
        timeout_s: float | None = None,
        load: Callable[[], ComputeScore] | None = None,
    ):
        """`load`: how a worker process gets `compute_score` under a timeout (a picklable callable that
        returns it; by default the function itself, pickled by reference)."""
        if on_error not in ON_ERROR:
            raise ValueError(f"reward.on_error={on_error!r}: use one of {ON_ERROR}")
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.name = name
        self.on_error = on_error
        # reward.timeout_s: each call in a worker process, killed past it; without one, called here
        self.caller = make_caller(self.compute_score, timeout_s, load) if timeout_s else None
        # shows how far a slow scoring is: begin(total), advance(done), end() (trainer/reward_progress.py)
        self.progress: Any = None
        self.told: set[str] = set()  # the kinds of failure already logged with a traceback
        self.text_extras: set[str] = set()  # extras returned as text (not metrics), announced once each
        # a custom function's score may be a format bonus or +-1: only the built-in rules' 0/1 scores of
        # sources without an "acc" metric are their accuracy (verl then reports the reward, as here)
        self.score_is_accuracy = compute_score is None

    @classmethod
    def from_config(
        cls,
        tokenizer,
        path: str | None,
        name: str,
        reward_kwargs: dict[str, Any] | None = None,
        *,
        on_error: str = "raise",
        timeout_s: float | None = None,
    ) -> RuleRewardManager:
        if path:
            fn = load_custom_function(path, name, reward_kwargs)
            return cls(
                tokenizer,
                fn,
                name=f"{path}:{name}" + (f" with {reward_kwargs}" if reward_kwargs else ""),
                on_error=on_error,
                timeout_s=timeout_s,
                # a worker process loads the file itself (a function of a file-imported module cannot
                # be pickled by reference)
                load=functools.partial(
                    load_custom_function, os.path.abspath(path), name, dict(reward_kwargs or {})
                ),
            )
        if reward_kwargs:
            raise CustomFunctionError(
                f"reward.custom_function.reward_kwargs={reward_kwargs} is set but reward.custom_function.path "
                "is not: the keywords go to a custom function only (the built-in rules take none); set the "
                "path, or remove reward_kwargs"
            )
        return cls(tokenizer, on_error=on_error, timeout_s=timeout_s)

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
        """Batch with `token_level_scores (bs, R)` (and, with on_error mask or zero, `reward_failed (bs,)`
        and `reward_timed_out (bs,)`, bool), and each extra metric the functions returned, per sample."""
        texts = self.decode_responses(batch)
        mask = batch["response_mask"]
        scores = torch.zeros(mask.shape, dtype=torch.float32)
        last_tokens = last_loss_index(mask).tolist()  # the model's last token (a gap may follow it)
        failed = torch.zeros(len(texts), dtype=torch.bool)
        timed_out = torch.zeros(len(texts), dtype=torch.bool)
        extras: dict[str, list[float]] = {}
        if self.progress is not None:
            self.progress.begin(len(texts))
        try:
            for i, text in enumerate(texts):
                try:
                    value, extra = self._score_one(batch, i, text)
                except (RewardFunctionError, RewardTimeoutError, RewardOutputError) as e:
                    if self.on_error == "raise":
                        raise
                    failed[i], timed_out[i] = True, isinstance(e, RewardTimeoutError)
                    self._tell_once(e)
                    continue
                finally:
                    if self.progress is not None:
                        self.progress.advance(i + 1)
                scores[i, last_tokens[i]] = value
                for k, v in extra.items():
                    extras.setdefault(k, [float("nan")] * len(texts))[i] = v
        finally:
            if self.progress is not None:
                self.progress.end()
        out = Batch(tensors={"token_level_scores": scores})
        if self.on_error != "raise":
            out.update(Batch(tensors={"reward_failed": failed, "reward_timed_out": timed_out}))
        out.set("response_text", texts)
        return out, extras

    def _score_one(self, batch: Batch, i: int, text: str) -> tuple[float, dict[str, float]]:
        """(score, extras) of sample `i`; RewardFunctionError, RewardTimeoutError or RewardOutputError."""
        ds = batch["data_source"][i]
        kwargs = {
            "data_source": ds,
            "solution_str": text,
            "ground_truth": batch["ground_truth"][i],
            "extra_info": batch["extra_info"][i],
        }
        try:
            raw = self.caller(**kwargs) if self.caller else self.compute_score(**kwargs)
        except RewardTimeout:
            assert self.caller is not None
            raise RewardTimeoutError(
                f"reward function {self.name} did not return within reward.timeout_s={self.caller.timeout_s:g} s "
                f"on sample {i} (data_source={ds!r}, response starts {text[:120]!r}); {self.caller.on_timeout}. "
                "Raise reward.timeout_s, or set reward.on_error=mask (or zero) to go on without such samples"
            ) from None
        except RemoteError as e:  # raised in the worker process: its traceback comes as text
            raise RewardFunctionError(
                f"reward function {self.name} raised {e.type_name}: {e.message}\n"
                f"  data_source={ds!r}, sample {i}, response starts {text[:120]!r}\n"
                f"  original traceback (in the reward's worker process):\n{e.traceback_text}"
            ) from None
        except RewardWorkerError as e:
            raise RewardFunctionError(
                f"reward function {self.name}: {e}\n  data_source={ds!r}, sample {i}, response starts "
                f"{text[:120]!r}"
            ) from e
        except Exception as e:
            raise RewardFunctionError(
                f"reward function {self.name} raised {type(e).__name__}: {e}\n"
                f"  data_source={ds!r}, sample {i}, response starts {text[:120]!r}\n"
                f"  original traceback:\n{''.join(traceback.format_exception(type(e), e, e.__traceback__))}"
            ) from e
        found: set[str] = set()
        value, extra = normalize_reward_output(raw, data_source=ds, index=i, text_extras=found)
        for key in found - self.text_extras:  # said once per key, not per sample
            log.warning(
                "reward function %s returned %r=%r for data_source %r: text, not a number, so not a "
                "metric; left out of the metrics (numbers and booleans are averaged)",
                self.name,
                key,
                raw[key],
                ds,
            )
        self.text_extras |= found
        return value, extra

    def close(self) -> None:
        """Stop the worker process of a function with a timeout (a new one starts if scoring goes on)."""
        if self.caller is not None:
            self.caller.close()

    def _tell_once(self, error: Exception) -> None:
        """Log the first error of its kind in full; the later ones are only counted."""
        kind = type(error).__name__
        if kind in self.told:
            return
        self.told.add(kind)
        what = "no gradient (left out of the update)" if self.on_error == "mask" else "a score of 0"
        log.warning(
            "%s\nreward.on_error=%s: such a sample gets %s and the run goes on; they are counted in "
            "reward/failed (reward/timed_out for timeouts), and this is the only %s shown",
            error,
            self.on_error,
            what,
            kind,
        )
