"""The errors a config raises: each names the key, the value, where it came from and what to write."""

from __future__ import annotations

from lucidrl.diagnostics.errors import UserError


class ConfigError(UserError, ValueError):
    """A config value that cannot mean what the user intended."""


class RangeError(ConfigError):
    """A number of the right type outside its key's Range (schema.py)."""
