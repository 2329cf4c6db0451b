"""Every number key declares its range in the schema, and the loader holds every value to it: read
from a file, from an override, or set in code."""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import pytest

from lucidrl.cli import main
from lucidrl.config import LucidConfig, SFTConfig, load_config, validate
from lucidrl.config.errors import RangeError
from lucidrl.config.schema import PoolConfig, Range
from lucidrl.config.validation import check_ranges


def _number_leaves(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    """(key, annotation) of every number in a schema; list items as KEY[], mapping values as KEY.*."""
    out = []
    for f in dataclasses.fields(cls):
        hint = get_type_hints(cls, include_extras=True)[f.name]
        out += _leaves_of(hint, f"{prefix}{f.name}")
    return out


def _leaves_of(hint: Any, key: str) -> list[tuple[str, Any]]:
    if dataclasses.is_dataclass(hint):
        return _number_leaves(hint, key + ".")
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return [leaf for opt in get_args(hint) if opt is not type(None) for leaf in _leaves_of(opt, key)]
    if origin is list:
        return _leaves_of(get_args(hint)[0], key + "[]")
    if origin is dict:
        return _leaves_of(get_args(hint)[1], key + ".*")
    base = get_args(hint)[0] if origin is Annotated else hint
    return [(key, hint)] if base in (int, float) else []


SCHEMAS = [LucidConfig, SFTConfig]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_every_number_key_declares_its_range(schema):
    leaves = _number_leaves(schema)
    assert len(leaves) > 40 if schema is LucidConfig else len(leaves) > 15  # the walk finds them
    bare = [key for key, hint in leaves if get_origin(hint) is not Annotated]
    assert not bare, f"number keys without a Range (write Annotated[int, Range('>= 1')] etc.): {bare}"


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_every_default_is_inside_its_range(schema):
    check_ranges(schema())


def _outside(hint: Any) -> Any:
    """A value of the key's type just outside its range (None where the range is 'any')."""
    base, rng = get_args(hint)[0], get_args(hint)[1]
    low, low_in, high, high_in = rng.bounds()
    step = 1 if base is int else 0.5
    if math.isfinite(low):
        value = low - step if low_in else low
    elif math.isfinite(high):
        value = high + step if high_in else high
    else:
        return None
    return int(value) if base is int else float(value)


RANGED = sorted(
    {(key, hint) for key, hint in _number_leaves(LucidConfig) if get_args(hint)[1].spec != "any"},
    key=lambda kv: kv[0],
)


@pytest.mark.parametrize("key,hint", RANGED, ids=[k for k, _ in RANGED])
def test_a_value_outside_a_keys_range_is_refused_where_it_is_read(key, hint, tmp_path):
    value = _outside(hint)
    rng = get_args(hint)[1]
    if key.endswith("[]"):  # a list's items: the whole list given, one item out
        override, shown = f"{key[:-2]}=[{value}, {value}]", f"{key[:-2]}[0]"
    elif ".*." in key:  # an entry of a mapping (placement.pools.NAME.nodes)
        override = key.replace(".*.", ".global.") + f"={value}"
        shown = key.replace(".*.", ".global.")
    else:
        override, shown = f"{key}={value}", key
    with pytest.raises(RangeError) as err:
        load_config(None, [override])
    text = str(err.value)
    assert f"config key '{shown}'" in text and f"override '{override}'" in text
    assert f"must be {rng.text()}" in text and text.endswith(f"got {value!r}")
    if rng.why:
        assert rng.why in text


def test_a_file_value_out_of_range_names_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  optim:\n    grad_clip: 0\n")
    with pytest.raises(RangeError) as err:
        load_config(path)
    assert str(err.value) == (
        f"config key 'actor.optim.grad_clip' (from file {path}) must be > 0 (the largest gradient norm kept, "
        ".inf: no clipping; 0 zeroes every gradient, a negative limit reverses them), got 0"
    )


def test_an_optional_number_out_of_range_says_the_range_not_the_type():
    # the union's other option (null) also failing used to read "must be int | null, got 0"
    with pytest.raises(RangeError, match=r"'trainer.num_threads' .* must be >= 1, got 0$"):
        load_config(None, ["trainer.num_threads=0"])
    assert load_config(None, ["trainer.num_threads=null", "model.path=x"]).trainer.num_threads is None


def test_values_on_a_bound_are_taken_and_infinity_where_the_range_is_open():
    cfg = load_config(
        None,
        [
            "model.path=x",
            "actor.optim.grad_clip=.inf",
            "rollout.top_p=1",
            "algorithm.gamma=0",
            "trainer.master_port=65535",
            "actor.clip_ratio_c=1.001",
        ],
    )
    assert cfg.actor.optim.grad_clip == math.inf and cfg.rollout.top_p == 1.0 and cfg.algorithm.gamma == 0.0
    with pytest.raises(RangeError, match=r"must be in \[0, 1\], got 1.0000001"):
        load_config(None, ["algorithm.gamma=1.0000001"])


def test_a_tree_changed_in_code_is_held_to_the_same_ranges():
    cfg = LucidConfig()
    cfg.model.path = "x"
    cfg.actor.optim.betas = [0.9, 1.0]
    with pytest.raises(RangeError, match=r"'actor.optim.betas\[1\]' \(from the config\) must be in \[0, 1\)"):
        validate(cfg)
    cfg = LucidConfig()
    cfg.placement.pools["big"] = PoolConfig(nodes=0)
    with pytest.raises(
        RangeError, match=r"'placement.pools.big.nodes' \(from the config\) must be >= 1, got 0"
    ):
        validate(cfg)
    sft = SFTConfig()
    sft.trainer.max_time_s = -1.0
    with pytest.raises(RangeError, match="'trainer.max_time_s' .* must be > 0 .seconds."):
        validate(sft)


def test_help_config_prints_each_range(capsys):
    assert main(["train", "--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "actor.optim.grad_clip = 1.0  (float > 0)" in lines
    assert "trainer.master_port = null  (int in [1, 65535] | null)" in lines
    assert "actor.optim.betas = [0.9, 0.999]  (list of float in [0, 1))" in lines
    assert "actor.entropy_coeff = 0.0  (float)" in lines  # 'any': no range printed


@pytest.mark.parametrize("spec", ["> x", "1..2", "[0, 1", "=> 0", ""])
def test_a_malformed_range_is_a_schema_bug_found_at_import(spec):
    with pytest.raises(ValueError, match="Range spec"):
        Range(spec)


@pytest.mark.parametrize("key", ["actor.optim.lr", "critic.optim.lr", "actor.optim.weight_decay"])
def test_an_infinite_learning_rate_is_refused_when_the_config_loads(key):
    """actor.optim.lr=.inf was refused only after training steps ran (every weight NaN)."""
    with pytest.raises(RangeError) as info:
        load_config(None, ["model.path=m", "data.train_files=[x]", f"{key}=.inf"])
    assert str(info.value).startswith(
        f"config key '{key}' (from command-line override '{key}=.inf') must be in [0, inf)"
    )
    assert str(info.value).endswith("got inf")
