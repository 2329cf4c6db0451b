"""The typed configuration tree: every key a run understands, with its default and meaning.

Names follow verl where a verl user would look for them (`data.train_batch_size` counts prompts,
`rollout.n` samples per prompt, `actor.ppo_mini_batch_size` counts prompts). The loader
(`lucidrl.config.loader`) fills these dataclasses from YAML and `key=value` overrides and refuses
unknown keys, wrong types and impossible batch arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
    path: str = ""  # a local HuggingFace causal-LM folder (`lucidrl model tiny` builds one)
    tokenizer_path: str | None = None  # defaults to model.path
    pad_token: str | None = None  # used when the tokenizer has none; else eos is used, with a warning
    dtype: Literal["float32", "bfloat16"] = "float32"  # parameter dtype of actor and reference
    trust_remote_code: bool = False


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    prompt_key: str = "prompt"
    max_prompt_length: int = 512  # tokens, after the chat template
    max_response_length: int = 256  # new tokens per sample
    filter_overlong_prompts: bool = False  # False: an overlong prompt is an error naming file and row
    train_batch_size: int = 8  # prompts per step (each sampled rollout.n times)
    val_batch_size: int | None = None  # prompts per validation generate call; None: all at once
    shuffle: bool = True
    seed: int = 0


@dataclass
class ValKwargsConfig:
    n: int = 1
    do_sample: bool = False  # False: greedy decoding
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class RolloutConfig:
    name: Literal["hf"] = "hf"
    n: int = 4  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k filtering
    micro_batch_size: int = 64  # sequences per generate call
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0  # linear learning-rate warm-up from 0
    grad_clip: float = 1.0  # max global grad norm; a non-finite norm skips the step and is counted


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 8  # prompts per optimizer step (x rollout.n samples)
    ppo_micro_batch_size: int = 8  # samples per forward/backward (gradient accumulation)
    log_prob_micro_batch_size: int = 16  # samples per forward when computing log-probs
    ppo_epochs: int = 1
    policy_loss: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True  # False: Dr.GRPO


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = (
        None  # a .py file defining compute_score(data_source, solution_str, ground_truth, extra_info)
    )
    name: str = "compute_score"


@dataclass
class RewardConfig:
    custom_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)


@dataclass
class TrainerConfig:
    project_name: str = "lucidrl"
    experiment_name: str = "run"
    run_dir: str | None = None  # defaults to runs/<experiment_name>
    overwrite: bool = False  # replace a run directory that already holds a run
    total_epochs: int = 1
    total_training_steps: int | None = None  # None: total_epochs over the training set
    test_freq: int = 0  # validate every N steps (and after the last); 0: only after the last step
    val_before_train: bool = True
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    save_final_model: bool = True
    seed: int = 0
    device: str = "cpu"
    num_threads: int | None = None  # torch intra-op threads; None: torch's default


@dataclass
class LucidConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
