"""One GRPO batch, two losses: lucidrl's update against TRL's GRPOTrainer loss, gradient by gradient.

`learning_vs_trl.py` compares held-out curves, but each framework samples its own completions, so a gap
between them can come from the samples as much as from the update. This check takes the samples out:

1. lucidrl runs one step of the demo's GRPO config (`learning_vs_trl.lucidrl_config`, the smollm2
   setting) on `--prompts` prompts x 8 samples from `--model`: it generates, scores, computes GRPO's
   advantages and runs its update, whose gradient is taken just before the optimizer step (gradient
   clipping off, so it is the loss's own gradient).
2. TRL's GRPOTrainer, built with the GRPOConfig `learning_vs_trl.py` gives it (loss_type "dapo", the
   same clip, no KL), computes its loss on the same prompts, completions and advantages from the same
   weights, and is differentiated.
3. The two gradients are compared over all parameters: cosine similarity, the relative size of their
   difference, and the parameter where they differ most. A control row differentiates TRL's loss_type
   "grpo" (each sequence's mean, then the mean over sequences), which weighs tokens differently from a
   token-mean: it shows the size of difference a different weighting makes, so "equal" above means
   something.

Both sides compute in float32 here, whatever the CPU, so the rows measure the loss's math and not
bf16 rounding. The advantages row compares lucidrl's advantages with TRL's formula for
scale_rewards="group", (score - group mean) / (group std + 1e-4), on the same scores.

A step whose groups all tied (every sample right, or every one wrong) has no gradient on either side;
start from a checkpoint that solves some problems, such as a demo run's `final` model:

    .venv/bin/python benchmarks/grpo_gradient_vs_trl.py --model outputs/demo/seed0/final [--prompts 4] [--seed 0]

TRL is a benchmark dependency only: `pip install -c constraints.txt trl==1.16.0`.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from learning_vs_trl import (
    lucidrl_config,
    recipe,
    smollm2_setting,
    trl_dataset,
    trl_grpo_config,
    write_word_problems,
)

TRL_EPS = 1e-4  # TRL's (score - mean) / (std + 1e-4) for scale_rewards="group"


def lucidrl_step(setting, prompts: int, work: Path, threads: int, seed: int) -> tuple[dict, dict, dict]:
    """One lucidrl GRPO step from setting.model: its batch, its update's gradient by parameter name (before
    the optimizer step, unclipped), and the step's metrics."""
    from lucidrl.config import config_from_dict
    from lucidrl.trainer.ppo import PPOTrainer

    cfg = lucidrl_config(setting, 1, work / "lucidrl", threads, seed)
    cfg["model"]["compute_dtype"] = None  # float32: the loss's math, not bf16 rounding
    cfg["data"]["train_batch_size"] = prompts
    cfg["data"]["val_files"] = []
    cfg["actor"]["ppo_mini_batch_size"] = prompts  # one update over the whole batch, as the demo's
    cfg["actor"]["ppo_micro_batch_size"] = min(32, prompts * cfg["rollout"]["n"])
    cfg["actor"]["optim"]["grad_clip"] = math.inf  # the gradient as the loss gives it
    trainer = PPOTrainer(config_from_dict(cfg, source="grpo_gradient_vs_trl"))
    actor = trainer.workers.actor.worker.actor  # in-process: the policy worker's ActorWorker
    seen: dict = {}
    collect = trainer.collector.collect

    def keep_batch(t):
        batch, metrics = collect(t)
        seen["batch"] = batch  # the trainer adds the advantages to this batch in place
        return batch, metrics

    def keep_grads(optimizer, args, kwargs):
        seen["grads"] = {
            name: p.grad.detach().clone() for name, p in actor.model.named_parameters() if p.grad is not None
        }

    trainer.collector.collect = keep_batch
    actor.optimizer.register_step_pre_hook(keep_grads)
    trainer.global_step = 1
    metrics = trainer.step()
    if "grads" not in seen:
        sys.exit("lucidrl's update never reached the optimizer step: no gradient to compare")
    return seen["batch"], seen["grads"], metrics


def trl_gradients(setting, r: dict, batch, work: Path, loss_type: str) -> tuple[dict, float]:
    """TRL's GRPOTrainer loss (`loss_type`) on lucidrl's batch from the same starting weights: its gradient
    by parameter name, and the loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tok = AutoTokenizer.from_pretrained(setting.model)
    attn = {"attn_implementation": r["attn_implementation"]} if r["attn_implementation"] else {}
    model = AutoModelForCausalLM.from_pretrained(setting.model, dtype=torch.float32, **attn)
    samples = len(batch["responses"])
    # the whole batch as one training micro-batch, no accumulation: TRL's "dapo" then divides by the
    # batch's completion tokens (num_items_in_batch), as its accumulated micro-batches add up to
    whole = {**r, "prompts": samples // r["n"], "micro_batch": samples, "bf16": False}
    config = trl_grpo_config(whole, work / "trl", 1, 0)
    if config.gradient_accumulation_steps != 1 or config.steps_per_generation != 1:
        sys.exit(f"TRL's config accumulates {config.gradient_accumulation_steps} micro-batches: not one pass")
    config.loss_type = loss_type
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),  # never called: no generation
        args=config,
        train_dataset=trl_dataset(setting, tok),
        processing_class=tok,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training loop, which does not run here
    mask = batch["response_mask"].float()
    inputs = {
        "prompt_ids": batch["prompts"],
        "prompt_mask": batch["prompt_mask"],
        "completion_ids": batch["responses"],
        "completion_mask": mask,
        "advantages": batch["advantages"][:, 0],  # GRPO's advantage is one value a sequence
        "num_items_in_batch": mask.sum(),
    }
    model.train()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return grads, float(loss.detach())


def compare(ours: dict, theirs: dict) -> dict:
    """Cosine similarity, ||ours - theirs|| / ||theirs|| and the parameter where they differ most."""
    if set(ours) != set(theirs):
        only = sorted(set(ours) ^ set(theirs))[:4]
        sys.exit(f"the two models' parameters with a gradient differ: {only}")
    dot = sq_ours = sq_theirs = sq_diff = 0.0
    worst, worst_rel = "", -1.0
    for name in ours:
        a, b = ours[name].double(), theirs[name].double()
        dot += float((a * b).sum())
        sq_ours += float((a * a).sum())
        sq_theirs += float((b * b).sum())
        diff = float(((a - b) ** 2).sum())
        sq_diff += diff
        rel = math.sqrt(diff) / max(float(b.norm()), 1e-30)
        if rel > worst_rel:
            worst, worst_rel = name, rel
    return {
        "norm_ours": math.sqrt(sq_ours),
        "norm_theirs": math.sqrt(sq_theirs),
        "cosine": dot / max(math.sqrt(sq_ours * sq_theirs), 1e-30),
        "rel_diff": math.sqrt(sq_diff) / max(math.sqrt(sq_theirs), 1e-30),
        "worst": worst,
        "worst_rel": worst_rel,
    }


def say(what: str, start: list[float] = []) -> None:  # noqa: B006 - the first call's time, kept
    start = start or start.append(time.perf_counter()) or start
    print(f"[{time.perf_counter() - start[0]:6.0f} s] {what}", file=sys.stderr, flush=True)


def trl_advantages(scores: torch.Tensor, n: int) -> torch.Tensor:
    groups = scores.view(-1, n)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + TRL_EPS)).view(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder that solves some of the problems")
    p.add_argument("--prompts", type=int, default=4, help="prompts in the batch, 8 samples each (default 4)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--seed", type=int, default=0, help="lucidrl's sampling seed (default 0)")
    args = p.parse_args()
    if args.prompts < 1:
        sys.exit(f"--prompts {args.prompts}: must be >= 1")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setting = smollm2_setting(Path(args.model), work / "data")
        write_word_problems(work / "data")
        say("lucidrl: one GRPO step")
        batch, ours, metrics = lucidrl_step(setting, args.prompts, work, args.threads, args.seed)
        n = len(batch["responses"]) // args.prompts
        scores = batch["token_level_scores"].sum(-1)
        mixed = int((scores.view(-1, n).std(1) > 0).sum())
        if mixed == 0:
            sys.exit(
                f"none of the {args.prompts} groups had mixed scores (mean score {float(scores.mean()):.3f}), so "
                "both gradients are zero: start from a model that solves some problems, or give more --prompts"
            )
        r = recipe(lucidrl_config(setting, 1, work / "lucidrl", args.threads, args.seed))
        say("TRL: its loss on lucidrl's batch, and the control")
        theirs, trl_loss = trl_gradients(setting, r, batch, work, "dapo")
        control, control_loss = trl_gradients(setting, r, batch, work, "grpo")
        say("done")
    adv = batch["advantages"][:, 0].double()
    adv_gap = float((adv - trl_advantages(scores.double(), n)).abs().max())
    same, other = compare(ours, theirs), compare(ours, control)
    tokens = int(batch["response_mask"].sum())
    print(
        f"\nGRPO gradient from {args.model}: {args.prompts} prompts x {n} samples ({tokens} response tokens), "
        f"{mixed} of {args.prompts} groups with mixed scores, float32, seed {args.seed}\n"
    )
    print(
        f"{'TRL loss_type':<24s} {'loss':>10s} {'grad norm':>10s} {'cosine':>10s} {'|diff|/|TRL|':>13s}  worst parameter"
    )
    print(f"{'lucidrl (token-mean)':<24s} {metrics['actor/pg_loss']:10.6f} {same['norm_ours']:10.6f}")
    for label, loss, c in (("dapo (token-mean)", trl_loss, same), ("grpo (control)", control_loss, other)):
        print(
            f"{label:<24s} {loss:10.6f} {c['norm_theirs']:10.6f} {c['cosine']:10.6f} {c['rel_diff']:13.2e}  "
            f"{c['worst']} ({c['worst_rel']:.1e})"
        )
    print(f"\nlucidrl's grad norm as its update logged it: {metrics['actor/grad_norm']:.6f}")
    if "actor/zero_advantage_skipped" in metrics:
        print(
            f"lucidrl's update left out {metrics['actor/zero_advantage_skipped']:.3f} of the samples, those "
            "whose advantages were all 0 (actor.skip_zero_advantage)"
        )
    print(f"advantages, lucidrl's against TRL's formula on the same scores: max |diff| {adv_gap:.2e}")


if __name__ == "__main__":
    main()
