"""torch.distributed among the ranks of a worker group: a free port, init, and model wrapping."""

from __future__ import annotations

import errno
import inspect
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lucidrl.diagnostics.errors import UserError


class PortInUseError(OSError, UserError):
    """The configured rendezvous port is taken on the rank-0 host (a setting to change: a user error)."""


@dataclass(frozen=True)
class DistInfo:
    """Where rank 0 listens for the rendezvous, and this rank's place in the group."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    backend: str  # "gloo" (CPU) or "nccl" (GPU)


def node_ip() -> str:
    """This host's address as other nodes reach it (loopback when that is all there is)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def pick_port(host: str, port: int | None) -> int:
    """`port` if it is free on this host (else PortInUseError naming it), or a free one the OS picks."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port or 0))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"trainer.master_port={port} is already in use on {host}; pick another port or leave "
                    f"trainer.master_port unset (null) to use a free one"
                ) from e
            raise
        return s.getsockname()[1]


def init_process_group(info: DistInfo) -> float:
    """Join the group (gloo on CPU, nccl on GPU); returns the seconds it took (LUCIDRL_DEBUG prints them)."""
    start = time.perf_counter()
    os.environ.update(
        MASTER_ADDR=info.master_addr,
        MASTER_PORT=str(info.master_port),
        RANK=str(info.rank),
        WORLD_SIZE=str(info.world_size),
        # the GPU this rank set as current (local_cuda_index), which vLLM's engine also takes
        LOCAL_RANK=str(torch.cuda.current_device()) if info.backend == "nccl" else "0",
    )
    dist.init_process_group(backend=info.backend, rank=info.rank, world_size=info.world_size)
    return time.perf_counter() - start


def local_cuda_index() -> int:
    """The index, among the GPUs this process sees, of the one Ray assigned to it (a rank asks for one).

    Ray normally sets CUDA_VISIBLE_DEVICES to that GPU alone, so it is cuda:0. A cluster with
    RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES shows every rank all the node's GPUs; then the rank
    must pick its own, or all of them would use cuda:0 (verl handles the same case). 0 outside Ray.
    """
    try:
        import ray

        assigned = [str(i) for i in ray.get_gpu_ids()] if ray.is_initialized() else []
    except ImportError:
        assigned = []
    if not assigned:
        return 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        return visible.index(assigned[0]) if assigned[0] in visible else 0
    return int(assigned[0])


def wrap_for_training(
    model: torch.nn.Module, strategy: str, device: str, compute_dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """FSDP2 (`fully_shard` per decoder layer, then the root) or DDP over the initialised group.

    `compute_dtype` (bfloat16 over float32 weights, model.compute_dtype): FSDP2 gathers the
    parameters in that dtype and reduces gradients in float32 (MixedPrecisionPolicy, as verl does),
    so the all-gathers move half the bytes and autocast keeps no low-precision copy of every full
    weight for the backward pass. The shards, their gradients and the optimizer stay float32.
    """
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # no buffer broadcast in every forward: the buffers (rotary frequencies) are the same on every
        # rank, built from the same config. torch 2.13 renamed the option (the old name warns)
        takes_new = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        no_sync = {"forward_sync_buffers": False} if takes_new else {"broadcast_buffers": False}
        return DistributedDataParallel(model, **no_sync)
    if strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
        policy = (
            MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            if compute_dtype is not None
            else MixedPrecisionPolicy()
        )
        layers = _decoder_layers(model)
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    raise ValueError(f"trainer.strategy must be 'fsdp2' or 'ddp', got {strategy!r}")


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (the unit FSDP shards by); HF models keep them in a ModuleList `layers`."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList):
            return list(module)
    return []


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF module under a DDP wrapper (FSDP2 shards in place, so there is nothing to unwrap)."""
    return getattr(model, "module", model)


def reshard(model: torch.nn.Module) -> None:
    """Put every FSDP2 module of `model` back into its sharded state.

    FSDP2 never reshards the root after a forward: after a no-grad forward (the old-log-prob pass) its
    parameters (embeddings, final norm, head) are still the gathered, compute-dtype tensors. Reading
    the weights then gives those (bf16 beside float32 shards), and torch's optimizer state dict fails
    (KeyError). Called before anything reads the parameters as a whole; a no-op for other models.
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def full_parameters(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of each parameter, one at a time (cast to `dtype` first, when given).

    FSDP2 parameters are all-gathered one by one (`full_tensor`, a collective every rank must run
    in the same order, to the end), so no rank ever holds a whole second copy of the weights.
    Others are yielded as they are.
    """
    reshard(model)
    for name, param in unwrap(model).named_parameters():
        if hasattr(param, "full_tensor"):
            param = (param.to(dtype) if dtype is not None else param).full_tensor()
        yield name, param


@torch.no_grad()
def copy_full_parameters(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Set `dst`'s parameters (an unsharded copy) to `src`'s full values, one gathered tensor at a time."""
    targets = dict(dst.named_parameters())
    for name, param in full_parameters(src):
        targets[name].copy_(param)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as a full (unsharded) tensor, on every rank: for the rollout copy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if dist.is_initialized():
        reshard(model)
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return unwrap(model).state_dict()
