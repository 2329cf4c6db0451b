"""Worker groups: the same calls on one in-process worker (`local`) or on Ray actors, one per rank (`ray`).

`group.generate(batch, params)` looks up the method's dispatch mode (lucidrl.controller.dispatch),
sends each rank its part, waits, and merges. A failure in any rank comes back as RemoteWorkerError
(original type, message, role, rank, host, remote traceback); a rank whose process died comes back
as WorkerDiedError naming its role and rank.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from lucidrl.controller.dispatch import merge_from_ranks, split_for_ranks
from lucidrl.controller.errors import RemoteFailure, RemoteWorkerError, WorkerDiedError
from lucidrl.diagnostics.debug import debug_enabled
from lucidrl.workers.common.dispatch import Dispatch, dispatch_mode
from lucidrl.workers.common.distributed import DistInfo, node_ip, pick_port

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

log = logging.getLogger(__name__)


class WorkerGroup:
    """The interface both backends share: attribute access calls a worker method on the group."""

    role: str
    world_size: int
    worker_cls: type

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        dispatch_mode(self.worker_cls, name)  # an unknown method fails here, listing the real ones
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def shutdown(self) -> None:
        pass


class LocalWorkerGroup(WorkerGroup):
    """One rank in the trainer's own process: zero start-up cost, exceptions arrive untouched."""

    def __init__(self, worker_cls: type, role: str, *args: Any, **kwargs: Any):
        self.worker_cls, self.role, self.world_size = worker_cls, role, 1
        self.worker = worker_cls(*args, dist_info=None, **kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        dispatch_mode(self.worker_cls, method)
        return getattr(self.worker, method)(*args, **kwargs)


class _RankHost:
    """The Ray actor of one rank: builds the worker, runs its methods, returns failures as strings."""

    def __init__(self, role: str, rank: int, num_threads: int, cwd: str):
        import torch

        self.role, self.rank, self.worker = role, rank, None
        torch.set_num_threads(num_threads)
        # a relative path of the run (model.path, trainer.run_dir and the checkpoints under it, a tool's
        # file) means the trainer's folder, as in a local run; the workers of a joined cluster start
        # where `ray start` ran. A node that lacks the folder keeps its own: its paths must be absolute
        if os.path.isdir(cwd):
            os.chdir(cwd)
        elif cwd != os.getcwd():
            log.warning(
                "%s rank %d: the trainer's folder %s does not exist on this node (%s), so relative paths in "
                "the config resolve against %s here; give absolute paths on a shared filesystem",
                role, rank, cwd, node_ip(), os.getcwd(),
            )  # fmt: skip

    def rendezvous(self, port: int | None) -> tuple[str, Any]:
        """(this host's address, a free port or `port`), or the failure (a taken port) as run's are."""
        try:
            host = node_ip()
            return "ok", (host, pick_port(host, port))
        except BaseException as e:  # noqa: BLE001
            return "error", RemoteFailure.capture(e, role=self.role, rank=self.rank, method="rendezvous")

    def init_worker(self, worker_cls: type, args: tuple, kwargs: dict) -> tuple[str, Any]:
        try:
            self.worker = worker_cls(*args, **kwargs)
            return "ok", None
        except BaseException as e:  # noqa: BLE001 - every failure must reach the trainer
            return "error", RemoteFailure.capture(e, role=self.role, rank=self.rank, method="__init__")

    def run(self, method: str, args: tuple, kwargs: dict) -> tuple[str, Any]:
        try:
            return "ok", getattr(self.worker, method)(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            return "error", RemoteFailure.capture(e, role=self.role, rank=self.rank, method=method)


def ray_target(address: str | None) -> tuple[str, str]:
    """(the address ray.init gets, where it leads in words) for trainer.ray_address.

    Unset: a Ray instance of this process's own (`address="local"`), also when `ray start` left a
    cluster running on this host (bare `ray.init()` would join that one, and refuse the CPU count
    we give a private one); RAY_ADDRESS, which `ray job submit` sets, joins the job's cluster.
    """
    if address:
        return address, f"the Ray cluster at {address} (trainer.ray_address)"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return env, f"the Ray cluster at {env} (RAY_ADDRESS)"
    return "local", "a Ray instance started here"


def ensure_ray(address: str | None, num_cpus: int | None) -> str:
    """Start (or join, with trainer.ray_address or RAY_ADDRESS) Ray once per process; says which.

    `num_cpus` sizes an instance started here; a cluster joined has its own.
    """
    import ray

    from lucidrl.launch import MALLOC_ENV, tuned_env

    target, where = ray_target(address)
    if ray.is_initialized():
        return where
    kwargs: dict[str, Any] = {"address": target, "include_dashboard": False, "log_to_driver": True}
    if target == "local" and num_cpus:
        kwargs["num_cpus"] = num_cpus
    # the workers must import lucidrl the way this process does (a source checkout or an install)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env_vars = {"PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    # glibc reads its allocator settings at process start: hand them to the workers' start (launch.py)
    tuned = tuned_env()
    env_vars.update({k: tuned[k] for k in MALLOC_ENV if k in tuned})
    # the CLI sets the first (no per-file bars from the workers); LUCIDRL_DEBUG reaches workers on
    # other hosts this way, where they do not inherit this process's environment
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "LUCIDRL_DEBUG"):
        if name in os.environ:
            env_vars[name] = os.environ[name]
    kwargs["runtime_env"] = {"env_vars": env_vars}
    ray.init(**kwargs)
    return where


class RayWorkerGroup(WorkerGroup):
    """`world_size` Ray actors in one placement group, joined in a torch.distributed group."""

    def __init__(
        self,
        worker_cls: type,
        role: str,
        *args: Any,
        world_size: int,
        nodes: int = 1,
        cpus_per_rank: int = 1,
        gpus_per_rank: int = 0,
        master_port: int | None = None,
        backend: str = "gloo",
        ready_timeout_s: float = 120.0,
        **kwargs: Any,
    ):
        import ray
        from ray.util.placement_group import placement_group

        self.worker_cls, self.role, self.world_size = worker_cls, role, world_size
        if world_size % nodes:
            raise ValueError(f"role {role}: {world_size} ranks do not spread evenly over {nodes} nodes")
        per_node = world_size // nodes
        # one bundle per node holding that node's ranks; several nodes: each bundle on a different node
        bundle = {
            "CPU": cpus_per_rank * per_node,
            **({"GPU": gpus_per_rank * per_node} if gpus_per_rank else {}),
        }
        self.pg = placement_group([bundle] * nodes, strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
        try:
            ray.get(self.pg.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self.pg)
            raise RuntimeError(
                f"role {role}: Ray could not place {nodes} node(s) x {bundle} within {ready_timeout_s:.0f}s; "
                f"the cluster has {ray.cluster_resources()} — lower the placement's nodes x devices_per_node "
                f"or trainer.cpus_per_rank, or add nodes (a run without trainer.ray_address or RAY_ADDRESS starts "
                f"a Ray instance of its own on this host: for a cluster started with `ray start`, set "
                f"trainer.ray_address=auto or HOST:PORT)"
            ) from None
        self.hosts: list[Any] = []
        try:
            self._start(
                worker_cls, args, kwargs, per_node, cpus_per_rank, gpus_per_rank, master_port, backend
            )
        except BaseException:  # a rank that failed to start: the others and the placement go too
            self.shutdown()
            raise

    def _start(
        self,
        worker_cls: type,
        args: tuple,
        kwargs: dict,
        per_node: int,
        cpus_per_rank: int,
        gpus_per_rank: int,
        master_port: int | None,
        backend: str,
    ) -> None:
        """Start one _RankHost per rank in the placement group, rendezvous, and build the workers."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        role, world_size = self.role, self.world_size
        host_cls = ray.remote(_RankHost)
        self.hosts[:] = [
            host_cls.options(
                num_cpus=cpus_per_rank,
                num_gpus=gpus_per_rank,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=i // per_node
                ),
            ).remote(role, i, cpus_per_rank, os.getcwd())
            for i in range(world_size)
        ]
        addr, port = self._gather([self.hosts[0].rendezvous.remote(master_port)], "rendezvous")[0]
        if debug_enabled():
            print(
                f"[lucidrl debug] {role}: {world_size} Ray ranks, rendezvous {addr}:{port} ({backend})",
                file=sys.stderr,
                flush=True,
            )
        futures = [
            h.init_worker.remote(
                worker_cls, args, {**kwargs, "dist_info": DistInfo(i, world_size, addr, port, backend)}
            )
            for i, h in enumerate(self.hosts)
        ]
        self._gather(futures, "__init__")

    def _get(self, future: Any, rank: int, method: str) -> Any:
        import ray

        try:
            return ray.get(future)
        except ray.exceptions.RayActorError as e:
            cause = _ANSI.sub("", str(e))  # Ray colours parts of its message for terminals
            raise WorkerDiedError(
                self.role,
                rank,
                method,
                f"{type(e).__name__}: {cause}",
                failed_to_start=bool(e.actor_init_failed),
            ) from None
        except ray.exceptions.RayTaskError as e:
            # not the method's own exception (run and init_worker send those back as values) but Ray's
            # around it, e.g. a result it could not pickle: named with its worker all the same
            cause = e.cause if e.cause is not None else e
            raise RemoteWorkerError(
                RemoteFailure(
                    type_name=type(cause).__qualname__,
                    module=type(cause).__module__,
                    message=f"{cause} (raised by Ray around the worker method: a result or argument it could "
                    "not pickle, for one)",
                    traceback=_ANSI.sub("", str(e)),
                    role=self.role,
                    rank=rank,
                    host=str(getattr(e, "ip", None) or "?"),
                    method=method,
                )
            ) from None

    def _gather(self, futures: list[Any], method: str) -> list[Any]:
        """Wait for every rank; raise at the first failure (the others may be stuck in a collective with it)."""
        import ray

        results: list[Any] = [None] * len(futures)
        pending = dict(zip(futures, range(len(futures)), strict=True))
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(done[0])
            try:
                status, value = self._get(done[0], rank, method)
            except WorkerDiedError:
                # a group with a dead rank cannot go on: the others may wait for it in a collective for
                # ever, and a restart (trainer/restart.py) needs their CPUs and GPUs for the new group
                self.shutdown()
                raise
            if status == "error":
                value.raise_()
            results[rank] = value
        return results

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        mode = dispatch_mode(self.worker_cls, method)
        if mode in (Dispatch.DP, Dispatch.DP_EXACT):
            chunks, pad = split_for_ranks(args[0], self.world_size, mode, method)
            futures = [
                h.run.remote(method, (c, *args[1:]), kwargs) for h, c in zip(self.hosts, chunks, strict=True)
            ]
            sent = sum(len(c) for c in chunks)
            return merge_from_ranks(self._gather(futures, method), pad, mode, sent, method)
        if mode is Dispatch.RANK0:
            return self._gather([self.hosts[0].run.remote(method, args, kwargs)], method)[0]
        results = self._gather([h.run.remote(method, args, kwargs) for h in self.hosts], method)
        return results[0]

    def shutdown(self) -> None:
        """Kill the ranks and free their placement group (once: later calls do nothing)."""
        import ray

        for h in self.hosts:
            ray.kill(h)
        self.hosts = []
        if self.pg is not None:
            ray.util.remove_placement_group(self.pg)
            self.pg = None
