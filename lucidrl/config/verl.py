"""verl command lines for `lucidrl train`: Hydra overrides translated key by key through verl_table.py.

`lucidrl train actor_rollout_ref.model.path=... data.train_files=...` (any `actor_rollout_ref.*` or
`custom_reward_function.*` key, or `lucidrl train --verl`) reads its overrides as verl's: `+key=value`,
`++key=value`, `~key` and Hydra's value syntax. Each key is translated to a lucidrl key, accepted with
a printed note (no meaning on this machine, or lucidrl's behaviour already), or refused with the
reason; the run starts only when nothing is refused, and the whole translation is printed once,
"verl key -> lucidrl key". Without a config file, verl's defaults where lucidrl's differ come first
(a verl command line means verl's base config).

`python -m lucidrl.config.verl_docs --write-docs docs/migration.md` renders the table into that page.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, get_origin

from lucidrl.config.errors import ConfigError
from lucidrl.config.fields import all_keys, field_hints
from lucidrl.config.schema import LucidConfig
from lucidrl.config.values import parse_override
from lucidrl.config.verl_rows import MISSING, NOT_BUILT, Context, Noted, Refused, Row, Sets, Value
from lucidrl.config.verl_table import FOLLOWS, ROWS, SMALLEST_WINS, VERL_DEFAULTS

# top-level keys only verl has: one of them makes a command line verl's
VERL_ROOTS = (
    "actor_rollout_ref",
    "custom_reward_function",
    "reward_manager",
    "ray_kwargs",
    "ray_init",
    "global_profiler",
    "transfer_queue",
    "hydra",
)
_KEY = re.compile(r"[A-Za-z_][\w\-@]*(?:\.[\w\-@]+)*")


@dataclass
class Line:
    """What became of one verl override."""

    given: str  # the override as written ("key=value")
    key: str
    status: str  # "translated", "accepted", "refused", "lucidrl" (a lucidrl key, passed through)
    result: str = ""  # "model.path=/x", or the reason it was accepted or refused
    why: str = ""
    derived: bool = False  # not on the command line: a verl default that follows a key that is (FOLLOWS)


@dataclass
class Translation:
    """The lucidrl assignments of a verl command line and one line per override saying what became of it."""

    lines: list[Line] = field(default_factory=list)
    assignments: list[tuple[str, Any, str]] = field(default_factory=list)  # (lucidrl key, value, source)
    # verl's defaults applied where lucidrl's differ (printed)
    defaults: list[tuple[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def refused(self) -> list[Line]:
        return [line for line in self.lines if line.status == "refused"]

    def status_of(self, key: str) -> str:
        """The status of the override of verl key `key` ("" when it was not given)."""
        return next((line.status for line in self.lines if line.key == key), "")

    def counts(self) -> dict[str, int]:
        """How many overrides of the command line were translated, accepted, refused or lucidrl keys."""
        out = {"translated": 0, "accepted": 0, "refused": 0, "lucidrl": 0}
        for line in self.lines:
            out[line.status] += not line.derived
        return out

    def describe(self) -> str:
        """The translation as printed at the start of a run: one line per override, then verl's defaults."""
        c = self.counts()
        parts = [f"{c['translated']} translated", f"{c['accepted']} accepted with a note"]
        if c["lucidrl"]:
            parts.append(f"{c['lucidrl']} lucidrl keys")
        if c["refused"]:
            parts.append(f"{c['refused']} refused")
        out = [
            f"lucidrl: a verl command line ({sum(c.values())} overrides: {', '.join(parts)}); verl key -> lucidrl key "
            "(docs/migration.md):"
        ]
        for line in self.lines:
            if line.status in ("translated", "lucidrl"):
                tail = f"  ({line.why})" if line.why else ""
                out.append(f"  {line.given} -> {line.result}{tail}")
            else:
                out.append(f"  {line.given} -> {line.status}: {line.result}")
        if self.defaults:
            shown = ", ".join(f"{k}={_show(v)}" for k, v in self.defaults)
            out.append(f"  verl's defaults where lucidrl's differ (no config file given): {shown}")
        out += [f"  {note}" for note in self.notes]
        return "\n".join(out)

    def refusal(self) -> str:
        lines = [
            f"this verl command line has {len(self.refused)} override(s) lucidrl cannot honour, so nothing ran; "
            "remove them (or change them as said) and run again (docs/migration.md lists every verl key):"
        ]
        lines += [f"  {line.given}: {line.result}" for line in self.refused]
        return "\n".join(lines)


def looks_like_verl(overrides: list[str]) -> bool:
    """Whether a command line is verl's: it names a key under a section only verl has (`+`/`~` alone do not
    make it one: lucidrl reads them too, and a verl command line brings verl's defaults)."""
    return any(
        text.split("=", 1)[0].strip().lstrip("+~").split(".", 1)[0] in VERL_ROOTS for text in overrides
    )


def verl_row(key: str) -> tuple[Row, str] | None:
    """The table row of verl key `key` and what its `**` matched, or None."""
    for row in ROWS:
        tail = row.matches(key)
        if tail is not None:
            return row, tail
    return None


def settable(key: str) -> bool:
    """Whether `key` is a lucidrl config key, or a key inside a mapping-valued one (reward_kwargs.x)."""
    node: Any = LucidConfig
    parts = key.split(".")
    for i, name in enumerate(parts):
        hints = field_hints(node)
        if name not in hints:
            return False
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            node = hint
            continue
        if get_origin(hint) is dict:
            return True
        return i == len(parts) - 1
    return False


def resolve_target(target: str | None) -> str | None:
    """The first of `a|b` alternatives that lucidrl has (None when none: not built yet)."""
    if target is None:
        return None
    return next((t for t in target.split("|") if settable(t)), None)


def _parse(text: str) -> tuple[str, str, Any]:
    """(op, key, value) of one Hydra override: op is "set" (key=v, +key=v, ++key=v) or "delete" (~key)."""
    body = text.strip()
    op = "delete" if body.startswith("~") else "set"
    body = body.lstrip("~+")
    key, eq, raw = body.partition("=")
    key = key.strip()
    if not _KEY.fullmatch(key):
        raise ConfigError(f"override {text!r} is not verl's key=value, +key=value or ~key")
    if op == "delete":
        return op, key, MISSING
    if not eq:
        raise ConfigError(f"override {text!r} has no value: write {key}=VALUE (or ~{key} to drop it)")
    if "${" in raw:
        raise ConfigError(
            f"override {text!r} holds a Hydra interpolation; lucidrl does not resolve them: write the value"
        )
    if _top_level_comma(raw):
        raise ConfigError(
            f"override {text!r} is a Hydra sweep (a value per comma, for --multirun); for a list write {key}=[{raw}]"
        )
    return op, key, parse_override(f"{key}={raw}")[1]


def _top_level_comma(raw: str) -> bool:
    depth, quote = 0, ""
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            return True
    return False


def _default_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def translate(overrides: list[str], *, from_file: bool = False, cuda: bool | None = None) -> Translation:
    """The lucidrl assignments of verl overrides; refused ones are listed on the Translation (`translate_or_raise`
    raises). `cuda`: whether verl's default trainer.device=cuda holds here (None: ask torch)."""
    parsed: dict[str, tuple[str, Any, str]] = {}
    superseded: list[tuple[str, str, str]] = []  # (key, text, the override that replaced it)
    for text in overrides:
        op, key, value = _parse(text)
        if key in parsed:  # the later one wins, in its own place, as in Hydra; the earlier one is said
            superseded.append((key, parsed[key][2], text.strip()))
            parsed.pop(key)
        parsed[key] = (op, value, text.strip())
    values = {k: v for k, (op, v, _) in parsed.items() if op == "set"}
    derived = set()
    if values.get("algorithm.adv_estimator", "gae") == "gae":  # the critic's defaults that follow the actor's
        for follower, leader in FOLLOWS.items():
            if leader in values and follower not in parsed:
                text = f"{follower}={_show(values[leader])} (verl's default follows {leader})"
                parsed[follower] = ("set", values[leader], text)
                values[follower] = values[leader]
                derived.add(follower)
    if "trainer.device" in values:
        on_gpu = values["trainer.device"] == "cuda"
    else:
        on_gpu = _default_cuda() if cuda is None else cuda
    world = 1
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node"):
        if isinstance(values.get(key), int):
            world *= max(1, values[key])
    ctx = Context(values=values, world=world, cuda=on_gpu)

    out = Translation()
    for key, text, later in superseded:
        out.lines.append(Line(text, key, "accepted", f"given again later ({later}): the later one is used"))
    wanted: dict[str, list[tuple[Any, Line]]] = {}
    for key, (op, value, text) in parsed.items():
        line, pairs = _one(key, op, value, text, ctx)
        line.derived = key in derived
        out.lines.append(line)
        for lucid_key, lucid_value in pairs:
            wanted.setdefault(lucid_key, []).append((lucid_value, line))
    for lucid_key, options in wanted.items():
        value = options[-1][0]
        if len({_show(v) for v, _ in options}) > 1:
            if lucid_key not in SMALLEST_WINS:
                given = " and ".join(line.given for _, line in options)
                for _, line in options:  # each is refused: which one was meant is the user's to say
                    line.status, line.why = "refused", ""
                    line.result = (
                        f"{given} all set lucidrl's {lucid_key}, to different values; make them agree"
                    )
                continue
            value = min(v for v, _ in options)
        source = "verl override " + " and ".join(line.given for _, line in options)
        out.assignments.append((lucid_key, value, source))
    _per_sequence_losses(out)
    if not from_file:
        defaults = dict(VERL_DEFAULTS)
        defaults["trainer.device"] = "cuda" if on_gpu else "cpu"
        applied = [(k, v) for k, v in defaults.items() if k not in wanted]
        out.assignments[:0] = [(k, v, "verl's default") for k, v in applied]
        out.defaults = [(k, v) for k, v in applied if _differs(k, v)]
        if not on_gpu and "trainer.device" not in wanted:
            out.notes.append("verl's default trainer.device=cuda: no CUDA GPU here, so trainer.device=cpu")
    return out


# policy losses that verl 0.9.1 aggregates per sequence whatever actor.loss_agg_mode says; lucidrl's loader
# asks for the mode to say so (config/algorithm_checks.py)
PER_SEQUENCE_LOSSES = ("geo_mean", "sapo")


def _per_sequence_losses(out: Translation) -> None:
    """With geo_mean or sapo, verl ignores loss_agg_mode and averages per sequence: the translation says
    so in lucidrl's key (seq-mean-token-mean), whatever the command line set, and notes it."""
    loss = next((v for k, v, _ in out.assignments if k == "actor.policy_loss"), None)
    if loss not in PER_SEQUENCE_LOSSES:
        return
    given = [v for k, v, _ in out.assignments if k == "actor.loss_agg_mode"]
    out.assignments = [a for a in out.assignments if a[0] != "actor.loss_agg_mode"]
    out.assignments.append(("actor.loss_agg_mode", "seq-mean-token-mean", f"verl's {loss} loss"))
    was = (
        f" (the command line's {given[-1]} is what verl ignores)"
        if given and given[-1] != "seq-mean-token-mean"
        else ""
    )
    out.notes.append(
        f"actor.policy_loss={loss}: verl aggregates it per sequence whatever loss_agg_mode says, so "
        f"actor.loss_agg_mode=seq-mean-token-mean{was}"
    )


def translate_or_raise(
    overrides: list[str], *, from_file: bool = False, cuda: bool | None = None
) -> Translation:
    """translate(), raising one ConfigError that lists every refused override."""
    out = translate(overrides, from_file=from_file, cuda=cuda)
    if out.refused:
        raise ConfigError(out.refusal())
    return out


def _differs(key: str, value: Any) -> bool:
    node: Any = LucidConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node != value


def _one(key: str, op: str, value: Any, text: str, ctx: Context) -> tuple[Line, list[tuple[str, Any]]]:
    """The Line of one override and the lucidrl (key, value) pairs it sets."""
    found = verl_row(key)
    if found is None:
        if settable(key):  # a lucidrl key among verl's: taken as written
            if op == "delete":
                return Line(text, key, "lucidrl", f"{key} reset to its default"), [(key, _lucid_default(key))]
            return Line(text, key, "lucidrl", f"{key}={_show(value)}", "a lucidrl key"), [(key, value)]
        return Line(text, key, "refused", _unknown(key)), []
    row, tail = found
    if op == "delete":
        target = resolve_target(row.target(tail)) if row.kind == "map" else None
        if target is None:
            return Line(text, key, "accepted", "dropping it changes nothing in lucidrl"), []
        base = VERL_DEFAULTS.get(target, _lucid_default(target))
        return Line(text, key, "translated", f"{target}={_show(base)}", "reset to its default"), [
            (target, base)
        ]
    is_default = row.default is not MISSING and value == row.default
    if row.kind == "refuse":
        if is_default:
            return Line(
                text, key, "accepted", f"verl's default value, nothing to do ({row.why}: not in lucidrl)"
            ), []
        hint = f"; lucidrl key: {row.lucidrl}" if row.lucidrl else ""
        return Line(text, key, "refused", f"{row.category}: {row.why}{hint}"), []
    if row.kind == "note" and row.convert is None:
        return Line(text, key, "accepted", row.why), []
    try:
        result = row.convert(value, ctx) if row.convert is not None else value
    except Refused as e:
        hint = f"; lucidrl key: {e.lucidrl}" if e.lucidrl else ""
        return Line(text, key, "refused", e.why + hint), []
    if isinstance(result, Noted):
        return Line(text, key, "accepted", result.why), []
    if isinstance(result, Sets):
        shown = ", ".join(f"{k}={_show(v)}" for k, v in result.pairs)
        return Line(text, key, "translated", shown, result.why), list(result.pairs)
    why = ""
    if isinstance(result, Value):
        result, why = result.value, result.why
    wanted = row.target(tail)
    target = resolve_target(wanted)
    if target is None:
        if is_default:
            return Line(text, key, "accepted", f"verl's default value (lucidrl has no {wanted} yet)"), []
        return Line(text, key, "refused", f"{NOT_BUILT}: lucidrl has no {wanted.split('|')[0]} yet"), []
    return Line(text, key, "translated", f"{target}={_show(result)}", why or row.why), [(target, result)]


def _lucid_default(key: str) -> Any:
    node: Any = LucidConfig()
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
    return node


def _unknown(key: str) -> str:
    known = [row.verl for row in ROWS if "*" not in row.verl] + [k for k in all_keys(LucidConfig)]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"not a verl key lucidrl knows, nor a lucidrl key.{hint} docs/migration.md lists every verl key; "
        "`lucidrl train --help-config` every lucidrl key"
    )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)
