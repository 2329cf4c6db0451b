"""The `auto` settings of a run chosen from the memory plan's estimates (memory_plan.py), and fixed
settings that cannot fit refused with the numbers.

What the plan decides when its key is `auto`:

- `actor.head_chunk_tokens`: the chunked LM head wherever the vocabulary is large enough for the logits
  to matter (benchmarks/head_chunks.py measured it no slower there), on one rank;
- `actor.ppo_micro_batch_size` / `actor.log_prob_micro_batch_size`: the largest divisor of the
  mini-batch's samples within a token target, smaller where the phase would not fit;
- `model.enable_gradient_checkpointing`: on only where no micro-batch of at least MIN_UPDATE_TOKENS
  fits without it.
"""

from __future__ import annotations

from typing import Any

from lucidrl.config.errors import ConfigError
from lucidrl.config.memory_plan import (
    AUTO_CHUNK_TOKENS,
    CHUNK_ENTRIES,
    CHUNK_FROM_VOCAB,
    MIN_UPDATE_TOKENS,
    UPDATE_TOKENS,
    USABLE_SHARE,
    MemoryPlan,
    ModelShape,
    Phase,
    RunNumbers,
    available_memory,
    gib,
    log_prob_bytes,
    rollout_bytes,
    update_bytes,
)


def _divisors_desc(n: int, at_most: int) -> list[int]:
    return [d for d in range(min(n, max(at_most, 1)), 0, -1) if n % d == 0]


def _run_numbers(cfg: Any, shape: ModelShape) -> RunNumbers:
    from lucidrl.config.placement import plan_groups

    world = max((p.world_size for p in plan_groups(cfg) if "actor" in p.roles), default=1)
    d, a, r, m = cfg.data, cfg.actor, cfg.rollout, cfg.model
    reference = bool(a.use_kl_loss or cfg.algorithm.use_kl_in_reward)
    val_rows = (d.val_batch_size or 64) * cfg.rollout.val_kwargs.n if d.val_files else 0
    return RunNumbers(
        shape=shape,
        cpu=not str(cfg.trainer.device).startswith("cuda"),
        weight_bytes=2 if m.dtype == "bfloat16" else 4,
        bf16_compute=m.compute_dtype == "bfloat16" and m.dtype == "float32",
        lora_rank=m.lora_rank,
        reference=reference,
        prompt=d.max_prompt_length,
        response=d.max_response_length,
        mini_samples=max(a.ppo_mini_batch_size * r.n // world, 1),
        rollout_rows=min(r.micro_batch_size, d.train_batch_size * r.n),
        val_rows=min(r.micro_batch_size, val_rows),
        world_size=world,
        eager_attention=m.attn_implementation == "eager",
        n=r.n,
        share_prompt=a.share_prompt_forward and r.n > 1,
    )


def plan_memory(cfg: Any, shape: ModelShape | None = None) -> MemoryPlan | None:
    """The memory plan of an RL config (config.schema.LucidConfig), its auto keys resolved in place; None
    when the model's config.json cannot be read (the auto keys then take their plain defaults).

    Raises ConfigError when settings the user fixed need more memory than the machine has, naming the
    phase, the numbers and the keys that would make it fit."""
    shape = shape or ModelShape.from_path(cfg.model.path)
    if shape is None:
        _plain_defaults(cfg)
        return None
    run = _run_numbers(cfg, shape)
    available, where = available_memory(str(cfg.trainer.device), cfg.trainer.memory_budget_gib)
    v = cfg.rollout.vllm
    if available and not run.cpu and cfg.rollout.name == "vllm" and not v.enable_sleep_mode:
        # a colocated vLLM engine keeps its share of the GPU through the update
        available = int(available * (1 - v.gpu_memory_utilization))
        where += f", less rollout.vllm.gpu_memory_utilization={v.gpu_memory_utilization}"
    plan = MemoryPlan(device=str(cfg.trainer.device), available=available, where=where)
    budget = plan.budget
    a, m = cfg.actor, cfg.model
    width = run.prompt + run.response
    target = UPDATE_TOKENS["cpu" if run.cpu else "cuda"]

    # the LM head: chunks where the vocabulary is large, on one rank and without logit transforms
    if a.head_chunk_tokens == "auto":
        if run.world_size > 1 or shape.logit_transform or shape.vocab < CHUNK_FROM_VOCAB:
            why = (
                "several ranks" if run.world_size > 1
                else "the model's logits are not just its LM head's" if shape.logit_transform
                else f"a vocabulary of {shape.vocab} (< {CHUNK_FROM_VOCAB}): its logits are small"
            )  # fmt: skip
            a.head_chunk_tokens = 0
        else:
            chunk = AUTO_CHUNK_TOKENS
            while chunk > 64 and chunk * shape.vocab > CHUNK_ENTRIES:
                chunk //= 2
            a.head_chunk_tokens = chunk
            why = f"a vocabulary of {shape.vocab}: no (tokens, vocabulary) logits, {chunk} tokens at a time"
        plan.choices["actor.head_chunk_tokens"] = (a.head_chunk_tokens, why)
    chunk = a.head_chunk_tokens

    # the update: micro-batch and checkpointing
    fits = (lambda n: True) if budget is None else (lambda n: n <= budget)  # noqa: E731
    mb_auto, ckpt_auto = a.ppo_micro_batch_size == "auto", m.enable_gradient_checkpointing == "auto"
    if a.use_dynamic_bsz:  # verl's token budget decides the micro-batches
        rows_options = [max(a.ppo_max_token_len_per_gpu // width, 1)]
    elif mb_auto:
        rows_options = _divisors_desc(run.mini_samples, max(target // width, 1))
    else:
        rows_options = [a.ppo_micro_batch_size]
    ckpt_options = [False, True] if ckpt_auto else [m.enable_gradient_checkpointing]
    chosen = None
    for ckpt in ckpt_options:  # without checkpointing, down to MIN_UPDATE_TOKENS; then with it
        for rows in rows_options:
            small = rows * width < MIN_UPDATE_TOKENS and rows != rows_options[0]
            if ckpt is False and ckpt_auto and small:
                break
            if fits(sum(update_bytes(run, rows, ckpt, chunk).values())):
                chosen = (rows, ckpt)
                break
        if chosen:
            break
    if chosen is None and ckpt_auto and mb_auto:  # below MIN_UPDATE_TOKENS without checkpointing
        for rows in rows_options:
            if fits(sum(update_bytes(run, rows, True, chunk).values())):
                chosen = (rows, True)
                break
    if chosen is None:
        rows, ckpt = rows_options[-1], ckpt_options[-1]
        need = update_bytes(run, rows, ckpt, chunk)
        raise ConfigError(_refusal("the update", need, plan, cfg, run))
    rows, ckpt = chosen
    if mb_auto and not a.use_dynamic_bsz:
        a.ppo_micro_batch_size = rows
        plan.choices["actor.ppo_micro_batch_size"] = (
            rows, f"{rows} samples of up to {width} tokens: the largest divisor of the mini-batch's "
            f"{run.mini_samples} samples within {target} tokens that fits",
        )  # fmt: skip
    elif a.ppo_micro_batch_size == "auto":
        a.ppo_micro_batch_size = 8  # unused with use_dynamic_bsz
    if ckpt_auto:
        m.enable_gradient_checkpointing = ckpt
        plan.choices["model.enable_gradient_checkpointing"] = (
            ckpt, "needed to fit the update" if ckpt else "the update fits without it",
        )  # fmt: skip
    plan.phases.append(Phase(f"update ({rows} x {width} tokens)", update_bytes(run, rows, ckpt, chunk)))

    # the log-prob passes
    if a.log_prob_micro_batch_size == "auto":
        options = _divisors_desc(run.mini_samples, max(2 * target // width, 1)) or [1]
        lp_rows = next((n for n in options if fits(sum(log_prob_bytes(run, n, chunk).values()))), options[-1])
        a.log_prob_micro_batch_size = lp_rows
        plan.choices["actor.log_prob_micro_batch_size"] = (
            lp_rows, f"the largest divisor of {run.mini_samples} samples within {2 * target} tokens that fits",
        )  # fmt: skip
    lp_rows = a.log_prob_max_token_len_per_gpu // width if a.use_dynamic_bsz else a.log_prob_micro_batch_size
    plan.phases.append(
        Phase(f"log-prob pass ({lp_rows} x {width} tokens)", log_prob_bytes(run, lp_rows, chunk))
    )

    # generation (hf: lucidrl's or transformers' loop; vLLM and servers hold their own memory)
    if cfg.rollout.name == "hf":
        rows = max(run.rollout_rows, run.val_rows)
        plan.phases.append(Phase(f"rollout ({rows} rows x {width} tokens)", rollout_bytes(run, rows)))
    for phase in plan.phases:
        if budget is not None and phase.total > budget:
            raise ConfigError(_refusal(phase.name.split(" (")[0], phase.parts, plan, cfg, run))
    return plan


def _plain_defaults(cfg: Any) -> None:
    """The auto keys' values when there is no plan (no readable config.json)."""
    cfg.actor = plain_actor(cfg.actor, cfg.actor.ppo_mini_batch_size * cfg.rollout.n)
    if cfg.model.enable_gradient_checkpointing == "auto":
        cfg.model.enable_gradient_checkpointing = False


def plain_actor(actor: Any, mini_samples: int = 8) -> Any:
    """An ActorConfig with any auto key that no plan resolved (a config built in code, or a model
    without a readable config.json) at its plain value: whole-head logits, micro-batches of 8 samples
    (at most the mini-batch's) and 16 for the log-prob passes."""
    from dataclasses import replace

    changes: dict[str, int] = {}
    if actor.head_chunk_tokens == "auto":
        changes["head_chunk_tokens"] = 0
    if actor.ppo_micro_batch_size == "auto":
        changes["ppo_micro_batch_size"] = min(8, max(mini_samples, 1))
    if actor.log_prob_micro_batch_size == "auto":
        changes["log_prob_micro_batch_size"] = 16
    return replace(actor, **changes) if changes else actor


def _refusal(phase: str, parts: dict[str, int], plan: MemoryPlan, cfg: Any, run: RunNumbers) -> str:
    biggest = ", ".join(f"{k} {gib(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    fixes = []
    if (
        isinstance(cfg.actor.ppo_micro_batch_size, int)
        and cfg.actor.ppo_micro_batch_size > 1
        and phase == "the update"
    ):
        fixes.append("actor.ppo_micro_batch_size=auto (or smaller)")
    if cfg.model.enable_gradient_checkpointing is False:
        fixes.append("model.enable_gradient_checkpointing=auto")
    if not cfg.model.lora_rank:
        fixes.append("model.lora_rank=16 (LoRA: no full gradients or optimizer state)")
    if cfg.rollout.micro_batch_size > 1 and phase == "rollout":
        fixes.append("a smaller rollout.micro_batch_size")
    fixes.append("shorter data.max_prompt_length / data.max_response_length")
    return (
        f"memory plan: {phase} needs about {gib(sum(parts.values()))} ({biggest}), but {gib(plan.budget)} "
        f"are usable here ({USABLE_SHARE:.0%} of {gib(plan.available)}, {plan.where}); to fit, try "
        + "; ".join(fixes)
        + ". `lucidrl doctor CONFIG` prints the whole plan (docs/memory.md)"
    )
