"""Supervised fine-tuning: cross-entropy on response tokens, validation loss, checkpoints and resuming
(the RL trainer's: `trainer.save_freq`, `trainer.resume_mode`, `lucidrl export`)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.markup import escape

from lucidrl.config import ConfigError, SFTConfig, to_dict
from lucidrl.config.validation import check_devices_here
from lucidrl.data.sft_dataset import IGNORE, collate_sft, load_sft_rows, sft_batches, sft_micro_batches
from lucidrl.models import check_tokenizer_matches_model, load_run_model, load_run_tokenizer
from lucidrl.models.loading import DTYPES
from lucidrl.models.precision import autocast_dtype, compute_context
from lucidrl.models.saving import save_hf_folder
from lucidrl.trainer import checkpoint, run_status
from lucidrl.trainer.interrupt import RunInterrupted, StopSignals, how_to_continue, stopped_message
from lucidrl.trainer.setup import prepare_run_dir, refuse_unwritable, run_dir_of, seed_everything
from lucidrl.trainer.tracking import Tracker
from lucidrl.workers.common.model_support import enable_activation_checkpointing
from lucidrl.workers.training.forward import check_chunkable_head, chunked_head_log_probs
from lucidrl.workers.training.optim import NonFiniteLossError, build_optimizer, clip_grad
from lucidrl.workers.training.train_state import load_train_state, save_train_state

SFT_CONSOLE_KEYS = [
    ("sft/loss", "loss"),
    ("sft/grad_norm", "grad"),
    ("sft/lr", "lr"),
    ("perf/tokens_per_s", "tok/s"),
    ("timing_s/step", "s/step"),
]


def response_loss_sum(
    model, batch: dict[str, torch.Tensor], head_chunk_tokens: int = 0, count_correct: bool = True
) -> tuple[torch.Tensor, int, int]:
    """Summed cross-entropy over labelled tokens, their count, and how many the argmax got right (0
    without `count_correct`). `head_chunk_tokens` > 0: the LM head runs on that many labelled tokens at
    a time (lucidrl.algos.head_logprob), so no (rows, length, vocabulary) logits are ever held."""
    if head_chunk_tokens:
        return _chunked_loss_sum(model, batch, head_chunk_tokens, count_correct)
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits
    logits, labels = logits[:, :-1].float(), batch["labels"][:, 1:]
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    keep = labels != IGNORE
    correct = int((logits.argmax(-1)[keep] == labels[keep]).sum()) if count_correct else 0
    return loss, int(keep.sum()), correct


def _chunked_loss_sum(model, batch, chunk_tokens: int, count_correct: bool) -> tuple[torch.Tensor, int, int]:
    states = model.get_decoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state[:, :-1]
    labels = batch["labels"][:, 1:]
    keep = labels != IGNORE
    head = model.get_output_embeddings()
    log_probs, _ = chunked_head_log_probs(
        head, states, labels.clamp(min=0), keep, temperature=1.0, with_entropy=False, entropy_grad=False,
        chunk_tokens=chunk_tokens,
    )  # fmt: skip
    correct = 0
    if count_correct:  # the argmax chunk by chunk too, without a graph
        with torch.no_grad():
            h, y = states[keep], labels[keep]
            correct = sum(
                int((head(h[i : i + chunk_tokens]).argmax(-1) == y[i : i + chunk_tokens]).sum())
                for i in range(0, len(y), chunk_tokens)
            )
    return -log_probs.sum(), int(keep.sum()), correct


class SFTTrainer:
    """Trains a causal LM on (prompt, response) rows; the step is forward, backward, clip, step."""

    def __init__(self, cfg: SFTConfig):
        self.cfg = cfg
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        check_devices_here(cfg)  # before anything is read or loaded
        seed_everything(cfg.trainer.seed)
        self.run_dir = run_dir_of(cfg)
        refuse_unwritable(cfg, self.run_dir)  # before a resume reads it
        resume = checkpoint.resume_point(cfg, self.run_dir)
        in_place = checkpoint.resumes_in_place(resume, self.run_dir)
        prepare_run_dir(cfg, keep=in_place)
        m, d = cfg.model, cfg.data
        self.tokenizer = load_run_tokenizer(m)
        self.model = load_run_model(m, DTYPES[m.dtype])
        check_tokenizer_matches_model(self.model, self.tokenizer, m.path)
        if cfg.head_chunk_tokens:
            try:
                check_chunkable_head(self.model, key="head_chunk_tokens")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if m.enable_gradient_checkpointing is True:  # auto: no memory plan for SFT yet, so off
            enable_activation_checkpointing(self.model)
        self.model.to(cfg.trainer.device)
        kw = dict(
            tokenizer=self.tokenizer,
            max_length=d.max_length,
            prompt_key=d.prompt_key,
            response_key=d.response_key,
        )
        self.train_rows = load_sft_rows(d.train_files, what="data.train_files", **kw)
        self.val_rows = load_sft_rows(d.val_files, what="data.val_files", **kw) if d.val_files else []
        steps_per_epoch = len(self.train_rows) // d.batch_size
        self.total_steps = cfg.trainer.total_training_steps or steps_per_epoch * cfg.trainer.total_epochs
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim)
        self.global_step = 0
        self.batches_drawn = 0  # batches taken from the shuffled epochs so far (a resume skips them)
        self.last_val: dict[str, float] = {}
        self.resumed_from: Path | None = None
        self.resume_changes: dict[str, tuple] = {}
        if resume is not None:
            self.resume(resume)
        # after the resume: one that is refused opens no tracker run
        self.tracker = Tracker.for_run(
            cfg,
            self.run_dir,
            resumed_step=self.global_step if in_place else None,
            console_keys=SFT_CONSOLE_KEYS,
        )
        left_out = len(self.train_rows) % cfg.data.batch_size
        if left_out:  # as PromptLoader announces its remainder: nothing is left out silently
            self.tracker.console.print(
                f"[dim]lucidrl:[/dim] {left_out} of the {len(self.train_rows)} training rows do not fill a batch of "
                f"data.batch_size={cfg.data.batch_size} and are left out of each epoch"
                + (" (the same rows every epoch: data.shuffle=false)" if not cfg.data.shuffle else "")
            )
        if resume is not None:
            self.tracker.console.print(
                f"[dim]lucidrl:[/dim] resumed from {escape(str(resume))} after step {self.global_step}: weights, "
                "optimizer moments, LR schedule position, data position and RNG restored"
                + escape(
                    "".join(f"; {k} {old!r} -> {new!r}" for k, (old, new) in self.resume_changes.items())
                )
            )

    def _autocast(self):
        m = self.cfg.model
        dtype = torch.bfloat16 if self.cfg.bf16_autocast else autocast_dtype(m.dtype, m.compute_dtype)
        return compute_context(self.model, dtype)

    def step(self, rows) -> dict[str, float]:
        cfg = self.cfg
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens = sum(len(r.input_ids) - r.n_prompt for r in rows)
        total = 0.0
        for piece in self._micro_batches(rows):
            batch = collate_sft(piece, self.tokenizer.pad_token_id)
            batch = {k: v.to(cfg.trainer.device) for k, v in batch.items()}
            with self._autocast():
                loss, _, _ = response_loss_sum(self.model, batch, cfg.head_chunk_tokens, count_correct=False)
            (loss / n_tokens).backward()
            total += loss.item()
        grad_norm = clip_grad(self.model, cfg.optim.grad_clip)
        if not math.isfinite(grad_norm):
            raise NonFiniteLossError(
                f"SFT step {self.global_step}: gradient norm is {grad_norm}; lower optim.lr or turn off bf16_autocast"
            )
        self.optimizer.step()
        self.scheduler.step()
        return {
            "sft/loss": total / n_tokens,
            "sft/grad_norm": grad_norm,
            "sft/lr": self.scheduler.get_last_lr()[0],
            "perf/tokens": float(n_tokens),
        }

    def _micro_batches(self, rows):
        d = self.cfg.data
        return sft_micro_batches(
            rows,
            self.cfg.micro_batch_size,
            length_sorted=self.cfg.length_sorted_micro_batches,
            max_tokens=d.max_token_len_per_gpu if d.use_dynamic_bsz else None,
        )

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        if not self.val_rows:
            return {}
        self.model.eval()
        loss = tokens = correct = 0
        for piece in self._micro_batches(self.val_rows):
            batch = collate_sft(piece, self.tokenizer.pad_token_id)
            with self._autocast():
                s, n, c = response_loss_sum(
                    self.model,
                    {k: v.to(self.cfg.trainer.device) for k, v in batch.items()},
                    self.cfg.head_chunk_tokens,
                )
            loss, tokens, correct = loss + s.item(), tokens + n, correct + c
        self.last_val = {"val/loss": loss / tokens, "val/token_acc": correct / tokens}
        return self.last_val

    def _batches(self):
        d = self.cfg.data
        for position, rows in enumerate(
            sft_batches(self.train_rows, d.batch_size, shuffle=d.shuffle, seed=d.seed), start=1
        ):
            if position > self.batches_drawn:  # after a resume, the batches before are skipped
                self.batches_drawn = position
                yield rows

    def fit(self) -> Path:
        # a run that raises is marked failed in W&B and MLflow; RUN_DIR/run_status.json says how it ended;
        # Ctrl-C and SIGTERM end the step first (trainer/interrupt.py)
        with (
            self.tracker,
            run_status.recorded(self.run_dir, lambda: self.global_step),
            StopSignals(lambda: f"step {self.global_step}", self._how_to_continue) as signals,
        ):
            t = self.cfg.trainer
            batches = self._batches()
            start = time.perf_counter()
            while self.global_step < self.total_steps:
                self.global_step += 1
                t0 = time.perf_counter()
                metrics = self.step(next(batches))
                metrics["timing_s/step"] = time.perf_counter() - t0
                metrics["perf/tokens_per_s"] = metrics["perf/tokens"] / metrics["timing_s/step"]
                out_of_time = t.max_time_s is not None and time.perf_counter() - start >= t.max_time_s
                last = self.global_step == self.total_steps or out_of_time
                stopping = signals.requested is not None and not last  # the last step finishes the run
                if ((t.test_freq and self.global_step % t.test_freq == 0) or last) and not stopping:
                    metrics.update(self.validate())
                self.tracker.log(metrics, step=self.global_step)
                saves = t.save_freq > 0 and (self.global_step % t.save_freq == 0 or last)  # -1: never
                if saves or (stopping and t.save_on_interrupt):
                    began = time.perf_counter()
                    path = self.save_checkpoint()
                    line = checkpoint.saved_line(path, time.perf_counter() - began)
                    self.tracker.console.print(f"[dim]lucidrl:[/dim] {escape(line)}")
                if stopping:
                    latest = checkpoint.latest_name(self.run_dir)
                    msg = stopped_message(
                        signals.requested, self.global_step, self.total_steps, latest, t.resume_mode
                    )
                    raise RunInterrupted(signals.requested, msg)
                if out_of_time:
                    self.tracker.console.print(
                        f"[dim]lucidrl:[/dim] stopped at step {self.global_step}: "
                        f"trainer.max_time_s={t.max_time_s} reached"
                    )
                    break
            if t.save_final_model:
                self.save(self.run_dir / "final")
        return self.run_dir

    def _how_to_continue(self) -> str:
        return how_to_continue(checkpoint.latest_name(self.run_dir), self.cfg.trainer.resume_mode)

    def save(self, path: Path) -> None:
        save_hf_folder(self.model, self.tokenizer, path)

    def save_checkpoint(self) -> Path:
        """The model (as the actor), AdamW state, LR schedule, data position and RNG: a resumable step."""
        with checkpoint.writing(self.run_dir, self.global_step) as tmp:  # removed if the save fails
            save_train_state(
                self.model,
                self.optimizer,
                self.scheduler,
                tmp / "actor",
                {},
                hf_model=self.model,
                tokenizer=self.tokenizer,
            )
            state = {"kind": "sft", "global_step": self.global_step, "batches_drawn": self.batches_drawn}
            checkpoint.write_trainer_state(tmp, state, to_dict(self.cfg))
            return checkpoint.commit(tmp, self.cfg.trainer.max_ckpt_to_keep)

    def resume(self, path: Path) -> None:
        state, self.resume_changes = checkpoint.resumable(path, to_dict(self.cfg), kind="sft")
        checkpoint.restore_rng(path)
        load_train_state(self.model, self.optimizer, self.scheduler, path / "actor", {})
        self.global_step = state["global_step"]
        self.batches_drawn = state["batches_drawn"]
        self.resumed_from = path
        checkpoint.continue_from(self.run_dir, path, self.global_step)
