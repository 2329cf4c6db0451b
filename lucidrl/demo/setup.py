"""The demo's model and data, made once under its output folder and reused by later runs."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from lucidrl.demo.plan import DemoPlan
from lucidrl.diagnostics.errors import UsageError

# what the data folder was made with: a later run with another plan makes it again
_DATA_STAMP = "demo_data.json"


def ensure_model(out: Path, plan: DemoPlan, model: str | None, console: Console) -> Path:
    """The model folder: `model` when given (checked), else `out/model`, written from the installed
    package by `lucidrl model get` the first time."""
    if model is not None:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise UsageError(
                f"lucidrl demo: --model {model} is not a HuggingFace model folder (no config.json); give "
                f"one, or leave --model out to use {plan.model_name} from the installed package"
            )
        return path
    path = out / "model"
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        console.print(f"model: {escape(str(path))} (made by an earlier run)")
        return path
    from lucidrl.models.gguf import get_packaged_model

    with console.status(f"writing {plan.model_name} to {escape(str(path))} (once; about half a minute)"):
        info = get_packaged_model(plan.model_name, path, overwrite=True)
    console.print(
        f"model: {info['model_class']} of {info['num_parameters'] / 1e6:.1f}M parameters from "
        f"{escape(str(info['source']))} → {escape(str(path))}"
    )
    return path


def ensure_data(out: Path, plan: DemoPlan, console: Console) -> dict[str, str]:
    """train.parquet and val.parquet of the plan's task under `out`: made again only when the plan's
    data settings changed. The val problems never share their numbers with a train problem."""
    from lucidrl.data.word_problems import write_word_problems_parquet

    wanted = {"task": plan.task, "n_train": plan.n_train, "n_val": plan.n_val, "seed": 0}
    files = {"train": str(out / "train.parquet"), "val": str(out / "val.parquet")}
    stamp = out / _DATA_STAMP
    if (
        stamp.is_file()
        and json.loads(stamp.read_text()) == wanted
        and all(Path(f).is_file() for f in files.values())
    ):
        console.print(f"data: {escape(str(out))} (made by an earlier run)")
        return files
    if plan.task != "word_problems":
        raise UsageError(
            f"lucidrl demo: task {plan.task!r} is not one the demo generates; it has word_problems"
        )
    try:
        info = write_word_problems_parquet(
            out, n_train=plan.n_train, n_val=plan.n_val, seed=0, fmt="answer_is"
        )
    except ValueError as exc:
        raise UsageError(f"lucidrl demo: --n-val {plan.n_val} with --n-train {plan.n_train}: {exc}") from exc
    stamp.write_text(json.dumps(wanted) + "\n")
    console.print(
        f"data: {info['n_train']} training and {info['n_val']} held-out word problems "
        f"(no held-out problem's numbers in training) → {escape(str(out))}"
    )
    return files
