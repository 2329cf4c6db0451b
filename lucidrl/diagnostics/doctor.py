"""`lucidrl doctor`: check what a run needs before it starts, and say how to fix each failure.

Without a config it checks the machine: torch and its threads against the CPUs this process may use,
CUDA (driver library, devices, NCCL), /dev/shm, torch.compile (a real compile in a child process),
gloo (and NCCL) across two processes on a free port, Ray, and vLLM's torch pin. Given a `lucidrl train`
config it also checks that config: it loads and validates, its placement fits the devices here, the
tokenizer loads with a pad token, every model folder's weights match its architecture (read from the
safetensors headers, nothing loaded), the run directory (a new run, a resume, or a refusal), a
rollout server (rollout.name=server) answers and takes weights, the data files have the schema, and
every data_source in them has a reward function that runs and returns a valid score.

Each check ends as ok, warn, fail or skip, with a fix for warn and fail; the command exits 1 if any
check failed. Checks that start processes (compile, distributed, ray) can be skipped with --skip.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

GiB = 2**30
SLOW_CHECKS = ("compile", "distributed", "ray")
SHM_WARN_BYTES = 1 * GiB  # Ray's object store and shared-memory tensors live in /dev/shm


@dataclass
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail" | "skip"
    detail: str
    fix: str = ""
    seconds: float = 0.0


@dataclass
class Needs:
    """What the checks must hold the machine to: from the config, or nothing when there is none."""

    gpu: bool = False
    compile: bool = False
    vllm: bool = False
    ray: bool = False
    ray_address: str | None = None
    joins_cluster: bool = False  # trainer.ray_address or RAY_ADDRESS: the ranks may run on other hosts
    ranks: int = 1
    cpus_per_rank: int = 1
    gpus: int = 0  # GPUs this host must have (cuda ranks placed on one node)
    logits_dtype: str = "float32"  # what the actor's head computes in: torch.compile builds a graph per dtype


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {"ok": not self.failed, "checks": [asdict(c) for c in self.checks]}


def _run(name: str, fn: Callable[[], Any]) -> tuple[Check, Any]:
    """Run one check (`fn` returns a Check, or a Check and what later checks need).

    The framework's own errors (a bad config key, model folder, data row) become the check's failure
    as they are: their messages already say what to do. Any other exception is a failure of the check
    itself, reported, never a crash of the doctor.
    """
    from lucidrl.diagnostics.debug import debug_enabled
    from lucidrl.diagnostics.errors import UserError

    start = time.perf_counter()
    value = None
    try:
        out = fn()
        check, value = out if isinstance(out, tuple) else (out, None)
    except UserError as exc:
        check = Check(name, "fail", str(exc))
    except Exception as exc:
        check = Check(
            name,
            "fail",
            f"the check raised {type(exc).__name__}: {exc}",
            "run with LUCIDRL_DEBUG=1 for the traceback; if the error is not about your setup, report it",
        )
        if debug_enabled():
            traceback.print_exc()
    check.name, check.seconds = name, time.perf_counter() - start
    return check, value


# ---------------------------------------------------------------------------------------------- machine


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, lowered by a cgroup CPU quota."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return max(1, min(n, int(quota))) if quota else n


def cgroup_cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> float | None:
    """The cgroup v2 CPU quota in CPUs ("200000 100000" is 2.0), or None when unlimited or unknown."""
    try:
        quota, period = Path(path).read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def check_torch(cpus: int | None = None) -> Check:
    cpus = cpus or usable_cpus()
    threads = torch.get_num_threads()
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    detail = (
        f"torch {torch.__version__} ({build}), python {sys.version.split()[0]}, "
        f"{threads} intra-op threads on {cpus} usable CPUs"
    )
    if threads > cpus:
        return Check(
            "torch",
            "warn",
            detail + ": more threads than CPUs, so they take turns and every matmul slows down",
            f"export OMP_NUM_THREADS={cpus} (torch counts the host's cores, not this container's CPU quota)",
        )
    return Check("torch", "ok", detail)


def _libcuda_error() -> str | None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return str(exc)
    return None


def check_cuda(needs: Needs) -> Check:
    if torch.version.cuda is None:
        if needs.gpu:
            return Check(
                "cuda",
                "fail",
                f"the config places ranks on GPUs, but torch {torch.__version__} is a CPU build",
                "install a CUDA build of the same torch version (on Linux x86_64, PyPI's default torch wheel)",
            )
        return Check("cuda", "ok", "CPU build of torch; runs use the CPU (trainer.device=cpu)")
    if not torch.cuda.is_available():
        status = "fail" if needs.gpu else "warn"
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        if hidden is not None and hidden.strip() in ("", "-1"):
            return Check(
                "cuda",
                status,
                f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU from this process",
                "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (e.g. 0,1)",
            )
        err = _libcuda_error()
        if err:
            return Check(
                "cuda",
                status,
                f"torch is built for CUDA {torch.version.cuda} but the driver library libcuda.so.1 cannot be "
                f"loaded ({err}); LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')!r}",
                "install the NVIDIA driver, or add the folder holding libcuda.so.1 to LD_LIBRARY_PATH "
                "(in a container: start it with the NVIDIA container toolkit, e.g. docker run --gpus all)",
            )
        return Check(
            "cuda",
            status,
            f"torch is built for CUDA {torch.version.cuda} and the driver loads, but no GPU is usable",
            "check `nvidia-smi`; a driver older than the CUDA version torch was built for also gives this",
        )
    count = torch.cuda.device_count()
    names = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        names.append(f"cuda:{i} {p.name} ({p.total_memory / GiB:.0f} GiB, sm_{p.major}{p.minor})")
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "none"
    detail = f"CUDA {torch.version.cuda}, NCCL {nccl}, bf16 {torch.cuda.is_bf16_supported()}: " + "; ".join(
        names
    )
    if needs.gpus > count:
        return Check(
            "cuda",
            "fail",
            detail + f"; the config's placement asks for {needs.gpus} GPUs",
            "lower the placement's devices/devices_per_node to the GPUs here, or run on a bigger machine",
        )
    home = os.environ.get("CUDA_HOME")
    if home and not Path(home).is_dir():
        return Check(
            "cuda",
            "warn",
            detail + f"; CUDA_HOME={home!r} does not exist",
            "unset CUDA_HOME or point it at the CUDA toolkit; extensions that JIT-compile read it",
        )
    return Check("cuda", "ok", detail)


def check_shm(path: str = "/dev/shm") -> Check:
    try:
        st = os.statvfs(path)
    except OSError:
        if sys.platform != "linux":
            return Check("shm", "skip", f"no {path} on {sys.platform}")
        return Check(
            "shm",
            "warn",
            f"{path} is missing",
            "mount a tmpfs at /dev/shm; Ray and shared-memory tensors need it",
        )
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    detail = f"{path}: {free / GiB:.1f} GiB free of {total / GiB:.1f} GiB"
    if free < SHM_WARN_BYTES:
        return Check(
            "shm",
            "warn",
            detail + ": Ray's object store falls back to slow disk and shared-memory tensors can fail "
            "with 'bus error' (Docker gives 64 MiB by default)",
            "start the container with a larger /dev/shm (docker run --shm-size=8g, or a larger tmpfs mount)",
        )
    return Check("shm", "ok", detail)


def _child(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lucidrl.diagnostics.probes", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _collect(proc: subprocess.Popen, timeout: float) -> tuple[dict | None, str]:
    """The child's JSON result, or None and why (its stderr tail, an exit signal, a timeout)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, f"no result within {timeout:.0f} s (killed)"
    lines = out.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1]), ""
        except json.JSONDecodeError:
            pass
    tail = " | ".join(line.strip() for line in err.strip().splitlines()[-4:])
    code = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return None, f"the child process ended with {code}: {tail[-600:]}"


def cxx_compiler() -> str | None:
    from torch._inductor import config as inductor_config

    for name in (os.environ.get("CXX"), *inductor_config.cpp.cxx):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def check_compile(needs: Needs, device: str = "cpu", timeout: float = 600.0) -> Check:
    bad = "fail" if needs.compile else "warn"
    off = "" if needs.compile else " (only matters with actor.use_torch_compile=true)"
    fix_off = "or set actor.use_torch_compile=false (the default) to skip compiling"
    if device == "cpu" and cxx_compiler() is None:
        return Check(
            "compile",
            bad,
            "no C++ compiler for inductor's CPU kernels (looked for $CXX, g++, clang++)" + off,
            f"install one (Debian/Ubuntu: apt install g++) {fix_off}",
        )
    dtype = needs.logits_dtype
    result, why = _collect(_child(["compile", "--device", device, "--dtype", dtype]), timeout)
    if result is None:
        return Check(
            "compile",
            bad,
            f"compiling the fused log-prob on {device} ({dtype} logits) crashed: {why}" + off,
            f"run `python -m lucidrl.diagnostics.probes compile --device {device} --dtype {dtype}` to see it "
            f"whole; {fix_off}",
        )
    if not result["compiled"]:
        return Check(
            "compile",
            bad,
            f"torch.compile failed, so training falls back to eager: {result['failure']}" + off,
            f"fix the toolchain the error names {fix_off}",
        )
    if result["max_diff"] > 1e-3 or result["grad_rel_diff"] > result["grad_rel_tol"]:
        return Check(
            "compile",
            "fail",
            f"the compiled log-prob ({dtype} logits) differs from eager by {result['max_diff']:.2e}, its "
            f"gradient by {result['grad_rel_diff']:.2e} of its size",
            "set actor.use_torch_compile=false and report the torch version",
        )
    return Check(
        "compile",
        "ok",
        f"fused log-prob and entropy compiled on {device} for {dtype} logits in {result['seconds']:.1f} s "
        f"(forward and backward), within {result['max_diff']:.1e} of eager (gradient "
        f"{result['grad_rel_diff']:.1e} of its size)",
    )


def check_distributed(backend: str = "gloo", world: int = 2, timeout: float = 120.0) -> Check:
    from lucidrl.controller.distributed import pick_port

    port = pick_port("127.0.0.1", None)
    procs = [
        _child(["dist", "--rank", str(r), "--world", str(world), "--port", str(port), "--backend", backend])
        for r in range(world)
    ]
    # wait for all; the first rank to fail is the one to report (the others would wait out the timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    first_failed = any(p.poll() not in (None, 0) for p in procs)
    results: list[tuple[dict | None, str]] = []
    for proc in procs:
        if proc.poll() is None and first_failed:
            proc.kill()
            proc.communicate()
            results.append((None, "stopped after another rank failed"))
        else:
            results.append(_collect(proc, max(1.0, deadline - time.monotonic())))
    failed = [f"rank {r}: {why}" for r, (res, why) in enumerate(results) if res is None]
    want = world * (world + 1) / 2
    if failed:
        return Check(
            "distributed",
            "fail",
            f"{backend} across {world} processes on 127.0.0.1:{port} failed; " + "; ".join(failed),
            "gloo picks its network interface from the hostname: if that resolves to an address this host "
            "cannot reach, set GLOO_SOCKET_IFNAME (e.g. lo, eth0); for nccl set NCCL_DEBUG=INFO to see why",
        )
    sums = [res["sum"] for res, _ in results]
    if any(s != want for s in sums):
        return Check("distributed", "fail", f"{backend} all_reduce gave {sums}, expected {want}", "report it")
    init = max(res["init_s"] for res, _ in results)
    return Check(
        "distributed", "ok", f"{backend}: {world} processes joined in {init:.2f} s, all_reduce right"
    )


def check_ray(needs: Needs, start: bool) -> Check:
    try:
        version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        status = "fail" if needs.ray else "warn"
        return Check(
            "ray",
            status,
            "ray is not installed" + ("" if needs.ray else " (only trainer.backend=ray needs it)"),
            "pip install 'ray[default]' with the torch pin as a constraint",
        )
    if not start:
        return Check("ray", "ok", f"ray {version} (not started; --ray or trainer.backend=ray starts a probe)")
    import ray

    from lucidrl.batch import Batch
    from lucidrl.controller.errors import RemoteWorkerError
    from lucidrl.controller.probe import ProbeWorker
    from lucidrl.controller.worker_group import RayWorkerGroup, ensure_ray

    started = not ray.is_initialized()
    group = None
    try:
        where = ensure_ray(needs.ray_address, num_cpus=max(2, usable_cpus()))
        group = RayWorkerGroup(ProbeWorker, "doctor-probe", world_size=2)
        out = group.where(Batch(tensors={"x": torch.arange(4)}))
        if out["rank"] != [0, 0, 1, 1]:
            return Check(
                "ray", "fail", f"ray {version}: dispatch placed samples on ranks {out['rank']}", "report it"
            )
        total = group.all_reduce_sum(1.0)
        if total != 3.0:
            return Check(
                "ray", "fail", f"ray {version}: gloo all_reduce gave {total}, expected 3.0", "report it"
            )
        try:
            group.fail("raise")
        except RemoteWorkerError as exc:
            if exc.type_name != "TwoArgError":
                return Check("ray", "fail", f"a worker's error arrived as {exc.type_name}", "report it")
        else:
            return Check("ray", "fail", "a worker's exception did not reach the driver", "report it")
        return Check(
            "ray", "ok", f"ray {version}: 2 probe actors on {where}, gloo all_reduce and remote errors work"
        )
    except Exception as exc:
        return Check(
            "ray",
            "fail",
            f"ray {version}: the probe group failed: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}",
            "check `ray status` (with trainer.ray_address: that the cluster is up and its ray version matches)",
        )
    finally:
        if group is not None:
            group.shutdown()
        if started and ray.is_initialized():
            ray.shutdown()


def vllm_torch_conflict(requires: list[str], torch_version: str) -> str | None:
    """vLLM's torch requirement, if the installed torch does not meet it; None when it does."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    installed = Version(torch_version.split("+")[0])
    for text in requires:
        req = Requirement(text)
        if req.name == "torch" and (req.marker is None or req.marker.evaluate()):
            if req.specifier and installed not in req.specifier:
                return f"torch{req.specifier}"
    return None


def check_vllm(needs: Needs) -> Check:
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        if needs.vllm:
            return Check(
                "vllm",
                "fail",
                "rollout.name=vllm but vllm is not installed",
                "pip install 'lucidrl[vllm]' (a GPU machine), or use rollout.name=hf",
            )
        return Check("vllm", "ok", "not installed (only rollout.name=vllm needs it)")
    conflict = vllm_torch_conflict(importlib.metadata.requires("vllm") or [], torch.__version__)
    if conflict:
        return Check(
            "vllm",
            "fail" if needs.vllm else "warn",
            f"vllm {version} requires {conflict} but torch {torch.__version__} is installed; its compiled "
            "kernels fail to import or crash against another torch",
            f"install the torch vllm {version} was built for ({conflict}), or the vllm built for your torch",
        )
    if needs.vllm and not torch.cuda.is_available():
        return Check(
            "vllm", "fail", f"vllm {version} is installed but no GPU is usable", "see the cuda check"
        )
    return Check("vllm", "ok", f"vllm {version}, built for this torch")


# ---------------------------------------------------------------------------------------------- config


def needs_of(cfg: Any) -> tuple[Needs, str]:
    """What the config asks of the machine, and its placement in words."""
    from lucidrl.controller.placement import plan_groups
    from lucidrl.controller.worker_group import ray_target

    plans = plan_groups(cfg)
    # GPUs this host must have: every cuda rank, unless the ranks go to a Ray cluster of other hosts
    gpus = sum(p.world_size for p in plans if p.device.startswith("cuda") and p.nodes == 1)
    # as the run decides: RAY_ADDRESS (which `ray job submit` sets) joins a cluster as the key does
    joins = cfg.trainer.backend == "ray" and ray_target(cfg.trainer.ray_address)[0] != "local"
    needs = Needs(
        gpu=any(p.device.startswith("cuda") for p in plans) or cfg.rollout.name == "vllm",
        compile=cfg.actor.use_torch_compile,
        vllm=cfg.rollout.name == "vllm",
        ray=cfg.trainer.backend == "ray",
        ray_address=cfg.trainer.ray_address,
        joins_cluster=joins,
        ranks=sum(p.world_size for p in plans),
        cpus_per_rank=cfg.trainer.cpus_per_rank,
        gpus=0 if joins else gpus,  # a cluster's GPUs are not this host's
        logits_dtype=cfg.model.compute_dtype or cfg.model.dtype,
    )
    words = "; ".join(f"{'+'.join(sorted(p.roles))} x{p.world_size} on {p.where} ({p.device})" for p in plans)
    return needs, f"{cfg.trainer.backend} backend: {words}"


def check_placement(needs: Needs, words: str, cpus: int | None = None) -> Check:
    cpus = cpus or usable_cpus()
    if needs.ray and not needs.joins_cluster and not needs.gpu and needs.ranks * needs.cpus_per_rank > cpus:
        return Check(
            "placement",
            "fail",
            f"{words}: {needs.ranks} ranks x trainer.cpus_per_rank={needs.cpus_per_rank} CPUs, but this "
            f"machine has {cpus} usable CPUs, so Ray cannot place them (a run waits 120 s for them, then fails)",
            "lower the pools' nodes/devices_per_node or trainer.cpus_per_rank, or join a cluster (trainer.ray_address)",
        )
    return Check("placement", "ok", words)


def check_tokenizer(cfg: Any) -> tuple[Check, Any]:
    from lucidrl.models import load_run_tokenizer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok = load_run_tokenizer(cfg.model)
    detail = f"{type(tok).__name__}, {len(tok)} tokens, pad {tok.pad_token!r} (id {tok.pad_token_id})"
    if any("no pad token" in str(w.message) for w in caught):
        return Check(
            "tokenizer",
            "warn",
            detail + ": the tokenizer has no pad token, so runs pad with eos",
            "fine for training (lucidrl masks padding itself); set model.pad_token to silence the warning",
        ), tok
    return Check("tokenizer", "ok", detail), tok


def check_model(cfg: Any, tokenizer: Any, path: str, key: str) -> Check:
    from lucidrl.models.inspection import inspect_model_folder

    info = inspect_model_folder(path, config_key=key, trust_remote_code=cfg.model.trust_remote_code)
    name = f"model ({key})"
    gib = info.size_gib(cfg.model.dtype)
    size = f"{gib:.1f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB"
    detail = (
        f"{info.architecture}, {info.num_parameters / 1e6:.1f}M parameters ({size} in {cfg.model.dtype}), "
        f"{len(info.weight_files)} weight file(s)"
    )
    problems = []
    if info.missing:
        problems.append(
            f"{len(info.missing)} tensors missing from the weight files (first: {info.missing[:3]})"
        )
    if info.mismatched:
        problems.append(
            f"{len(info.mismatched)} shapes differ from config.json (first: {info.mismatched[:2]})"
        )
    if problems:
        return Check(
            name,
            "fail",
            detail + ": " + "; ".join(problems),
            "the weights belong to another model or config.json was edited; save the model again with "
            "save_pretrained, or fix config.json to the shapes the weights have",
        )
    if info.embedding_rows < len(tokenizer):
        return Check(
            name,
            "fail",
            detail + f": {info.embedding_rows} embedding rows but the tokenizer has {len(tokenizer)} tokens",
            "use the tokenizer saved with this model (model.tokenizer_path) or resize the model's embeddings",
        )
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    if info.max_positions is not None and length > info.max_positions:
        return Check(
            name,
            "warn",
            detail + f": data.max_prompt_length + data.max_response_length = {length} is more than the "
            f"model's max_position_embeddings={info.max_positions}",
            "lower the lengths; positions past the model's range were never trained",
        )
    if info.converted:
        return Check(
            name,
            "ok",
            detail + " (tensor names not compared: transformers converts this architecture's on load)",
        )
    if info.checked_tensors == 0:
        return Check(name, "ok", detail + " (.bin weights: names and shapes not checked; safetensors are)")
    if info.unexpected:
        return Check(
            name,
            "warn",
            detail
            + f"; {len(info.unexpected)} tensors in the files that the architecture does not use (first: "
            f"{info.unexpected[:3]}); from_pretrained drops them",
            "check config.json (fewer layers than the weights have?) or that the folder holds the model you mean",
        )
    return Check(name, "ok", detail + f"; all {info.checked_tensors} tensors match the architecture")


def check_rollout_server(cfg: Any, tokenizer: Any) -> Check:
    """rollout.name=server: the server answers its health check and takes the actor's weights."""
    from lucidrl.workers.rollout_server import ServerRollout

    sv = cfg.rollout.server
    engine = ServerRollout(
        sv.base_url, tokenizer, host=sv.host, port=sv.port, timeout_s=min(sv.timeout_s, 30.0)
    )
    version = engine.check_accepts_weights()
    return Check(
        "rollout server",
        "ok",
        f"{engine.base_url} serves {engine.model_name!r} and takes weight updates ({version} taken so far)",
    )


def check_run_dir(cfg: Any) -> Check:
    """Where the run goes, and whether it resumes: the refusals `lucidrl train` would give, given now."""
    from lucidrl.config import to_dict
    from lucidrl.trainer import checkpoint
    from lucidrl.trainer.setup import refuse_occupied, run_dir_of

    run_dir = run_dir_of(cfg)
    resume = checkpoint.resume_point(cfg, run_dir)  # CheckpointError for a broken `latest`
    if resume is not None:
        state, changes = checkpoint.resumable(resume, to_dict(cfg))
        more = f"; changed since: {', '.join(changes)}" if changes else ""
        return Check(
            "run dir", "ok", f"{run_dir}: resumes from {resume} after step {state['global_step']}{more}"
        )
    refuse_occupied(cfg, run_dir)  # RunDirError, as `lucidrl train` would raise it
    if run_dir.is_dir() and any(run_dir.iterdir()):
        return Check("run dir", "warn", f"{run_dir} holds a run that trainer.overwrite=true will delete")
    return Check("run dir", "ok", f"{run_dir}: a new run")


def check_data(cfg: Any, tokenizer: Any) -> tuple[Check, list]:
    from lucidrl.trainer.setup import load_data

    train, val, report = load_data(cfg, tokenizer)  # what `lucidrl train` loads, and its errors
    dropped = f", {report.overlong_filtered} overlong dropped" if report.overlong_filtered else ""
    detail = (
        f"data.train_files: {len(train)} of {report.total_rows} rows{dropped}, longest prompt "
        f"{report.longest_prompt} tokens (max {cfg.data.max_prompt_length}); "
        + (f"data.val_files: {len(val)} rows" if val else "no data.val_files (no validation)")
    )
    return Check("data", "ok", detail), train + val


def check_reward_model(cfg: Any, policy_tokenizer: Any) -> Check:
    """reward_model.model.path: a one-output classifier with a score head in its weights (headers only)."""
    from pathlib import Path

    from transformers import AutoConfig

    from lucidrl.models.inspection import _safetensors_shapes
    from lucidrl.models.loading import load_tokenizer
    from lucidrl.workers.reward_model import same_tokenizer

    m = cfg.reward_model.model
    config = AutoConfig.from_pretrained(m.path, local_files_only=True, trust_remote_code=m.trust_remote_code)
    arch = ", ".join(getattr(config, "architectures", None) or ["(no architectures in config.json)"])
    found = _safetensors_shapes(Path(m.path))
    fix = "point reward_model.model.path at a *ForSequenceClassification checkpoint with num_labels=1"
    if found is None:
        return Check(
            "reward model",
            "warn",
            f"{m.path}: {arch}, weights not in safetensors: its score head is checked only when training loads it",
            "save it with save_pretrained (safetensors) to have it checked here",
        )
    heads = {k: v for k, v in found[1].items() if k.endswith("score.weight")}
    if not heads:
        return Check(
            "reward model", "fail", f"{m.path}: {arch} with no score.weight in its safetensors weights", fix
        )
    shape = next(iter(heads.values()))
    if shape[0] != 1:
        return Check("reward model", "fail", f"{m.path}: {arch} whose score head has {shape[0]} outputs", fix)
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, config_key="reward_model.model.tokenizer_path")
    if same_tokenizer(tokenizer, policy_tokenizer):
        how = "the policy's tokenizer: the rollout's token ids are scored as they are"
    elif getattr(tokenizer, "chat_template", None):
        how = "another tokenizer: each conversation is rendered again with its chat template"
    else:
        return Check(
            "reward model",
            "fail",
            f"{m.path}: its tokenizer differs from the policy's and has no chat template",
            "give reward_model.model.tokenizer_path a tokenizer with a chat template (or the policy's)",
        )
    return Check(
        "reward model",
        "ok",
        f"{arch}, score head {shape[0]} x {shape[1]}, combine={cfg.reward_model.combine}; {how}",
    )


def check_rewards(cfg: Any, samples: list) -> Check:
    from lucidrl.rewards.custom import load_custom_function, normalize_reward_output
    from lucidrl.rewards.manager import RewardFunctionError
    from lucidrl.rewards.registry import _qualname, default_compute_score, get_reward_function

    fn_cfg = cfg.reward.custom_function
    if fn_cfg.reward_kwargs and not fn_cfg.path:
        from lucidrl.rewards.manager import RuleRewardManager

        RuleRewardManager.from_config(None, None, fn_cfg.name, fn_cfg.reward_kwargs)  # refuses, saying why
    custom = load_custom_function(fn_cfg.path, fn_cfg.name, fn_cfg.reward_kwargs) if fn_cfg.path else None
    compute = custom or default_compute_score
    first: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for s in samples:
        first.setdefault(s.data_source, s)
        counts[s.data_source] = counts.get(s.data_source, 0) + 1
    parts = []
    for ds, s in first.items():
        # UnknownDataSourceError names the known data sources and the fix
        name = f"{fn_cfg.path}:{fn_cfg.name}" if custom else _qualname(get_reward_function(ds))
        try:
            raw = compute(
                data_source=ds, solution_str="", ground_truth=s.ground_truth, extra_info=s.extra_info
            )
        except Exception as exc:
            raise RewardFunctionError(
                f"reward function {name} raised {type(exc).__name__}: {exc} on an empty response to "
                f"{s.source} (data_source {ds!r}); a reward function has to score any text, malformed "
                "responses included: return 0 or a penalty for them"
            ) from exc
        text: set[str] = set()
        value, _ = normalize_reward_output(raw, data_source=ds, index=0, text_extras=text)
        parts.append(
            f"{ds} ({counts[ds]} rows): {name}, an empty response scores {value:g}"
            + (f" (text extras, not metrics: {', '.join(sorted(text))})" if text else "")
        )
    return Check("rewards", "ok", "; ".join(parts))


# ---------------------------------------------------------------------------------------------- the run


def run_doctor(
    config_path: str | None = None,
    overrides: list[str] | None = None,
    *,
    skip: tuple[str, ...] = (),
    start_ray: bool = False,
    on_check: Callable[[Check], None] | None = None,
) -> Report:
    """Every check, in order; `on_check` sees each as it finishes (the CLI prints them as they come)."""
    report = Report()

    def add(name: str, fn: Callable[[], Any]) -> Any:
        check, value = (Check(name, "skip", "skipped (--skip)"), None) if name in skip else _run(name, fn)
        report.checks.append(check)
        if on_check:
            on_check(check)
        return value if check.status != "fail" else None

    needs, cfg, words = Needs(), None, ""
    if config_path is not None or overrides:
        from lucidrl.config import load_config

        def load() -> tuple[Check, Any]:
            loaded = load_config(config_path, overrides or [])
            where = config_path or "command-line overrides"
            detail = f"{where}: {loaded.algorithm.adv_estimator}, rollout.name={loaded.rollout.name}"
            return Check("config", "ok", detail), (loaded, *needs_of(loaded))

        got = add("config", load)
        if got is not None:
            cfg, needs, words = got

    add("torch", check_torch)
    add("cuda", lambda: check_cuda(needs))
    add("shm", check_shm)
    add("compile", lambda: check_compile(needs, "cuda" if needs.gpu and torch.cuda.is_available() else "cpu"))
    add("distributed", check_distributed)
    if torch.cuda.is_available():
        add("distributed", lambda: check_distributed("nccl", min(2, torch.cuda.device_count())))
    add("ray", lambda: check_ray(needs, start_ray or needs.ray))
    add("vllm", lambda: check_vllm(needs))
    if cfg is not None:
        _config_checks(cfg, needs, words, add)
    return report


def _config_checks(cfg: Any, needs: Needs, words: str, add: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Placement, tokenizer, models, data, rewards: each later check needs what the earlier ones loaded."""
    add("placement", lambda: check_placement(needs, words))
    add("run dir", lambda: check_run_dir(cfg))
    tokenizer = add("tokenizer", lambda: check_tokenizer(cfg))
    paths = [(cfg.model.path, "model.path")]
    if cfg.algorithm.adv_estimator == "gae" and cfg.critic.model_path not in (None, cfg.model.path):
        paths.append((cfg.critic.model_path, "critic.model_path"))
    if tokenizer is None:
        for name in [f"model ({key})" for _, key in paths] + ["data", "rewards"]:
            add(name, lambda: Check("", "skip", "needs the tokenizer, which failed"))
        return
    for path, key in paths:
        add(f"model ({key})", lambda path=path, key=key: check_model(cfg, tokenizer, path, key))
    if cfg.rollout.name == "server":
        add("rollout server", lambda: check_rollout_server(cfg, tokenizer))
    if cfg.reward_model.enable:
        add("reward model", lambda: check_reward_model(cfg, tokenizer))
    samples = add("data", lambda: check_data(cfg, tokenizer))
    if samples is None:
        add("rewards", lambda: Check("", "skip", "needs the data, which failed"))
        return
    if cfg.reward_model.enable and cfg.reward_model.combine == "replace":
        add("rewards", lambda: Check("", "skip", "reward_model.combine=replace: no rule function is called"))
        return
    add("rewards", lambda: check_rewards(cfg, samples))


_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def format_check(check: Check) -> str:
    """One check as rich markup: status, name, detail, and the fix on its own line."""
    from rich.markup import escape

    took = f" [dim]({check.seconds:.1f} s)[/dim]" if check.seconds >= 0.5 else ""
    text = f"[{_STYLE[check.status]}]{check.status:>4}[/] [bold]{escape(check.name)}[/bold]: {escape(check.detail)}{took}"
    if check.fix:
        text += f"\n     [bold]fix:[/bold] {escape(check.fix)}"
    return text
