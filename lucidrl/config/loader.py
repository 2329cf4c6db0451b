"""Load the typed config from YAML plus dotted `key=value` overrides, refusing what it cannot mean.

Reading checks each value against its field (parsing.py); validation checks the tree as a whole
(validation.py): a config that loads is one that can run as written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lucidrl.config.parsing import apply_dict, parse_config
from lucidrl.config.schema import LucidConfig
from lucidrl.config.validation import validate

T = TypeVar("T")


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    schema: type[T] = LucidConfig,
    *,
    verl: bool | None = None,
    echo: Callable[[str], None] | None = print,
) -> T:
    """The config (of `schema`: the RL run's by default) from a YAML file plus `key=value` overrides, validated.

    A verl command line (`verl=True`, or None and one is recognised) is translated (config/verl.py) and the
    translation passed to `echo` (printed by default; None: kept quiet)."""
    cfg = parse_config(path, overrides, schema, verl=verl, echo=echo)
    validate(cfg)
    return cfg


def config_from_dict(data: dict[str, Any], source: str = "dict", schema: type[T] = LucidConfig) -> T:
    """The config from a nested dict (tests, notebooks), validated like a file."""
    cfg = schema()
    apply_dict(cfg, data, source)
    validate(cfg)
    return cfg
