"""What one seed of the demo does (budgets in steps), and what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from lucidrl.diagnostics.errors import UsageError
from lucidrl.rewards.word_problems import STOP_AFTER_ANSWER


@dataclass
class DemoPlan:
    """What one seed of the demo does. Budgets are steps; the defaults are `make demo`'s."""

    model_name: str = "smollm2-135m-instruct"  # what `lucidrl model get` installs when no --model is given
    task: str = "word_problems"  # `lucidrl data word-problems`, asking for "The answer is N."
    n_train: int = 2000
    n_val: int = 150  # 50 of each operation: of the 64 one-digit products, 14 are left for training
    # 3 steps of 16 prompts at lr 5e-5 with no warm-up: a third of the samples of 10 steps at 2e-5 with a
    # 3-step warm-up, so that a seed fits the demo's 10 minutes on a CPU without native bf16 too
    # (docs/demo.md has what each plan measured, and why not 8 prompts a step)
    steps: int = 3
    prompts: int = 16  # prompts per step
    n: int = 8  # samples per prompt (GRPO's group)
    max_new_tokens: int = 64
    # rollout.stop_regex: a response ends once it has stated its answer. Without it trained answers run on
    # past "The answer is N.", repeating it to the length limit, and the reward (the last answer given)
    # keeps rewarding that on some seeds (docs/demo.md); None: eos or the limit only
    stop_regex: str | None = STOP_AFTER_ANSWER
    lr: float = 5e-5
    warmup_steps: int = 0  # 0: no warm-up, the first step at the full lr
    kl_coef: float = 0.0  # 0: no reference model, no KL (the verifier alone)
    lora_rank: int = 0  # 0: every weight trains
    # bf16 compute over float32 master weights where the CPU has native bf16 (AVX-512 BF16, AMX), else
    # float32 (emulated bf16 is several times slower): "auto"; or "bfloat16", or None for float32
    compute_dtype: str | None = "auto"
    # model.attn_implementation: "auto" is eager under bf16 compute on an AMX CPU, where its backward
    # beats the flash-attention kernel's at the demo's lengths (benchmarks/attention_cpu.py), else
    # transformers' choice (sdpa); or a value of model.attn_implementation, or None
    attn_implementation: str | None = "auto"
    eval_every: int = 3  # with 3 steps: the base model and the trained one
    # 0.7, not 1: at 1 the 4-bit model's samples are mostly noise, and a quarter as many groups are mixed
    # (have a gradient) at the start (docs/tasks.md)
    temperature: float = 0.7
    device: str = "cpu"  # trainer.device (the demo runs on the CPU; benchmarks/demo_sweep.py may use cuda)

    def resolved_compute_dtype(self) -> str | None:
        """The model.compute_dtype the run gets: "auto" decided by the device and the CPU's flags."""
        if self.compute_dtype != "auto":
            return self.compute_dtype
        if self.device != "cpu":
            return "bfloat16"
        from lucidrl.models.precision import cpu_has_native_bf16

        return None if cpu_has_native_bf16() is False else "bfloat16"

    def resolved_attn_implementation(self) -> str | None:
        """The model.attn_implementation the run gets: "auto" decided by the device, precision and CPU."""
        if self.attn_implementation != "auto":
            return self.attn_implementation
        if self.device != "cpu" or self.resolved_compute_dtype() != "bfloat16":
            return None
        from lucidrl.models.precision import cpu_has_amx

        return "eager" if cpu_has_amx() else None

    def __post_init__(self) -> None:
        for key in ("n_train", "n_val", "steps", "prompts", "n", "max_new_tokens", "eval_every"):
            if getattr(self, key) < 1:
                raise UsageError(
                    f"lucidrl demo: {key.replace('_', '-')} must be >= 1, got {getattr(self, key)}"
                )
        if self.warmup_steps < 0:
            raise UsageError(f"lucidrl demo: warmup-steps must be >= 0 (0: none), got {self.warmup_steps}")
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
