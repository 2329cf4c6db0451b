"""The configuration reference, generated from the schema: every key, its type and range, default and doc.

A key's doc is the comment written beside its field in schema.py (the lines just above it, and the
one at the end of its line), or, for a section, its dataclass's docstring: the schema stays the one
place a key is documented, and docs/reference/configuration.md is rebuilt from it
(`python -m lucidrl.config.reference OUT.md`; a test fails when the page is stale).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any

import yaml

from lucidrl.config import schema
from lucidrl.config.fields import field_hints, type_name
from lucidrl.config.schema import LucidConfig, SFTConfig


def _field_comments() -> dict[tuple[str, str], str]:
    """(dataclass name, field name) -> the comment lines above the field and on its line, joined."""
    source = inspect.getsource(schema)
    lines = source.splitlines()
    docs: dict[tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
                continue
            above: list[str] = []
            i = item.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            # the comment after the field's last line (a field may span lines)
            end = lines[item.end_lineno - 1]
            trailing = end.split("  # ", 1)[1].strip() if "  # " in end else ""
            text = " ".join(part for part in (" ".join(above), trailing) if part)
            docs[(node.name, item.target.id)] = text
    return docs


@dataclasses.dataclass
class KeyDoc:
    key: str
    type: str
    default: str
    doc: str


def _default_text(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    elif isinstance(value, dict):
        value = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in value.items()}
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def key_docs(root: type = LucidConfig) -> list[tuple[str, str, list[KeyDoc]]]:
    """Per section (dotted prefix, its doc): the keys in schema order, with type, default and doc."""
    comments = _field_comments()
    sections: list[tuple[str, str, list[KeyDoc]]] = []

    def walk(obj: Any, prefix: str, doc: str) -> None:
        keys: list[KeyDoc] = []
        sections.append((prefix.rstrip("."), doc, keys))
        hints = field_hints(type(obj))
        for f in dataclasses.fields(obj):
            value, hint = getattr(obj, f.name), hints[f.name]
            text = comments.get((type(obj).__name__, f.name), "")
            if dataclasses.is_dataclass(hint):
                own = inspect.getdoc(hint) or ""
                if own.startswith(f"{hint.__name__}("):  # the dataclass's generated signature, not a doc
                    own = ""
                walk(value, f"{prefix}{f.name}.", " ".join(p for p in (text, own) if p))
                continue
            keys.append(KeyDoc(f"{prefix}{f.name}", type_name(hint), _default_text(value), text))

    walk(root(), "", "")
    return [s for s in sections if s[2]]


def undocumented(root: type = LucidConfig) -> list[str]:
    """Keys without a doc: each should say what it means, in a comment beside its field."""
    return [k.key for _, _, keys in key_docs(root) for k in keys if not k.doc]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """The configuration reference page, as Markdown."""
    out = [
        "# Configuration reference",
        "",
        "Every key of `lucidrl train` (and, below, of `lucidrl sft`): its type and the values it may take,",
        "its default, and what it means. Set keys in a YAML file or on the command line as `key=value`",
        "(`rollout.n=8`); `lucidrl train --help-config` prints the same list. This page is generated from",
        "`lucidrl/config/schema.py` by `python -m lucidrl.config.reference docs/reference/configuration.md`.",
        "",
    ]
    for title, root in (("lucidrl train", LucidConfig), ("lucidrl sft", SFTConfig)):
        out += [f"## {title}", ""]
        for section, doc, keys in key_docs(root):
            if section:
                out += [f"### `{section}`", ""]
                if doc:
                    out += [doc, ""]
            out += ["| key | type | default | meaning |", "|---|---|---|---|"]
            for k in keys:
                out.append(f"| `{k.key}` | {_cell(k.type)} | `{_cell(k.default)}` | {_cell(k.doc)} |")
            out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lucidrl.config.reference OUT.md", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(reference_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
