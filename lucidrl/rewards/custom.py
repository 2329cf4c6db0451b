"""Loading a user's reward function from a .py file, and checking what reward functions return.

`load_custom_function` implements `reward.custom_function.path` / `.name`. `normalize_reward_output`
turns any reward function's return value into (score, extra metrics), booleans as 1.0/0.0 (verl takes a
function returning `pred == gt`), and refuses the values that would otherwise be trained on silently:
strings, None, NaN and infinities.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from lucidrl.diagnostics.errors import UserError

_EXPECTED_OUTPUT = (
    "a finite float (or a boolean), or a dict with one under 'score' and numbers as extra metrics"
)


class CustomFunctionError(UserError, ValueError):
    """reward.custom_function.path / .name do not lead to a usable function (the message says why)."""


class RewardOutputError(UserError, ValueError):
    """A reward function returned something that is not a usable score (the message says which sample)."""


STANDARD_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")


def load_custom_function(
    path: str, name: str, reward_kwargs: Mapping[str, Any] | None = None
) -> Callable[..., Any]:
    """The function `name` defined in the Python file `path` (reward.custom_function.path / .name),
    with `reward_kwargs` (reward.custom_function.reward_kwargs) bound: passed to every call."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        where = "is a directory" if os.path.isdir(path) else "does not exist"
        raise CustomFunctionError(
            f"reward.custom_function.path={path!r} {where} (absolute: {os.path.abspath(path)!r}); "
            f"point it at a .py file that defines {name!r}"
        )
    if not path.endswith(".py"):
        raise CustomFunctionError(
            f"reward.custom_function.path={path!r} is not a .py file; put {name!r} in a Python source file"
        )
    module = _import_file(path)
    if not hasattr(module, name):
        # Only what the file itself defines: imported helpers (e.g. `dataclass`) are not candidates.
        public = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value)
            and not attr.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        )
        raise CustomFunctionError(
            f"reward.custom_function.name={name!r} is not defined in {path}; the public callables it "
            f"defines are {public}. Set reward.custom_function.name to one of them."
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise CustomFunctionError(
            f"reward.custom_function.name={name!r} in {path} is not callable (it is {fn!r:.80}, of type "
            f"{type(fn).__name__}); point it at a function such as compute_score(data_source, "
            f"solution_str, ground_truth, extra_info=None)"
        )
    kwargs = dict(reward_kwargs or {})
    clash = sorted(set(kwargs) & set(STANDARD_ARGUMENTS))
    if clash:
        raise CustomFunctionError(
            f"reward.custom_function.reward_kwargs sets {', '.join(clash)}, which every call passes itself "
            f"(per sample); leave {'it' if len(clash) == 1 else 'them'} out of reward_kwargs"
        )
    try:  # called as verl's reward managers call it: by keyword (a positional call misassigns other orders)
        inspect.signature(fn).bind(data_source="", solution_str="", ground_truth=None, extra_info=None)
    except TypeError as e:
        raise CustomFunctionError(
            f"reward.custom_function {path}:{name}{inspect.signature(fn)} cannot be called as "
            f"{name}(data_source=..., solution_str=..., ground_truth=..., extra_info=...), the keywords verl "
            f"and lucidrl pass ({e}); name its parameters so (in any order; extra_info may default to None), "
            "or take **kwargs"
        ) from e
    except ValueError:  # no signature to read (a builtin): the call says whether it fits
        return functools.partial(fn, **kwargs) if kwargs else fn
    if not kwargs:
        return fn
    try:
        inspect.signature(fn).bind(
            data_source="", solution_str="", ground_truth=None, extra_info=None, **kwargs
        )
    except TypeError as e:
        raise CustomFunctionError(
            f"reward.custom_function {path}:{name}{inspect.signature(fn)} does not take "
            f"reward.custom_function.reward_kwargs={kwargs} ({e}); add the parameter(s) to the function, "
            "or remove them from reward_kwargs"
        ) from e
    return functools.partial(fn, **kwargs)


def _import_file(path: str) -> Any:
    """Import a .py file as a fresh module registered in sys.modules (so dataclasses and pickling work)."""
    abspath = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(abspath))[0]
    digest = hashlib.sha1(abspath.encode()).hexdigest()[:10]
    module_name = f"lucidrl_custom_reward_{''.join(c if c.isalnum() else '_' for c in stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, abspath)
    if spec is None or spec.loader is None:
        raise CustomFunctionError(f"cannot import reward.custom_function.path={path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise CustomFunctionError(
            f"importing reward.custom_function.path={path!r} failed with {type(exc).__name__}: {exc}"
        ) from exc
    return module


def normalize_reward_output(
    value: Any, *, data_source: str, index: int, text_extras: set[str] | None = None
) -> tuple[float, dict[str, float]]:
    """(score, extra metrics) from a reward function's return value for sample `index` of `data_source`.

    With `text_extras` (a set the caller keeps), an extra that is text or None (verl's math_dapo returns
    its parsed answer as "pred") is not a metric: its key is added to the set and left out, for the
    caller to say so. Without it, such an extra is an error.
    """
    if isinstance(value, Mapping):
        if "score" not in value:
            raise _error(
                value, data_source, index, f"the dict has no 'score' key (keys: {sorted(map(str, value))})"
            )
        score = _finite_float(value["score"], value, data_source, index, "its 'score'")
        extras: dict[str, float] = {}
        for key, metric in value.items():
            if key == "score":
                continue
            if not isinstance(key, str):
                raise _error(value, data_source, index, f"extra metric key {key!r} is not a string")
            if text_extras is not None and (metric is None or isinstance(metric, (str, bytes))):
                text_extras.add(key)
                continue
            extras[key] = _finite_float(metric, value, data_source, index, f"extra metric {key!r}")
        return score, extras
    return _finite_float(value, value, data_source, index, "the score"), {}


def _finite_float(x: Any, whole: Any, data_source: str, index: int, what: str) -> float:
    """`x` as a finite float (a Python, numpy or 0-d torch boolean is 1.0 or 0.0, as verl takes `pred == gt`);
    RewardOutputError for strings, non-numbers, NaN and infinities."""
    if _is_bool(x):
        try:
            return 1.0 if bool(x) else 0.0
        except (TypeError, ValueError, RuntimeError) as exc:  # an array of booleans has no one truth value
            raise _error(whole, data_source, index, f"{what} is not one boolean ({exc})") from exc
    if isinstance(x, (str, bytes)) or not hasattr(type(x), "__float__"):
        raise _error(whole, data_source, index, f"{what} is a {type(x).__name__}, not a number")
    try:
        result = float(x)
    except (TypeError, ValueError, RuntimeError) as exc:  # e.g. a tensor with more than one element
        raise _error(whole, data_source, index, f"{what} cannot be turned into one float ({exc})") from exc
    if not math.isfinite(result):
        raise _error(whole, data_source, index, f"{what} is {result}")
    return result


def _is_bool(x: Any) -> bool:
    """True for Python, numpy and torch booleans (checked without importing numpy or torch)."""
    if isinstance(x, bool) or type(x).__name__ in ("bool_", "bool8"):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and "bool" in str(dtype)


def _error(value: Any, data_source: str, index: int, problem: str) -> RewardOutputError:
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:197] + "..."
    return RewardOutputError(
        f"reward function for data_source {data_source!r} returned {shown} for sample {index}: {problem}. "
        f"Expected {_EXPECTED_OUTPUT}, e.g. 1.0 or {{'score': 1.0, 'acc': 1.0}}."
    )
