"""`lucidrl demo`: GRPO with only a verifier, from a real pretrained model, on the CPU (run.py)."""

from lucidrl.demo.plan import DemoPlan, SeedResult
from lucidrl.demo.report import points
from lucidrl.demo.run import run_demo, run_seed

__all__ = ["DemoPlan", "SeedResult", "points", "run_demo", "run_seed"]
