"""Collapse signs (trainer/collapse.py): each fires only after `patience` bad steps in a row, names its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucidrl.config import ConfigError, config_from_dict
from lucidrl.config.schema import CollapseConfig
from lucidrl.trainer.collapse import CollapseMonitor
from lucidrl.trainer.collapse_guard import CollapseGuard


def _feed(monitor: CollapseMonitor, rows: list[dict]) -> list:
    return [monitor.update(step, m) for step, m in enumerate(rows, start=1)]


def test_mixed_groups_falling_below_a_share_of_the_start_fires_after_patience():
    mon = CollapseMonitor(CollapseConfig(patience=3, baseline_steps=2, min_mixed_groups_ratio=0.25))
    mixed = [0.6, 0.8, 0.5, 0.1, 0.1, 0.3, 0.1, 0.1, 0.1]  # baseline 0.7 -> threshold 0.175
    out = _feed(mon, [{"critic/groups_with_mixed_scores": v} for v in mixed])
    assert out[:8] == [None] * 8  # steps 4-5 bad, 6 recovers (resets), 7-8 bad
    report = out[8]
    assert (report.step, report.onset_step) == (9, 7)
    assert "groups_with_mixed_scores 0.10 < 0.25 x its first-2-step mean 0.70" in report.message()


def test_a_start_with_no_mixed_groups_is_not_a_collapse():
    mon = CollapseMonitor(CollapseConfig(patience=1, baseline_steps=1))
    assert _feed(mon, [{"critic/groups_with_mixed_scores": 0.0}] * 5) == [None] * 5


def test_entropy_kl_and_score_drop_signs():
    cfg = CollapseConfig(patience=1, min_mixed_groups_ratio=None, min_entropy=0.05, max_kl=0.3)
    assert CollapseMonitor(cfg).update(1, {"actor/entropy": 0.2, "actor/kl_loss": 0.1}) is None
    r = CollapseMonitor(cfg).update(1, {"actor/entropy": 0.01, "actor/kl_loss": 0.5})
    assert "actor/entropy 0.0100 < trainer.collapse.min_entropy 0.05" in r.message()
    assert "KL to the reference 0.5000 > trainer.collapse.max_kl 0.3" in r.message()
    drop = CollapseMonitor(
        CollapseConfig(
            patience=2, min_mixed_groups_ratio=None, max_score_drop=0.5, score_ema=0.0, baseline_steps=1
        )
    )
    out = _feed(drop, [{"critic/score/mean": s} for s in [0.0, 1.0, 0.8, 0.6, 0.4, 0.3]])
    assert out[:5] == [None] * 5 and out[5].onset_step == 5  # 0.6 is within 0.5 of the best 1.0; 0.4 is not
    assert (
        "fell more than trainer.collapse.max_score_drop 0.5 below its best 1.000" in out[5].message()
        and "EMA 0.300" in out[5].message()
    )


def test_a_best_score_of_zero_is_kept():
    """K&K scores are negative when wrong: a best EMA of exactly 0.0 must not be replaced by a worse one."""
    mon = CollapseMonitor(
        CollapseConfig(
            patience=2, min_mixed_groups_ratio=None, max_score_drop=0.5, score_ema=0.0, baseline_steps=1
        )
    )
    out = _feed(mon, [{"critic/score/mean": s} for s in [0.0, -1.0, -1.0]])
    assert out[:2] == [None, None] and out[2].onset_step == 2 and "below its best 0.000" in out[2].message()


def test_a_lucky_first_batch_is_not_a_best_to_fall_from():
    """The demo's scores from a run that was stopped at step 11 when the EMA started at step 1's 1.01.

    Step 1's 16 prompts happened to score 1.01; the next ten batches scored 0.29-0.85, the same
    policy's ordinary spread. Started from the first three steps' mean, the EMA sees no drop; a real
    fall from a level the run had reached still fires.
    """
    cfg = CollapseConfig(patience=3, min_mixed_groups_ratio=None, max_score_drop=0.5, score_ema=0.7)
    noisy = [1.01, 0.32, 0.37, 0.51, 0.47, 0.85, 0.29, 0.43, 0.40, 0.30, 0.38]
    assert _feed(CollapseMonitor(cfg), [{"critic/score/mean": s} for s in noisy]) == [None] * len(noisy)
    falling = [0.4, 0.5, 0.45, 1.2, 1.3, 1.4, 1.3, 0.3, 0.1, 0.0, 0.0, 0.0, 0.0]
    out = _feed(CollapseMonitor(cfg), [{"critic/score/mean": s} for s in falling])
    fired = [r for r in out if r is not None]
    assert len(fired) == 1 and "below its best" in fired[0].message()


def test_the_demos_settings_ride_out_batch_noise_and_still_catch_a_collapse():
    """Scores of a healthy demo GRPO run (renamed-label start, 16 prompts x 8) that a 3-step EMA with a
    0.5 drop stopped at step 78: steps 43-45 reached 2.07-2.37, then ordinary batches (1.08-1.27)
    pulled the short EMA 0.7 below. The demo's settings (EMA 0.9, drop 1.0) let it run, and still stop
    a real collapse (format and answers lost: scores near -3) within a few steps."""
    from lucidrl.experiments.scarce_labels import ScarceLabelsPlan, grpo_config

    demo = grpo_config("m", {"unlabelled": "u"}, Path("r"), ScarceLabelsPlan(), 0)["trainer"]["collapse"]
    cfg = CollapseConfig(**{**demo, "min_mixed_groups_ratio": None})
    healthy = [
        1.387, 1.27, 1.145, 1.082, 1.219, 1.578, 1.66, 1.523, 0.848, 1.797, 1.309, 1.711, 1.441, 1.289, 1.109,
        0.91, 1.289, 1.754, 1.082, 1.914, 1.684, 1.559, 1.387, 1.816, 1.211, 1.695, 1.832, 1.59, 1.102, 1.559,
        1.621, 1.621, 1.523, 1.289, 2.055, 1.465, 1.754, 1.887, 1.25, 1.992, 1.938, 1.941, 2.074, 2.258, 2.371,
        1.574, 1.707, 1.988, 1.625, 2.168, 1.258, 1.387, 1.785, 1.871, 1.715, 1.234, 1.75, 1.465, 1.676, 2.0,
        1.926, 1.586, 1.75, 1.793, 1.93, 1.34, 1.41, 1.848, 1.871, 1.605, 1.516, 2.031, 1.738, 1.078, 1.828,
        1.258, 1.27, 1.359,
    ]  # fmt: skip
    old = CollapseConfig(patience=3, min_mixed_groups_ratio=None, max_score_drop=0.5, score_ema=0.7)
    assert any(
        r is not None for r in _feed(CollapseMonitor(old), [{"critic/score/mean": x} for x in healthy])
    )
    assert _feed(CollapseMonitor(cfg), [{"critic/score/mean": x} for x in healthy]) == [None] * len(healthy)
    collapsing = healthy[:40] + [-2.5, -3.0, -3.0, -3.0, -3.0, -3.0, -3.0]
    out = _feed(CollapseMonitor(cfg), [{"critic/score/mean": x} for x in collapsing])
    fired = [i for i, r in enumerate(out) if r is not None]
    assert fired and fired[0] <= 40 + 5, fired


def test_reports_once():
    mon = CollapseMonitor(CollapseConfig(patience=1, min_mixed_groups_ratio=None, min_entropy=1.0))
    out = _feed(mon, [{"actor/entropy": 0.1}] * 4)
    assert [r is not None for r in out] == [True, False, False, False]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"patience": 0}, "'trainer.collapse.patience' .* must be >= 1"),
        (
            {"min_mixed_groups_ratio": 1.5},
            r"'trainer.collapse.min_mixed_groups_ratio' .* must be in \(0, 1\]",
        ),
        ({"min_entropy": -1.0}, "'trainer.collapse.min_entropy' .* must be > 0, got -1.0"),
        ({"min_mixed_groups_ratio": None}, "every sign is off"),
    ],
)
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"trainer": {"collapse": override}})


def test_a_resumed_monitor_reports_where_an_uninterrupted_one_does():
    """The windows travel in the checkpoint's JSON: a sign that began before the save still counts."""
    import json

    cfg = CollapseConfig(patience=3, baseline_steps=2, min_mixed_groups_ratio=0.25, max_score_drop=0.5)
    rows = [
        {"critic/groups_with_mixed_scores": v, "critic/score/mean": s}
        for v, s in [(0.6, 1.0), (0.8, 1.2), (0.5, 1.5), (0.1, 1.4), (0.1, 1.3), (0.1, 1.2), (0.1, 1.1)]
    ]
    straight = _feed(CollapseMonitor(cfg), rows)
    assert straight[5] is not None and straight[5].onset_step == 4
    first = CollapseMonitor(cfg)
    _feed(first, rows[:4])  # saved after step 4, one bad step into the sign
    resumed = CollapseMonitor(cfg)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    after = [resumed.update(step, m) for step, m in enumerate(rows[4:], start=5)]
    assert after[1] is not None and after[1].message() == straight[5].message()
    afresh = CollapseMonitor(cfg)  # what a resume without the windows saw: a new baseline, no sign yet
    assert [afresh.update(step, m) for step, m in enumerate(rows[4:], start=5)] == [None] * 3


def test_max_kl_reads_the_reward_penalty_that_apply_kl_penalty_reports():
    import torch

    from lucidrl.algos.kl import apply_kl_penalty

    mask = torch.ones(2, 3)
    _, metrics = apply_kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), torch.full((2, 3), -1.0), mask, 0.1)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(1.0)
    cfg = CollapseConfig(patience=1, min_mixed_groups_ratio=None, max_kl=0.3)
    report = CollapseMonitor(cfg).update(1, metrics)
    assert (
        report is not None and "KL to the reference 1.0000 > trainer.collapse.max_kl 0.3" in report.message()
    )


class _Actor:
    """Weights are their step number; a copy is that number."""

    weights, candidate, kept = 0, None, None

    def snapshot_actor(self):
        self.candidate = self.weights

    def keep_snapshot(self):
        self.kept = self.candidate

    def restore_actor(self):
        self.weights = self.kept


class _Context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fit_with_entropies(
    tmp_path, entropy_of: dict[int, float], patience: int, total_steps: int, metrics_of=None, collapse=None
):
    """PPOTrainer.fit over a stand-in actor whose step k measures the entropy of the weights it starts
    from (`entropy_of[k - 1]`) and then updates them; min_entropy 0.1 and keep_last_healthy on.
    `metrics_of(weights)` and `collapse` (a CollapseConfig) replace the entropies and those settings.
    Returns (trainer, actor, weights measured per step, console lines)."""
    from types import SimpleNamespace

    from lucidrl.trainer.pipeline import Supply
    from lucidrl.trainer.ppo import PPOTrainer

    printed: list[str] = []
    trainer = object.__new__(PPOTrainer)
    trainer.workers, trainer.tracker = _Context(), _Context()
    trainer.workers.actor = actor = _Actor()
    trainer.tracker.console = SimpleNamespace(print=lambda text, **_: printed.append(text))
    trainer.tracker.log = lambda metrics, step: None
    collapse = collapse or CollapseConfig(
        min_mixed_groups_ratio=None, min_entropy=0.1, patience=patience, keep_last_healthy=True
    )
    metrics_of = metrics_of or (lambda weights: {"actor/entropy": entropy_of[weights]})
    trainer.cfg = SimpleNamespace(
        trainer=SimpleNamespace(
            val_before_train=False, collapse=collapse, max_time_s=None, test_freq=0, save_freq=0,
            save_final_model=False,
        )
    )  # fmt: skip
    trainer.guard = CollapseGuard(collapse, actor, trainer.tracker.console.print, tmp_path)
    trainer.global_step, trainer.total_steps = 0, total_steps
    trainer.resumed_from, trainer.run_dir, trainer.on_step = None, tmp_path, None
    trainer.validate = lambda: {}
    trainer.supply = Supply(collect=None, cursor=dict, max_staleness=0)  # step() below makes no batches
    measured = []

    def step():
        measured.append(actor.weights)
        metrics = metrics_of(actor.weights)
        actor.weights += 1  # the update
        return metrics

    trainer.step = step
    trainer.fit()
    return trainer, actor, measured, printed


def test_the_kept_weights_are_the_last_ones_measured_healthy_not_the_next_update(tmp_path):
    """A step measures the weights it starts from (rollouts, entropy, KL) and then updates them. The
    trainer kept the weights each healthy step produced, so a stop restored the first weights whose own
    rollouts showed the sign (from a review: W3 of entropy 0.05 was restored, not W2 of 0.8)."""
    entropy_of = {0: 1.0, 1: 0.9, 2: 0.8, 3: 0.05, 4: 0.04, 5: 0.03, 6: 0.02}  # of the weights after step k
    trainer, actor, measured, printed = _fit_with_entropies(tmp_path, entropy_of, patience=2, total_steps=10)
    assert measured == [0, 1, 2, 3, 4]  # the sign first shows at step 4 (weights 3), holds at step 5
    assert trainer.collapse.step == 5 and actor.weights == 2 and trainer.guard.healthy_step == 2
    assert any(
        "restored the weights after step 2, the last whose rollouts showed no sign" in p for p in printed
    )


def test_with_dapos_filter_the_signs_read_what_was_generated_not_what_was_kept():
    """The filtered batch is mixed groups by construction: critic/groups_with_mixed_scores stayed near 1
    while the policy's own fraction fell from 0.68 to 0.10, and the default sign never fired."""
    mon = CollapseMonitor(
        CollapseConfig(
            patience=2, baseline_steps=2, min_mixed_groups_ratio=0.25, max_score_drop=0.5, score_ema=0.0
        )
    )
    generated = [0.68, 0.66, 0.4, 0.12, 0.10]
    scores = [1.0, 1.0, 0.8, 0.2, 0.1]
    rows = [
        {
            "critic/groups_with_mixed_scores": 1.0,
            "critic/score/mean": 0.9,
            "dapo/generated/groups_with_mixed_scores": g,
            "dapo/generated/score/mean": s,
        }
        for g, s in zip(generated, scores, strict=True)
    ]
    report = _feed(mon, rows)[-1]
    assert report is not None and (report.step, report.onset_step) == (5, 4)
    assert (
        "dapo/generated/groups_with_mixed_scores 0.10 < 0.25 x its first-2-step mean 0.67" in report.message()
    )
    assert "dapo/generated/score/mean (EMA" in report.message()


def test_a_sign_still_building_when_the_run_ends_falls_back_on_the_last_healthy_weights(tmp_path):
    """A collapse that had not yet held `patience` steps when the time ran out was neither reported nor
    rolled back: the flagged weights became the final model (from a review of the demo)."""
    entropy_of = {0: 1.0, 1: 0.9, 2: 0.8, 3: 0.05, 4: 0.04}
    # the sign shows at steps 4 and 5 (weights 3 and 4): two of three, when the steps end
    trainer, actor, _, printed = _fit_with_entropies(tmp_path, entropy_of, patience=3, total_steps=5)
    assert trainer.collapse is None and actor.weights == 2 and trainer.restored_step == 2
    assert any(
        "ended with a sign of collapse held since step 4" in p and "after step 2" in p for p in printed
    )


def _groups(mixed: float, at_best: float, score: float, best: float = 3.0) -> dict[str, float]:
    return {
        "critic/groups_with_mixed_scores": mixed,
        "critic/groups_tied_at_best": at_best,
        "critic/score/mean": score,
        "critic/score/max": best,
    }


def test_groups_tied_at_the_best_score_with_the_score_up_are_saturation_not_collapse():
    """The demo's GRPO solved its 85 pool puzzles (mixed groups 0.52 -> 0.00, score 2.9 of 3) and was
    stopped as a policy collapse, its last weights thrown away for older ones."""
    cfg = CollapseConfig(patience=2, baseline_steps=2, min_mixed_groups_ratio=0.25)
    rows = [_groups(0.5, 0.2, 1.0), _groups(0.54, 0.2, 1.2), _groups(0.3, 0.5, 2.0)]
    solved = rows + [_groups(0.06, 0.9, 2.8), _groups(0.0, 1.0, 2.9)]
    mon = CollapseMonitor(cfg)
    out = _feed(mon, solved)
    assert out[:4] == [None] * 4 and mon.healthy  # a saturated step is a healthy one
    report = out[4]
    assert report.kind == "saturation" and (report.step, report.onset_step) == (5, 4)
    said = report.message()
    assert said.startswith("RL signal saturated at step 5 (signs since step 4)")
    assert "1.00 of the groups scored the batch's best in every sample" in said
    assert "critic/score/mean 2.900 is not below its first-steps mean 1.100: the prompts are solved" in said
    # tied at a worse score than the batch's best (every sample wrong): a collapse, as before
    broken = rows + [_groups(0.06, 0.1, 0.9), _groups(0.0, 0.0, 0.8)]
    report = _feed(CollapseMonitor(cfg), broken)[4]
    assert report.kind == "collapse" and report.message().startswith("policy collapse detected at step 5")
    # every sample of the batch the same (all tied at "the best") but the score fell: a collapse too
    fallen = rows + [_groups(0.0, 1.0, -1.0, best=-1.0), _groups(0.0, 1.0, -1.0, best=-1.0)]
    assert _feed(CollapseMonitor(cfg), fallen)[4].kind == "collapse"


def test_a_collapse_to_one_formatted_wrong_answer_above_a_weak_start_is_still_a_collapse():
    """From a review: every sample formatted but wrong ties at the batch's own best (-0.5 in K&K), and
    from a start below that the score had not fallen: it read as solved prompts."""
    cfg = CollapseConfig(patience=2, baseline_steps=2, min_mixed_groups_ratio=0.25)
    weak = [_groups(0.5, 0.0, -1.8, best=3.0), _groups(0.5, 0.0, -1.6, best=-0.5)]
    wrong = [_groups(0.0, 1.0, -0.5, best=-0.5)] * 2  # best of the run so far: 3.0, at step 1
    report = _feed(CollapseMonitor(cfg), weak + wrong)[3]
    assert report is not None and report.kind == "collapse"


def test_a_run_flipping_between_solved_and_collapsing_steps_is_stopped_as_a_collapse():
    cfg = CollapseConfig(patience=3, baseline_steps=2, min_mixed_groups_ratio=0.25)
    start = [_groups(0.5, 0.2, 1.0), _groups(0.5, 0.2, 1.2)]
    solved, broken = _groups(0.0, 1.0, 2.9), _groups(0.0, 0.0, 0.8)
    mon = CollapseMonitor(cfg)
    out = _feed(mon, [*start, solved, broken, solved, broken])
    assert out[:5] == [None] * 5 and not mon.healthy  # the solved step 5 does not clear step 4's sign
    assert out[5].kind == "collapse" and (out[5].step, out[5].onset_step) == (6, 4)


def test_saturation_on_resume_and_under_dapo():
    import json

    cfg = CollapseConfig(patience=2, baseline_steps=2, min_mixed_groups_ratio=0.25, max_score_drop=1.0)
    start = [_groups(0.5, 0.2, 1.0), _groups(0.5, 0.2, 1.2)]
    old = CollapseMonitor(cfg)
    _feed(old, start)
    state = json.loads(json.dumps(old.state_dict()))
    for key in ("baseline_score", "best_seen", "saturated_since"):  # a checkpoint of the last release
        state.pop(key)
    resumed = CollapseMonitor(cfg)
    resumed.load_state_dict(state)
    assert resumed.baseline_score == [1.0, 1.2]  # the first steps' scores, from first_scores
    out = [resumed.update(step, _groups(0.0, 1.0, 2.9)) for step in (3, 4)]
    assert out[1] is not None and out[1].kind == "saturation"
    again = CollapseMonitor(cfg)  # a run resumed after its saturation stop reports it again
    again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    assert again.update(5, _groups(0.0, 1.0, 2.9)).kind == "saturation"  # its run of solved steps goes on

    def dapo(mixed, at_best, score):
        return {
            "critic/groups_with_mixed_scores": 1.0, "critic/groups_tied_at_best": 0.0,
            "critic/score/mean": 0.5, "critic/score/max": 3.0,
            "dapo/generated/groups_with_mixed_scores": mixed, "dapo/generated/groups_tied_at_best": at_best,
            "dapo/generated/score/mean": score, "dapo/generated/score/max": 3.0,
        }  # fmt: skip

    rows = [dapo(0.5, 0.2, 1.0), dapo(0.5, 0.2, 1.2), dapo(0.05, 0.9, 2.8), dapo(0.0, 1.0, 2.9)]
    report = _feed(CollapseMonitor(cfg), rows)[3]
    assert report.kind == "saturation" and "dapo/generated/groups_with_mixed_scores 0.00" in report.message()


def test_step_metrics_count_the_groups_tied_at_the_batch_best():
    import torch

    from lucidrl.batch import Batch
    from lucidrl.trainer.metrics import step_metrics

    scores = torch.tensor([3.0, 3.0, 3.0, -1.0, -1.0, -1.0])  # groups: solved, mixed, all wrong
    batch = Batch(
        tensors={
            "prompts": torch.ones(6, 2, dtype=torch.long),
            "prompt_mask": torch.ones(6, 2),
            "responses": torch.ones(6, 1, dtype=torch.long),
            "response_mask": torch.ones(6, 1),
            "token_level_scores": scores[:, None],
            "token_level_rewards": scores[:, None],
            "advantages": torch.zeros(6, 1),
        },
        non_tensors={"uid": ["a", "a", "b", "b", "c", "c"]},
    )
    m = step_metrics(batch, max_response_length=1)
    assert m["critic/groups_with_mixed_scores"] == pytest.approx(1 / 3)
    assert m["critic/groups_tied_at_best"] == pytest.approx(1 / 3)


def test_a_saturated_run_stops_on_its_last_weights(tmp_path):
    cfg = CollapseConfig(patience=2, baseline_steps=2, min_mixed_groups_ratio=0.25, keep_last_healthy=True)
    # the weights after step k: solved from weights 3 on
    of = {0: _groups(0.5, 0.2, 1.0), 1: _groups(0.5, 0.2, 1.2), 2: _groups(0.4, 0.4, 1.8)}
    trainer, actor, measured, printed = _fit_with_entropies(
        tmp_path, {}, patience=2, total_steps=10, collapse=cfg,
        metrics_of=lambda w: of.get(w, _groups(0.0, 1.0, 2.9)),
    )  # fmt: skip
    assert measured == [0, 1, 2, 3, 4]  # signs at steps 4 and 5: stopped after patience
    assert trainer.collapse is None and trainer.restored_step is None
    assert trainer.saturation.step == 5 and actor.weights == 5  # nothing restored
    assert any("RL signal saturated at step 5" in p and "nothing is restored" in p for p in printed)
    assert (tmp_path / "SATURATED.txt").is_file() and not (tmp_path / "COLLAPSE.txt").exists()
