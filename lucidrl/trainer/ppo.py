"""The PPO-family trainer: the step order of DESIGN.md, in-process, one screen long."""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path

import torch
from rich.markup import escape

from lucidrl.algos import apply_kl_penalty, get_advantage_estimator, make_kl_controller
from lucidrl.batch import Batch
from lucidrl.config import LucidConfig, to_dict
from lucidrl.controller.dispatch import mini_batch_order
from lucidrl.data.dataset import PromptLoader
from lucidrl.diagnostics.debug import debug_hop
from lucidrl.models.precision import autocast_dtype, cpu_has_native_bf16, float32_attention_wanted
from lucidrl.trainer import checkpoint, setup
from lucidrl.trainer.collapse import CollapseMonitor, CollapseReport
from lucidrl.trainer.collect import BatchCollector
from lucidrl.trainer.metrics import step_metrics, timer, timing_metrics
from lucidrl.trainer.tracking import Tracker
from lucidrl.trainer.validation import validate

log = logging.getLogger(__name__)


def compute_advantage(batch: Batch, cfg: LucidConfig) -> Batch:
    """Call the configured estimator with the inputs its signature asks for."""
    estimator = get_advantage_estimator(cfg.algorithm.adv_estimator)
    alg = cfg.algorithm
    available = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": batch["response_mask"],
        "index": batch["uid"],
        "norm_adv_by_std_in_grpo": alg.norm_adv_by_std_in_grpo,
        "gamma": alg.gamma,
        "lam": alg.lam,
    }
    for key in ("values", "reward_baselines"):
        if key in batch:
            available[key] = batch[key]
    wanted = inspect.signature(estimator).parameters
    missing = [k for k, p in wanted.items() if p.default is p.empty and k not in available]
    if missing:
        raise ValueError(
            f"advantage estimator '{alg.adv_estimator}' needs {missing}, which this run does not compute"
        )
    advantages, returns = estimator(**{k: v for k, v in available.items() if k in wanted})
    return Batch(tensors={"advantages": advantages, "returns": returns})


def apply_reward_kl(batch: Batch, controller, kind: str) -> tuple[Batch, dict[str, float]]:
    """token_level_rewards = scores − β·KL(actor ‖ reference) per token; the controller adapts β."""
    rewards, metrics = apply_kl_penalty(
        batch["token_level_scores"],
        batch["old_log_probs"],
        batch["ref_log_probs"],
        batch["response_mask"],
        controller.value,
        kind,
    )
    controller.update(metrics["actor/reward_kl_penalty"], n_steps=len(batch))
    return Batch(tensors={"token_level_rewards": rewards}), metrics


class PPOTrainer:
    """Drives rollout → reward → log-probs → advantage → update → sync, with validation and metrics."""

    def __init__(self, cfg: LucidConfig):
        self.cfg = cfg
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        setup.seed_everything(cfg.trainer.seed)
        self.run_dir = setup.run_dir_of(cfg)
        resume = checkpoint.resume_point(cfg, self.run_dir)
        in_place = checkpoint.resumes_in_place(resume, self.run_dir)
        setup.prepare_run_dir(cfg, keep=in_place)
        self.workers = setup.build_workers(cfg)
        tok = self.workers.tokenizer
        self.train_samples, self.val_samples, self.filter_report = setup.load_data(cfg, tok)
        self.loader = PromptLoader(
            self.train_samples,
            cfg.data.train_batch_size,
            tok.pad_token_id,
            shuffle=cfg.data.shuffle,
            seed=cfg.data.seed,
        )
        self.total_steps = (
            cfg.trainer.total_training_steps or self.loader.steps_per_epoch * cfg.trainer.total_epochs
        )
        self.collector = BatchCollector(
            cfg, self.workers.actor, self.workers.reward, self._batches(), pad_token_id=tok.pad_token_id
        )
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = (
            make_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon)
            if cfg.algorithm.use_kl_in_reward
            else None
        )
        a = cfg.actor
        # bf16 compute over float32 weights (autocast in every forward)
        self.mixed_precision = autocast_dtype(cfg.model.dtype, cfg.model.compute_dtype) is not None
        # one epoch of one mini-batch per step and nothing else reading them: the old log-probs are the
        # update's own forward's, detached (ratio 1), whatever engine sampled and in whatever precision. The
        # rollout's are never used for them (vLLM and bf16 decoding round differently, a server may hold
        # other weights), only compared (rollout/logprob_diff_*). With dropout on the update's forward is a
        # dropped-out one, so the eval-mode pass runs
        self.on_policy = (
            a.on_policy_skip_old_log_prob
            and a.ppo_epochs == 1
            and a.ppo_mini_batch_size == cfg.data.train_batch_size
            and not cfg.algorithm.use_kl_in_reward
            and a.disable_dropout
        )
        self.global_step = 0
        self.batches_drawn = 0  # batches taken from the loader's epochs so far (a resume skips them)
        self.data_epoch = 0  # the epoch of the data the last prompt batch came from
        self.monitor = CollapseMonitor(cfg.trainer.collapse)
        self.collapse: CollapseReport | None = None
        self.saturation: CollapseReport | None = None  # the prompts solved (trainer/collapse.py)
        self.healthy_step = 0  # the step whose weights the kept snapshot holds (keep_last_healthy)
        self.restored_step: int | None = None  # set when the run ended on those weights instead of its last
        self.last_val: dict[str, float] = {}
        self.first_val: dict[str, float] = {}
        self.resumed_from: Path | None = None
        self.resume_changes: dict[str, tuple] = {}
        if resume is not None:
            self.resume(resume)
        # after the resume: one that is refused opens no tracker run
        self.tracker = Tracker.for_run(cfg, self.run_dir, resumed_step=self.global_step if in_place else None)

    def announce(self) -> None:
        """Say what this run will do, including anything the data loading dropped."""
        r, cfg = self.filter_report, self.cfg
        lines = [
            f"run directory {self.run_dir}",
            f"{len(self.train_samples)} training prompts ({r.overlong_filtered} overlong filtered, longest "
            f"{r.longest_prompt} tokens), {len(self.val_samples)} validation prompts",
            f"{self.total_steps} steps of {cfg.data.train_batch_size} prompts x {cfg.rollout.n} samples, "
            f"adv_estimator={cfg.algorithm.adv_estimator}, policy_loss={cfg.actor.policy_loss}, "
            f"KL loss {'on (' + cfg.actor.kl_loss_type + ')' if cfg.actor.use_kl_loss else 'off'}, "
            f"KL in reward {'on (' + cfg.algorithm.kl_penalty + ')' if cfg.algorithm.use_kl_in_reward else 'off'}, "
            f"critic {'on' if self.workers.critic is not None else 'off'}",
        ]
        if self.workers.ray_cluster:
            lines.append(f"workers: Ray actors on {self.workers.ray_cluster}")
        if self.mixed_precision and cfg.trainer.device == "cpu" and cpu_has_native_bf16() is False:
            lines.append(
                "model.compute_dtype=bfloat16 on a CPU without AVX-512 BF16 or AMX: its bfloat16 matmuls are "
                "emulated, several times slower than float32 (benchmarks/mixed_precision.py); use float32 here"
            )
        if (
            self.mixed_precision
            and cfg.trainer.device == "cpu"
            and float32_attention_wanted(torch.device("cpu"), torch.bfloat16)
        ):
            lines.append(
                "model.compute_dtype=bfloat16 on the CPU: the attention (transformers' SDPA) runs in float32, "
                "faster than bfloat16 on CPUs without AMX (README, Speed); LUCIDRL_CPU_FLOAT32_ATTENTION=0 keeps "
                "it in bfloat16"
            )
        if (
            cfg.rollout.name == "vllm"
            and cfg.trainer.device.startswith("cuda")
            and (cfg.model.compute_dtype or cfg.model.dtype) == "float32"
        ):
            lines.append(
                "rollout.name=vllm in float32 (model.dtype=float32, no model.compute_dtype): vLLM's engine runs "
                "float32 only on slower attention backends; set model.compute_dtype=bfloat16 for it to generate "
                "in bf16 (the actor keeps float32 weights)"
            )
        c = cfg.trainer.collapse
        if c.enable and cfg.rollout.n < 2 and not (c.min_entropy or c.max_score_drop or c.max_kl):
            lines.append(
                "trainer.collapse watches nothing in this run: its one sign, min_mixed_groups_ratio, compares "
                "a prompt's samples and rollout.n=1 gives one; set trainer.collapse.min_entropy or max_score_drop"
            )
        if cfg.model.dtype == "bfloat16":
            trained = "actor's and critic's" if self.workers.critic is not None else "actor's"
            lines.append(
                f"model.dtype=bfloat16: the {trained} weights and AdamW state are bfloat16, with no float32 "
                "master copy, so an update smaller than about 1/256 of a weight rounds away (at lr 1e-6 most "
                "do); for bfloat16 compute over float32 master weights set model.dtype=float32 "
                "model.compute_dtype=bfloat16"
            )
        if self.resumed_from is not None:
            lines.append(
                f"resumed from {self.resumed_from} after step {self.global_step} ({self.batches_drawn} batches "
                "into the data): weights, optimizer moments, LR schedule position, adaptive KL coefficient, "
                "collapse monitor and RNG restored"
                + (
                    " (the collapse monitor starts afresh: trainer.collapse changed)"
                    if any(k.startswith("trainer.collapse.") for k in self.resume_changes)
                    else ""
                )
                + (
                    " (the adaptive KL coefficient starts afresh: algorithm.kl_ctrl changed)"
                    if self._adaptive_kl() and self._kl_ctrl_changed()
                    else ""
                )
                + (f"; changed since: {_changes(self.resume_changes)}" if self.resume_changes else "")
            )
        if self.loader.dropped_per_epoch:
            lines.append(
                f"{self.loader.dropped_per_epoch} prompts per epoch do not fill a batch of "
                f"{cfg.data.train_batch_size} and are left out of that epoch"
            )
        for line in lines:
            self.tracker.console.print(f"[dim]lucidrl:[/dim] {escape(line)}")

    def _batches(self):
        position, epoch = 0, 0
        while True:
            for batch in self.loader.epoch(epoch):
                position += 1
                if position > self.batches_drawn:  # after a resume, the batches before are skipped
                    self.batches_drawn = position
                    self.data_epoch = epoch  # training/epoch: DAPO's extra rounds go past total_epochs
                    yield batch
            epoch += 1

    def step(self) -> dict[str, float]:
        """One RL step, in DESIGN.md's order; returns its metrics."""
        cfg, w, t = self.cfg, self.workers, {}
        with timer("step", t):
            batch, metrics = self.collector.collect(t)  # rollout.generate + rewards.score (+ DAPO filter)
            debug_hop("rollout + reward -> trainer", batch)
            updates_actor = self.global_step > cfg.critic.warmup_steps
            # on-policy the update takes them from its own forward; while the critic warms up no update
            # runs, and the pass still reports the rollout gap
            if not (self.on_policy and updates_actor):
                with timer("old_log_prob", t):
                    batch.update(w.actor.compute_log_prob(batch))
            if w.reference is not None:
                with timer("ref", t):
                    batch.update(w.reference.compute_ref_log_prob(batch))
            if w.critic is not None:
                with timer("values", t):
                    batch.update(w.critic.compute_values(batch))
            with timer("adv", t):
                if self.kl_ctrl is not None:
                    rewards, kl_metrics = apply_reward_kl(batch, self.kl_ctrl, cfg.algorithm.kl_penalty)
                    batch.update(rewards)
                    metrics.update(kl_metrics)
                else:
                    batch.set("token_level_rewards", batch["token_level_scores"])
                batch.update(compute_advantage(batch, cfg))
            debug_hop("trainer -> critic/actor update", batch)
            if w.critic is not None:
                with timer("update_critic", t):
                    ordered = self._by_mini_batch(batch, cfg.critic_mini_batch_prompts, w.critic)
                    metrics.update(w.critic.update_critic(ordered))
            if updates_actor:
                with timer("update_actor", t):
                    ordered = self._by_mini_batch(batch, cfg.actor.ppo_mini_batch_size, w.actor)
                    metrics.update(w.actor.update_actor(ordered))
                with timer("sync_weights", t):
                    w.actor.sync_rollout()
        metrics.update(step_metrics(batch, cfg.data.max_response_length))
        metrics.update(timing_metrics(t, batch))
        metrics["training/epoch"] = float(self.data_epoch)  # of the last prompt batch drawn, from 0
        return metrics

    def _by_mini_batch(self, batch: Batch, prompts: int, group) -> Batch:
        """`batch` ordered so that each of `group`'s ranks gets its part of every global mini-batch of
        `prompts` prompts (dispatch.mini_batch_order): the same optimizer steps on any number of ranks."""
        return mini_batch_order(batch, prompts * self.cfg.rollout.n, group.world_size)

    def validate(self) -> dict[str, float]:
        w, cfg = self.workers, self.cfg
        if not self.val_samples:
            return {}
        metrics = validate(
            w.actor,
            w.reward,
            self.val_samples,
            setup.val_sampling(cfg),
            pad_token_id=w.tokenizer.pad_token_id,
            batch_size=cfg.data.val_batch_size,
        )
        self.first_val = self.first_val or metrics
        self.last_val = metrics
        return metrics

    def fit(self) -> Path:
        """Train for the configured steps (or time); stop on a detected collapse. Returns the run directory."""
        # a run that raises is marked failed in W&B and MLflow; its Ray actors are stopped either way
        with self.tracker, self.workers:
            cfg = self.cfg.trainer
            if cfg.val_before_train and self.resumed_from is None:
                self.tracker.log(self.validate(), step=0)
            keep = cfg.collapse.keep_last_healthy
            if keep:  # the starting weights, until a step's measurements certify later ones
                self.workers.actor.snapshot_actor()
                self.workers.actor.keep_snapshot()
            start, first_step = time.perf_counter(), self.global_step + 1
            while self.global_step < self.total_steps:
                self.global_step += 1
                if keep and self.global_step > first_step:  # the first starts from the copy just made
                    # this step's rollouts, entropy and KL measure the weights it starts from: they are
                    # the ones its verdict certifies (its own update's are measured by the next step)
                    self.workers.actor.snapshot_actor()
                metrics = self.step()
                collapse = self.monitor.update(self.global_step, metrics)
                saturation = collapse if collapse is not None and collapse.kind == "saturation" else None
                if saturation is not None:  # the prompts are solved: stop (or warn), the weights are fine
                    collapse, self.saturation = None, saturation
                    metrics["collapse/saturated"] = 1.0
                    self._report_collapse(saturation)
                out_of_time = cfg.max_time_s is not None and time.perf_counter() - start >= cfg.max_time_s
                stop = out_of_time or ((collapse or saturation) is not None and cfg.collapse.action == "stop")
                if collapse is not None:
                    self.collapse = collapse
                    metrics["collapse/detected"] = 1.0
                    self._report_collapse(collapse)
                elif keep and self.monitor.healthy:
                    self.workers.actor.keep_snapshot()
                    self.healthy_step = self.global_step - 1
                last = self.global_step == self.total_steps or stop
                # a sign still building up when the run ends (time or steps): not yet `patience` steps
                # long, so not reported, but the last weights are unmeasured and the ones before showed it
                pending = last and collapse is None and not self.monitor.healthy
                if keep and cfg.collapse.action == "stop" and pending:
                    self.workers.actor.restore_actor()
                    self.restored_step = self.healthy_step
                    self.tracker.console.print(
                        f"[dim]lucidrl:[/dim] the run ended with a sign of collapse held since step "
                        f"{self.monitor.bad_since} (fewer than trainer.collapse.patience steps, so not reported): "
                        f"restored the weights after step {self.healthy_step}, the last measured healthy; "
                        "validation and the final model use them"
                    )
                if collapse is not None and cfg.collapse.action == "stop" and keep:
                    self.workers.actor.restore_actor()
                    self.restored_step = self.healthy_step
                    which = (
                        f"the weights after step {self.healthy_step}"
                        if self.healthy_step
                        else "the starting weights (step 0)"
                    )
                    self.tracker.console.print(
                        f"[dim]lucidrl:[/dim] restored {which}, the last whose rollouts showed no sign of "
                        "collapse; validation and the final model use them"
                    )
                if (cfg.test_freq and self.global_step % cfg.test_freq == 0) or last:
                    metrics.update(self.validate())
                self.tracker.log(metrics, step=self.global_step)
                if cfg.save_freq and (self.global_step % cfg.save_freq == 0 or last):
                    if collapse is None:
                        began = time.perf_counter()
                        path = self.save_checkpoint()
                        line = checkpoint.saved_line(path, time.perf_counter() - began)
                        self.tracker.console.print(f"[dim]lucidrl:[/dim] {escape(line)}")
                    else:  # its weights may be collapsed, or a restored earlier step's next to later optimizer state
                        self.tracker.console.print(
                            f"[dim]lucidrl:[/dim] no checkpoint at step {self.global_step}, which collapsed; a resume "
                            "continues from the last one before it"
                        )
                if out_of_time:
                    self.tracker.console.print(
                        f"[dim]lucidrl:[/dim] stopped at step {self.global_step}: trainer.max_time_s={cfg.max_time_s} reached"
                    )
                if stop:
                    break
            if cfg.save_final_model:
                self.save_model(self.run_dir / "final")
        return self.run_dir

    def _report_collapse(self, report: CollapseReport) -> None:
        action = self.cfg.trainer.collapse.action
        then = "stopping the run" if action == "stop" else "training on (trainer.collapse.action=warn)"
        if report.kind == "saturation":
            if action == "stop":
                then += " on its last weights (a saturated run has not collapsed: nothing is restored)"
            self.tracker.console.print(
                f"[bold yellow]lucidrl: {escape(report.message())}[/bold yellow]; {then}"
            )
            (self.run_dir / "SATURATED.txt").write_text(report.message() + "\n")
            return
        self.tracker.console.print(f"[bold red]lucidrl: {escape(report.message())}[/bold red]; {then}")
        (self.run_dir / "COLLAPSE.txt").write_text(report.message() + "\n")

    def save_checkpoint(self) -> Path:
        """Every group's training state plus the trainer's, under a temporary name renamed when complete."""
        tmp = checkpoint.begin(self.run_dir, self.global_step)
        for group in self.workers.groups:
            group.save_checkpoint(str(tmp))
        state = {
            "kind": "rl",
            "global_step": self.global_step,
            "batches_drawn": self.batches_drawn,
            "generation_rounds": self.collector.rounds,
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "collapse_monitor": self.monitor.state_dict(),
        }
        checkpoint.write_trainer_state(tmp, state, to_dict(self.cfg))
        return checkpoint.commit(tmp, self.cfg.trainer.max_ckpt_to_keep)

    def resume(self, path: Path) -> None:
        """Continue from a checkpoint: the groups' training state, then the trainer's own counters."""
        state, self.resume_changes = checkpoint.resumable(path, to_dict(self.cfg))
        checkpoint.restore_rng(path)
        for group in self.workers.groups:
            group.load_checkpoint(str(path))
        self.global_step = state["global_step"]
        self.batches_drawn = state["batches_drawn"]
        self.collector.rounds = state["generation_rounds"]
        # an adaptive coefficient continues from the saved value unless algorithm.kl_ctrl changed; a fixed
        # one is the config's (a new algorithm.kl_ctrl.kl_coef takes effect, as in verl)
        if self._adaptive_kl() and not self._kl_ctrl_changed() and state["kl_coef"] is not None:
            self.kl_ctrl.value = state["kl_coef"]
        if not any(k.startswith("trainer.collapse.") for k in self.resume_changes):
            self.monitor.load_state_dict(state["collapse_monitor"])  # else its windows mean other things
        self.resumed_from = path
        self.healthy_step = self.global_step  # keep_last_healthy's snapshot starts from the resumed weights
        checkpoint.continue_from(self.run_dir, path, self.global_step)

    def _adaptive_kl(self) -> bool:
        return self.kl_ctrl is not None and self.cfg.algorithm.kl_ctrl.type == "adaptive"

    def _kl_ctrl_changed(self) -> bool:
        return any(k.startswith("algorithm.kl_ctrl.") for k in self.resume_changes)

    def save_model(self, path: Path) -> None:
        """A HuggingFace model folder (safetensors + tokenizer) loadable by from_pretrained."""
        self.workers.actor.save_model(str(path))


def _changes(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
