"""The vocabulary of the verl translation table (verl_table.py): a row, and what a row's value becomes.

A row names a verl key (or a pattern of keys: `*` is one dotted component, a trailing `**` any
number of them) and says what lucidrl does with it:

- `map`: sets a lucidrl key, the value as written or turned by the row's `convert`;
- `note`: accepted with a printed reason, nothing set (no meaning on this machine, or lucidrl's
  behaviour already);
- `refuse`: the run stops before it starts, saying why ("GPU-only", "not built yet") and the lucidrl
  key to write instead where there is one.

A converter takes the value and the `Context` (every override given, the number of ranks, whether
runs go to a GPU) and returns the lucidrl value, `Value(value, why)` to print a reason beside it,
`Sets(...)` for several lucidrl keys, `Noted(why)` to accept without setting anything, or raises
`Refused(why)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["map", "note", "refuse"]
MISSING: Any = type("_Missing", (), {"__repr__": lambda self: "MISSING"})()

GPU_ONLY = "GPU-only"
NOT_BUILT = "not built yet"


class Refused(Exception):
    """A converter cannot honour a value: `why` starts with its category (GPU-only, not built yet)."""

    def __init__(self, why: str, lucidrl: str | None = None):
        super().__init__(why)
        self.why = why
        self.lucidrl = lucidrl


@dataclass(frozen=True)
class Value:
    """A lucidrl value with the reason it differs from the verl value as written."""

    value: Any
    why: str = ""


@dataclass(frozen=True)
class Sets:
    """Several lucidrl keys from one verl key."""

    pairs: tuple[tuple[str, Any], ...]
    why: str = ""


@dataclass(frozen=True)
class Noted:
    """Accepted, nothing set; `why` is printed."""

    why: str


@dataclass(frozen=True)
class Context:
    """What a converter may look at beyond its own value."""

    values: Mapping[str, Any]  # every verl override given, by verl key (the last one for a key given twice)
    world: int = 1  # ranks: trainer.nnodes x trainer.n_gpus_per_node as given (1 when not given)
    cuda: bool = False  # runs go to a GPU (verl's trainer.device, or this machine's default)

    def given(self, key: str) -> bool:
        return key in self.values


Converter = Callable[[Any, Context], Any]


@dataclass(frozen=True)
class Row:
    """One verl key or key pattern and what lucidrl does with it."""

    verl: str
    lucidrl: str | None = None  # the lucidrl key it sets (map), or the one to write instead (refuse)
    kind: Kind = "map"
    why: str = ""  # printed beside the key: what differs (map), why nothing is set (note/refuse)
    convert: Converter | None = None
    # verl's default: where the override equals it, a refuse row (or a map row whose lucidrl key is not
    # built yet) is accepted as a note, since the run means what it would without the line
    default: Any = MISSING
    category: str = ""  # refuse rows: GPU_ONLY or NOT_BUILT

    def matches(self, key: str) -> str | None:
        """The tail matched by a trailing `**` ("" for a plain match), or None when `key` is not this row's."""
        want, have = self.verl.split("."), key.split(".")
        if want[-1] == "**":
            head = want[:-1]
            if len(have) <= len(head) or not _same(head, have[: len(head)]):
                return None
            return ".".join(have[len(head) :])
        return "" if len(want) == len(have) and _same(want, have) else None

    def target(self, tail: str) -> str | None:
        """The lucidrl key, with `{rest}` replaced by what `**` matched."""
        if self.lucidrl is None:
            return None
        return self.lucidrl.replace("{rest}", tail)


def _same(pattern: list[str], parts: list[str]) -> bool:
    return all(p == "*" or p == k for p, k in zip(pattern, parts, strict=True))


# -- row constructors -----------------------------------------------------------------------------------


def Map(
    verl: str, lucidrl: str, why: str = "", convert: Converter | None = None, default: Any = MISSING
) -> Row:  # noqa: N802
    return Row(verl, lucidrl, "map", why, convert, default)


def Note(verl: str, why: str) -> Row:  # noqa: N802
    return Row(verl, None, "note", why)


def Refuse(  # noqa: N802
    verl: str, why: str, *, lucidrl: str | None = None, default: Any = MISSING, gpu: bool = False
) -> Row:
    """Refused unless the value is verl's `default` (then noted: the line changes nothing)."""
    return Row(verl, lucidrl, "refuse", why, None, default, GPU_ONLY if gpu else NOT_BUILT)
