"""Name -> function registries for advantage estimators and policy losses.

Configs name an algorithm by string (`adv_estimator: grpo`, `policy_loss: vanilla`); these registries
turn the string into the function and, for a typo, say which names exist and which one was probably
meant. Add an algorithm by decorating a top-level function:

    @register_advantage_estimator("my_estimator")
    def compute_my_advantage(token_level_rewards, response_mask, ...): ...
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class _Registry:
    """One name -> function table; `kind` is what the error messages call its entries."""

    def __init__(self, kind: str, decorator_name: str) -> None:
        self.kind = kind
        self.decorator_name = decorator_name
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            existing = self._fns.get(name)
            # Re-registering the same function (e.g. a module re-import) is harmless; a different one
            # under a taken name would silently change what configs mean.
            if existing is not None and _qualname(existing) != _qualname(fn):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered to {_qualname(existing)}; "
                    f"cannot register {_qualname(fn)} under the same name — pick another name"
                )
            self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> Callable[..., Any]:
        fn = self._fns.get(name)
        if fn is not None:
            return fn
        names = self.names()
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"Unknown {self.kind} {name!r}.{hint} Registered: {names}. "
            f"To add one, decorate a function with @{self.decorator_name}({name!r})."
        )

    def names(self) -> list[str]:
        return sorted(self._fns)


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


_ADVANTAGE_ESTIMATORS = _Registry("advantage estimator", "register_advantage_estimator")
_POLICY_LOSSES = _Registry("policy loss", "register_policy_loss")
# policy losses that aggregate one way whatever actor.loss_agg_mode says (verl: sapo, geo_mean)
_LOSS_AGG_OF: dict[str, str] = {}
# policy losses in which a sample whose advantages are all 0 has no gradient and changes no other
# sample's term (actor.skip_zero_advantage may leave it out of the update's forwards)
_ZERO_ADVANTAGE_INERT: set[str] = set()


def register_advantage_estimator(name: str) -> Callable[[F], F]:
    """Decorator registering an advantage estimator under `name` (the `adv_estimator` config value)."""
    return _ADVANTAGE_ESTIMATORS.register(name)


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as `name`; ValueError listing the registered names if none."""
    return _ADVANTAGE_ESTIMATORS.get(name)


def list_advantage_estimators() -> list[str]:
    """Sorted names of all registered advantage estimators."""
    return _ADVANTAGE_ESTIMATORS.names()


def register_policy_loss(
    name: str, loss_agg_mode: str | None = None, zero_advantage_inert: bool = False
) -> Callable[[F], F]:
    """Decorator registering a policy loss under `name` (the `policy_loss` config value).

    `loss_agg_mode`: the aggregation the loss always uses (SAPO's and GMPO's are per sequence); the
    config loader then asks for the same actor.loss_agg_mode, so the entropy and KL terms and the
    micro-batch weights aggregate as the policy loss does.
    `zero_advantage_inert`: each sample's term is its own (no statistic over the batch) and is 0, with
    a zero gradient, where its advantages are 0, on-policy or not; then an update may leave such
    samples out of its forwards and keep their count in the aggregation (actor.skip_zero_advantage).
    """
    if loss_agg_mode is not None:
        _LOSS_AGG_OF[name] = loss_agg_mode
    if zero_advantage_inert:
        _ZERO_ADVANTAGE_INERT.add(name)
    return _POLICY_LOSSES.register(name)


def policy_loss_zero_advantage_inert(name: str) -> bool:
    """Whether the policy loss `name` was registered with zero_advantage_inert=True."""
    return name in _ZERO_ADVANTAGE_INERT


def policy_loss_agg_mode(name: str) -> str | None:
    """The aggregation mode the policy loss `name` always uses, or None when it honours actor.loss_agg_mode."""
    return _LOSS_AGG_OF.get(name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as `name`; ValueError listing the registered names if none."""
    return _POLICY_LOSSES.get(name)


def list_policy_losses() -> list[str]:
    """Sorted names of all registered policy losses."""
    return _POLICY_LOSSES.names()
