"""YAML 1.2 core scalars, as OmegaConf and Hydra users expect, for config files and `key=value` overrides."""

from __future__ import annotations

import re
from typing import Any

import yaml

from lucidrl.config.errors import ConfigError


class CoreLoader(yaml.SafeLoader):
    """YAML with YAML 1.2's core schema for plain scalars, as OmegaConf users expect: `true`/`false`
    only are booleans (1.1 also made `yes`, `no`, `on` and `off` booleans: `trainer.logger=yes` was
    ['True']), integers are decimal, 0o or 0x (1.1 read `012` as 10 and `1:30` as 90), and `1e-4` is a
    float (1.1 needs a dot), so a quoted '1e-4' stays the string it was written as."""


CoreLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx)
        for tag, rx in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
CoreLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
CoreLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
CoreLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)


def _construct_core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 16) if text.startswith("0x") else int(text, 10)


def _construct_core_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).lower()
    if text.endswith("inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    return float("nan") if text == ".nan" else float(text)


CoreLoader.add_constructor("tag:yaml.org,2002:int", _construct_core_int)
CoreLoader.add_constructor("tag:yaml.org,2002:float", _construct_core_float)


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` → ("a.b", parsed value), parsing the value as YAML 1.2 core (8, 1e-4, true, [a, b],
    null). A value with a `#` in it is the text as written, unless it is a list or mapping: YAML would
    read `run #2` as `run` and a comment."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value (e.g. rollout.n=8)")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if not key or any(not part.strip() for part in key.split(".")):
        where = "nothing before '='" if not key else f"an empty part in {key!r}"
        raise ConfigError(
            f"override '{text}' has an empty key ({where}): write it as key=value with the whole dotted key, "
            f"e.g. actor.optim.lr={raw.strip() or '1e-6'} (--help-config lists every key)"
        )
    if "#" in raw and not raw.strip().startswith(("[", "{")):
        return key, raw
    try:
        value = yaml.load(raw, Loader=CoreLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


class UniqueKeyLoader(CoreLoader):
    """CoreLoader for config files, where a key given twice in one mapping is an error: with
    yaml.safe_load the last one silently won (`actor:` twice in a file dropped the first section's keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice in one mapping (lines {seen[key]} and {line}); merge them "
                    "into one (the second replaced the first)",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)
