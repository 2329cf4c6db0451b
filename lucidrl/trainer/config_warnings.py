"""Warnings a config earns on this machine: settings that run, but slower or weaker than they could.

Printed by the trainer at start (`PPOTrainer.announce`) and reported by `lucidrl doctor CONFIG` before
anything runs. Refusals are the config validation's job (config/validation.py); these are the cases
where the run is still what was asked for, so the user decides.
"""

from __future__ import annotations

import torch

from lucidrl.config import LucidConfig
from lucidrl.models.precision import autocast_dtype, cpu_has_native_bf16, float32_attention_wanted


def config_warnings(cfg: LucidConfig) -> list[str]:
    """One line per warning, each naming the keys involved and what to set instead."""
    lines = []
    mixed_precision = autocast_dtype(cfg.model.dtype, cfg.model.compute_dtype) is not None
    on_cpu = cfg.trainer.device == "cpu"
    if mixed_precision and on_cpu and cpu_has_native_bf16() is False:
        lines.append(
            "model.compute_dtype=bfloat16 on a CPU without AVX-512 BF16 or AMX: its bfloat16 matmuls are "
            "emulated, several times slower than float32 (benchmarks/mixed_precision.py); use float32 here"
        )
    if mixed_precision and on_cpu and float32_attention_wanted(torch.device("cpu"), torch.bfloat16):
        lines.append(
            "model.compute_dtype=bfloat16 on the CPU: the attention (transformers' SDPA) runs in float32, "
            "faster than bfloat16 on CPUs without AMX (docs/performance.md); LUCIDRL_CPU_FLOAT32_ATTENTION=0 "
            "keeps it in bfloat16"
        )
    if (
        cfg.rollout.name == "vllm"
        and cfg.trainer.device.startswith("cuda")
        and (cfg.model.compute_dtype or cfg.model.dtype) == "float32"
    ):
        lines.append(
            "rollout.name=vllm in float32 (model.dtype=float32, no model.compute_dtype): vLLM's engine runs "
            "float32 only on slower attention backends; set model.compute_dtype=bfloat16 for it to generate "
            "in bf16 (the actor keeps float32 weights)"
        )
    c = cfg.trainer.collapse
    if c.enable and cfg.rollout.n < 2 and not (c.min_entropy or c.max_score_drop or c.max_kl):
        lines.append(
            "trainer.collapse watches nothing in this run: its one sign, min_mixed_groups_ratio, compares "
            "a prompt's samples and rollout.n=1 gives one; set trainer.collapse.min_entropy or max_score_drop"
        )
    t = cfg.trainer
    if t.max_restarts and not t.save_freq:
        lines.append(
            f"trainer.max_restarts={t.max_restarts} with trainer.save_freq=0: a run restarted after a worker died "
            "starts again from step 0, having no checkpoint to resume from; set trainer.save_freq"
        )
    if cfg.model.dtype == "bfloat16":
        trained = "actor's and critic's" if cfg.algorithm.adv_estimator == "gae" else "actor's"
        lines.append(
            f"model.dtype=bfloat16: the {trained} weights and AdamW state are bfloat16, with no float32 "
            "master copy, so an update smaller than about 1/256 of a weight rounds away (at lr 1e-6 most "
            "do); for bfloat16 compute over float32 master weights set model.dtype=float32 "
            "model.compute_dtype=bfloat16"
        )
    mt = cfg.rollout.multi_turn
    if mt.enable and "python" in mt.tools:
        from lucidrl.workers.rollout.agent.sandbox import layers

        held, missing = layers()
        if missing:
            lines.append(
                f"rollout.multi_turn.tools has python, whose sandbox on this host lacks "
                f"{'; '.join(f'{k} ({v})' for k, v in missing)}: an audit hook stands in, which native code gets "
                f"past (it holds: {', '.join(held)}); docs/multi_turn.md says what each layer stops"
            )
    return lines
