"""Typed configuration: the schema, reading it from YAML and overrides, and validating it."""

from lucidrl.config.errors import ConfigError
from lucidrl.config.loader import config_from_dict, load_config
from lucidrl.config.parsing import describe_keys, flat_keys, parse_override, to_dict
from lucidrl.config.schema import LucidConfig, SFTConfig
from lucidrl.config.validation import missing_logger_packages, validate

__all__ = [
    "ConfigError",
    "LucidConfig",
    "SFTConfig",
    "config_from_dict",
    "describe_keys",
    "flat_keys",
    "load_config",
    "missing_logger_packages",
    "parse_override",
    "to_dict",
    "validate",
]
