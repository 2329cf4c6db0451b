"""Sync vs one-step-off vs async RL, simulated on a GPU cluster from first principles: which knob buys what.

What it models (all figures are inputs; defaults are round numbers of the kind verl's and AReaL's
reports give, not measurements of lucidrl):

- Rollout engines with `--slots` concurrent sequences each (continuous batching, as vLLM): every decode
  step takes `--t-decode` seconds whatever the occupancy (decoding is memory-bound) and adds a token to
  every active sequence; a finished sequence's slot takes the next prompt at once.
- Response lengths drawn from a long-tailed distribution (log-normal, median `--median-len`, capped at
  `--max-len`): most responses are short, a few run to the limit.
- Training: `--t-train-token` seconds per token on one training GPU, split over the training GPUs.
- A weight update: `--t-sync` seconds during which the engines generate nothing.

Modes:
- sync (colocated, as verl's default): all GPUs generate a batch, then all train on it; the long tail of
  the batch leaves slots idle.
- one_step_off: N rollout GPUs generate batch j+1 while M training GPUs train batch j; the engines
  drain (finish every sequence) before taking the new weights.
- async: the engines generate continuously, up to `max_staleness` versions ahead; without partial
  rollouts an update waits for in-flight sequences to drain, with them (`+partial`) the update reaches
  the engines mid-sequence and the sequences go on with the new weights (their tokens keep their own
  versions).

    python benchmarks/async_sim.py
    python benchmarks/async_sim.py --gpus 64 --rollout-share 0.75 --max-staleness 2 --steps 40

The trainer takes finished samples in the order they finish; one that finishes more than
`max_staleness` versions behind is dropped (counted in `dropped`). Batches then lean toward short
responses where the bound drops long ones, which flatters the async rows' seconds per step: read the
speed-up beside `dropped` (AReaL bounds admission instead, and drops nothing).

It prints, per mode, seconds per step, the speed-up over sync, the idle shares of the rollout and the
training GPUs, and the mean staleness of the trained tokens.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from dataclasses import dataclass


@dataclass
class Setting:
    gpus: int
    rollout_share: float
    slots: int
    batch: int
    steps: int
    median_len: float
    sigma: float
    max_len: int
    t_decode: float
    t_train_token: float
    t_sync: float
    seed: int


def lengths(s: Setting, count: int, rng: random.Random) -> list[int]:
    return [
        min(s.max_len, max(1, int(rng.lognormvariate(math.log(s.median_len), s.sigma)))) for _ in range(count)
    ]


def decode_time(lens: list[int], engines: int, s: Setting) -> tuple[float, float]:
    """(seconds, busy slot-seconds) for one batch of `lens` on `engines` engines with continuous batching,
    every sequence of the batch to its end (the batch's long tail included)."""
    per_engine: list[list[int]] = [[] for _ in range(engines)]
    for i, n in enumerate(sorted(lens, reverse=True)):  # longest first, spread round-robin
        per_engine[i % engines].append(n)
    worst = 0.0
    for queue_lens in per_engine:
        active: list[int] = []  # finish steps of the sequences in the slots
        step = 0
        for n in queue_lens:
            if len(active) == s.slots:
                step = heapq.heappop(active)
            heapq.heappush(active, step + n)
        worst = max(worst, max(active, default=0) * s.t_decode)
    return worst, sum(lens) * s.t_decode


def run_sync(s: Setting, rng: random.Random) -> dict[str, float]:
    total = busy_gen = busy_train = 0.0
    for _ in range(s.steps):
        lens = lengths(s, s.batch, rng)
        gen, slot_seconds = decode_time(lens, s.gpus, s)
        train = sum(lens) * s.t_train_token / s.gpus
        total += gen + train + s.t_sync
        busy_gen += slot_seconds / (s.slots * s.gpus)
        busy_train += train
    return {
        "s_per_step": total / s.steps,
        "rollout_idle": 1 - busy_gen / total,
        "train_idle": 1 - busy_train / total,
        "staleness": 0.0,
        "dropped": 0.0,
    }


def run_one_step_off(s: Setting, rng: random.Random) -> dict[str, float]:
    """Batch j+1 generates on the rollout GPUs (to its last sequence) while batch j trains on the others;
    then the engines take the new weights."""
    n_roll = max(1, round(s.gpus * s.rollout_share))
    n_train = max(1, s.gpus - n_roll)
    total = busy_gen = busy_train = 0.0
    lens = lengths(s, s.batch, rng)
    first, slot_seconds = decode_time(lens, n_roll, s)  # batch 1: nothing to overlap with
    total += first + s.t_sync
    busy_gen += slot_seconds / (s.slots * n_roll)
    for step in range(s.steps):
        train = sum(lens) * s.t_train_token / n_train
        nxt = lengths(s, s.batch, rng)
        gen, slot_seconds = decode_time(nxt, n_roll, s) if step < s.steps - 1 else (0.0, 0.0)
        total += max(gen, train) + s.t_sync
        busy_gen += slot_seconds / (s.slots * n_roll)
        busy_train += train
        lens = nxt
    return {
        "s_per_step": total / s.steps,
        "rollout_idle": 1 - busy_gen / total,
        "train_idle": 1 - busy_train / total,
        "staleness": (s.steps - 1) / s.steps,
        "dropped": 0.0,
    }


def run_overlapped(s: Setting, rng: random.Random, max_staleness: int, partial: bool) -> dict[str, float]:
    """Event simulation: N engines decode step by step; M trainers take a batch once `batch` samples
    allowed by the staleness bound are done."""
    n_roll = max(1, round(s.gpus * s.rollout_share))
    n_train = max(1, s.gpus - n_roll)
    t = 0.0
    version = 0  # the trainer's updates so far
    engine_version = 0  # the weights the engines hold
    done: list[tuple[int, int]] = []  # (first token's version, tokens) of finished samples
    slots: list[list[int]] = []  # per active sequence: [tokens left, tokens made, version at admission]
    train_free_at = 0.0
    training_batch: tuple[float, list] | None = None  # (finish time, samples)
    pending_sync = False
    steps_done = 0
    busy_gen = busy_train = 0.0
    stale_sum = stale_tokens = 0.0
    dropped = made = 0
    capacity = s.slots * n_roll
    while steps_done < s.steps:
        # the trainer: finish a batch, then take the next one as soon as enough fresh samples are done
        if training_batch is not None and t >= training_batch[0]:
            training_batch = None
            version += 1
            pending_sync = True
            steps_done += 1
        if training_batch is None and steps_done < s.steps:
            fresh = [x for x in done if version - x[0] <= max_staleness]
            dropped += len(done) - len(fresh)  # too old to train under the bound: generated for nothing
            made += len(done) - len(fresh)
            done = fresh
            if len(done) >= s.batch:
                batch, done = done[: s.batch], done[s.batch :]
                made += len(batch)
                tokens = sum(n for _, n in batch)
                for v, n in batch:
                    stale_sum += (version - v) * n
                    stale_tokens += n
                dur = tokens * s.t_train_token / n_train
                busy_train += dur
                training_batch = (max(t, train_free_at) + dur, batch)
                train_free_at = training_batch[0]
        # the engines: a weight update waits for a drain unless partial rollouts are on
        if pending_sync and (partial or not slots):
            t += s.t_sync
            engine_version = version
            pending_sync = False
            continue
        admit = not pending_sync and engine_version >= version - max_staleness + 0  # fresh enough to start
        while admit and len(slots) < capacity and len(done) + len(slots) < s.batch * (max_staleness + 1):
            (n,) = lengths(s, 1, rng)
            slots.append([n, 0, engine_version])
        if not slots:  # nothing to decode: jump to the trainer's next event
            if training_batch is None:
                break
            t = training_batch[0]
            continue
        # jump to the next event: a sequence ends, or the trainer finishes its batch
        jump = min(seq[0] for seq in slots)
        if training_batch is not None and training_batch[0] > t:
            jump = max(1, min(jump, math.ceil((training_batch[0] - t) / s.t_decode)))
        t += jump * s.t_decode
        busy_gen += len(slots) / capacity * jump * s.t_decode
        keep = []
        for seq in slots:
            seq[0] -= jump
            seq[1] += jump
            if seq[0] <= 0:
                done.append((seq[2], seq[1]))
            else:
                keep.append(seq)
        slots = keep
    return {
        "s_per_step": t / max(steps_done, 1),
        "rollout_idle": 1 - busy_gen / t,
        "train_idle": 1 - busy_train / (t * 1.0),
        "staleness": stale_sum / max(stale_tokens, 1),
        "dropped": dropped / max(made, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=32)
    p.add_argument(
        "--rollout-share", type=float, default=0.75, help="share of the GPUs that generate (overlapped modes)"
    )
    p.add_argument("--slots", type=int, default=64, help="concurrent sequences per engine")
    p.add_argument("--batch", type=int, default=2048, help="samples per training step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--median-len", type=float, default=1500)
    p.add_argument("--sigma", type=float, default=0.8, help="log-normal spread of the lengths (the tail)")
    p.add_argument("--max-len", type=int, default=16384)
    p.add_argument("--t-decode", type=float, default=0.02, help="seconds per decode step of an engine")
    p.add_argument("--t-train-token", type=float, default=2e-4, help="training seconds per token on one GPU")
    p.add_argument("--t-sync", type=float, default=5.0, help="seconds per weight update of the engines")
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    s = Setting(a.gpus, a.rollout_share, a.slots, a.batch, a.steps, a.median_len, a.sigma, a.max_len,
                a.t_decode, a.t_train_token, a.t_sync, a.seed)  # fmt: skip
    rows = [
        ("sync (colocated)", run_sync(s, random.Random(a.seed))),
        ("one_step_off", run_one_step_off(s, random.Random(a.seed))),
        (
            f"async k={a.max_staleness}",
            run_overlapped(s, random.Random(a.seed), a.max_staleness, partial=False),
        ),
        (
            f"async k={a.max_staleness} +partial",
            run_overlapped(s, random.Random(a.seed), a.max_staleness, partial=True),
        ),
    ]
    base = rows[0][1]["s_per_step"]
    print(f"{a.gpus} GPUs ({a.rollout_share:.0%} generate in the overlapped modes), {a.batch} samples a step, "
          f"lengths median {a.median_len:.0f} (sigma {a.sigma}, cap {a.max_len}), {a.steps} steps")  # fmt: skip
    print(
        f"{'mode':<24} {'s/step':>8} {'speed-up':>9} {'rollout idle':>13} {'train idle':>11} {'staleness':>10} {'dropped':>8}"
    )
    for name, r in rows:
        print(f"{name:<24} {r['s_per_step']:8.1f} {base / r['s_per_step']:8.2f}x {r['rollout_idle']:12.0%} "
              f"{r['train_idle']:10.0%} {r['staleness']:10.2f} {r['dropped']:8.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
