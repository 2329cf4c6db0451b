"""SFT's micro-batches: one padded forward per step against length-sorted and token-budget pieces.

The demo's SFT data and model: Knights & Knaves truth-table traces of 2 and 3 people (prompt and
response 120-450 tokens; a random batch of 32 is about half padding) and the 0.6M-parameter tiny
Qwen2 (hidden 128, 2 layers). Per variant, in a fresh process each: `--steps` SFT steps of 32 rows
after 3 warm-up steps, every variant on the same batches. Printed: median seconds per step, the share
of the forwards' tokens that are padding, real (unpadded) tokens per second, the speed-up over the
first variant and peak RSS growth. Every variant computes the same gradient (tests/test_sft.py); the
last column is the largest difference of its weights from the first variant's after the steps.

    .venv/bin/python benchmarks/sft_micro_batches.py [--steps 15] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from processes import peak_rss_mb, rss_mb, run_variant

BATCH = 32
# name -> SFT config overrides
VARIANTS = {
    "32 rows unsorted": {"micro_batch_size": 32, "length_sorted_micro_batches": False},
    "16 rows sorted": {"micro_batch_size": 16},
    "8 rows sorted": {"micro_batch_size": 8},
    "4k tokens": {"data": {"use_dynamic_bsz": True, "max_token_len_per_gpu": 4096}},
    "8k tokens": {"data": {"use_dynamic_bsz": True, "max_token_len_per_gpu": 8192}},
}


def prepare(work: Path) -> None:
    """The tiny model and 560 traced rows (280 of 2 and of 3 people: 2-person K&K has 285 puzzles)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lucidrl.data.kk import generate_dataset
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model

    rows, _ = generate_dataset((2, 3), 560, 0, seed=0, trace=True)
    for r in rows:
        r["prompt"] = [m for m in r["prompt"] if m["role"] != "system"]
    pq.write_table(pa.Table.from_pylist(rows), work / "train.parquet")
    build_tiny_model(work / "model", kk_tokenizer_corpus(0), hidden_size=128, num_layers=2, seed=0)


def worker(work: Path, name: str, steps: int) -> dict:
    from lucidrl.config import SFTConfig, config_from_dict
    from lucidrl.trainer.sft import SFTTrainer

    cfg = {
        "model": {"path": str(work / "model")},
        "data": {"train_files": [str(work / "train.parquet")], "batch_size": BATCH, "max_length": 2048},
        "optim": {"lr": 1e-3},
        "trainer": {"run_dir": str(work / name.replace(" ", "_")), "overwrite": True,
                    "logger": [], "save_final_model": False, "seed": 0},
    }  # fmt: skip
    for key, value in VARIANTS[name].items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    trainer = SFTTrainer(config_from_dict(cfg, source="sft_micro_batches", schema=SFTConfig))
    batches = trainer._batches()
    for _ in range(3):
        trainer.step(next(batches))
    before = rss_mb()
    seconds, real, padded = [], 0, 0
    for _ in range(steps):
        rows = next(batches)
        pieces = trainer._micro_batches(rows)
        real += sum(len(r.input_ids) for r in rows)
        padded += sum(len(p) * max(len(r.input_ids) for r in p) for p in pieces)
        t = time.perf_counter()
        trainer.step(rows)
        seconds.append(time.perf_counter() - t)
    torch.save(trainer.model.state_dict(), work / f"{name}.pt")
    return {
        "s_per_step": statistics.median(seconds),
        "padding": 1 - real / padded,
        "real_tok_s": real / sum(seconds),
        "peak_growth_mb": peak_rss_mb() - before,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--only", default=",".join(VARIANTS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(Path(args.work), args.worker, args.steps)))
        return
    names = args.only.split(",")
    if any(n not in VARIANTS for n in names):
        sys.exit(f"--only {args.only}: variants are {list(VARIANTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work)
        rows = {}
        for name in names:
            rows[name] = run_variant(__file__, name, tmp, "--steps", str(args.steps))
            print(f"  {name}: {rows[name]}", flush=True)
        first = torch.load(work / f"{names[0]}.pt")
        for name in names:
            other = torch.load(work / f"{name}.pt")
            rows[name]["weights_diff"] = max((first[k] - other[k]).abs().max().item() for k in first)
    print(
        f"\nSFT, {BATCH} rows a step, K&K traces of 2 and 3 people, tiny Qwen2 128/2; median of {args.steps} steps\n"
    )
    base = rows[names[0]]
    print(
        f"{'micro-batches':18s} {'s/step':>7s} {'padding':>8s} {'real tok/s':>11s} {'vs ' + names[0]:>22s} "
        f"{'peak RSS growth MB':>19s} {'max |dw|':>9s}"
    )
    for name, r in rows.items():
        print(
            f"{name:18s} {r['s_per_step']:7.3f} {r['padding']:8.0%} {r['real_tok_s']:11.0f} "
            f"{base['s_per_step'] / r['s_per_step']:22.2f} {r['peak_growth_mb']:19.0f} {r['weights_diff']:9.1e}"
        )


if __name__ == "__main__":
    main()
