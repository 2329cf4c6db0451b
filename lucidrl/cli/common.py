"""What several commands share: config arguments, the key listing, the closing line of a run."""

from __future__ import annotations

from pathlib import Path


def print_keys(schema: type) -> int:
    from lucidrl.config import describe_keys

    print("\n".join(describe_keys(schema)))
    return 0


def run_dir_contents(trainer_cfg) -> str:
    """What a finished run's folder holds, by its config: the line `train` and `sft` end with."""
    held = ["metrics.jsonl"] if "jsonl" in trainer_cfg.logger else []
    held.append("config.yaml")
    if trainer_cfg.save_final_model:
        held.append("final/ HuggingFace model")
    return ", ".join(held)


def split_config_args(items: list[str]) -> tuple[str | None, list[str]]:
    """(the config file, the overrides): the first argument is the file when it has no `=`, or when it
    names a .yaml file that exists (a path such as runs/lr=1e-4/config.yaml); `~key` (Hydra's delete) is
    an override."""
    if items and items[0].startswith("~") and not Path(items[0]).exists():
        return None, items
    if items and ("=" not in items[0] or (items[0].endswith((".yaml", ".yml")) and Path(items[0]).is_file())):
        return items[0], items[1:]
    return None, items
