"""verl's config keys and what lucidrl does with each: the translation table (one row per key or pattern).

Read by lucidrl/config/verl.py (which applies it to a command line) and rendered into
docs/migration.md (`python -m lucidrl.config.verl_docs --write-docs docs/migration.md`; a test fails when
the page and this table disagree). Rows are tried in order: a specific key before the pattern that
also covers it. Keys are verl 0.9's (verl/trainer/config/_generated_ppo_trainer.yaml), plus the older
names Logic-RL's and TinyZero's scripts use and the DAPO recipe's.

A map row whose lucidrl key does not exist is refused as "not built yet", and starts working with no
change here once the key is added under the name written.
"""

from __future__ import annotations

from typing import Any

from lucidrl.config.verl_convert import (
    VERL_ESTIMATORS,
    VERL_POLICY_LOSSES,
    clip_ratio,
    critic_enable,
    device,
    do_sample,
    equals_key,
    files,
    follows_actor,
    freq,
    local_dir,
    logger,
    one_of,
    only_if_off,
    optimizer,
    path,
    per_rank,
    placement,
    precision,
    registered,
    rm_length,
    rollout_name,
    save_contents,
    scheduler,
    seed,
    strategy,
    test_freq,
    warmup_ratio,
    warmup_steps,
)
from lucidrl.config.verl_rows import Map, Note, Noted, Refuse, Row

MEMORY = "memory/speed only, no change to the numbers; lucidrl has no such switch"
ONE_ENGINE = "vLLM parallelism: lucidrl runs one engine per rank (no tensor/pipeline parallelism)"
RAY = "lucidrl starts or joins Ray itself (trainer.ray_address)"
PROFILE = "profiling hooks: not built; nothing is profiled"


def _optim_rows(verl: str, ours: str) -> list[Row]:
    """actor_rollout_ref.actor.optim.* and critic.optim.*."""
    section = verl.rsplit(".optim", 1)[0]
    return [
        Map(f"{verl}.lr", f"{ours}.lr"),
        Map(f"{verl}.weight_decay", f"{ours}.weight_decay"),
        Map(f"{verl}.betas", f"{ours}.betas"),
        Map(f"{verl}.clip_grad", f"{ours}.grad_clip"),
        Map(f"{verl}.lr_warmup_steps", f"{ours}.warmup_steps", convert=warmup_steps),
        Map(f"{verl}.lr_warmup_steps_ratio", f"{ours}.warmup_steps", convert=warmup_ratio(section)),
        Row(f"{verl}.lr_scheduler_type", None, "note", convert=scheduler),
        Row(f"{verl}.warmup_style", None, "note", convert=scheduler),  # lr_scheduler_type's old name
        Row(
            f"{verl}.min_lr_ratio", None, "note", convert=only_if_off(f"{verl}.lr_scheduler_type", "constant")
        ),
        Row(f"{verl}.num_cycles", None, "note", convert=only_if_off(f"{verl}.lr_scheduler_type", "constant")),
        Row(f"{verl}.optimizer", None, "note", convert=optimizer),
        Refuse(f"{verl}.optimizer_impl", "lucidrl's AdamW is torch.optim's", default="torch.optim"),
        Note(f"{verl}.total_training_steps", "verl fills it in at run time"),
        Refuse(f"{verl}.override_optimizer_config", "optimizer options beyond the keys above", default=None),
        Note(f"{verl}._target_", "verl's config class"),
    ]


def _fsdp_rows(prefix: str) -> list[Row]:
    return [
        Map(f"{prefix}.fsdp_config.strategy", "trainer.strategy", convert=strategy),
        # FSDP's mixed precision: the weights' dtype and the compute dtype (verl: fp32 weights, bf16 compute)
        Map(f"{prefix}.fsdp_config.model_dtype", "model.dtype", convert=precision),
        Map(f"{prefix}.fsdp_config.dtype", "model.compute_dtype", convert=precision),
        Note(f"{prefix}.fsdp_config.**", f"FSDP tuning (offload, wrap policy, prefetch, ...): {MEMORY}"),
    ]


ROWS: list[Row] = [
    # ---- data ----
    Map("data.train_files", "data.train_files", convert=files),
    Map("data.val_files", "data.val_files", convert=files),
    Map("data.prompt_key", "data.prompt_key"),
    Map("data.max_prompt_length", "data.max_prompt_length"),
    Map("data.max_response_length", "data.max_response_length"),
    Map("data.train_batch_size", "data.train_batch_size"),
    Map("data.val_batch_size", "data.val_batch_size"),
    Map("data.filter_overlong_prompts", "data.filter_overlong_prompts"),
    Map("data.truncation", "data.truncation"),
    Map("data.shuffle", "data.shuffle"),
    Map(
        "data.seed",
        "data.seed",
        convert=seed,
    ),
    Map("data.apply_chat_template_kwargs", "data.apply_chat_template_kwargs"),
    Map("data.apply_chat_template_kwargs.**", "data.apply_chat_template_kwargs.{rest}"),
    Row(
        "data.gen_batch_size",
        None,
        "note",
        convert=equals_key("data.train_batch_size", 1024, "prompts per generation round"),
    ),
    Note("data.return_raw_chat", "lucidrl keeps every row's chat messages (raw_prompt)"),
    Note(
        "data.return_raw_input_ids", "lucidrl re-renders the chat for a reward model with another tokenizer"
    ),
    Note("data.return_full_prompt", "lucidrl keeps every row's chat messages (raw_prompt)"),
    Note("data.dataloader_num_workers", "lucidrl tokenizes every row once at start"),
    Note("data.filter_overlong_prompts_workers", "lucidrl tokenizes every row once at start"),
    Note("data.use_shm", MEMORY),
    Refuse("data.validation_shuffle", "validation prompts in another order than written", default=False),
    Refuse(
        "data.tokenizer",
        "a data-only tokenizer (lucidrl uses model.tokenizer_path)",
        lucidrl="model.tokenizer_path",
        default=None,
    ),
    Refuse("data.train_max_samples", "a cap on the training rows; cut the file instead", default=-1),
    Refuse("data.val_max_samples", "a cap on the validation rows; cut the file instead", default=-1),
    Refuse("data.reward_fn_key", "lucidrl picks the reward by the data_source column", default="data_source"),
    Note("data.image_key", "lucidrl trains text models: rows' images are not read"),
    Note("data.video_key", "lucidrl trains text models: rows' videos are not read"),
    Note("data.image_patch_size", "lucidrl trains text models"),
    Note("data.return_multi_modal_inputs", "lucidrl trains text models"),
    Note("data.trust_remote_code", "the tokenizer follows model.trust_remote_code"),
    Refuse("data.tool_config_path", "tool calling in rollouts", default=None),
    Refuse("data.custom_cls.**", "a custom dataset class", default=None),
    Refuse("data.sampler.**", "a custom curriculum sampler", default=None),
    Refuse("data.datagen.**", "a dynamic data generator", default=None),
    # ---- actor_rollout_ref.model ----
    Map("actor_rollout_ref.model.path", "model.path", convert=path),
    Map("actor_rollout_ref.model.tokenizer_path", "model.tokenizer_path", convert=path),
    Map("actor_rollout_ref.model.trust_remote_code", "model.trust_remote_code"),
    Map("actor_rollout_ref.model.lora_rank", "model.lora_rank"),
    Map("actor_rollout_ref.model.lora_alpha", "model.lora_alpha"),
    Map("actor_rollout_ref.model.target_modules", "model.target_modules"),
    Refuse("actor_rollout_ref.model.exclude_modules", "LoRA module exclusion", default=None),
    Refuse("actor_rollout_ref.model.lora_adapter_path", "starting from a saved LoRA adapter", default=None),
    Refuse("actor_rollout_ref.model.override_config", "model config overrides", default={}),
    Map("actor_rollout_ref.model.override_config.attn_implementation", "model.attn_implementation"),
    Refuse(
        "actor_rollout_ref.model.override_config.**",
        "model config overrides (change the model folder's config.json)",
    ),
    Refuse(
        "actor_rollout_ref.model.custom_chat_template",
        "a chat template override (edit tokenizer_config.json)",
        default=None,
    ),
    Refuse("actor_rollout_ref.model.external_lib", "importing a model library", default=None),
    Refuse("actor_rollout_ref.model.hf_config_path", "a config.json from another folder", default=None),
    Map("actor_rollout_ref.model.enable_gradient_checkpointing", "model.enable_gradient_checkpointing"),
    Note("actor_rollout_ref.model.enable_activation_offload", MEMORY),
    Note(
        "actor_rollout_ref.model.use_remove_padding",
        "lucidrl cuts each micro-batch to its longest response (actor.length_sorted_micro_batches): same numbers",
    ),
    Note(
        "actor_rollout_ref.model.use_fused_kernels",
        "fused log-prob kernels: lucidrl's are actor.use_torch_compile and actor.head_chunk_tokens",
    ),
    Note(
        "actor_rollout_ref.model.fused_kernel_options.**",
        "fused log-prob kernels: lucidrl's are actor.use_torch_compile and actor.head_chunk_tokens",
    ),
    Note("actor_rollout_ref.model.use_liger", MEMORY),
    Note("actor_rollout_ref.model.use_shm", MEMORY),
    Note("actor_rollout_ref.model.tiled_mlp.**", MEMORY),
    Refuse("actor_rollout_ref.model.mtp.enable", "multi-token prediction", default=False),
    Row(
        "actor_rollout_ref.model.mtp.**",
        None,
        "note",
        convert=only_if_off("actor_rollout_ref.model.mtp.enable"),
    ),
    Note("actor_rollout_ref.model._target_", "verl's config class"),
    # ---- actor_rollout_ref.actor ----
    *_optim_rows("actor_rollout_ref.actor.optim", "actor.optim"),
    Map("actor_rollout_ref.actor.grad_clip", "actor.optim.grad_clip"),
    Map("actor_rollout_ref.actor.strategy", "trainer.strategy", convert=strategy),
    Map("actor_rollout_ref.actor.ppo_mini_batch_size", "actor.ppo_mini_batch_size"),
    Map("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor.ppo_micro_batch_size"),
    Map("actor_rollout_ref.actor.ppo_micro_batch_size", "actor.ppo_micro_batch_size", convert=per_rank),
    Map("actor_rollout_ref.actor.use_dynamic_bsz", "actor.use_dynamic_bsz"),
    Map("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor.ppo_max_token_len_per_gpu"),
    Map("actor_rollout_ref.actor.ppo_epochs", "actor.ppo_epochs"),
    Map("actor_rollout_ref.actor.clip_ratio", "actor.clip_ratio_low", convert=clip_ratio),
    Map("actor_rollout_ref.actor.clip_ratio_low", "actor.clip_ratio_low"),
    Map("actor_rollout_ref.actor.clip_ratio_high", "actor.clip_ratio_high"),
    Map("actor_rollout_ref.actor.clip_ratio_c", "actor.clip_ratio_c"),
    Map("actor_rollout_ref.actor.loss_agg_mode", "actor.loss_agg_mode"),
    Map("actor_rollout_ref.actor.entropy_coeff", "actor.entropy_coeff"),
    Map("actor_rollout_ref.actor.use_kl_loss", "actor.use_kl_loss"),
    Map("actor_rollout_ref.actor.kl_loss_coef", "actor.kl_loss_coef"),
    Map("actor_rollout_ref.actor.kl_loss_type", "actor.kl_loss_type"),
    Map("actor_rollout_ref.actor.use_torch_compile", "actor.use_torch_compile"),
    Map(
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        "actor.policy_loss.loss_mode|actor.policy_loss",
        convert=registered("policy loss", VERL_POLICY_LOSSES),
    ),
    # verl 0.9's policy-loss options and scaling
    Map(
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio",
        "actor.policy_loss.clip_cov_ratio",
        default=0.0002,
    ),
    Map("actor_rollout_ref.actor.policy_loss.clip_cov_lb", "actor.policy_loss.clip_cov_lb", default=1.0),
    Map("actor_rollout_ref.actor.policy_loss.clip_cov_ub", "actor.policy_loss.clip_cov_ub", default=5.0),
    Map(
        "actor_rollout_ref.actor.policy_loss.kl_cov_ratio",
        "actor.policy_loss.kl_cov_ratio",
        default=0.0002,
    ),
    Map("actor_rollout_ref.actor.policy_loss.ppo_kl_coef", "actor.policy_loss.ppo_kl_coef", default=0.1),
    Note("actor_rollout_ref.actor.policy_loss._target_", "verl's config class"),
    Map("actor_rollout_ref.actor.loss_scale_factor", "actor.loss_scale_factor", default=None),
    Map("actor_rollout_ref.actor.tau_pos", "actor.tau_pos", default=1.0),
    Map("actor_rollout_ref.actor.tau_neg", "actor.tau_neg", default=1.05),
    Refuse(
        "actor_rollout_ref.actor.calculate_sum_pi_squared",
        "the sum of squared probabilities (optimal-token baselines)",
        default=False,
    ),
    Note("actor_rollout_ref.actor.sum_pi_squared_checkpointing", MEMORY),
    Note("actor_rollout_ref.actor.calculate_entropy", "lucidrl always measures actor/entropy"),
    Note(
        "actor_rollout_ref.actor.use_prefix_grouper",
        "lucidrl runs each prompt once for its samples (actor.share_prompt_forward)",
    ),
    Note(
        "actor_rollout_ref.actor.shuffle",
        "lucidrl's mini-batch order: whole prompt groups (controller/dispatch.py)",
    ),
    Note("actor_rollout_ref.actor.data_loader_seed", "lucidrl's mini-batch order follows trainer.seed"),
    Row("actor_rollout_ref.actor.checkpoint.save_contents", None, "note", convert=save_contents),
    Note(
        "actor_rollout_ref.actor.checkpoint.**", "lucidrl's checkpoints hold everything, written then renamed"
    ),
    Note(
        "actor_rollout_ref.actor.use_fused_kernels",
        "fused log-prob kernels: lucidrl's are actor.use_torch_compile and actor.head_chunk_tokens",
    ),
    Note(
        "actor_rollout_ref.actor.use_remove_padding",
        "lucidrl cuts each micro-batch to its longest response: same numbers",
    ),
    Note(
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        f"sequence parallelism: {MEMORY} (each sequence runs whole on one rank)",
    ),
    Note(
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
        "lucidrl's chunked LM head: actor.head_chunk_tokens",
    ),
    Note("actor_rollout_ref.actor.entropy_checkpointing", MEMORY),
    Note("actor_rollout_ref.actor.freeze_vision_tower", "lucidrl trains text models"),
    Note("actor_rollout_ref.actor.rollout_n", "verl copies rollout.n here"),
    Refuse("actor_rollout_ref.actor.router_replay.mode", "MoE router replay", default="disabled"),
    Row(
        "actor_rollout_ref.actor.router_replay.**",
        None,
        "note",
        convert=only_if_off("actor_rollout_ref.actor.router_replay.mode", "disabled"),
    ),
    *_fsdp_rows("actor_rollout_ref.actor"),
    Refuse("actor_rollout_ref.actor.megatron.**", "Megatron-LM training", gpu=True),
    Note("actor_rollout_ref.actor.profiler.**", PROFILE),
    Note("actor_rollout_ref.actor._target_", "verl's config class"),
    # ---- actor_rollout_ref.ref ----
    Map("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor.log_prob_micro_batch_size"),
    Map(
        "actor_rollout_ref.ref.log_prob_micro_batch_size", "actor.log_prob_micro_batch_size", convert=per_rank
    ),
    Row(
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        None,
        "note",
        convert=follows_actor("actor_rollout_ref.actor.use_dynamic_bsz", False),
    ),
    Map("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "actor.log_prob_max_token_len_per_gpu"),
    Note("actor_rollout_ref.ref.use_torch_compile", "the reference follows actor.use_torch_compile"),
    Note("actor_rollout_ref.ref.ulysses_sequence_parallel_size", f"sequence parallelism: {MEMORY}"),
    Note(
        "actor_rollout_ref.ref.entropy_from_logits_with_chunking",
        "lucidrl's chunked LM head: actor.head_chunk_tokens",
    ),
    Note("actor_rollout_ref.ref.entropy_checkpointing", MEMORY),
    Note("actor_rollout_ref.ref.rollout_n", "verl copies rollout.n here"),
    Note("actor_rollout_ref.ref.strategy", "the reference is sharded as the actor (trainer.strategy)"),
    Row(
        "actor_rollout_ref.ref.router_replay.**",
        None,
        "note",
        convert=only_if_off("actor_rollout_ref.actor.router_replay.mode", "disabled"),
    ),
    Note("actor_rollout_ref.ref.fsdp_config.model_dtype", "the reference holds the actor's model.dtype"),
    Note(
        "actor_rollout_ref.ref.fsdp_config.dtype", "the reference computes as the actor (model.compute_dtype)"
    ),
    Note("actor_rollout_ref.ref.fsdp_config.**", f"FSDP tuning (offload, ...): {MEMORY}"),
    Refuse("actor_rollout_ref.ref.megatron.**", "Megatron-LM training", gpu=True),
    Note("actor_rollout_ref.ref.profiler.**", PROFILE),
    Note("actor_rollout_ref.ref._target_", "verl's config class"),
    # ---- actor_rollout_ref.rollout ----
    Map("actor_rollout_ref.rollout.name", "rollout.name", convert=rollout_name),
    Map("actor_rollout_ref.rollout.n", "rollout.n"),
    Map("actor_rollout_ref.rollout.temperature", "rollout.temperature"),
    Map("actor_rollout_ref.rollout.top_p", "rollout.top_p"),
    Map("actor_rollout_ref.rollout.top_k", "rollout.top_k"),
    Row("actor_rollout_ref.rollout.do_sample", None, "note", convert=do_sample),
    Map("actor_rollout_ref.rollout.val_kwargs.n", "rollout.val_kwargs.n"),
    Map("actor_rollout_ref.rollout.val_kwargs.do_sample", "rollout.val_kwargs.do_sample"),
    Map("actor_rollout_ref.rollout.val_kwargs.temperature", "rollout.val_kwargs.temperature"),
    Map("actor_rollout_ref.rollout.val_kwargs.top_p", "rollout.val_kwargs.top_p"),
    Map("actor_rollout_ref.rollout.val_kwargs.top_k", "rollout.val_kwargs.top_k"),
    Note("actor_rollout_ref.rollout.val_kwargs._target_", "verl's config class"),
    Map("actor_rollout_ref.rollout.prompt_length", "data.max_prompt_length"),
    Map("actor_rollout_ref.rollout.response_length", "data.max_response_length"),
    Map("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor.log_prob_micro_batch_size"),
    Map(
        "actor_rollout_ref.rollout.log_prob_micro_batch_size",
        "actor.log_prob_micro_batch_size",
        convert=per_rank,
    ),
    Row(
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        None,
        "note",
        convert=follows_actor("actor_rollout_ref.actor.use_dynamic_bsz", False),
    ),
    Map("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "actor.log_prob_max_token_len_per_gpu"),
    Map("actor_rollout_ref.rollout.gpu_memory_utilization", "rollout.vllm.gpu_memory_utilization"),
    Map("actor_rollout_ref.rollout.max_model_len", "rollout.vllm.max_model_len"),
    Map("actor_rollout_ref.rollout.enforce_eager", "rollout.vllm.enforce_eager"),
    Map("actor_rollout_ref.rollout.free_cache_engine", "rollout.vllm.enable_sleep_mode"),
    Note("actor_rollout_ref.rollout.tensor_model_parallel_size", ONE_ENGINE),
    Note("actor_rollout_ref.rollout.data_parallel_size", ONE_ENGINE),
    Note("actor_rollout_ref.rollout.expert_parallel_size", ONE_ENGINE),
    Note("actor_rollout_ref.rollout.pipeline_model_parallel_size", ONE_ENGINE),
    Note("actor_rollout_ref.rollout.mode", "lucidrl generates each batch in one call per rank"),
    Note("actor_rollout_ref.rollout.dtype", "the rollout computes in model.compute_dtype (else model.dtype)"),
    Note("actor_rollout_ref.rollout.load_format", "lucidrl pushes the actor's weights to its engine"),
    Note("actor_rollout_ref.rollout.layered_summon", MEMORY),
    Note("actor_rollout_ref.rollout.max_num_batched_tokens", f"vLLM scheduling: {MEMORY}"),
    Note("actor_rollout_ref.rollout.max_num_seqs", f"vLLM scheduling: {MEMORY}"),
    Note("actor_rollout_ref.rollout.enable_chunked_prefill", f"vLLM scheduling: {MEMORY}"),
    Note("actor_rollout_ref.rollout.enable_prefix_caching", f"vLLM scheduling: {MEMORY}"),
    Note("actor_rollout_ref.rollout.scheduling_policy", f"vLLM scheduling: {MEMORY}"),
    Note("actor_rollout_ref.rollout.cudagraph_capture_sizes", f"vLLM CUDA graphs: {MEMORY}"),
    Note("actor_rollout_ref.rollout.disable_log_stats", "vLLM's own logging"),
    Note("actor_rollout_ref.rollout.multi_stage_wake_up", MEMORY),
    Note("actor_rollout_ref.rollout.skip_tokenizer_init", "lucidrl passes token ids to its engine"),
    Note(
        "actor_rollout_ref.rollout.calculate_log_probs",
        "lucidrl compares rollout and actor log-probs (rollout/logprob_diff_*)",
    ),
    Note(
        "actor_rollout_ref.rollout.logprobs_mode",
        "lucidrl compares rollout and actor log-probs (rollout/logprob_diff_*)",
    ),
    Refuse(
        "actor_rollout_ref.rollout.ignore_eos", "generating past the end-of-sequence token", default=False
    ),
    Refuse(
        "actor_rollout_ref.rollout.over_sample_rate", "over-sampling and cutting slow requests", default=0
    ),
    Refuse("actor_rollout_ref.rollout.skip_rollout", "replaying dumped rollouts", default=False),
    Row(
        "actor_rollout_ref.rollout.skip_dump_dir",
        None,
        "note",
        convert=only_if_off("actor_rollout_ref.rollout.skip_rollout"),
    ),
    Refuse("actor_rollout_ref.rollout.quantization", "quantised rollouts", default=None, gpu=True),
    Refuse(
        "actor_rollout_ref.rollout.quantization_config_file", "quantised rollouts", default=None, gpu=True
    ),
    Refuse("actor_rollout_ref.rollout.enable_rollout_routing_replay", "MoE routing replay", default=False),
    Refuse("actor_rollout_ref.rollout.engine_kwargs.**", "extra vLLM/SGLang engine options", default={}),
    Refuse("actor_rollout_ref.rollout.multi_turn.enable", "multi-turn rollouts with tools", default=False),
    Row(
        "actor_rollout_ref.rollout.multi_turn.**",
        None,
        "note",
        convert=only_if_off("actor_rollout_ref.rollout.multi_turn.enable"),
    ),
    Note(
        "actor_rollout_ref.rollout.agent.**",
        "verl's agent-loop workers: lucidrl generates in its rollout role",
    ),
    Note(
        "actor_rollout_ref.rollout.checkpoint_engine.**",
        "lucidrl pushes the actor's weights to its engine in memory",
    ),
    Note("actor_rollout_ref.rollout.trace.**", "rollout tracing: not built; nothing traced"),
    Note("actor_rollout_ref.rollout.prometheus.**", "vLLM metrics export: not built"),
    Note("actor_rollout_ref.rollout.mtp", "multi-token prediction (actor_rollout_ref.model.mtp)"),
    Note("actor_rollout_ref.rollout.profiler.**", PROFILE),
    Note("actor_rollout_ref.rollout._target_", "verl's config class"),
    Note(
        "actor_rollout_ref.hybrid_engine",
        "lucidrl's roles share processes as placement.colocate says (all, by default)",
    ),
    Note("actor_rollout_ref.nccl_timeout", "lucidrl's process groups use torch's default timeout"),
    # ---- critic ----
    *_optim_rows("critic.optim", "critic.optim"),
    Map("critic.grad_clip", "critic.optim.grad_clip"),
    Map("critic.model.path", "critic.model_path", convert=path),
    Map("critic.strategy", "trainer.strategy", convert=strategy),
    Map("critic.ppo_mini_batch_size", "critic.ppo_mini_batch_size"),
    Map("critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size"),
    Map("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size", convert=per_rank),
    Map("critic.use_dynamic_bsz", "critic.use_dynamic_bsz"),
    Map("critic.ppo_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu"),
    Map("critic.ppo_epochs", "critic.ppo_epochs"),
    Map("critic.cliprange_value", "critic.cliprange_value"),
    Map("critic.loss_agg_mode", "critic.loss_agg_mode"),
    Row("critic.enable", None, "note", convert=critic_enable),
    Note(
        "critic.forward_micro_batch_size_per_gpu",
        "the critic's value forwards use critic.ppo_micro_batch_size",
    ),
    Note("critic.forward_micro_batch_size", "the critic's value forwards use critic.ppo_micro_batch_size"),
    Note(
        "critic.forward_max_token_len_per_gpu",
        "the critic's value forwards use critic.ppo_max_token_len_per_gpu",
    ),
    Note("critic.rollout_n", "verl copies rollout.n here"),
    Note("critic.shuffle", "lucidrl's mini-batch order: whole prompt groups"),
    Note("critic.data_loader_seed", "lucidrl's mini-batch order follows trainer.seed"),
    Note("critic.ulysses_sequence_parallel_size", f"sequence parallelism: {MEMORY}"),
    Note("critic.checkpoint.**", "lucidrl's checkpoints hold everything, written then renamed"),
    Note("critic.model.tokenizer_path", "the critic reads the policy's tokens"),
    Note("critic.model.trust_remote_code", "the critic follows model.trust_remote_code"),
    Refuse("critic.model.override_config", "model config overrides", default={}),
    Refuse("critic.model.external_lib", "importing a model library", default=None),
    Refuse(
        "critic.model.lora_rank",
        "LoRA on the critic (lucidrl's LoRA is the actor's: model.lora_rank)",
        default=0,
    ),
    Row("critic.model.lora_alpha", None, "note", convert=only_if_off("critic.model.lora_rank", 0)),
    Row("critic.model.target_modules", None, "note", convert=only_if_off("critic.model.lora_rank", 0)),
    Note("critic.model.enable_gradient_checkpointing", MEMORY),
    Note("critic.model.enable_activation_offload", MEMORY),
    Note(
        "critic.model.use_remove_padding",
        "lucidrl cuts each micro-batch to its longest response: same numbers",
    ),
    Note("critic.model.use_shm", MEMORY),
    Note("critic.model.tiled_mlp.**", MEMORY),
    Note("critic.model.fsdp_config.**", f"FSDP tuning (offload, ...): {MEMORY}"),
    Note("critic.model._target_", "verl's config class"),
    Note("critic.fsdp_config.**", f"FSDP tuning: {MEMORY}"),
    Refuse("critic.megatron.**", "Megatron-LM training", gpu=True),
    Note("critic.profiler.**", PROFILE),
    Note("critic._target_", "verl's config class"),
    # ---- reward_model (and the DAPO reward manager's keyword arguments) ----
    Map("reward_model.enable", "reward_model.enable"),
    Map("reward_model.model.path", "reward_model.model.path", convert=path),
    Map("reward_model.model.trust_remote_code", "reward_model.model.trust_remote_code"),
    Map("reward_model.micro_batch_size_per_gpu", "reward_model.micro_batch_size"),
    Map("reward_model.micro_batch_size", "reward_model.micro_batch_size", convert=per_rank),
    Map("reward_model.max_length", "reward_model.max_length"),
    Row(
        "reward_model.reward_manager",
        None,
        "note",
        convert=one_of(
            {
                "naive": Noted("lucidrl's rule reward manager"),
                "dapo": Noted("lucidrl's rule reward manager; the overlong buffer is reward.overlong_buffer"),
            }
        ),
    ),
    Map("reward_model.overlong_buffer.enable", "reward.overlong_buffer.enable"),
    Map("reward_model.overlong_buffer.len", "reward.overlong_buffer.len"),
    Map("reward_model.overlong_buffer.penalty_factor", "reward.overlong_buffer.penalty_factor"),
    Note("reward_model.overlong_buffer.log", "lucidrl always logs reward_extra/overlong_penalty"),
    Map("reward_model.reward_kwargs.overlong_buffer_cfg.enable", "reward.overlong_buffer.enable"),
    Map("reward_model.reward_kwargs.overlong_buffer_cfg.len", "reward.overlong_buffer.len"),
    Map(
        "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor",
        "reward.overlong_buffer.penalty_factor",
    ),
    Note(
        "reward_model.reward_kwargs.overlong_buffer_cfg.log",
        "lucidrl always logs reward_extra/overlong_penalty",
    ),
    Row(
        "reward_model.reward_kwargs.max_resp_len",
        None,
        "note",
        convert=equals_key("data.max_response_length", 512, "the overlong buffer's end"),
    ),
    Refuse("reward_model.reward_kwargs.**", "a reward manager option"),
    Note(
        "reward_model.model.input_tokenizer",
        "lucidrl re-renders each sample with the reward model's own tokenizer when it differs",
    ),
    Note("reward_model.model.use_remove_padding", "same numbers"),
    Note("reward_model.model.use_fused_kernels", MEMORY),
    Note("reward_model.model.use_shm", MEMORY),
    Refuse("reward_model.model.external_lib", "importing a model library", default=None),
    Refuse("reward_model.model.override_config", "model config overrides", default={}),
    Note("reward_model.model.fsdp_config.**", f"FSDP tuning: {MEMORY}"),
    Note("reward_model.strategy", "the reward model is sharded as the actor (trainer.strategy)"),
    Note(
        "reward_model.use_dynamic_bsz", "the reward model's forwards are cut by reward_model.micro_batch_size"
    ),
    Note(
        "reward_model.forward_max_token_len_per_gpu",
        "the reward model's forwards are cut by reward_model.micro_batch_size",
    ),
    Note("reward_model.ulysses_sequence_parallel_size", f"sequence parallelism: {MEMORY}"),
    Note(
        "reward_model.use_reward_loop",
        "lucidrl scores in its reward step (rules in the trainer, the reward model in its role)",
    ),
    Note("reward_model.num_workers", "lucidrl scores in its reward step"),
    Note("reward_model.launch_reward_fn_async", "lucidrl scores in its reward step"),
    Map("reward_model.rollout.prompt_length", "reward_model.max_length", convert=rm_length),
    Map("reward_model.rollout.response_length", "reward_model.max_length", convert=rm_length),
    Note(
        "reward_model.rollout.**",
        "serving the reward model with an inference engine: lucidrl runs its forward in the reward_model role",
    ),
    Refuse(
        "reward_model.enable_resource_pool",
        "a separate pool for the reward model",
        lucidrl="placement.reward_model.pool",
        default=False,
    ),
    Row(
        "reward_model.n_gpus_per_node", None, "note", convert=only_if_off("reward_model.enable_resource_pool")
    ),
    Row("reward_model.nnodes", None, "note", convert=only_if_off("reward_model.enable_resource_pool")),
    Refuse("reward_model.reward_loop_source", "a custom reward loop", default="register"),
    Refuse("reward_model.reward_loop_module_path", "a custom reward loop", default=None),
    Refuse("reward_model.reward_loop_class_name", "a custom reward loop", default=None),
    Refuse("reward_model.sandbox_fusion.url", "code execution in a sandbox", default=None),
    Row(
        "reward_model.sandbox_fusion.**",
        None,
        "note",
        convert=only_if_off("reward_model.sandbox_fusion.url", None),
    ),
    Note("reward_model.profiler.**", PROFILE),
    Refuse("reward_manager.source", "a custom reward manager", default="register"),
    Row(
        "reward_manager.name",
        None,
        "note",
        convert=one_of(
            {"naive": Noted("lucidrl's rule reward manager"), "dapo": Noted("lucidrl's rule reward manager")}
        ),
    ),
    Refuse("reward_manager.module.path", "a custom reward manager", default=None),
    Note("reward_manager.**", "verl's reward manager registry"),
    Map("custom_reward_function.path", "reward.custom_function.path", convert=path),
    Map("custom_reward_function.name", "reward.custom_function.name"),
    Map("custom_reward_function.reward_kwargs", "reward.custom_function.reward_kwargs"),
    Map("custom_reward_function.reward_kwargs.**", "reward.custom_function.reward_kwargs.{rest}"),
    # ---- algorithm ----
    Map(
        "algorithm.adv_estimator",
        "algorithm.adv_estimator",
        convert=registered("advantage estimator", VERL_ESTIMATORS),
    ),
    Map("algorithm.gamma", "algorithm.gamma"),
    Map("algorithm.lam", "algorithm.lam"),
    Map("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo"),
    Map("algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward"),
    Map("algorithm.kl_penalty", "algorithm.kl_penalty"),
    Map("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.type"),
    Map("algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.kl_coef"),
    Map("algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.horizon"),
    Map("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.target_kl"),
    Note("algorithm.kl_ctrl._target_", "verl's config class"),
    Map("algorithm.filter_groups.enable", "algorithm.filter_groups.enable"),
    Map("algorithm.filter_groups.metric", "algorithm.filter_groups.metric"),
    Map("algorithm.filter_groups.max_num_gen_batches", "algorithm.filter_groups.max_num_gen_batches"),
    Refuse("algorithm.use_pf_ppo", "preference-feedback PPO reweighting", default=False),
    Row("algorithm.pf_ppo.**", None, "note", convert=only_if_off("algorithm.use_pf_ppo")),
    # verl 0.9's rollout correction
    Map("algorithm.rollout_correction.rollout_is", "algorithm.rollout_correction.rollout_is", default=None),
    Map(
        "algorithm.rollout_correction.rollout_is_threshold",
        "algorithm.rollout_correction.rollout_is_threshold",
        default=2.0,
    ),
    Map("algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs", default=None),
    Map(
        "algorithm.rollout_correction.rollout_rs_threshold",
        "algorithm.rollout_correction.rollout_rs_threshold",
        default=None,
    ),
    Map(
        "algorithm.rollout_correction.bypass_mode", "algorithm.rollout_correction.bypass_mode", default=False
    ),
    Map(
        "algorithm.rollout_correction.loss_type", "algorithm.rollout_correction.loss_type", default="ppo_clip"
    ),
    Map(
        "algorithm.rollout_correction.rollout_is_batch_normalize",
        "algorithm.rollout_correction.rollout_is_batch_normalize",
        default=False,
    ),
    Map("algorithm.rollout_correction.**", "algorithm.rollout_correction.{rest}"),
    Note("algorithm._target_", "verl's config class"),
    # ---- trainer ----
    Map(
        "trainer.n_gpus_per_node",
        "placement.pools.global.devices_per_node",
        convert=placement("devices_per_node"),
    ),
    Map("trainer.nnodes", "placement.pools.global.nodes", convert=placement("nodes")),
    Map("trainer.device", "trainer.device", convert=device),
    Map("trainer.total_epochs", "trainer.total_epochs"),
    Map("trainer.total_training_steps", "trainer.total_training_steps"),
    Map("trainer.project_name", "trainer.project_name"),
    Map("trainer.experiment_name", "trainer.experiment_name"),
    Map("trainer.logger", "trainer.logger", convert=logger),
    Map("trainer.save_freq", "trainer.save_freq", convert=freq),
    Map("trainer.test_freq", "trainer.test_freq", convert=test_freq),
    Map("trainer.val_before_train", "trainer.val_before_train"),
    Map("trainer.critic_warmup", "critic.warmup_steps"),
    Map("trainer.resume_mode", "trainer.resume_mode"),
    Map("trainer.resume_from_path", "trainer.resume_from_path", convert=path),
    Map("trainer.default_local_dir", "trainer.run_dir", convert=local_dir),
    Map("trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    Map("trainer.max_critic_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    Refuse(
        "trainer.val_only", "validation alone: run `lucidrl eval MODEL --data FILE` instead", default=False
    ),
    Refuse("trainer.log_val_generations", "printing validation samples to the tracker", default=0),
    Refuse("trainer.rollout_data_dir", "dumping training rollouts to JSON lines", default=None),
    Refuse("trainer.validation_data_dir", "dumping validation rollouts to JSON lines", default=None),
    Refuse("trainer.default_hdfs_dir", "copying checkpoints to HDFS", default=None),
    Note(
        "trainer.del_local_ckpt_after_load",
        "lucidrl keeps local checkpoints (trainer.max_ckpt_to_keep prunes them)",
    ),
    Note(
        "trainer.balance_batch",
        "sequence-length balancing across ranks: lucidrl deals out whole prompt groups",
    ),
    Note("trainer.esi_redundant_time", "elastic-instance preemption margin: not built"),
    Note("trainer.ray_wait_register_center_timeout", RAY),
    Note("trainer.use_legacy_worker_impl", "verl's worker implementation switch"),
    Note("ray_kwargs.**", RAY),
    Note("ray_init.**", RAY),
    Note("global_profiler.**", PROFILE),
    Refuse("transfer_queue.enable", "verl's transfer queue", default=False),
    Note("hydra.**", "Hydra's own settings: lucidrl has its run directory (trainer.run_dir)"),
]

# keys whose verl default is another key's value (an OmegaConf interpolation): given the other and not this,
# this follows it, as in verl
FOLLOWS = {
    "critic.loss_agg_mode": "actor_rollout_ref.actor.loss_agg_mode",
    "critic.ppo_epochs": "actor_rollout_ref.actor.ppo_epochs",
    "critic.use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
}

# verl's defaults where lucidrl's differ, set first when a command line is verl's and no config file is
# given (a verl command line means verl's base config); the command line's own keys then win
VERL_DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    "rollout.n": 1,
    "actor.optim.weight_decay": 0.01,
    "critic.optim.weight_decay": 0.01,
    "data.train_batch_size": 1024,
    "data.max_response_length": 512,
    "actor.ppo_mini_batch_size": 256,
    "trainer.total_epochs": 30,
    "trainer.test_freq": -1,
}

# lucidrl keys that several verl keys may set: the smallest value wins (each bounds memory alone, so the
# smallest keeps every bound; the numbers do not change)
SMALLEST_WINS = (
    "actor.log_prob_micro_batch_size",
    "actor.log_prob_max_token_len_per_gpu",
)

__all__ = ["FOLLOWS", "ROWS", "SMALLEST_WINS", "VERL_DEFAULTS", "VERL_ESTIMATORS", "VERL_POLICY_LOSSES"]
