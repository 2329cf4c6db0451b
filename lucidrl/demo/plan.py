"""What one seed of the demo does (budgets in steps), and what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from lucidrl.diagnostics.errors import UsageError


@dataclass
class DemoPlan:
    """What one seed of the demo does. Budgets are steps; the defaults are `make demo`'s."""

    model_name: str = "smollm2-135m-instruct"  # what `lucidrl model get` installs when no --model is given
    task: str = "arithmetic"  # a generator of `lucidrl data` with an exact rule reward
    n_train: int = 2000
    n_val: int = 200
    steps: int = 40
    prompts: int = 16  # prompts per step
    n: int = 8  # samples per prompt (GRPO's group)
    max_new_tokens: int = 64
    lr: float = 2e-5
    warmup_steps: int = 3
    kl_coef: float = 0.0  # 0: no reference model, no KL (the verifier alone)
    lora_rank: int = 0  # 0: every weight trains
    compute_dtype: str | None = "bfloat16"  # bf16 compute over float32 master weights
    eval_every: int = 10
    temperature: float = 1.0
    device: str = "cpu"  # trainer.device (the demo runs on the CPU; benchmarks/demo_sweep.py may use cuda)

    def __post_init__(self) -> None:
        for key in ("n_train", "n_val", "steps", "prompts", "n", "max_new_tokens", "eval_every"):
            if getattr(self, key) < 1:
                raise UsageError(
                    f"lucidrl demo: {key.replace('_', '-')} must be >= 1, got {getattr(self, key)}"
                )
        if self.n < 2:
            raise UsageError(f"lucidrl demo: GRPO compares a prompt's samples: n must be >= 2, got {self.n}")
        if self.n_train < self.prompts:
            raise UsageError(
                f"lucidrl demo: {self.n_train} training problems cannot fill one step of {self.prompts} prompts"
            )


@dataclass
class SeedResult:
    seed: int
    base_acc: float | None = None  # held-out greedy accuracy of the model before training
    final_acc: float | None = None  # ... after the last step
    steps: int = 0
    seconds: float = 0.0  # the seed's wall time: training and its evaluations
    # [{"step", "acc"}] held-out greedy accuracy along the run (step 0: the base); [{"step", "score"}]
    curve: list[dict] = field(default_factory=list)
    reward: list[dict] = field(default_factory=list)
    collapse: str | None = None
