"""What the rows of the verl translation table (verl_table.py) do with a value: the converters.

Each takes the override's value and the Context (every override given, the number of ranks, whether
runs go to a GPU) and returns the lucidrl value, `Value(value, why)`, `Sets(...)` for several lucidrl
keys or `Noted(why)`, or raises `Refused(why)`. Its docstring's first line is what docs/migration.md
says of the rows that use it.
"""

from __future__ import annotations

import os
from typing import Any

from lucidrl.config.verl_rows import GPU_ONLY, NOT_BUILT, Context, Converter, Noted, Refused, Sets, Value


def path(value: Any, ctx: Context) -> Any:
    """a local path, `~` expanded (as verl's defaults are written); `hdfs://` and other remote paths refused"""
    if value is None:
        return None
    text = str(value)
    if "://" in text:
        raise Refused(
            f"{NOT_BUILT}: lucidrl reads local files only (verl copies {text.split('://')[0]}:// paths to a local "
            "cache first); copy it to a local folder and give that path"
        )
    return os.path.expanduser(text)


def files(value: Any, ctx: Context) -> Any:
    """one path or a list of them, `~` expanded"""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [path(v, ctx) for v in items]


def per_rank(value: Any, ctx: Context) -> Any:
    """verl's older global count divided over the ranks (lucidrl's micro-batches count per rank)"""
    if value is None:
        return Noted("null: verl then reads the *_per_gpu key")
    if ctx.world == 1:
        return value
    share = max(1, int(value) // ctx.world)
    return Value(share, f"verl's global micro-batch {value} over {ctx.world} ranks")


def freq(value: Any, ctx: Context) -> Any:
    """steps; any value <= 0 is verl's never, lucidrl's -1"""
    if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
        return Value(-1, "never (verl: any value <= 0)") if value != -1 else -1
    return value


def one_of(allowed: dict[Any, Any], why: str = "") -> Converter:
    """A value from `allowed` (verl value -> lucidrl value, or Noted); other values refused."""

    def convert(value: Any, ctx: Context) -> Any:
        """(set below)"""
        if value in allowed:
            out = allowed[value]
            return out if isinstance(out, Noted) else Value(out, why) if why else out
        raise Refused(
            f"{NOT_BUILT}: {value!r} has no lucidrl equivalent (lucidrl takes {', '.join(map(repr, allowed))})"
        )

    convert.__doc__ = f"{', '.join(f'`{v}`' for v in allowed)} accepted; other values refused (not built yet)"
    return convert


def equals_key(other: str, default: Any, what: str) -> Converter:
    """Accepted (noted) when the value equals verl key `other` (or its default), refused otherwise."""

    def convert(value: Any, ctx: Context) -> Any:
        expected = ctx.values.get(other, default)
        if value == expected:
            return Noted(f"equals {other}={expected!r}: {what}")
        raise Refused(f"{NOT_BUILT}: lucidrl reads {what} from {other} ({expected!r}); make them equal")

    convert.__doc__ = (
        f"accepted when it equals `{other}`; refused otherwise (lucidrl reads {what} from that key)"
    )
    return convert


def only_if_off(switch: str, off: Any = False) -> Converter:
    """A setting read only while verl key `switch` is on: noted while it is off, refused while it is on."""

    def convert(value: Any, ctx: Context) -> Any:
        if ctx.values.get(switch, off) == off:
            return Noted(f"read only with {switch} on, which it is not")
        raise Refused(f"{NOT_BUILT}: read with {switch}, which lucidrl does not have")

    shown = "null" if off is None else "false" if off is False else "true" if off is True else off
    convert.__doc__ = f"accepted while `{switch}` is `{shown}` (then it is not read); refused otherwise"
    return convert


# -- converters of particular keys ----------------------------------------------------------------------

# names verl 0.9.1 registers (REFERENCE.md); a name lucidrl lacks is "not built yet", another a typo
VERL_ESTIMATORS = (
    "gae", "gdpo", "gpg", "grpo", "grpo_passk", "grpo_vectorized", "opo", "optimal_token_baseline",
    "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "rloo_vectorized",
    "tir_optimal_token_baseline",
)  # fmt: skip
VERL_POLICY_LOSSES = (
    "bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg", "gspo", "kl_cov",
    "sapo", "vanilla",
)  # fmt: skip
# verl's vectorized estimators compute the same advantages as the plain ones
SAME_AS = {"grpo_vectorized": "grpo", "rloo_vectorized": "rloo"}


def registered(kind: str, verl_names: tuple[str, ...]):
    def convert(value: Any, ctx: Context) -> Any:
        """(set below)"""
        from lucidrl import algos

        names = algos.list_advantage_estimators() if "estimator" in kind else algos.list_policy_losses()
        if value in SAME_AS and SAME_AS[value] in names:
            return Value(SAME_AS[value], f"verl's {value} computes {SAME_AS[value]}'s advantages")
        if value in names or value not in verl_names:
            return value  # unknown to verl too: the config's validation lists the names
        raise Refused(f"{NOT_BUILT}: lucidrl has no {value!r} {kind} yet (it has {', '.join(sorted(names))})")

    convert.__doc__ = (
        f"the {kind} names lucidrl registers as written (verl's `*_vectorized` as the plain ones); one of verl's that "
        "lucidrl lacks refused (not built yet)"
    )
    return convert


def precision(value: Any, ctx: Context) -> Any:
    """`fp32`/`float32` and `bf16`/`bfloat16` as lucidrl's float32 and bfloat16; `fp16` refused (not built yet)"""
    names = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
    if value in names:
        return names[value]
    raise Refused(f"{NOT_BUILT}: lucidrl computes in float32 or bfloat16, not {value!r}")


def seed(value: Any, ctx: Context) -> Any:
    """a number as written; null (verl's default) keeps lucidrl's data.seed"""
    return Noted("null: lucidrl's data.seed") if value is None else value


def rollout_name(value: Any, ctx: Context) -> Any:
    """`vllm` on a GPU, lucidrl's `hf` engine on the CPU; `hf` as written; `sglang` and others refused (GPU-only)"""
    if value == "hf":
        return "hf"
    if value == "vllm":
        if ctx.cuda:
            return "vllm"
        return Value("hf", "vLLM needs a GPU and this run is on the CPU: lucidrl's hf engine samples instead")
    raise Refused(
        f"{GPU_ONLY}: lucidrl's rollout engines are hf, vllm and server (rollout.name)", "rollout.name"
    )


def strategy(value: Any, ctx: Context) -> Any:
    """`fsdp`/`fsdp2`: FSDP2; `megatron` refused (GPU-only)"""
    if value in ("fsdp", "fsdp2"):
        return Value("fsdp2", "" if value == "fsdp2" else "lucidrl shards with FSDP2")
    raise Refused(f"{GPU_ONLY}: {value} is not built (lucidrl trains with fsdp2 or ddp: trainer.strategy)")


def device(value: Any, ctx: Context) -> Any:
    """`cuda` or `cpu` as written; `npu` refused"""
    if value in ("cuda", "cpu"):
        return value
    raise Refused(f"{GPU_ONLY}: lucidrl runs on cpu or cuda, not {value!r}", "trainer.device")


def placement(which: str):
    def convert(value: Any, ctx: Context) -> Any:
        pairs: list[tuple[str, Any]] = [(f"placement.pools.global.{which}", value)]
        if ctx.world > 1:
            pairs.append(("trainer.backend", "ray"))
        if ctx.world == 1:
            return Sets(tuple(pairs), "one rank, in this process")
        where = "GPUs" if ctx.cuda else "CPU ranks (gloo)"
        return Sets(tuple(pairs), f"{ctx.world} {where}, as Ray actors")

    convert.__doc__ = (
        "`placement.pools.global`'s ranks (with the other of nnodes / n_gpus_per_node); more than one: Ray"
    )
    return convert


def clip_ratio(value: Any, ctx: Context) -> Any:
    """both `actor.clip_ratio_low` and `actor.clip_ratio_high`, where those are not given"""
    prefix = "actor_rollout_ref.actor."
    pairs = tuple(
        (f"actor.clip_ratio_{side}", value)
        for side in ("low", "high")
        if not ctx.given(prefix + f"clip_ratio_{side}")
    )
    if not pairs:
        return Noted("clip_ratio_low and clip_ratio_high are both given, and win (as in verl)")
    return Sets(
        pairs, "both sides of the clip (verl >= 0.3 reads it only where clip_ratio_low/high are null)"
    )


def warmup_steps(value: Any, ctx: Context) -> Any:
    """steps; -1 (verl: use the ratio) accepted"""
    if value is None or value < 0:
        return Noted("verl then warms up over lr_warmup_steps_ratio of the run")
    return value


def warmup_ratio(section: str):
    """verl's warm-up as a fraction of the run: steps, where trainer.total_training_steps says how many."""

    def convert(value: Any, ctx: Context) -> Any:
        steps_key = f"{section}.optim.lr_warmup_steps"
        if (ctx.values.get(steps_key) or -1) > 0:
            return Noted(f"{steps_key} is given and wins (as in verl)")
        if not value:
            return Noted("0: no warm-up")
        total = ctx.values.get("trainer.total_training_steps")
        if isinstance(total, int) and total > 0:
            return Value(int(value * total), f"{value} x trainer.total_training_steps={total}")
        raise Refused(
            f"{NOT_BUILT}: lucidrl counts warm-up in steps; the ratio needs trainer.total_training_steps, which "
            "this command line does not give: write the number of steps instead"
        )

    convert.__doc__ = (
        "the ratio x trainer.total_training_steps, in steps; refused where the command line gives no total"
    )
    return convert


def scheduler(value: Any, ctx: Context) -> Any:
    """`constant` accepted (lucidrl's schedule); `cosine` refused (not built yet)"""
    if value in (None, "constant"):
        return Noted("constant after the warm-up: lucidrl's schedule")
    raise Refused(f"{NOT_BUILT}: lucidrl's schedule is a linear warm-up then constant, not {value!r}")


def logger(value: Any, ctx: Context) -> Any:
    """as written; verl's `file` is lucidrl's `jsonl`"""
    items = value if isinstance(value, (list, tuple)) else [value]
    out = ["jsonl" if x == "file" else x for x in items]
    return Value(out, "verl's file logger writes JSON lines: lucidrl's jsonl") if out != list(items) else out


def test_freq(value: Any, ctx: Context) -> Any:
    """steps; any value <= 0 is verl's never, lucidrl's -1 (lucidrl's 0 validates after the last step)"""
    if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
        return Value(-1, "never (verl validates in the loop only when test_freq > 0)")
    return value


def local_dir(value: Any, ctx: Context) -> Any:
    """the run directory (checkpoints in its checkpoints/ folder)"""
    return Value(path(value, ctx), "the run directory; checkpoints go to its checkpoints/ folder")


def rm_length(value: Any, ctx: Context) -> Any:
    """prompt_length + response_length: the longest sequence the reward model reads"""
    p = ctx.values.get("reward_model.rollout.prompt_length", 2048)
    r = ctx.values.get("reward_model.rollout.response_length", 2048)
    return Value(
        p + r, f"prompt_length {p} + response_length {r}: the longest sequence the reward model reads"
    )


def follows_actor(actor_key: str, default: Any):
    """ref/rollout settings lucidrl shares with the actor's: accepted when they agree."""

    def convert(value: Any, ctx: Context) -> Any:
        actor = ctx.values.get(actor_key, default)
        if value == actor:
            return Noted(f"equals {actor_key} (lucidrl has one setting for both)")
        raise Refused(
            f"{NOT_BUILT}: lucidrl has one setting for the update and the log-prob passes ({actor_key}={actor!r})"
        )

    convert.__doc__ = (
        f"accepted when it equals `{actor_key}` (lucidrl has one setting for both); refused otherwise"
    )
    return convert


def critic_enable(value: Any, ctx: Context) -> Any:
    """accepted when it agrees with algorithm.adv_estimator (lucidrl runs a critic exactly for gae)"""
    gae = ctx.values.get("algorithm.adv_estimator", "gae") == "gae"
    if value is None or bool(value) == gae:
        return Noted("lucidrl runs a critic exactly when algorithm.adv_estimator=gae")
    raise Refused(f"{NOT_BUILT}: lucidrl runs a critic exactly when algorithm.adv_estimator=gae")


def save_contents(value: Any, ctx: Context) -> Any:
    """accepted: lucidrl's checkpoints hold model, optimizer and trainer state and a HuggingFace folder"""
    return Noted("lucidrl's checkpoints hold model, optimizer and trainer state, and a HuggingFace folder")


def do_sample(value: Any, ctx: Context) -> Any:
    """`true` accepted; `false` (greedy training rollouts) refused (not built yet)"""
    if value is True:
        return Noted("training rollouts sample")
    raise Refused(f"{NOT_BUILT}: greedy training rollouts (lucidrl samples at rollout.temperature)")


def optimizer(value: Any, ctx: Context) -> Any:
    """`AdamW` accepted; other optimizers refused (not built yet)"""
    if value in ("AdamW", "adamw"):
        return Noted("AdamW: lucidrl's optimizer")
    raise Refused(f"{NOT_BUILT}: lucidrl's optimizer is AdamW")
