"""Actor and reference workers: log-probs of sampled responses, and the PPO-family policy update."""

from __future__ import annotations

import inspect

import torch

from lucidrl.algos import agg_loss, get_policy_loss, kl_penalty
from lucidrl.algos.aggregation import norm_width, pad_response_width
from lucidrl.batch import Batch, loss_mask
from lucidrl.config.memory_choices import plain_actor
from lucidrl.config.schema import ActorConfig, RolloutCorrectionConfig
from lucidrl.models.precision import compute_context
from lucidrl.workers.training.forward import check_chunkable_head, check_prompt_sharable, response_log_probs
from lucidrl.workers.training.log_prob_pass import per_token_log_probs, per_token_log_probs_and_sum_pi_squared
from lucidrl.workers.training.micro_batches import inert_pads, loss_weights, micro_batches, token_shares
from lucidrl.workers.training.optim import build_optimizer
from lucidrl.workers.training.rank_metrics import Combine, RankMetrics
from lucidrl.workers.training.update_loop import run_update, update_metrics


def policy_loss_kwargs(
    cfg: ActorConfig, rc: RolloutCorrectionConfig, rollout_is_weights: torch.Tensor | None = None
) -> dict:
    """Every keyword argument the actor can give a policy loss, by name: actor.* and (for bypass_mode)
    algorithm.rollout_correction.*, and the micro-batch's importance weights (bs, R) or None. A loss
    takes those its signature names."""
    return {
        "clip_ratio_low": cfg.clip_ratio_low, "clip_ratio_high": cfg.clip_ratio_high,
        "clip_ratio_c": cfg.clip_ratio_c, "loss_agg_mode": cfg.loss_agg_mode,
        "loss_scale_factor": cfg.loss_scale_factor, "rollout_is_weights": rollout_is_weights,
        "tau_pos": cfg.tau_pos, "tau_neg": cfg.tau_neg, "clip_cov_ratio": cfg.clip_cov_ratio,
        "clip_cov_lb": cfg.clip_cov_lb, "clip_cov_ub": cfg.clip_cov_ub, "kl_cov_ratio": cfg.kl_cov_ratio,
        "ppo_kl_coef": cfg.ppo_kl_coef, "dro_beta": cfg.dro_beta, "loss_type": rc.loss_type,
        "rollout_is": rc.rollout_is, "rollout_is_threshold": rc.rollout_is_threshold,
        "rollout_is_batch_normalize": rc.rollout_is_batch_normalize, "rollout_rs": rc.rollout_rs,
        "rollout_rs_threshold": rc.rollout_rs_threshold,
    }  # fmt: skip


class ReferenceWorker:
    """A frozen copy of the initial policy, for the KL term."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        micro_batch_size: int,
        temperature: float,
        share_prompt: bool = True,
        length_sorted: bool = True,
        max_tokens: int | None = None,
        head_chunk_tokens: int = 0,
        compute_dtype: torch.dtype | None = None,
        compiled: bool = False,
        world_size: int = 1,
    ):
        self.model = model.eval().requires_grad_(False)
        self.world_size = world_size  # > 1: the model is sharded (FSDP2) over that many ranks
        self.head_chunk_tokens = head_chunk_tokens
        self.compiled = compiled  # fused torch.compile'd log-probs (actor.use_torch_compile)
        self.compute_dtype = compute_dtype  # autocast dtype (model.compute_dtype); None: the weights'
        if head_chunk_tokens:
            check_chunkable_head(model)
        if share_prompt:
            check_prompt_sharable(model)
        self.share_prompt = share_prompt
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.length_sorted = length_sorted
        self.max_tokens = max_tokens

    @torch.no_grad()
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Batch with `ref_log_probs (bs, R)`."""
        with compute_context(self.model, self.compute_dtype):
            lp, _ = per_token_log_probs(
                self.model,
                batch,
                self.micro_batch_size,
                self.temperature,
                False,
                self.share_prompt,
                self.length_sorted,
                self.max_tokens,
                self.head_chunk_tokens,
                self.compiled,
                world_size=self.world_size,
            )
        return Batch(tensors={"ref_log_probs": lp * batch["response_mask"]})


class ActorWorker:
    """Holds the policy and its optimizer; computes log-probs and runs PPO-style updates."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: ActorConfig,
        *,
        temperature: float,
        samples_per_prompt: int,
        world_size: int = 1,
        compute_dtype: torch.dtype | None = None,
        response_length: int | None = None,
        rollout_correction: RolloutCorrectionConfig | None = None,
        sum_pi_squared: bool = False,
    ):
        self.model = model
        cfg = plain_actor(cfg, cfg.ppo_mini_batch_size * samples_per_prompt)  # a config no plan resolved
        self.cfg = cfg
        # the loss inputs' padded width (seq-mean-token-sum-norm's divisor, unless loss_scale_factor gives it)
        self.norm_width = norm_width(cfg.loss_agg_mode, response_length, cfg.loss_scale_factor)
        self.rollout_correction = rollout_correction or RolloutCorrectionConfig()
        self.sum_pi_squared = sum_pi_squared  # compute_log_prob adds it (the optimal token baselines read it)
        self.temperature = temperature
        self.compute_dtype = compute_dtype  # autocast dtype of every forward; weights and grads keep theirs
        # a mini-batch is ppo_mini_batch_size prompts in all; each data-parallel rank holds its share
        self.mini_batch = cfg.ppo_mini_batch_size * samples_per_prompt // world_size
        self.world_size = world_size
        # one sample per prompt: nothing to share (and every micro-batch takes the same path)
        self.share_prompt = cfg.share_prompt_forward and samples_per_prompt > 1
        if self.share_prompt:
            check_prompt_sharable(model)
        if cfg.head_chunk_tokens:
            check_chunkable_head(model)
        self.policy_loss_fn = get_policy_loss(cfg.policy_loss)
        self.policy_loss_args = set(inspect.signature(self.policy_loss_fn).parameters)
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim)
        self.nonfinite_skipped = 0
        self._gap_max = 0.0  # the largest rollout-vs-update log-prob gap of the current update
        # a loss's own *_max / *_min metrics (bypass_mode's rollout_corr/*): extremes over the update
        self._extremes: dict[str, tuple[float, Combine]] = {}

    @torch.no_grad()
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Batch with `old_log_probs (bs, R)` and `entropy (bs, R)` under the current weights."""
        was_training = self.model.training
        self.model.eval()
        c = self.cfg
        max_tokens = c.log_prob_max_token_len_per_gpu if c.use_dynamic_bsz else None
        spsq = None
        try:
            with compute_context(self.model, self.compute_dtype):
                if self.sum_pi_squared:
                    lp, ent, spsq = per_token_log_probs_and_sum_pi_squared(
                        self.model, batch, c.log_prob_micro_batch_size, self.temperature, self.share_prompt,
                        c.length_sorted_micro_batches, max_tokens, c.head_chunk_tokens, c.use_torch_compile,
                        world_size=self.world_size,
                    )  # fmt: skip
                else:
                    lp, ent = per_token_log_probs(
                        self.model, batch, c.log_prob_micro_batch_size, self.temperature, True,
                        self.share_prompt, c.length_sorted_micro_batches, max_tokens, c.head_chunk_tokens,
                        c.use_torch_compile, world_size=self.world_size,
                    )  # fmt: skip
        finally:
            self.model.train(was_training)
        mask = batch["response_mask"]
        out = Batch(tensors={"old_log_probs": lp * mask, "entropy": ent * mask})
        if spsq is not None:
            out.set("sum_pi_squared", spsq * mask)
        return out

    def _micro_step(
        self, ub: Batch, weight: float, metrics: dict[str, float], token_weight: float | None = None
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch, its loss scaled by `weight`, and its metrics added to
        `metrics` weighted so they sum to the mini-batch's: the losses by `weight`, as the loss; the
        policy loss's token means (clip fractions, ppo_kl) by `token_weight`, the micro-batch's share
        of the tokens (default: `weight`, which it is under token-mean). Returns its entropy aggregated
        as the loss is (detached), for the entropy metric."""
        token_weight = weight if token_weight is None else token_weight
        cfg = self.cfg
        with compute_context(self.model, self.compute_dtype):  # the backward below runs outside it
            log_prob, entropy = response_log_probs(
                self.model,
                ub,
                temperature=self.temperature,
                with_entropy=True,
                share_prompt=self.share_prompt,
                data_parallel=self.world_size > 1,
                entropy_grad=bool(cfg.entropy_coeff),  # otherwise a metric: kept out of autograd
                head_chunk_tokens=cfg.head_chunk_tokens,
                compiled=cfg.use_torch_compile,
            )
        # the tokens that count: rollout correction's rejection drops some (the forward attended to all)
        adv, mask = ub["advantages"], loss_mask(ub)
        if "old_log_probs" in ub:
            old = ub["old_log_probs"]
        else:  # on-policy (update checked it): this forward's own log-probs are the sampling policy's
            old = log_prob.detach()
            if "rollout_log_probs" in ub:  # what the skipped old-log-prob pass would have shown
                self._rollout_gap(old, ub["rollout_log_probs"], ub["response_mask"], token_weight, metrics)
        ref = ub["ref_log_probs"] if cfg.use_kl_loss else None
        is_weights = ub["rollout_is_weights"] if "rollout_is_weights" in ub else None
        if self.norm_width is not None:
            log_prob, entropy, old, adv, mask, ref, is_weights = pad_response_width(
                self.norm_width, log_prob, entropy, old, adv, mask, ref, is_weights
            )
        pg_loss, pg_metrics = self.policy_loss_fn(
            old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
            **self._loss_kwargs(is_weights),
        )  # fmt: skip
        loss = pg_loss
        scale = cfg.loss_scale_factor
        entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, scale)
        per_token = self._per_token_metrics
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * entropy_loss
        if cfg.use_kl_loss:
            kl = kl_penalty(log_prob, ref, cfg.kl_loss_type)
            kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, scale)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] += weight * kl_loss.item()
            if per_token:
                metrics["actor/kl_loss_token_mean"] += (
                    token_weight * agg_loss(kl.detach(), mask, "token-mean").item()
                )
        (loss * weight).backward()
        metrics["actor/pg_loss"] += weight * pg_loss.item()
        for k, v in pg_metrics.items():  # token means whatever loss_agg_mode is
            if "/" not in k:
                metrics[f"actor/{k}"] += token_weight * float(v)
            elif k.endswith(("_max", "_min")):  # a loss's own prefixed metrics (bypass_mode's rollout_corr/*)
                how = Combine.MAX if k.endswith("_max") else Combine.MIN
                pick = max if how is Combine.MAX else min
                self._extremes[k] = (pick(self._extremes.get(k, (float(v), how))[0], float(v)), how)
            else:
                metrics[k] += token_weight * float(v)
        token_mean = agg_loss(entropy.detach(), mask, "token-mean") if per_token else None
        return entropy_loss.detach(), token_mean

    def _loss_kwargs(self, rollout_is_weights: torch.Tensor | None) -> dict:
        """The keyword arguments the configured policy loss's signature names (policy_loss_kwargs)."""
        if rollout_is_weights is not None and "rollout_is_weights" not in self.policy_loss_args:
            raise ValueError(
                f"actor.policy_loss={self.cfg.policy_loss} takes no rollout_is_weights, but rollout correction "
                "made some (algorithm.rollout_correction.rollout_is); the loss would ignore them"
            )
        available = policy_loss_kwargs(self.cfg, self.rollout_correction, rollout_is_weights)
        return {k: v for k, v in available.items() if k in self.policy_loss_args}

    def _rollout_gap(
        self, log_prob: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, token_weight: float, metrics
    ) -> None:
        """rollout/logprob_diff_*: |the rollout engine's log-probs - the actor's| of the sampled tokens, as
        the trainer reports it from the old-log-prob pass when that runs (mean: weighted by token share,
        summed over micro-batches and averaged over ranks like ppo_kl; max: over everything)."""
        diff = (log_prob - rollout).abs()[mask.bool()]
        mean = diff.mean().item() if diff.numel() else 0.0
        metrics["rollout/logprob_diff_mean"] += token_weight * mean  # on every rank, even an all-empty one
        if diff.numel():
            self._gap_max = max(self._gap_max, diff.max().item())

    @property
    def _per_token_metrics(self) -> bool:
        """Whether to log actor/entropy_token_mean and actor/kl_loss_token_mean beside verl's
        actor/entropy and actor/kl_loss, which are aggregated as the loss is (a sum per sequence under
        seq-mean-token-sum: 100 tokens of 0.02 nats read 2.0): collapse detection's thresholds are per
        token. Under token-mean the two are the same number."""
        return self.cfg.loss_agg_mode != "token-mean"

    def _batch_entropy(self, batch: Batch) -> tuple[float, float | None]:
        """The rollout policy's entropy, aggregated with loss_agg_mode (verl's actor/entropy, from the
        old-log-prob pass), and per token where that differs: this rank's parts, which the ranks' mean
        makes the whole batch's."""
        # over every generated token, rejected by rollout correction or not: the sampling policy's entropy
        entropy, mask = batch["entropy"], batch["response_mask"]
        generated = Batch(tensors={"response_mask": mask})
        token_mean = None
        if self._per_token_metrics:  # every rank alike: loss_weights may all-reduce
            (tokens,) = loss_weights(generated, [generated], "token-mean", self.world_size)
            token_mean = tokens * float(agg_loss(entropy, mask, "token-mean"))
        if self.norm_width is not None:
            entropy, mask = pad_response_width(self.norm_width, entropy, mask)
        (share,) = loss_weights(generated, [generated], self.cfg.loss_agg_mode, self.world_size)
        agg = agg_loss(entropy, mask, self.cfg.loss_agg_mode, self.cfg.loss_scale_factor)
        return share * float(agg), token_mean

    @staticmethod
    def _samples_with_gradient(mb: Batch) -> Batch:
        """The samples of `mb` with a non-zero advantage on some loss token (actor.skip_zero_advantage):
        under the policy losses that allow it the others add nothing to the loss or its gradient."""
        has = ((mb["advantages"] != 0) & loss_mask(mb).bool()).any(-1)
        return mb if bool(has.all()) else mb.select(has.nonzero().squeeze(-1))

    def _kept_shares(self, weights: list[float], shares: list[float]) -> tuple[float, float]:
        """The kept micro-batches' shares of the mini-batch's loss and tokens, over all ranks (each rank's
        shares count times the rank count, as a rank mean of the metrics they weigh makes the whole's)."""
        kept = (sum(weights), sum(shares))
        if self.world_size == 1:
            return kept
        import torch.distributed as dist

        total = torch.tensor(kept, dtype=torch.float64, device=next(self.model.parameters()).device)
        dist.all_reduce(total)  # every rank, every mini-batch: whether or not it kept a sample
        return float(total[0]) / self.world_size, float(total[1]) / self.world_size

    @staticmethod
    def _gap_over_kept(metrics: dict[str, float], kept_tokens: float) -> None:
        """The rollout gap, summed over the kept micro-batches by their shares of the whole mini-batch's
        tokens, as the mean over the kept tokens. The policy loss's metrics stay as they are: a left-out
        sample's clip fraction is 0, and on-policy its ppo_kl too."""
        if "rollout/logprob_diff_mean" in metrics and kept_tokens > 0:
            metrics["rollout/logprob_diff_mean"] /= kept_tokens

    def _micro_batches(self, mb: Batch) -> list[Batch]:
        """Length-sorted, padding-trimmed micro-batches (plain consecutive chunks with the option off) of
        ppo_micro_batch_size samples, or of at most ppo_max_token_len_per_gpu tokens (use_dynamic_bsz)."""
        cfg = self.cfg
        length_sorted = cfg.length_sorted_micro_batches
        max_tokens = cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None
        chunks = micro_batches(mb, cfg.ppo_micro_batch_size, length_sorted, max_tokens, self.world_size)
        return [ub for _, ub in chunks]

    def _loss_weights(self, mb: Batch, ubs: list[Batch]) -> list[float]:
        """Each micro-batch's share of the mini-batch loss (micro_batches.loss_weights)."""
        return loss_weights(mb, ubs, self.cfg.loss_agg_mode, self.world_size)

    def update(self, batch: Batch) -> RankMetrics:
        """ppo_epochs passes over mini-batches of `ppo_mini_batch_size` prompts; one optimizer step each
        (workers/training/update_loop.py, shared with the critic)."""
        cfg = self.cfg
        lr = self.scheduler.get_last_lr()[0]  # the rate every optimizer step of this update uses
        # entropy of the policy that sampled the batch: from the old-log-prob pass where it ran;
        # otherwise (provably on-policy: one epoch, one mini-batch) the first mini-batch's forwards
        # run before any optimizer step and see that same policy
        entropy, entropy_per_token = self._batch_entropy(batch) if "entropy" in batch else (None, None)
        own_old = "old_log_probs" not in batch  # on-policy: the old log-probs come from the update's forward
        if own_old and (cfg.ppo_epochs != 1 or len(batch) > self.mini_batch):
            raise RuntimeError(
                f"the actor got no old_log_probs for an update of {cfg.ppo_epochs} epoch(s) over {len(batch)} "
                f"samples in mini-batches of {self.mini_batch}: only one epoch of one mini-batch is on-policy (a "
                "bug in the trainer: it skips the old-log-prob pass only then)"
            )
        self._gap_max = 0.0
        self._extremes = {}

        def step_mini_batch(mb: Batch, mb_metrics: dict[str, float]) -> None:
            nonlocal entropy, entropy_per_token
            kept = self._samples_with_gradient(mb) if cfg.skip_zero_advantage else mb
            ubs = self._micro_batches(kept) if len(kept) else []
            # shares of the whole mini-batch: samples left out still count in the token or sequence mean
            weights = self._loss_weights(mb, ubs)
            # each micro-batch's metrics times its loss weight: summed, the mini-batch's; averaged
            # over ranks, the mini-batch's across all of them (a plain mean of micro-batch or rank
            # means gave token-mean losses that changed with the micro-batching and the rank count)
            shares = token_shares(mb, ubs, cfg.loss_agg_mode, weights, self.world_size)
            kept_weight, kept_tokens = (
                self._kept_shares(weights, shares) if cfg.skip_zero_advantage else (1, 1)
            )
            if cfg.skip_zero_advantage and self.world_size > 1:
                # ranks that kept fewer samples run as many forwards as the rank with the most, on
                # zero-advantage samples of weight zero: each forward and backward is a collective
                pads = inert_pads(mb, ubs)
                ubs, weights, shares = ubs + pads, weights + [0.0] * len(pads), shares + [0.0] * len(pads)
            entropies = [
                self._micro_step(ub, w, mb_metrics, t) for ub, w, t in zip(ubs, weights, shares, strict=True)
            ]
            if cfg.skip_zero_advantage:
                mb_metrics["actor/zero_advantage_skipped"] += (len(mb) - len(kept)) / len(mb)
                self._gap_over_kept(mb_metrics, kept_tokens)
                if not ubs:
                    # a zero gradient, so AdamW still takes its step as the full update would, and the
                    # zero loss and clip fractions the full update would log
                    for param in self.model.parameters():
                        if param.requires_grad:
                            param.grad = torch.zeros_like(param)
                    for key in (
                        "actor/pg_loss",
                        "actor/pg_clipfrac",
                        "actor/pg_clipfrac_lower",
                        "actor/ppo_kl",
                    ):
                        mb_metrics[key] += 0.0
            if entropy is None and ubs:
                entropy = sum(w * float(e) for w, (e, _) in zip(weights, entropies, strict=True))
                if self._per_token_metrics:
                    entropy_per_token = sum(t * float(e) for t, (_, e) in zip(shares, entropies, strict=True))
                # with samples left out, a mean over the kept ones (a token-sum stays their sum)
                if cfg.skip_zero_advantage and cfg.loss_agg_mode != "token-sum":
                    entropy /= kept_weight
                    if entropy_per_token is not None:
                        entropy_per_token /= kept_tokens

        outcome = run_update(
            batch,
            step_mini_batch,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            epochs=cfg.ppo_epochs,
            mini_rows=self.mini_batch,
            grad_clip=cfg.optim.grad_clip,
            role="actor",
            lr_hint="lower actor.optim.lr, check the rewards for NaN, or use model.dtype=float32",
        )
        self.nonfinite_skipped += outcome.skipped
        out = update_metrics(outcome, "actor", lr)
        if cfg.use_kl_loss:
            out.same("actor/kl_coef", cfg.kl_loss_coef)
        # None: every sample of an on-policy update was left out (skip_zero_advantage)
        if entropy is not None:
            out.mean("actor/entropy", entropy)
        if entropy_per_token is not None:
            out.mean("actor/entropy_token_mean", entropy_per_token)
        if own_old and "rollout/logprob_diff_mean" in out:
            out.put("rollout/logprob_diff_max", self._gap_max, Combine.MAX)
        for k, (value, how) in self._extremes.items():  # a loss's own *_max / *_min over the update
            out.put(k, value, how)
        return out
