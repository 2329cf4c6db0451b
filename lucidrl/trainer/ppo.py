"""The PPO-family trainer: the step order of docs/architecture.md, in-process, one screen long."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.markup import escape

from lucidrl.algos import make_kl_controller
from lucidrl.batch import Batch
from lucidrl.config import LucidConfig, to_dict
from lucidrl.config.algorithm_checks import rollout_correction_active
from lucidrl.config.schema import TrainerConfig
from lucidrl.config.validation import check_devices_here
from lucidrl.controller.dispatch import mini_batch_order
from lucidrl.data.dataset import PromptLoader
from lucidrl.diagnostics.debug import debug_hop
from lucidrl.trainer import checkpoint, run_status, setup
from lucidrl.trainer.advantage import (
    apply_reward_kl,
    compute_advantage,
    correct_rollout,
    estimator_needs,
    rollout_log_probs,
)
from lucidrl.trainer.collapse import CollapseMonitor, CollapseReport
from lucidrl.trainer.collapse_guard import CollapseGuard
from lucidrl.trainer.collect import BatchCollector
from lucidrl.trainer.config_warnings import config_warnings
from lucidrl.trainer.interrupt import RunInterrupted, StopSignals, how_to_continue, stopped_message
from lucidrl.trainer.metrics import step_metrics, timer, timing_metrics
from lucidrl.trainer.pipeline import Supply, staleness_metrics
from lucidrl.trainer.reward_progress import show_scoring_progress
from lucidrl.trainer.rewards import leave_out_failed
from lucidrl.trainer.save_failure import removed_on_failure
from lucidrl.trainer.tracking import Tracker
from lucidrl.trainer.validation import validate

log = logging.getLogger(__name__)


class PPOTrainer:
    """Drives rollout → reward → log-probs → advantage → update → sync, with validation and metrics."""

    def __init__(self, cfg: LucidConfig):
        self.cfg = cfg
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        check_devices_here(cfg)  # before anything is read or loaded
        setup.seed_everything(cfg.trainer.seed)
        self.run_dir = setup.run_dir_of(cfg)
        setup.refuse_unwritable(cfg, self.run_dir)  # before a resume reads it
        resume = checkpoint.resume_point(cfg, self.run_dir)
        in_place = checkpoint.resumes_in_place(resume, self.run_dir)
        setup.prepare_run_dir(cfg, keep=in_place)
        self.workers = setup.build_workers(cfg)
        # a set-up that fails from here on (a bad data file, a refused resume) leaves no Ray actors behind
        with self.workers.shut_down_on_error():
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
                # these read the old log-probs before the update: the pass must run
                and not rollout_correction_active(cfg)
                and not estimator_needs(cfg, "old_log_probs")
                # samples made by an older policy (rollout.mode one_step_off/async): the pass measures the
                # policy being trained
                and cfg.rollout.max_staleness == 0
            )
            # algorithm.rollout_correction.bypass_mode: the engine's log-probs are the old ones, no pass
            self.bypass = cfg.algorithm.rollout_correction.bypass_mode
            self.global_step = 0
            self.batches_drawn = 0  # batches taken from the loader's epochs so far (a resume skips them)
            self.data_epoch = 0  # the epoch of the data the last prompt batch came from
            # batches made now (sync) or ahead in a thread (one_step_off, async; trainer/pipeline.py)
            self.supply = Supply(
                self.collector.collect,
                self._cursor,
                cfg.rollout.max_staleness,
                abort=self.workers.actor.abort_rollout,
            )
            self.trained_cursor = self._cursor()  # where the data stood after the last batch trained
            # keeps the last healthy weights, restores them on a collapse, reports (trainer/collapse_guard.py)
            self.guard = CollapseGuard(
                cfg.trainer.collapse,
                self.workers.actor,
                lambda text: self.tracker.console.print(text),
                self.run_dir,
            )
            self.last_val: dict[str, float] = {}
            self.first_val: dict[str, float] = {}
            self.resumed_from: Path | None = None
            self.resume_changes: dict[str, tuple] = {}
            # called with (step, metrics) after each step's metrics are logged: a progress display's hook
            self.on_step: Callable[[int, dict[str, float]], None] | None = None
            if resume is not None:
                self.resume(resume)
            # after the resume: one that is refused opens no tracker run
            self.tracker = Tracker.for_run(
                cfg, self.run_dir, resumed_step=self.global_step if in_place else None
            )
            # a slow reward says how far it is
            show_scoring_progress(self.workers.reward, self.tracker.console)

    def announce(self) -> None:
        """Say what this run will do, including anything the data loading dropped."""
        r, cfg = self.filter_report, self.cfg
        lines = [
            f"run directory {self.run_dir}",
            f"{len(self.train_samples)} training prompts ({r.overlong_filtered} overlong filtered, "
            + (f"{r.truncated} cut to data.max_prompt_length, " if r.truncated else "")
            + (f"{r.raw_prompts} fed as raw text (data.prompt_format), " if r.raw_prompts else "")
            + f"longest {r.longest_prompt} tokens), {len(self.val_samples)} validation prompts",
            f"{self.total_steps} steps of {cfg.data.train_batch_size} prompts x {cfg.rollout.n} samples, "
            f"adv_estimator={cfg.algorithm.adv_estimator}, policy_loss={cfg.actor.policy_loss}, "
            f"KL loss {'on (' + cfg.actor.kl_loss_type + ')' if cfg.actor.use_kl_loss else 'off'}, "
            f"KL in reward {'on (' + cfg.algorithm.kl_penalty + ')' if cfg.algorithm.use_kl_in_reward else 'off'}, "
            f"critic {'on' if self.workers.critic is not None else 'off'}",
        ]
        rc = cfg.algorithm.rollout_correction
        if rollout_correction_active(cfg):
            lines.append(
                f"rollout correction: importance weights {rc.rollout_is or 'off'}, rejection {rc.rollout_rs or 'off'} "
                "between the rollout engine's log-probs and the actor's (the old-log-prob pass runs every step)"
            )
        if rc.bypass_mode:
            lines.append(
                "rollout correction in bypass mode: the rollout engine's log-probs are the old log-probs (no "
                f"old-log-prob pass), policy loss {cfg.actor.policy_loss}"
            )
        if self.workers.ray_cluster:
            lines.append(f"workers: Ray actors on {self.workers.ray_cluster}")
        plan = getattr(cfg, "_memory_plan", None)
        if plan is not None:  # the whole plan: `lucidrl doctor CONFIG` (docs/memory.md)
            chosen = ", ".join(f"{k}={str(v).lower()}" for k, (v, _) in plan.choices.items())
            lines.append(
                f"memory plan: peak about {plan.peak.total / 2**30:.1f} GiB in the {plan.peak.name.split(' (')[0]}"
                + (f" of {plan.budget / 2**30:.1f} GiB usable" if plan.budget else "")
                + (f"; auto: {chosen}" if chosen else "")
            )
        lines += config_warnings(cfg)
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
        """One RL step, in docs/architecture.md's order; returns its metrics."""
        cfg, w, t = self.cfg, self.workers, {}
        with timer("step", t):
            # rollout.generate + rewards.score (+ DAPO filter): now, or made ahead while earlier steps trained
            made, waited, ready = self.supply.take(self.global_step)
            batch, metrics = made.batch, dict(made.metrics)
            t.update(made.timings)
            self.trained_cursor = made.cursor
            if cfg.rollout.max_staleness > 0:
                metrics.update(staleness_metrics(batch, self.global_step, made, waited, ready))
            if cfg.reward.on_error == "mask":
                batch = leave_out_failed(batch)  # no gradient from a sample whose reward failed
            debug_hop("rollout + reward -> trainer", batch)
            updates_actor = self.global_step > cfg.critic.warmup_steps
            # on-policy the update takes them from its own forward; while the critic warms up no update
            # runs, and the pass still reports the rollout gap. Bypass mode takes the engine's
            if self.bypass:
                batch.set(
                    "old_log_probs", rollout_log_probs(batch, "algorithm.rollout_correction.bypass_mode")
                )
            elif not (self.on_policy and updates_actor):
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
                if rollout_correction_active(cfg):  # importance weights, rejection: before the estimator
                    corrected, corr_metrics = correct_rollout(batch, cfg)
                    batch.update(corrected)
                    metrics.update(corr_metrics)
                batch.update(compute_advantage(batch, cfg))
            debug_hop("trainer -> critic/actor update", batch)
            if w.critic is not None:
                with timer("update_critic", t):
                    ordered = self._by_mini_batch(batch, cfg.critic_mini_batch_samples, w.critic)
                    metrics.update(w.critic.update_critic(ordered))
            if updates_actor:
                with timer("update_actor", t):
                    ordered = self._by_mini_batch(batch, cfg.actor_mini_batch_samples, w.actor)
                    metrics.update(w.actor.update_actor(ordered))
                with timer("sync_weights", t):
                    w.actor.sync_rollout(version=self.global_step)
            elif cfg.rollout.max_staleness > 0:  # the critic warms up: same weights, the next version
                w.actor.sync_rollout(version=self.global_step)
            self.supply.synced(self.global_step)  # batches made ahead wait on it
        # in bypass mode the old log-probs are the engine's: no actor pass to compare them with
        metrics.update(step_metrics(batch, cfg.data.max_response_length, compare_rollout=not self.bypass))
        metrics.update(timing_metrics(t, batch))
        metrics["training/epoch"] = float(
            made.cursor["data_epoch"]
        )  # of the last prompt batch trained, from 0
        return metrics

    def _by_mini_batch(self, batch: Batch, samples: int, group) -> Batch:
        """`batch` ordered so that each of `group`'s ranks gets its part of every global mini-batch of
        `samples` samples (dispatch.mini_batch_order): the same optimizer steps on any number of ranks."""
        return mini_batch_order(batch, samples, group.world_size)

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
        # a run that raises is marked failed in W&B and MLflow; its Ray actors are stopped either way;
        # RUN_DIR/run_status.json says how it ended; Ctrl-C and SIGTERM end the step first (interrupt.py)
        with (
            self.tracker,
            self.workers,
            run_status.recorded(self.run_dir, lambda: self.global_step),
            StopSignals(lambda: f"step {self.global_step}", self._how_to_continue) as signals,
        ):
            cfg = self.cfg.trainer
            if cfg.val_before_train and self.resumed_from is None:
                before = self.validate()
                self.tracker.log(before, step=0)
                if self.on_step is not None:
                    self.on_step(0, before)
            self.guard.start(self.global_step)
            start = time.perf_counter()
            self.supply.first_step, self.supply.last_step = self.global_step + 1, self.total_steps
            self.supply.start(self.global_step)
            try:
                self._steps(cfg, signals, start)
            finally:
                self.supply.close()  # a generation under way ends first
            if cfg.save_final_model:
                self.save_model(self.run_dir / "final")
        return self.run_dir

    def _cursor(self) -> dict[str, int]:
        return {
            "batches_drawn": self.batches_drawn,
            "generation_rounds": self.collector.rounds,
            "data_epoch": self.data_epoch,
        }

    def _steps(self, cfg: TrainerConfig, signals: StopSignals, start: float) -> None:
        """Steps until the budget, a collapse or a signal ends the run."""
        while self.global_step < self.total_steps:
            self.global_step += 1
            self.guard.before_step(self.global_step)
            metrics = self.step()
            out_of_time = cfg.max_time_s is not None and time.perf_counter() - start >= cfg.max_time_s
            ending = out_of_time or self.global_step == self.total_steps
            verdict = self.guard.after_step(self.global_step, metrics, ending)
            last = ending or verdict.stop
            stopping = signals.requested is not None and not last  # the last step finishes the run
            # test_freq -1 (verl's default): never, not even after the last step
            validates = (cfg.test_freq > 0 and self.global_step % cfg.test_freq == 0) or (
                last and cfg.test_freq >= 0
            )
            if validates and not stopping:
                metrics.update(self.validate())
            self.tracker.log(metrics, step=self.global_step)
            if self.on_step is not None:
                self.on_step(self.global_step, metrics)
            saves = cfg.save_freq > 0 and (self.global_step % cfg.save_freq == 0 or last)  # -1: never
            if saves or (stopping and cfg.save_on_interrupt):
                self._save_or_say_why_not(verdict.collapsed)
            if stopping:
                self._stop(signals.requested)
            if out_of_time:
                self._say(f"stopped at step {self.global_step}: trainer.max_time_s={cfg.max_time_s} reached")
            if last:
                break

    def _stop(self, signum: int) -> None:
        """After a step that a signal asked to be the last: say what was saved and how to go on."""
        latest = checkpoint.latest_name(self.run_dir)
        msg = stopped_message(
            signum, self.global_step, self.total_steps, latest, self.cfg.trainer.resume_mode
        )
        raise RunInterrupted(signum, msg)

    def _how_to_continue(self) -> str:
        return how_to_continue(checkpoint.latest_name(self.run_dir), self.cfg.trainer.resume_mode)

    def _save_or_say_why_not(self, collapsed: bool) -> None:
        if (
            collapsed
        ):  # its weights may be collapsed, or a restored earlier step's next to later optimizer state
            self._say(
                f"no checkpoint at step {self.global_step}, which collapsed; a resume continues from the last "
                "one before it"
            )
            return
        began = time.perf_counter()
        path = self.save_checkpoint()
        self._say(checkpoint.saved_line(path, time.perf_counter() - began))

    def _say(self, line: str) -> None:
        self.tracker.console.print(f"[dim]lucidrl:[/dim] {escape(line)}")

    # the collapse guard's findings, read by the demo and experiments
    @property
    def monitor(self) -> CollapseMonitor:
        return self.guard.monitor

    @property
    def collapse(self) -> CollapseReport | None:
        return self.guard.collapse

    @property
    def saturation(self) -> CollapseReport | None:
        return self.guard.saturation

    @property
    def restored_step(self) -> int | None:
        return self.guard.restored_step

    def save_checkpoint(self) -> Path:
        """Every group's training state plus the trainer's, under a temporary name renamed when complete."""
        with checkpoint.writing(self.run_dir, self.global_step) as tmp:  # removed if the save fails
            for group in self.workers.groups:
                group.save_checkpoint(str(tmp))
            state = {
                "kind": "rl",
                "global_step": self.global_step,
                # the data as of the last batch trained: batches made ahead are made again on resume
                "batches_drawn": self.trained_cursor["batches_drawn"],
                "generation_rounds": self.trained_cursor["generation_rounds"],
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
            group.load_checkpoint(str(path), state["global_step"])
        self.global_step = state["global_step"]
        self.batches_drawn = state["batches_drawn"]
        self.collector.rounds = state["generation_rounds"]
        self.trained_cursor = self._cursor()
        # an adaptive coefficient continues from the saved value unless algorithm.kl_ctrl changed; a fixed
        # one is the config's (a new algorithm.kl_ctrl.kl_coef takes effect, as in verl)
        if self._adaptive_kl() and not self._kl_ctrl_changed() and state["kl_coef"] is not None:
            self.kl_ctrl.value = state["kl_coef"]
        if not any(k.startswith("trainer.collapse.") for k in self.resume_changes):
            self.monitor.load_state_dict(state["collapse_monitor"])  # else its windows mean other things
        self.resumed_from = path
        checkpoint.continue_from(self.run_dir, path, self.global_step)

    def _adaptive_kl(self) -> bool:
        return self.kl_ctrl is not None and self.cfg.algorithm.kl_ctrl.type == "adaptive"

    def _kl_ctrl_changed(self) -> bool:
        return any(k.startswith("algorithm.kl_ctrl.") for k in self.resume_changes)

    def save_model(self, path: Path) -> None:
        """A HuggingFace model folder (safetensors + tokenizer) loadable by from_pretrained."""
        tmp = Path(path).resolve().with_name(Path(path).name + ".tmp")  # where save_hf_folder writes it
        with removed_on_failure(tmp, checkpoint.latest_name(self.run_dir)):
            self.workers.actor.save_model(str(path))


def _changes(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
