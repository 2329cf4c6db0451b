"""One trained model's full training state (weights, AdamW state, LR schedule) in a checkpoint folder.

    ROLE/model/     the weights as a HuggingFace folder: config.json, model-*.safetensors and their
                    index (plus the tokenizer for the actor); `from_pretrained` loads it as it is
    ROLE/           AdamW state, LR schedule and counters (.metadata, *.distcp)

torch.distributed.checkpoint (DCP) writes both: with FSDP2 every rank writes its own shards (the
weights' shards are then joined into whole tensors by rank 0, file to file, with no gather), with DDP
or one process the same calls write whole tensors. Loading reads each rank's slice of every tensor,
so a checkpoint resumes under another world size. `trainer/checkpoint.py` lays the folders out and
decides when to save and what to resume.
"""

from __future__ import annotations

import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lucidrl.models.lora import ADAPTER, is_lora, load_adapter_state
from lucidrl.models.saving import make_portable
from lucidrl.workers.common.rng import set_process_rng_state
from lucidrl.workers.training.checkpoint_files import (  # noqa: F401 - CheckpointError is imported from here too
    CheckpointError,
    check_saved_shapes,
    damaged,
    load_rng_state,
    read_errors,
)

WEIGHTS = "model"  # the HuggingFace folder inside a role's checkpoint folder
INDEX = "model.safetensors.index.json"  # what DCP's HuggingFace writer names the weight map


@contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group; one process is what the local backend means."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def _untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without the later names of tied tensors (lm_head.weight when it is the embedding):
    safetensors refuses shared storage, and HuggingFace re-ties them on load, as save_pretrained expects."""
    seen, kept = set(), {}
    for name, value in state.items():
        local = value.to_local() if hasattr(value, "to_local") else value
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape))
        if local.numel() == 0 or key not in seen:  # an empty shard has no storage worth comparing
            seen.add(key)
            kept[name] = value
    return kept


def _is_writer() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _write_model_files(hf_model, folder: Path, tokenizer) -> None:
    """What save_pretrained writes beside the weights: config.json (naming the class that loads them),
    generation_config.json, the code of a trust_remote_code model, and the tokenizer."""
    import copy

    from transformers.dynamic_module_utils import custom_object_save

    config = copy.deepcopy(hf_model.config)
    config.architectures = [type(hf_model).__name__.removeprefix("FSDP")]  # FSDP2 renames the class
    if getattr(hf_model, "_auto_class", None) is not None:
        custom_object_save(hf_model, folder, config=config)
    config.save_pretrained(folder)
    generation = getattr(hf_model, "generation_config", None)
    if generation is not None and hf_model.can_generate():
        generation.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    make_portable(
        folder
    )  # a checkpoint's weights folder loads with from_pretrained, in transformers 4.5x too


def save_train_state(
    model: torch.nn.Module,
    optimizer,
    scheduler,
    path: Path,
    extra: dict[str, Any],
    *,
    hf_model,
    tokenizer=None,
) -> None:
    """Weights (a HuggingFace folder), optimizer and schedule of one trained model (collective).

    `hf_model` (the HuggingFace module under any DDP wrapper) and `tokenizer` complete the weights
    into a folder that `from_pretrained` loads. An optimizer that has not stepped yet (the actor during
    critic.warmup_steps) is saved as absent: asking torch for its state dict would create the state
    with a zero-gradient step, and the first real update would then be AdamW's second.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from lucidrl.workers.common.distributed import reshard

    weights = path / WEIGHTS
    sharded = dist.is_initialized() and dist.get_world_size() > 1
    if sharded:
        reshard(model)  # a no-grad forward (critic warm-up steps) leaves FSDP2's root gathered
    lora = is_lora(hf_model)
    has_optim = bool(optimizer.state)
    state = {"scheduler": scheduler.state_dict(), "extra": {**extra, "has_optim": has_optim}}
    if has_optim:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    with _single_process_quiet():
        if not lora:  # a LoRA actor saves its adapters alone (below): the base weights never change
            writer = dcp.HuggingFaceStorageWriter(
                str(weights), save_distributed=sharded, enable_consolidation=sharded
            )
            dcp.save(_untied(get_model_state_dict(model)), storage_writer=writer)
        dcp.save(state, checkpoint_id=str(path))
    if _is_writer():
        if lora:
            hf_model.save_pretrained(path / ADAPTER)  # adapter_config.json, adapter_model.safetensors
        else:
            shutil.rmtree(weights / "sharded", ignore_errors=True)  # the per-rank files, now joined
            _write_model_files(hf_model, weights, tokenizer)


def check_train_state(path: Path) -> None:
    """CheckpointError unless `path` holds a complete training state as save_train_state writes it."""
    weights = (path / WEIGHTS / INDEX).is_file() or (path / ADAPTER / "adapter_config.json").is_file()
    if not (path / ".metadata").is_file() or not weights:
        raise CheckpointError(
            f"checkpoint folder {path} is missing or incomplete: it needs .metadata (optimizer state) and "
            f"{WEIGHTS}/{INDEX} (the weights as safetensors; checkpoints written before the weights moved "
            f"there keep them inside the .distcp files, and this version cannot resume them), or {ADAPTER}/ "
            "for a LoRA actor"
        )


def restore_rng_file(path: Path) -> None:
    """This process's RNG states from a checkpoint file (CheckpointError naming it when it cannot be)."""
    rng = load_rng_state(path)
    try:
        set_process_rng_state(rng)
    except (TypeError, ValueError, RuntimeError) as exc:  # a state of another shape or version
        raise damaged(path, "the process's RNG state", exc) from exc


def load_train_state(
    model: torch.nn.Module,
    optimizer,
    scheduler,
    path: Path,
    extra: dict[str, Any],
    *,
    model_key: str = "model.path",
) -> dict:
    """The inverse of save_train_state, into modules built as the run builds them; returns `extra` filled.

    A file that cannot be read, or saved weights whose shapes differ from the model's (`model_key`'s
    folder rebuilt at another size), is a CheckpointError naming the file and the earlier checkpoints."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    check_train_state(path)
    hf_model = getattr(model, "module", model)  # under DDP
    if is_lora(hf_model) != (path / ADAPTER).is_dir():
        raise CheckpointError(
            f"{path} holds {'LoRA adapters' if (path / ADAPTER).is_dir() else 'full weights'}, but this run's "
            f"model is {'a LoRA actor' if is_lora(hf_model) else 'trained whole'}: resume with the model.lora_rank "
            "it was saved with"
        )
    # the optimizer and schedule were just built from this run's config: its hyperparameters win over the
    # checkpoint's (a resume announces "changed since: actor.optim.lr ..."; AdamW's and the schedule's
    # saved state would otherwise put the old values back silently)
    configured = [{k: g[k] for k in _HYPER if k in g} for g in optimizer.param_groups]
    base_lrs = list(scheduler.base_lrs)
    state: dict[str, Any] = {"scheduler": scheduler.state_dict(), "extra": {**extra, "has_optim": False}}
    failed = read_errors()
    with _single_process_quiet():
        if is_lora(hf_model):
            from safetensors.torch import load_file

            adapter = path / ADAPTER / "adapter_model.safetensors"
            try:
                adapter_state = load_file(adapter)
            except failed as exc:  # a truncated file: safetensors' header errors
                raise damaged(adapter, "the LoRA adapters", exc) from exc
            load_adapter_state(hf_model, adapter_state)
        else:
            # strict: a weight the checkpoint lacks is an error; tied names fill in through the shared tensor
            weights = get_model_state_dict(model)
            untied = _untied(weights)
            check_saved_shapes(path / WEIGHTS, {k: v.shape for k, v in untied.items()}, model_key)
            try:
                dcp.load(untied, storage_reader=dcp.HuggingFaceStorageReader(str(path / WEIGHTS)))
            except failed as exc:  # "AssertionError: metadata is None" for a truncated file, ...
                raise damaged(path / WEIGHTS, "the weights", exc) from exc
            set_model_state_dict(model, weights)
        try:
            dcp.load(state, checkpoint_id=str(path))
        except failed as exc:  # a truncated .distcp: "EOFError: Ran out of input", ...
            raise damaged(path, "the optimizer state and LR schedule (.metadata, *.distcp)", exc) from exc
        scheduler.load_state_dict(state["scheduler"])
        if state["extra"].pop("has_optim"):
            # partial: a parameter that had no gradient before the save has no AdamW state in it
            optim = {"optim": get_optimizer_state_dict(model, optimizer)}
            try:
                dcp.load(optim, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True))
            except failed as exc:
                raise damaged(path, "the optimizer state (.metadata, *.distcp)", exc) from exc
            set_optimizer_state_dict(model, optimizer, optim["optim"])
    _reapply_hyperparameters(optimizer, scheduler, configured, base_lrs)
    return state["extra"]


_HYPER = ("betas", "weight_decay", "eps", "initial_lr")


def _reapply_hyperparameters(optimizer, scheduler, configured: list[dict], base_lrs: list[float]) -> None:
    """Put this run's lr, betas, weight decay and eps back after loading a checkpoint's optimizer and
    schedule state, keeping the schedule's position (its step count) and AdamW's moments."""
    for group, values in zip(optimizer.param_groups, configured, strict=True):
        group.update(values)
    scheduler.base_lrs = base_lrs
    lrs = [base * f(scheduler.last_epoch) for base, f in zip(base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() (actor/lr) reports
