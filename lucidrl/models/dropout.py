"""Training-time randomness off in the models an RL update trains: dropout, LayerDrop, router jitter.

PPO's ratio compares the update's forward (train mode) with the log-probs of the rollout or the
old-log-prob pass (eval mode). With dropout on, the two differ before any optimizer step: a tiny GPT-2
(dropout 0.1, as its checkpoints ship) gave per-token ratios from 0.87 to 1.11 at lr 0, and a
critic's values were predicted by another function than the one that computed them. TRL's PPO and
RLOO trainers turn dropout off in the policy, reference and value models for the same reason.

Modules are changed in place; the model's config is not, so a saved model keeps its dropout for
whatever trains it next.
"""

from __future__ import annotations

import torch

# float attributes that transformers' modules read in train mode only: attention dropout probabilities
# (Llama's `attention_dropout`, passed to the attention kernel), LayerDrop (OPT skips whole layers),
# MoE router jitter (Mixtral multiplies router inputs by noise)
_RANDOM_IN_TRAINING = ("dropout", "layerdrop", "pdrop", "jitter")


def disable_dropout(model: torch.nn.Module) -> list[str]:
    """Set every dropout module's p, and every such float attribute, to 0 in `model`; returns what was
    non-zero, as `module.attribute=value` (empty for a model with none, such as lucidrl's tiny Qwen2)."""
    changed = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            if module.p:
                changed.append(f"{name or 'model'}.p={module.p:g}")
            module.p = 0.0
        for attr, value in list(vars(module).items()):
            if isinstance(value, float) and value and any(word in attr for word in _RANDOM_IN_TRAINING):
                changed.append(f"{name or 'model'}.{attr}={value:g}")
                setattr(module, attr, 0.0)
    return changed


def describe(changed: list[str], key: str) -> str:
    """One log line for what disable_dropout changed."""
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return (
        f"{key}=true: turned off {len(changed)} sources of training-time randomness ({shown}), so the "
        f"update's forward computes what the log-prob pass did; {key}=false keeps them"
    )
