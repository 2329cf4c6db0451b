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

from lucidrl.doctor.checks import Check, Needs, Report, format_check
from lucidrl.doctor.machine import SLOW_CHECKS
from lucidrl.doctor.runner import run_doctor

__all__ = ["SLOW_CHECKS", "Check", "Needs", "Report", "format_check", "run_doctor"]
