"""One AdamW step over a real model's parameters: torch's multi-tensor (foreach) path against its fused
kernel, which lucidrl uses for parameters on the CPU (lucidrl.workers.training.optim). Both optimizers see the
same gradients, alternating `--repeats` times after one warm-up step each; printed: the median
seconds per step, their ratio and the largest difference between the two updated weights after one
step from the same state.

    .venv/bin/python benchmarks/adamw_fused.py --model outputs/demo/model [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder (e.g. outputs/demo/model)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from lucidrl.models import load_model

    torch.manual_seed(0)
    model = load_model(args.model)
    twins = {"foreach": model, "fused": copy.deepcopy(model)}
    for param in model.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    for param, twin in zip(model.parameters(), twins["fused"].parameters(), strict=True):
        twin.grad = param.grad.clone()  # the same gradients
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-5, fused=(k == "fused")) for k, m in twins.items()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for opt in opts.values():
        opt.step()
    a, b = (dict(m.named_parameters()) for m in twins.values())
    gap = max((a[n] - b[n]).abs().max().item() for n in a)
    moved = max((a[n] - p).abs().max().item() for n, p in before.items())
    times = {k: [] for k in opts}
    for _ in range(args.repeats):
        for k, opt in opts.items():
            start = time.perf_counter()
            opt.step()
            times[k].append(time.perf_counter() - start)
    n = sum(p.numel() for p in model.parameters())
    print(
        f"{args.model}: {n / 1e6:.1f}M float32 parameters, {args.threads} threads, median of {args.repeats}\n"
    )
    print(f"{'AdamW':8s} {'s/step':>8s} {'vs foreach':>11s}")
    base = statistics.median(times["foreach"])
    for k, ts in times.items():
        print(f"{k:8s} {statistics.median(ts):8.3f} {statistics.median(ts) / base:11.2f}")
    print(
        f"\nafter one step from the same state: weights moved by up to {moved:.1e}, the two differ by {gap:.1e}"
    )


if __name__ == "__main__":
    main()
