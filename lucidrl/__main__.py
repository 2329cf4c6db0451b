"""`python -m lucidrl` runs the `lucidrl` command."""

import sys

from lucidrl.cli import entry

sys.exit(entry())
