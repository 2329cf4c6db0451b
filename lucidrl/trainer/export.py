"""`lucidrl export`: a HuggingFace model folder from a training checkpoint's actor."""

from __future__ import annotations

from pathlib import Path

from lucidrl.trainer.checkpoint import check_checkpoint, read_config, read_state
from lucidrl.workers.training.checkpoint_files import verify_checkpoint
from lucidrl.workers.training.train_state import CheckpointError


def export_checkpoint(path: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """A HuggingFace folder of a checkpoint's actor, in the run's model.dtype.

    The checkpoint's `actor/model` already loads with `from_pretrained`; export checks that it does and
    writes it as save_pretrained would (one `model.safetensors`, tied weights once). OUT must be new or
    empty; with `overwrite`, an existing model folder (holding config.json) is replaced.
    """
    from lucidrl.config import LucidConfig, config_from_dict
    from lucidrl.models import load_model, load_run_tokenizer, load_tokenizer
    from lucidrl.models.loading import DTYPES, ModelLoadError
    from lucidrl.models.lora import ADAPTER, quiet_peft
    from lucidrl.models.saving import save_hf_folder
    from lucidrl.workers.training.train_state import WEIGHTS

    ckpt = check_checkpoint(path, key="CHECKPOINT")
    verify_checkpoint(ckpt)  # every file as its save wrote it, before any is read
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not overwrite:
            raise CheckpointError(
                f"OUT={str(out)!r} exists and is not empty; give a new folder, or --overwrite"
            )
        if not (target / "config.json").is_file() or (target / "checkpoints").exists():
            raise CheckpointError(
                f"OUT={str(out)!r} is not a HuggingFace model folder (no config.json, or it holds checkpoints); "
                "--overwrite only replaces a model folder: give a new folder"
            )
    from lucidrl.config import SFTConfig

    kind = read_state(ckpt).get("kind", "rl")
    cfg = config_from_dict(
        read_config(ckpt),
        source=str(ckpt / "config.yaml"),
        schema=SFTConfig if kind == "sft" else LucidConfig,
    )
    m = cfg.model
    adapter = ckpt / "actor" / ADAPTER
    if adapter.is_dir():  # LoRA: the adapters on the base model, merged
        from peft import PeftModel

        try:
            base = load_model(m.path, dtype=DTYPES[m.dtype], trust_remote_code=m.trust_remote_code)
            tokenizer = load_run_tokenizer(m)
        except ModelLoadError as exc:
            raise ModelLoadError(
                f"{exc}\n({ckpt} holds LoRA adapters only: export merges them into the run's base model, "
                f"model.path={m.path!r}; run it from the folder the run started in)"
            ) from exc
        with quiet_peft():
            model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
        return save_hf_folder(model, tokenizer, out)
    weights = ckpt / "actor" / WEIGHTS
    if not (weights / "config.json").is_file():
        raise CheckpointError(
            f"{ckpt} has no actor weights folder {weights} (a checkpoint written before the weights were "
            "saved as safetensors there); export it with the lucidrl version that wrote it"
        )
    try:
        model = load_model(
            str(weights),
            dtype=DTYPES[cfg.model.dtype],
            trust_remote_code=cfg.model.trust_remote_code,
            config_key="the checkpoint's actor/model",
        )
    except ModelLoadError as exc:
        raise ModelLoadError(
            f"{exc}\n(the actor weights of {ckpt}, a checkpoint without a manifest.json to check them by: "
            "export another checkpoint of the run, or the run's final model folder if it has one)"
        ) from exc
    tokenizer = load_tokenizer(str(weights), pad_token=cfg.model.pad_token)
    return save_hf_folder(model, tokenizer, out)
