"""The base of the exception types that mean "the user gave us something we cannot use".

The command line prints such an error's message alone (LUCIDRL_DEBUG=1 adds the traceback), and
`lucidrl doctor` reports it as the check's failure. Each type is defined beside the code that raises it
(ConfigError in config/errors.py, DatasetError in data/dataset.py, ...) and derives from UserError as
well as from the builtin it always was (ValueError, RuntimeError), so `except ValueError` still catches
it. A base class rather than a list of types: importing this module imports nothing, so commands that
need no torch (`lucidrl version`, `data`, `report`) do not wait seconds for it.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, data file, model folder, reward output, checkpoint): the message says what to do."""


class UsageError(UserError, ValueError):
    """A command-line argument that cannot mean what was asked."""
