"""Read a config tree from YAML and dotted `key=value` overrides, each value checked against its field.

Every value is checked against the dataclass field it lands in: an unknown key names the closest
valid key, a wrong type names the key, the value and where it came from (file or command line).
The reverse too: a config as plain dicts, dotted keys, and one line per key for --help-config.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from lucidrl.config.errors import ConfigError, RangeError
from lucidrl.config.fields import all_keys, field_hints, range_error, split_ranges, type_name
from lucidrl.config.schema import LucidConfig, SFTConfig
from lucidrl.config.values import UniqueKeyLoader, parse_override
from lucidrl.config.verl import looks_like_verl, translate_or_raise, verl_row

T = TypeVar("T")


# keys an earlier release had, and what to write now
RENAMED = {
    "trainer.checkpoint_freq": "trainer.save_freq (`lucidrl sft` now saves the full training state and "
    "resumes, with the same keys as `lucidrl train`)",
    "actor.reuse_rollout_log_probs": "actor.on_policy_skip_old_log_prob (on-policy updates now take the old "
    "log-probs from their own forward, detached, in any precision and with any rollout engine)",
}


# verl's keys whose meaning lucidrl has under another name
VERL_KEYS = {
    "rollout.multi_turn.max_assistant_turns": "rollout.multi_turn.max_turns",
    "rollout.multi_turn.max_user_turns": "rollout.multi_turn.max_turns (it counts assistant turns; each is "
    "answered by at most one round of tool or environment messages)",
    "rollout.multi_turn.max_tool_response_length": "rollout.multi_turn.max_tool_response_tokens (tokens, "
    "where verl counts characters)",
    "rollout.multi_turn.tool_config_path": "rollout.multi_turn.tools (tool names or module:function paths; "
    "a function's docstring or tool_schema attribute is its schema)",
    "rollout.multi_turn.interaction_config_path": "rollout.multi_turn.environment (a name or module:Class)",
}


def _unknown_key_error(key: str, source: str, root: type) -> ConfigError:
    if key in RENAMED and key not in all_keys(root):
        return ConfigError(f"config key '{key}' (from {source}) is gone: write {RENAMED[key]}")
    if key in VERL_KEYS and key not in all_keys(root):
        return ConfigError(f"config key '{key}' (from {source}) is verl's; lucidrl's is {VERL_KEYS[key]}")
    known = all_keys(root)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    if not close:  # try the last component alone: `rollout.temprature` vs `temperature`
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in known}
        hit = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
        close = [by_leaf[hit[0]]] if hit else []
    command = "sft" if root is SFTConfig else "train"
    found = verl_row(key) if root is LucidConfig else None
    if found is not None:
        row, _ = found
        ours = f" (lucidrl: {row.lucidrl.split('|')[0]})" if row.kind == "map" and row.lucidrl else ""
        return ConfigError(
            f"config key '{key}' (from {source}) is a verl key{ours}: lucidrl reads verl command lines with "
            "`lucidrl train --verl ...`, or by itself when they hold actor_rollout_ref.* keys (docs/migration.md)"
        )
    hint = (
        f"; did you mean '{close[0]}'?" if close else f"; see `lucidrl {command} --help-config` for every key"
    )
    return ConfigError(f"unknown config key '{key}' (from {source}){hint}")


def _coerce(value: Any, hint: Any, key: str, source: str, top: bool = True) -> Any:
    """Check `value` against the annotation `hint`; return it (ints widen to float). `top`: the value of
    a key itself, not an item inside one (only there does a string stand for a one-item list)."""
    if isinstance(value, float) and math.isnan(value):  # passes every `x <= 0` check, and means nothing
        raise ConfigError(f"config key '{key}' (from {source}) must be a number, got NaN")
    base, ranges = split_ranges(hint)
    if ranges:
        out = _coerce(value, base, key, source, top)
        for rng in ranges:
            if not rng.holds(out):
                raise range_error(key, source, rng, value)
        return out
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return _coerce(value, opt, key, source, top)
            except RangeError:  # the type fits, the value does not: say which range
                raise
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"config key '{key}' (from {source}) must be {type_name(hint)}, got {value!r}")
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise ConfigError(
                f"config key '{key}' (from {source}) must be one of {', '.join(map(repr, allowed))}, got {value!r}"
            )
        return value
    if origin is dict:
        key_type, value_type = get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' (from {source}) must be a mapping, got {value!r}")
        out = {}
        for k, v in value.items():
            if dataclasses.is_dataclass(value_type):
                item = value_type()
                _apply(item, v if v is not None else {}, f"{key}.{k}.", source, root=value_type)
                out[str(k)] = item
            else:
                out[str(k)] = _coerce(v, value_type, f"{key}.{k}", source, top=False)
        return out
    if origin is list:
        (item,) = get_args(hint) or (Any,)
        if top and isinstance(value, str) and item is str:
            # `data.train_files=a.parquet` means a one-element list; inside a list it does not
            # (`placement.colocate=[actor, rollout]` made each role a group of its own)
            value = [value]
        if not isinstance(value, (list, tuple)):
            hint_text = "" if top else " (a list of lists: write [[a, b]])"
            raise ConfigError(f"config key '{key}' (from {source}) must be a list, got {value!r}{hint_text}")
        return [_coerce(v, item, f"{key}[{i}]", source, top=False) for i, v in enumerate(value)]
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' (from {source}) must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}' (from {source}) must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' (from {source}) must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(
                f"config key '{key}' (from {source}) must be a string, got {value!r}; quote it in YAML"
            )
        return value
    raise ConfigError(f"config key '{key}' has an unsupported type {hint!r}")  # a schema bug


def _apply(obj: Any, data: dict[str, Any], prefix: str, source: str, root: type | None = None) -> None:
    root = root or type(obj)
    if not isinstance(data, dict):
        raise ConfigError(
            f"config section '{prefix.rstrip('.') or '<root>'}' (from {source}) must be a mapping"
        )
    hints = field_hints(type(obj))
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in hints:
            raise _unknown_key_error(key, source, root)
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(
                    f"config key '{key}' (from {source}) is a section; give it a mapping, not {value!r}"
                )
            _apply(getattr(obj, name), value, key + ".", source, root)
        else:
            setattr(obj, name, _coerce(value, hint, key, source))


def _nest(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def parse_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    schema: type[T] = LucidConfig,
    *,
    verl: bool | None = None,
    echo: Callable[[str], None] | None = None,
) -> T:
    """The config (of `schema`: the RL run's by default) from a YAML file plus `key=value` overrides, each value
    checked against its field as it is read; the cross-field checks are validation.py's (loader.load_config).

    `verl`: read the overrides as a verl command line (lucidrl/config/verl.py); None: when they look like one
    (an `actor_rollout_ref.*` key, ...). `echo` receives the printed translation."""
    cfg = schema()
    items = list(overrides or [])
    if verl or (verl is None and schema is LucidConfig and looks_like_verl(items)):
        if schema is not LucidConfig:
            raise ConfigError(
                "verl command lines are read by `lucidrl train`; `lucidrl sft` takes lucidrl keys"
            )
        translation = translate_or_raise(items, from_file=path is not None)
        if echo is not None:
            echo(translation.describe())
        assignments = translation.assignments
    else:
        assignments = [_lucid_override(text, schema) for text in items]
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(
                f"config file '{path}' is a directory; give the YAML file in it (e.g. {path / 'config.yaml'})"
            )
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) or {}
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"config file '{path}' is not text ({e.reason} at byte {e.start}): a config is a YAML text file; "
                "was another file (a checkpoint, a parquet or model file) given in its place?"
            ) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file '{path}' is not valid YAML: {e}") from e
        _apply(cfg, data, "", f"file {path}")
    # verl's defaults (first among a verl command line's assignments) stand in for a file, so they come
    # after one only when there is none
    for key, value, source in assignments:
        if not _set_inside_dict(cfg, key, value, source):
            _apply(cfg, _nest(key, value), "", source)
    return cfg


def _lucid_override(text: str, schema: type) -> tuple[str, Any, str]:
    """(key, value, source) of one lucidrl override; `~key` (Hydra's delete) puts the key's default back."""
    source = f"command-line override '{text}'"
    if text.strip().startswith("~"):
        key = text.strip().lstrip("~").split("=", 1)[0]
        node: Any = schema()
        for part in key.split("."):
            if not (dataclasses.is_dataclass(node) and hasattr(node, part)):
                raise _unknown_key_error(key, source, schema)
            node = getattr(node, part)
        return key, _asdict(node), source
    key, value = parse_override(text)
    return key, value, source


def _deep_merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out = dict(old)
    for k, v in new.items():
        out[k] = _deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def _set_inside_dict(cfg: Any, key: str, value: Any, source: str) -> bool:
    """An override that names a key inside a mapping-valued field (`placement.pools.global.nodes=1`,
    `reward.custom_function.reward_kwargs.x=2`) changes that key alone: the mapping's other keys, and
    the entry's other fields, keep what the defaults, the file or earlier overrides gave them. (Applied
    as a nested mapping, it replaced the whole field: `placement.pools.global.devices_per_node=2
    placement.pools.global.nodes=1` meant one device.) Returns False for any other key, which _apply
    then sets (or reports as unknown)."""
    parts = key.split(".")
    node, prefix = cfg, ""
    for i, name in enumerate(parts[:-1]):
        if not dataclasses.is_dataclass(node):
            return False
        hints = field_hints(type(node))
        if name not in hints:
            return False
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            node, prefix = getattr(node, name), f"{prefix}{name}."
            continue
        if get_origin(hint) is not dict:
            return False
        field_key, (_, value_type) = f"{prefix}{name}", get_args(hint)
        current = dict(getattr(node, name) or {})
        sub, rest = parts[i + 1], parts[i + 2 :]
        if dataclasses.is_dataclass(value_type):
            # a named field of an existing entry changes alone; the entry itself (no field): replaced
            item = copy.deepcopy(current[sub]) if rest and sub in current else value_type()
            data = _nest(".".join(rest), value) if rest else value
            _apply(item, data if data is not None else {}, f"{field_key}.{sub}.", source, root=value_type)
            current[sub] = item
        else:
            old = current.get(sub)
            data = (
                _deep_merge(old if isinstance(old, dict) else {}, _nest(".".join(rest), value))
                if rest
                else value
            )
            current[sub] = _coerce(data, value_type, f"{field_key}.{sub}", source)
        setattr(node, name, current)
        return True
    return False


def apply_dict(cfg: Any, data: dict[str, Any], source: str) -> None:
    """Set the keys of a nested dict on a config tree, each checked against its field."""
    _apply(cfg, data, "", source)


def flat_keys(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as dotted keys: {"actor": {"optim": {"lr": 1}}} -> {"actor.optim.lr": 1}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for the run directory's config.yaml)."""
    return dataclasses.asdict(cfg)


def describe_keys(schema: type = LucidConfig) -> list[str]:
    """One line per config key of `schema`: `key = default  (type)`, in schema order (--help-config)."""
    lines: list[str] = []

    def walk(obj: Any, prefix: str) -> None:
        hints = field_hints(type(obj))
        for f in dataclasses.fields(obj):
            value, hint, key = getattr(obj, f.name), hints[f.name], f"{prefix}{f.name}"
            if dataclasses.is_dataclass(hint):
                walk(value, key + ".")
                continue
            shown = _asdict(value)
            lines.append(
                f"{key} = {yaml.safe_dump(shown, default_flow_style=True).strip().removesuffix('...').strip()}  ({type_name(hint)})"
            )

    walk(schema(), "")
    return lines


def _asdict(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _asdict(v) for k, v in value.items()}
    return value
