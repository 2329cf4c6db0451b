"""Typed configuration: the schema and its loader."""

from lucidrl.config.loader import (
    ConfigError,
    config_from_dict,
    load_config,
    parse_override,
    to_dict,
    validate,
)
from lucidrl.config.schema import LucidConfig

__all__ = [
    "ConfigError",
    "LucidConfig",
    "config_from_dict",
    "load_config",
    "parse_override",
    "to_dict",
    "validate",
]
