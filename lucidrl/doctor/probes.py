"""The parts of `lucidrl doctor` that run in a child process, because they can hang or abort one.

    python -m lucidrl.doctor.probes compile [--device cuda] [--dtype bfloat16]
    python -m lucidrl.doctor.probes dist --rank R --world W --port P --backend gloo|nccl

Each prints one JSON line on stdout as its last line; the doctor reads it, or the stderr tail when
the child died.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings


def probe_compile(device: str, dtype: str = "float32") -> dict:
    """The actor's fused log-prob and entropy, compiled, forward and backward, against eager, on logits
    of `dtype` (bfloat16 where the run computes in it: that is another graph, which can fail alone)."""
    import torch

    from lucidrl.algos import fused_logprob as fl

    torch.manual_seed(0)
    logits = (torch.randn(64, 4096, device=device) * 4).to(getattr(torch, dtype)).requires_grad_()
    labels = torch.randint(0, 4096, (64,), device=device)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        lp, ent = fl.log_probs_and_entropy(logits, labels, temperature=0.7, with_entropy=True, compiled=True)
        (lp.sum() + ent.sum()).backward()
    seconds = time.perf_counter() - start
    grad = logits.grad.clone()
    logits.grad = None
    lp_e, ent_e = fl.log_probs_and_entropy(logits, labels, temperature=0.7, with_entropy=True, compiled=False)
    (lp_e.sum() + ent_e.sum()).backward()
    diff = max((lp - lp_e).abs().max().item(), (ent - ent_e).abs().max().item())  # float32 outputs
    # the gradient is in the logits' dtype: compared relative to its size, where a bfloat16 rounding
    # step is 2^-8 of it (one such step apart is agreement)
    grad_diff = ((grad.float() - logits.grad.float()).abs().max() / logits.grad.float().abs().max()).item()
    failure = fl.compiled_log_probs_and_entropy.failure
    return {
        "compiled": failure is None,
        "failure": failure,
        "max_diff": diff,
        "grad_rel_diff": grad_diff,
        "grad_rel_tol": max(1e-3, 4 * torch.finfo(logits.dtype).eps),
        "seconds": seconds,
        "dtype": dtype,
    }


def probe_dist(rank: int, world: int, port: int, backend: str) -> dict:
    """Join a group on 127.0.0.1:port and all-reduce rank + 1 (the sum is world (world + 1) / 2)."""
    import torch
    import torch.distributed as dist

    from lucidrl.workers.common.distributed import DistInfo, init_process_group

    if backend == "nccl":
        torch.cuda.set_device(rank)
    seconds = init_process_group(DistInfo(rank, world, "127.0.0.1", port, backend))
    x = torch.tensor([float(rank + 1)], device=f"cuda:{rank}" if backend == "nccl" else "cpu")
    dist.all_reduce(x)
    dist.destroy_process_group()
    return {"rank": rank, "init_s": seconds, "sum": x.item()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lucidrl.doctor.probes")
    sub = p.add_subparsers(dest="probe", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--device", default="cpu")
    c.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the logits' dtype")
    d = sub.add_parser("dist")
    d.add_argument("--rank", type=int, required=True)
    d.add_argument("--world", type=int, required=True)
    d.add_argument("--port", type=int, required=True)
    d.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    args = p.parse_args(argv)
    if args.probe == "compile":
        result = probe_compile(args.device, args.dtype)
    else:
        result = probe_dist(args.rank, args.world, args.port, args.backend)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
