"""Typed configuration: the schema and its loader."""

from lucidrl.config.loader import (
    ConfigError,
    config_from_dict,
    load_config,
    parse_override,
    to_dict,
    validate,
)
from lucidrl.config.schema import LucidConfig, SFTConfig

__all__ = [
    "ConfigError",
    "LucidConfig",
    "SFTConfig",
    "config_from_dict",
    "load_config",
    "parse_override",
    "to_dict",
    "validate",
]
