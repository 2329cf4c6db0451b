"""Collapse detection: RL on small models fails by collapsing, and a collapsed run must not train on.

A policy collapses in a few recognisable ways (REFERENCE.md, "What a tiny model learns on a CPU"):
its sampling turns deterministic (entropy to ~0), its groups stop disagreeing (GRPO's mixed-score
groups fall to a fraction of where they started, so there is no signal left), its reward falls away
from the best it reached (format and accuracy to 0), or it runs away from the reference (KL grows).
`CollapseMonitor` watches those step metrics; a sign must hold for `patience` consecutive steps. Then,
with `action: stop`, the trainer stops, reports which sign fired with the numbers, logs
`collapse/detected` and keeps the model from before the sign first appeared (a snapshot kept in
memory) as the final model; with `action: warn` it reports once and trains on.

Groups also stop disagreeing when the policy succeeds: every sample of a prompt right. Where the tied
groups are mostly tied at the batch's best score (`critic/groups_tied_at_best`), that best is the best
score any sample of the run has reached (a batch all formatted-but-wrong ties at its own best too),
and the score is not below where the run started, the mixed-groups sign is saturation, not collapse
(the demo's GRPO learnt its 85 pool puzzles and was stopped as "collapsed" at scores of 2.3-2.9 of
3 in its last steps): reported as such (`collapse/saturated`), stopping the run with `action: stop` on its own weights.
A saturated step after a collapse sign stays unhealthy and keeps that sign's count going, and a
collapse sign resets saturation's: a run flipping between the two is stopped as a collapse.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CollapseReport:
    step: int  # the step at which the sign had held for `patience` steps
    onset_step: int  # the first step of that run of bad steps
    reasons: list[str] = field(default_factory=list)
    kind: str = "collapse"  # or "saturation": the prompts solved, not the policy broken

    def message(self) -> str:
        what = "policy collapse detected" if self.kind == "collapse" else "RL signal saturated"
        return f"{what} at step {self.step} (signs since step {self.onset_step}): " + "; ".join(self.reasons)


class CollapseMonitor:
    """Feed it each step's metrics; it returns a CollapseReport when a sign has held `patience` steps."""

    def __init__(self, cfg) -> None:  # cfg: config.schema.CollapseConfig
        self.cfg = cfg
        self.baseline_mixed: list[float] = []  # mixed-score group fractions of the first steps
        self.baseline_score: list[float] = []  # and those steps' scores (saturation: no worse than them)
        self.best_seen: float | None = None  # the best score any sample of the run has reached
        self.saturated_since: int | None = None
        self.saturation_reported = False
        self.first_scores: list[float] = []  # scores of the first steps, the EMA's start
        self.best_score_ema: float | None = None
        self.score_ema: float | None = None
        self.bad_since: int | None = None
        self.reported = False

    def _signs(self, m: dict[str, float]) -> tuple[list[str], list[str]]:
        """(signs of collapse, signs of saturation) in one step's metrics."""
        c, signs, saturation = self.cfg, [], []
        score_key = _first_present(m, "dapo/generated/score/mean", "critic/score/mean")
        score = m.get(score_key)
        best = m.get(_first_present(m, "dapo/generated/score/max", "critic/score/max"))
        if best is not None:
            self.best_seen = best if self.best_seen is None else max(self.best_seen, best)
        # per token: actor/entropy is aggregated as the loss is (a sum per sequence under
        # seq-mean-token-sum), so under other modes than token-mean the actor logs a token mean too
        entropy_key = _first_present(m, "actor/entropy_token_mean", "actor/entropy")
        entropy = m.get(entropy_key)
        if c.min_entropy is not None and entropy is not None and entropy < c.min_entropy:
            signs.append(f"{entropy_key} {entropy:.4f} < trainer.collapse.min_entropy {c.min_entropy}")
        # with DAPO's filter the trained batch is mixed groups by construction (its fraction stayed
        # near 1 while the policy's fell from 0.68 to 0.10): read what was generated, before the filter
        mixed_key = _first_present(
            m, "dapo/generated/groups_with_mixed_scores", "critic/groups_with_mixed_scores"
        )
        mixed = m.get(mixed_key)
        if mixed is not None and c.min_mixed_groups_ratio is not None:
            if len(self.baseline_mixed) < c.baseline_steps:
                self.baseline_mixed.append(mixed)
                if score is not None:
                    self.baseline_score.append(score)
            else:
                base = sum(self.baseline_mixed) / len(self.baseline_mixed)
                if base > 0 and mixed < c.min_mixed_groups_ratio * base:
                    sign = (
                        f"{mixed_key} {mixed:.2f} < {c.min_mixed_groups_ratio} x its "
                        f"first-{c.baseline_steps}-step mean {base:.2f} (trainer.collapse.min_mixed_groups_ratio)"
                    )
                    solved = self._solved(m, mixed_key, mixed, score_key, score, best)
                    (saturation if solved else signs).append(sign + solved)
        if score is not None and c.max_score_drop is not None:
            if len(self.first_scores) < c.baseline_steps:
                # the EMA starts from the mean of the first steps: one lucky first batch (16 prompts are
                # noisy) must not become a best that ordinary batches then seem to fall from
                self.first_scores.append(score)
                if len(self.first_scores) == c.baseline_steps:
                    self.score_ema = self.best_score_ema = sum(self.first_scores) / len(self.first_scores)
            else:
                a = c.score_ema
                self.score_ema = a * self.score_ema + (1 - a) * score
                if self.score_ema < self.best_score_ema - c.max_score_drop:
                    signs.append(
                        f"{score_key} (EMA {self.score_ema:.3f}) fell more than "
                        f"trainer.collapse.max_score_drop {c.max_score_drop} below its best {self.best_score_ema:.3f}"
                    )
                self.best_score_ema = max(self.best_score_ema, self.score_ema)
        # the KL loss's, else the reward penalty's (algos/kl.py apply_kl_penalty)
        kl = m.get(_first_present(m, "actor/kl_loss_token_mean", "actor/kl_loss", "actor/reward_kl_penalty"))
        if c.max_kl is not None and kl is not None and kl > c.max_kl:
            signs.append(f"KL to the reference {kl:.4f} > trainer.collapse.max_kl {c.max_kl}")
        return signs, saturation

    def _solved(self, m: dict[str, float], mixed_key: str, mixed: float, score_key: str, score, best) -> str:
        """Why the tied groups are solved prompts (", ..."), or "" where they may be a collapse.

        Most tied groups at the batch's best score, that score the best of the run so far, and the
        score no lower than over the first steps. Under DAPO's filter all read what was generated.
        """
        top_key = (
            "dapo/generated/groups_tied_at_best"
            if mixed_key.startswith("dapo/")
            else "critic/groups_tied_at_best"
        )
        top = m.get(top_key)
        if top is None or score is None or best is None or not self.baseline_score:
            return ""
        start = sum(self.baseline_score) / len(self.baseline_score)
        if top < (1 - mixed) / 2 or best < self.best_seen or score < start:
            return ""
        return (
            f", but {top:.2f} of the groups scored the batch's best in every sample ({top_key}) "
            f"and {score_key} {score:.3f} is not below its first-steps mean {start:.3f}: the prompts are "
            "solved, and a group whose samples all score the same has no advantage to learn from (more or "
            "harder prompts give the signal back)"
        )

    def update(self, step: int, metrics: dict[str, float]) -> CollapseReport | None:
        """Check one step; a report when a sign has held for `patience` steps (once per run)."""
        if not self.cfg.enable:
            return None
        signs, saturation = self._signs(metrics)
        if not signs:
            # a solved step after a collapse sign is not yet healthy, and that sign's count goes on
            if not saturation:
                self.bad_since = None
            return self._saturation(step, saturation)
        self.saturated_since = None  # a collapse sign ends a run of solved steps
        if self.bad_since is None:
            self.bad_since = step
        if step - self.bad_since + 1 < self.cfg.patience or self.reported:
            return None
        self.reported = True
        return CollapseReport(step=step, onset_step=self.bad_since, reasons=signs)

    def _saturation(self, step: int, signs: list[str]) -> CollapseReport | None:
        """A saturation report once its sign has held `patience` steps; it leaves the run healthy."""
        if not signs:
            self.saturated_since = None
            return None
        if self.saturated_since is None:
            self.saturated_since = step
        if step - self.saturated_since + 1 < self.cfg.patience or self.saturation_reported:
            return None
        self.saturation_reported = True
        self.bad_since = None
        return CollapseReport(step=step, onset_step=self.saturated_since, reasons=signs, kind="saturation")

    STATE = (
        "baseline_mixed",
        "first_scores",
        "best_score_ema",
        "score_ema",
        "bad_since",
        "reported",
        "baseline_score",
        "best_seen",
        "saturated_since",
    )  # not saturation_reported: a resumed run (with more prompts, or the same) reports it again

    def state_dict(self) -> dict:
        """Its windows and counters, as JSON-able values: a resumed run watches on where it stopped."""
        return {k: getattr(self, k) for k in self.STATE}

    def load_state_dict(self, state: dict) -> None:
        for k in self.STATE:
            if k in state:
                setattr(self, k, state[k])
        if "baseline_score" not in state:  # from before saturation was told apart: the same steps' scores
            self.baseline_score = list(state.get("first_scores") or [])

    @property
    def healthy(self) -> bool:
        """No sign this step. A step measures the weights it starts from (its rollouts, entropy and KL),
        so those, not the ones its update makes, are a safe snapshot to fall back on."""
        return self.bad_since is None


def _first_present(metrics: dict[str, float], *keys: str) -> str:
    """The first of `keys` the step logged (the last when none is)."""
    return next((k for k in keys if metrics.get(k) is not None), keys[-1])
