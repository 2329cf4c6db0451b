"""One rank of the colocated worker: actor, rollout, reference and critic roles in one process.

Which roles a rank hosts comes from the placement (by default all of them, in every rank of the one
group). With several ranks the actor and critic train data-parallel (FSDP2 or DDP over gloo/NCCL);
the rollout generates from its own full copy of the actor's weights, refreshed after each update,
so generation never depends on the other ranks (ranks finish sequences at different times).

The rollout engine (`rollout.name`) is used only through its contract (workers/rollout/engine.py):
`hf` generates with the actor's own module (one rank) or a full copy (several); `vllm` is a vLLM
engine in this process; `server` is an HTTP server that takes weights. Every engine gets the actor's
weights through `sync_from`, before the first generation and after every update (`sync_rollout`).
"""

from __future__ import annotations

import copy
import logging
import random
import sys
import threading
from inspect import signature
from pathlib import Path

import torch

from lucidrl.algos import get_advantage_estimator
from lucidrl.batch import Batch
from lucidrl.config import LucidConfig
from lucidrl.diagnostics.debug import debug_enabled
from lucidrl.models import check_tokenizer_matches_model, load_model, load_run_model, load_run_tokenizer
from lucidrl.models.dropout import describe as describe_dropout
from lucidrl.models.dropout import disable_dropout
from lucidrl.models.loading import DTYPES
from lucidrl.models.lora import ADAPTER, apply_lora, is_lora, merged
from lucidrl.models.precision import autocast_dtype
from lucidrl.models.saving import save_hf_folder
from lucidrl.workers.common.dispatch import Dispatch, dispatch
from lucidrl.workers.common.distributed import (
    DistInfo,
    full_state_dict,
    init_process_group,
    local_cuda_index,
    unwrap,
    wrap_for_training,
)
from lucidrl.workers.common.model_support import enable_activation_checkpointing
from lucidrl.workers.common.rng import process_rng_state
from lucidrl.workers.rollout.engine import SamplingParams, engine_class
from lucidrl.workers.training.actor import ActorWorker, ReferenceWorker
from lucidrl.workers.training.critic import CriticWorker, load_value_model
from lucidrl.workers.training.rank_metrics import RankMetrics
from lucidrl.workers.training.reward_model import RewardModelWorker
from lucidrl.workers.training.train_state import load_train_state, restore_rng_file, save_train_state

log = logging.getLogger(__name__)


class PolicyWorker:
    """The per-rank host of the colocated roles; its methods are what the trainer calls on a group."""

    def __init__(
        self, cfg: LucidConfig, roles: frozenset[str], device: str = "cpu", dist_info: DistInfo | None = None
    ):
        self.cfg = cfg
        self.roles = roles
        self.rank = dist_info.rank if dist_info else 0
        self.world_size = dist_info.world_size if dist_info else 1
        if dist_info is not None:  # in-process, the trainer has seeded already
            random.seed(cfg.trainer.seed)  # every rank builds the same weights (any random init included)
            torch.manual_seed(cfg.trainer.seed)
        if dist_info is not None and device == "cuda":  # a Ray rank: its own GPU current before NCCL starts
            index = local_cuda_index()
            torch.cuda.set_device(index)
            device = f"cuda:{index}"
        self.device = device
        if dist_info is not None and dist_info.world_size > 1:
            seconds = init_process_group(dist_info)
            if debug_enabled():
                print(
                    f"[lucidrl debug] rank {self.rank}/{self.world_size} joined {dist_info.backend} at "
                    f"{dist_info.master_addr}:{dist_info.master_port} in {seconds:.2f}s",
                    file=sys.stderr,
                    flush=True,
                )
        m = cfg.model
        dtype = DTYPES[m.dtype]
        compute = self.compute_dtype = autocast_dtype(m.dtype, m.compute_dtype)  # bf16 over fp32 weights
        self.tokenizer = load_run_tokenizer(m)
        self.actor = self.rollout = self.reference = self.critic = self.reward_model = None
        self.agent = None  # with rollout.multi_turn.enable: the multi-turn rollout over self.rollout
        # one generation or weight sync at a time: with rollout.mode one_step_off/async the trainer's
        # thread syncs while another generates (generate and sync_rollout below)
        self._engine_lock = threading.Lock()
        self.rollout_version = 0  # the trainer's step whose weights the engine holds (policy_version)
        sharded = self.world_size > 1
        if "actor" in roles:
            model = load_run_model(m, dtype)
            check_tokenizer_matches_model(model, self.tokenizer, m.path)
            if cfg.actor.disable_dropout and (changed := disable_dropout(model)):  # the reference's too
                log.info("%s", describe_dropout(changed, "actor.disable_dropout"))
            # an engine with weights of its own (vLLM) starts before the actor and the reference are on
            # the GPU: it asks for gpu_memory_utilization of the card's memory and refuses less
            engine_cls = engine_class(cfg.rollout.name)
            engine = None if engine_cls.runs_actor_module else self._make_rollout(engine_cls, model)
            model.to(self.device)
            if "reference" in roles:
                self.reference = self._reference(copy.deepcopy(model))
            if m.lora_rank:  # after the reference copy: the reference stays the base model
                model = apply_lora(model, m)
            if m.enable_gradient_checkpointing is True:  # the update's forwards only (they need gradients)
                enable_activation_checkpointing(model)
            # with one rank an engine that runs the actor's module generates with it; with several it
            # gets a full copy (FSDP2 shards the actor in place), and so it does when generation overlaps
            # the update (rollout.mode one_step_off/async: the weights must not change mid-generation)
            own_copy = sharded or bool(cfg.rollout.max_staleness)
            self.rollout = engine or self._make_rollout(
                engine_cls, copy.deepcopy(model) if own_copy else model
            )
            train_model = (
                wrap_for_training(model, cfg.trainer.strategy, self.device, compute) if sharded else model
            )
            self.actor = ActorWorker(
                train_model,
                cfg.actor,
                temperature=cfg.rollout.temperature,
                samples_per_prompt=cfg.rollout.n,
                world_size=self.world_size,
                compute_dtype=compute,
                response_length=cfg.data.max_response_length,
                rollout_correction=cfg.algorithm.rollout_correction,
                # the optimal token baselines weigh tokens by sum_v pi(v)^2 from the old-log-prob pass
                sum_pi_squared="sum_pi_squared"
                in signature(get_advantage_estimator(cfg.algorithm.adv_estimator)).parameters,
            )
            self.sync_rollout()  # every engine generates with the actor's weights from the first rollout on
            if cfg.rollout.multi_turn.enable:  # conversations over the engine, one call per turn
                from lucidrl.workers.rollout.agent import MultiTurnRollout

                d = cfg.data
                self.agent = MultiTurnRollout(
                    self.rollout,
                    self.tokenizer,
                    cfg.rollout.multi_turn,
                    eos_ids=self.rollout.eos_ids,
                    max_prompt_length=d.max_prompt_length,
                    max_response_length=d.max_response_length,
                    model_where=f"model.path={m.path!r}",
                )
        elif "reference" in roles:
            ref = load_run_model(m, dtype).to(self.device)
            self.reference = self._reference(ref)
        if "critic" in roles:
            c = cfg.critic
            value_model = load_value_model(
                c.model_path or m.path,
                dtype=dtype,
                config_key="critic.model_path" if c.model_path else "model.path",
            )
            # a critic of another vocabulary indexed past its embedding at the first values forward
            check_tokenizer_matches_model(
                value_model,
                self.tokenizer,
                c.model_path or m.path,
                "critic.model_path" if c.model_path else "model.path",
            )
            if c.disable_dropout and (changed := disable_dropout(value_model)):
                log.info("%s", describe_dropout(changed, "critic.disable_dropout"))
            value_model = value_model.to(self.device)
            if sharded:
                value_model = wrap_for_training(value_model, cfg.trainer.strategy, self.device, compute)
            self.critic = CriticWorker(
                value_model,
                c,
                mini_batch_prompts=cfg.critic_mini_batch_prompts,
                samples_per_prompt=cfg.rollout.n,
                world_size=self.world_size,
                compute_dtype=compute,
                response_length=cfg.data.max_response_length,
            )
        if "reward_model" in roles:
            self.reward_model = RewardModelWorker.from_config(cfg.reward_model, self.tokenizer, self.device)
        if dist_info is not None:
            # a process of its own (a Ray actor): seeded per rank once the models are built, or its
            # sampling would differ from run to run and every rank would draw the same numbers
            random.seed(cfg.trainer.seed + self.rank)
            torch.manual_seed(cfg.trainer.seed + self.rank)

    def _reference(self, model: torch.nn.Module) -> ReferenceWorker:
        """The frozen reference. With several FSDP2 ranks it is sharded like the actor (verl's
        reference is too): a full float32 copy on every rank would cost as much memory as the
        unsharded actor. Its forwards are then collectives, so every rank runs as many micro-batches."""
        cfg, a = self.cfg, self.cfg.actor
        model.requires_grad_(False)
        shard = self.world_size > 1 and cfg.trainer.strategy == "fsdp2"
        if shard:
            model = wrap_for_training(model, "fsdp2", self.device, self.compute_dtype)
        return ReferenceWorker(
            model,
            micro_batch_size=a.log_prob_micro_batch_size,
            temperature=cfg.rollout.temperature,
            share_prompt=a.share_prompt_forward and cfg.rollout.n > 1,
            length_sorted=a.length_sorted_micro_batches,
            max_tokens=a.log_prob_max_token_len_per_gpu if a.use_dynamic_bsz else None,
            head_chunk_tokens=a.head_chunk_tokens,
            compute_dtype=self.compute_dtype,
            compiled=a.use_torch_compile,
            world_size=self.world_size if shard else 1,
        )

    def _make_rollout(self, engine_cls, model: torch.nn.Module):
        return engine_cls.from_config(
            self.cfg,
            model,
            self.tokenizer,
            device=self.device,
            rank=self.rank,
            world_size=self.world_size,
            compute_dtype=self.compute_dtype,
        )

    def _need(self, role: str, what):
        if what is None:
            raise RuntimeError(
                f"this worker (rank {self.rank}) hosts roles {sorted(self.roles)}, not '{role}'"
            )
        return what

    # Batches arrive on the CPU (the trainer's side) and go back there: each method moves its input to
    # this rank's device and its output to the CPU, as verl's workers do. On a GPU the models would
    # otherwise get CPU token ids, and NCCL refuses CPU tensors.
    def _in(self, batch: Batch) -> Batch:
        return batch.to(self.device)

    @staticmethod
    def _out(batch: Batch) -> Batch:
        return batch.to("cpu")

    @dispatch(Dispatch.DP)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Responses for `prompts`, with `policy_version`: per token, the trainer step whose weights
        generated it (the engine's weights do not change during a call)."""
        engine = self.agent or self._need("rollout", self.rollout)
        with self._engine_lock:
            out = engine.generate(self._in(prompts), params)
            version = self.rollout_version
        out.set("policy_version", torch.full(out["responses"].shape, version, dtype=torch.long))
        return self._out(out)

    @dispatch(Dispatch.DP)
    def compute_log_prob(self, batch: Batch) -> Batch:
        return self._out(self._need("actor", self.actor).compute_log_prob(self._in(batch)))

    @dispatch(Dispatch.DP)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return self._out(self._need("reference", self.reference).compute_log_prob(self._in(batch)))

    @dispatch(Dispatch.DP)
    def compute_values(self, batch: Batch) -> Batch:
        return self._out(self._need("critic", self.critic).compute_values(self._in(batch)))

    @dispatch(Dispatch.DP)
    def compute_rm_score(self, batch: Batch) -> Batch:
        # the reward model re-tokenizes the text and moves its own inputs: the batch stays on the CPU
        return self._out(self._need("reward_model", self.reward_model).compute_rm_score(batch))

    @dispatch(Dispatch.DP_EXACT)
    def update_actor(self, batch: Batch) -> RankMetrics:
        return self._need("actor", self.actor).update(self._in(batch))

    @dispatch(Dispatch.DP_EXACT)
    def update_critic(self, batch: Batch) -> RankMetrics:
        return self._need("critic", self.critic).update(self._in(batch))

    @dispatch(Dispatch.ALL)
    def sync_rollout(self, version: int | None = None) -> str:
        """Give the rollout the actor's new weights (a collective gather when sharded); `version`: the
        trainer step they are from (kept when None: a restore puts back weights of the same step)."""
        actor = self._need("actor", self.actor)
        with self._engine_lock:  # never while another thread generates
            result = self.rollout.sync_from(actor.model, rank=self.rank, world_size=self.world_size)
            if version is not None:
                self.rollout_version = version
        return result

    @dispatch(Dispatch.ALL)
    def abort_rollout(self) -> str:
        """Cut a generation running in another thread short (engines that can; others finish it). Takes
        no lock: the generation holds it."""
        if self.rollout is None or not self.rollout.can_abort:
            return "not aborted"
        self.rollout.abort()
        return "aborted"

    @dispatch(Dispatch.ALL)
    def snapshot_actor(self) -> str:
        """Copy this rank's actor weights (its shard, on its device) as the candidate snapshot: the
        weights the next step's rollouts and log-prob passes measure. `keep_snapshot` makes it the one
        `restore_actor` puts back, once those measurements showed no sign of collapse."""
        model = self._need("actor", self.actor).model
        self._candidate = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return "copied"

    @dispatch(Dispatch.ALL)
    def keep_snapshot(self) -> str:
        """The candidate snapshot becomes the one to fall back on (it stays the candidate too)."""
        candidate = getattr(self, "_candidate", None)
        if candidate is None:
            raise RuntimeError(f"rank {self.rank}: keep_snapshot called before any snapshot_actor")
        self._snapshot = candidate
        return "kept"

    @dispatch(Dispatch.ALL)
    def restore_actor(self) -> str:
        """Put the kept snapshot back into the actor and the rollout (the optimizer state is not restored)."""
        snapshot = getattr(self, "_snapshot", None)
        if snapshot is None:
            raise RuntimeError(f"rank {self.rank}: restore_actor called before any keep_snapshot")
        self._need("actor", self.actor).model.load_state_dict(snapshot)
        return self.sync_rollout()

    def _rng_file(self, path: str) -> Path:
        """This rank's RNG file: per group (separately placed roles are other processes) and rank."""
        return Path(path) / "rng" / f"{'+'.join(sorted(self.roles))}_rank_{self.rank}.pt"

    @dispatch(Dispatch.ALL)
    def save_checkpoint(self, path: str) -> list[str]:
        """Every rank writes its share of the actor's and critic's training state under `path`
        (each role's weights end up as a HuggingFace folder, `path/ROLE/model`)."""
        saved = []
        for role, worker in (("actor", self.actor), ("critic", self.critic)):
            if worker is not None:
                extra = {"nonfinite_skipped": getattr(worker, "nonfinite_skipped", 0)}
                save_train_state(
                    worker.model,
                    worker.optimizer,
                    worker.scheduler,
                    Path(path) / role,
                    extra,
                    hf_model=unwrap(worker.model),
                    tokenizer=self.tokenizer,  # the critic reads the actor's tokens: the same one
                )
                saved.append(role)
        # this process's RNG (sampling with rollout.deterministic=false): with Ray every rank has its own
        (Path(path) / "rng").mkdir(exist_ok=True)
        torch.save(process_rng_state(), self._rng_file(path))
        return saved

    @dispatch(Dispatch.ALL)
    def load_checkpoint(self, path: str, version: int | None = None) -> list[str]:
        """Put a checkpoint's training state back (each rank its shards), then refresh the rollout engine."""
        loaded = []
        for role, worker in (("actor", self.actor), ("critic", self.critic)):
            if worker is not None:
                extra = {"nonfinite_skipped": 0}
                critic_path = role == "critic" and self.cfg.critic.model_path
                extra = load_train_state(
                    worker.model,
                    worker.optimizer,
                    worker.scheduler,
                    Path(path) / role,
                    extra,
                    model_key="critic.model_path" if critic_path else "model.path",
                )
                if hasattr(worker, "nonfinite_skipped"):
                    worker.nonfinite_skipped = int(extra["nonfinite_skipped"])
                loaded.append(role)
        rng = self._rng_file(path)
        if not rng.is_file():  # the name before RNG files were kept per group
            rng = rng.with_name(f"rank_{self.rank}.pt")
        if rng.is_file():
            restore_rng_file(rng)  # tensors and numbers only: a crafted file runs no code
        else:  # weights and optimizer state reshard; the sampling RNG of a rank cannot
            log.warning(
                "%s is missing (the checkpoint was saved with fewer ranks, or with other roles in this "
                "group): rank %d's sampling RNG is not restored, so with rollout.deterministic=false it "
                "samples differently than an uninterrupted run would",
                self._rng_file(path),
                self.rank,
            )
        if self.actor is not None:
            self.sync_rollout(version)
        return loaded

    @dispatch(Dispatch.ALL)
    def save_model(self, path: str) -> str:
        """Rank 0 writes a HuggingFace folder of the full actor weights (all ranks take part in the gather)."""
        actor = self._need("actor", self.actor)
        state = full_state_dict(actor.model)
        if self.rank == 0:
            # one rank: the actor itself; several: the engine's full copy, or (an engine whose weights live
            # elsewhere) one built on the CPU to save
            model = unwrap(actor.model) if self.world_size == 1 else self.rollout.full_model()
            if model is None:
                m = self.cfg.model
                model = load_model(m.path, dtype=DTYPES[m.dtype], trust_remote_code=m.trust_remote_code)
            if model is not unwrap(actor.model):
                model.load_state_dict(state)
            if is_lora(model):  # a plain model with the adapters merged in, and the adapters beside it
                save_hf_folder(merged(model), self.tokenizer, path)
                model.save_pretrained(Path(path) / ADAPTER)
            else:
                save_hf_folder(model, self.tokenizer, path)
        return path
