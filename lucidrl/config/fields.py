"""What the schema's annotations say about a key: its type, its ranges, every key's dotted name."""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from lucidrl.config.errors import RangeError
from lucidrl.config.schema import Range


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """A dataclass's field annotations with their Annotated ranges kept (evaluated once per class)."""
    return get_type_hints(cls, include_extras=True)


def split_ranges(hint: Any) -> tuple[Any, list[Range]]:
    """(the type, its ranges) of an annotation: Annotated[int, Range(">= 1")] -> (int, [Range])."""
    if get_origin(hint) is Annotated:
        base, *meta = get_args(hint)
        return base, [m for m in meta if isinstance(m, Range)]
    return hint, []


def range_error(key: str, source: str, rng: Range, value: Any) -> RangeError:
    why = f" ({rng.why})" if rng.why else ""
    return RangeError(f"config key '{key}' (from {source}) must be {rng.text()}{why}, got {value!r}")


def all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        hint = field_hints(cls)[f.name]
        full = f"{prefix}{f.name}"
        keys.append(full)
        if dataclasses.is_dataclass(hint):
            keys.extend(all_keys(hint, full + "."))
    return keys


def type_name(hint: Any) -> str:
    base, ranges = split_ranges(hint)
    if ranges:
        return " ".join([type_name(base)] + [r.text() for r in ranges if r.spec != "any"])
    if get_origin(hint) is Literal:
        return " | ".join(repr(a) for a in get_args(hint))
    if get_origin(hint) is list and get_args(hint):
        return f"list of {type_name(get_args(hint)[0])}"
    if get_origin(hint) in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in get_args(hint))
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
