"""The critic: a value head on the policy's backbone (AutoModelForTokenClassification, one label, as verl)."""

from __future__ import annotations

import warnings

import torch
from transformers import AutoConfig, AutoModelForTokenClassification
from transformers.utils import logging as hf_logging

from lucidrl.algos import compute_value_loss
from lucidrl.algos.aggregation import norm_width, pad_response_width
from lucidrl.batch import Batch, loss_mask
from lucidrl.config.schema import CriticConfig
from lucidrl.models.loading import ModelLoadError, check_model_folder, read_weight_shapes
from lucidrl.models.precision import compute_context
from lucidrl.workers.training.forward import sequence_inputs
from lucidrl.workers.training.micro_batches import loss_weights, micro_batches, scatter_rows, token_shares
from lucidrl.workers.training.optim import build_optimizer
from lucidrl.workers.training.rank_metrics import RankMetrics
from lucidrl.workers.training.update_loop import run_update, update_metrics


def load_value_model(
    path: str, dtype: torch.dtype = torch.float32, *, config_key: str = "critic.model_path"
) -> torch.nn.Module:
    """A causal-LM folder loaded as a token classifier with one output: backbone kept, value head new (zeros).

    A folder that has a trained one-output head (`score.weight`: a reward model, or a critic exported
    before) keeps it, as OpenRLHF initialises the head only for a fresh critic. Dropout on the head is
    off (transformers defaults it to 0.1), so values computed for the batch and predicted during the
    update come from the same function. `config_key` names the setting `path` came from in errors (a
    folder that does not exist said "Repo id must be in the form 'repo_name'" before).
    """
    folder = check_model_folder(path, config_key)
    read_weight_shapes(folder, config_key)  # a truncated weight file named before transformers reads it
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the new head as "MISSING": expected here
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "newly initialized: score.weight" is the point here
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            config.num_labels, config.classifier_dropout = 1, 0.0
            model, info = AutoModelForTokenClassification.from_pretrained(
                path, config=config, dtype=dtype, local_files_only=True, output_loading_info=True
            )
    except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: a head of another size
        raise ModelLoadError(
            f"{config_key}={path!r} cannot be loaded as a value model (AutoModelForTokenClassification, "
            f"num_labels=1): {type(e).__name__}: {e}"
        ) from e
    finally:
        hf_logging.set_verbosity(verbosity)
    head = model.score if hasattr(model, "score") else model.get_output_embeddings()
    missing = set(info.get("missing_keys", []))
    trained = hasattr(model, "score") and "score.weight" not in missing
    if head is not None:
        if not trained:
            torch.nn.init.zeros_(head.weight)  # start predicting 0: a value estimate with no opinion yet
        # a token classifier's head has a bias a reward model's (sequence classifier) has not: 0 then
        if getattr(head, "bias", None) is not None and (not trained or "score.bias" in missing):
            torch.nn.init.zeros_(head.bias)
    return model


def response_values(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """V(s_t) for each response token t: the value at the position that predicts it. (bs, R)."""
    input_ids, attention_mask, position_ids = sequence_inputs(batch)
    resp_len = batch["responses"].shape[1]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return out.logits[:, -resp_len - 1 : -1, 0].float()


class CriticWorker:
    """Computes values and regresses them on the returns with PPO's clipped value loss."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: CriticConfig,
        *,
        mini_batch_prompts: int,
        samples_per_prompt: int,
        world_size: int = 1,
        compute_dtype: torch.dtype | None = None,
        response_length: int | None = None,
    ):
        self.model = model
        self.cfg = cfg
        self.norm_width = norm_width(cfg.loss_agg_mode, response_length)  # the loss inputs' padded width
        self.world_size = world_size
        self.compute_dtype = compute_dtype  # autocast dtype of the value forwards (model.compute_dtype)
        self.mini_batch = mini_batch_prompts * samples_per_prompt // world_size
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim)
        self.nonfinite_skipped = 0

    def _micro_batches(self, batch: Batch) -> list[tuple[torch.Tensor, Batch]]:
        """ppo_micro_batch_size samples in batch order; with use_dynamic_bsz, length-sorted, trimmed
        micro-batches of at most ppo_max_token_len_per_gpu tokens."""
        c = self.cfg
        if not c.use_dynamic_bsz:
            return micro_batches(batch, c.ppo_micro_batch_size, False)
        return micro_batches(
            batch, c.ppo_micro_batch_size, True, c.ppo_max_token_len_per_gpu, self.world_size
        )

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        self.model.eval()
        with compute_context(self.model, self.compute_dtype):
            parts = [(idx, response_values(self.model, mb)) for idx, mb in self._micro_batches(batch)]
        values = scatter_rows(parts, len(batch), batch["responses"].shape[1])
        return Batch(tensors={"values": values * batch["response_mask"]})

    def update(self, batch: Batch) -> RankMetrics:
        """ppo_epochs passes over mini-batches; one optimizer step each (workers/training/update_loop.py, shared
        with the actor). A step whose gradient norm is not finite is skipped and counted
        (critic/nonfinite_skipped); an update where every step is raises."""
        cfg = self.cfg
        lr = self.scheduler.get_last_lr()[0]

        def step_mini_batch(mb: Batch, mb_metrics: dict[str, float]) -> None:
            ubs = [ub for _, ub in self._micro_batches(mb)]
            # metrics weighted to sum to the mini-batch's, as the actor's: the loss as it is
            # weighted, the token means (clip fraction, mean prediction) by token share
            weights = loss_weights(mb, ubs, cfg.loss_agg_mode, self.world_size)
            shares = token_shares(mb, ubs, cfg.loss_agg_mode, weights, self.world_size)
            for ub, weight, share in zip(ubs, weights, shares, strict=True):
                with compute_context(self.model, self.compute_dtype):
                    vpreds = response_values(self.model, ub)
                # rollout correction's rejected tokens count for the critic neither (as verl's mask)
                returns, values, mask = ub["returns"], ub["values"], loss_mask(ub)
                if self.norm_width is not None:
                    vpreds, returns, values, mask = pad_response_width(
                        self.norm_width, vpreds, returns, values, mask
                    )
                loss, m = compute_value_loss(
                    vpreds, returns, values, mask, cfg.cliprange_value, cfg.loss_agg_mode
                )
                (loss * weight).backward()
                mb_metrics["critic/vf_loss"] += weight * loss.item()
                mb_metrics["critic/vf_clipfrac"] += share * float(m["vf_clipfrac"])
                mask = mask.bool()
                mb_metrics["critic/vpred_mean"] += share * (
                    vpreds.detach()[mask].mean().item() if mask.any() else 0.0
                )

        outcome = run_update(
            batch,
            step_mini_batch,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            epochs=cfg.ppo_epochs,
            mini_rows=self.mini_batch,
            grad_clip=cfg.optim.grad_clip,
            role="critic",
            lr_hint="lower critic.optim.lr or check the rewards for NaN",
        )
        self.nonfinite_skipped += outcome.skipped
        return update_metrics(outcome, "critic", lr)
