"""Every estimator, loss, KL mode, aggregation, rollout correction and DAPO refinement, selected purely
from config, for 2 real steps: the "Try it" override lists of docs/algorithms/ exactly as the pages print
them, and a few speed-up paths."""

import functools
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
from helpers import toy_train_args

from lucidrl.cli import main
from lucidrl.config import load_config

DOCS = Path(__file__).resolve().parent.parent / "docs" / "algorithms"

BASE = [
    "data.max_prompt_length=1000",
    "data.max_response_length=12",
    "data.train_batch_size=4",
    "rollout.n=4",
    "actor.optim.lr=1e-3",
    "actor.ppo_mini_batch_size=2",
    "actor.ppo_micro_batch_size=8",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.save_final_model=false",
    "data.val_files=[]",
]


def doc_cases() -> dict[str, list[str]]:
    """Every `lucidrl train CONFIG.yaml ...` command of the docs/algorithms pages, as its override list,
    named after its page (page-2, page-3 for a page's further commands)."""
    cases: dict[str, list[str]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for k, command in enumerate(re.findall(r"`lucidrl train CONFIG\.yaml([^`]*)`", page.read_text())):
            cases[page.stem if k == 0 else f"{page.stem}-{k + 1}"] = command.split()
    return cases


DOC_CASES = doc_cases()

# paths the pages do not show: token-budget and chunked-head micro-batches, compiled log-probs
SPEED_CASES = {
    "dynamic_bsz": [  # token-budget micro-batches: actor update, old-log-prob, reference and critic passes
        "algorithm.adv_estimator=gae",
        "critic.optim.lr=1e-3",
        "critic.use_dynamic_bsz=true",
        "critic.ppo_max_token_len_per_gpu=2500",
        "actor.use_dynamic_bsz=true",
        "actor.ppo_max_token_len_per_gpu=2100",
        "actor.log_prob_max_token_len_per_gpu=3200",
        "actor.on_policy_skip_old_log_prob=false",
        "actor.use_kl_loss=true",
    ],
    "head_chunks": [  # the LM head in 16-token chunks: update (entropy in the loss), old-log-prob, reference
        "actor.head_chunk_tokens=16",
        "actor.on_policy_skip_old_log_prob=false",
        "actor.use_kl_loss=true",
        "actor.entropy_coeff=0.001",
    ],
    "torch_compile": [  # fused, compiled log-prob and entropy in update, old-log-prob and reference passes
        "actor.use_torch_compile=true",
        "actor.on_policy_skip_old_log_prob=false",
        "actor.use_kl_loss=true",
        "actor.entropy_coeff=0.001",
    ],
}

CASES = {**DOC_CASES, **SPEED_CASES}

# every page names something to try; the ones this issue added, by name
EXPECTED_PAGES = {
    "gpg", "gdpo", "optimal_token_baseline", "optimal_token_baseline-2", "sapo", "gmpo", "dppo", "dppo-2",
    "clip_cov", "clip_cov-2", "dro", "rollout_correction", "rollout_correction-2", "aggregation_and_kl",
    "aggregation_and_kl-2", "grpo-3", "rloo-2",
}  # fmt: skip


def test_every_page_has_a_try_it_that_loads(tmp_path):
    """Quick: each page's overrides parse and validate on the e2e base (the slow test trains them)."""
    pages = {p.stem for p in DOCS.glob("*.md")}
    assert pages <= {name.split("-")[0] for name in DOC_CASES}
    assert EXPECTED_PAGES <= set(DOC_CASES)
    for name, overrides in DOC_CASES.items():
        assert all("=" in o for o in overrides), (name, overrides)
        load_config(None, ["model.path=unused", "data.train_files=[unused.parquet]", *BASE, *overrides])


def _has(overrides: list[str], text: str) -> bool:
    return any(o.startswith(text) for o in overrides)


def _spy_on_the_registries(monkeypatch) -> dict[str, Counter]:
    """Count the calls, by registered name, of every advantage estimator, policy loss and KL kind."""
    from lucidrl.algos import kl, registry
    from lucidrl.workers.training import actor

    called: dict[str, Counter] = {"estimator": Counter(), "policy_loss": Counter(), "kl": Counter()}
    for kind, table in (
        ("estimator", registry._ADVANTAGE_ESTIMATORS),
        ("policy_loss", registry._POLICY_LOSSES),
    ):
        for registered, fn in list(table._fns.items()):

            @functools.wraps(fn)  # keeps the signature the callers read the wanted inputs from
            def counted(*args, _fn=fn, _name=registered, _kind=kind, **kwargs):
                called[_kind][_name] += 1
                return _fn(*args, **kwargs)

            monkeypatch.setitem(table._fns, registered, counted)
    kl_penalty = kl.kl_penalty

    def counted_kl(log_prob, ref_log_prob, kind):
        called["kl"][kind] += 1
        return kl_penalty(log_prob, ref_log_prob, kind)

    monkeypatch.setattr(kl, "kl_penalty", counted_kl)  # the reward penalty's
    monkeypatch.setattr(actor, "kl_penalty", counted_kl)  # the KL loss's
    return called


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_two_steps_from_config(name, tmp_path, kk_data, tiny_model, monkeypatch):
    overrides = CASES[name]
    cfg = load_config(None, ["model.path=unused", "data.train_files=[unused.parquet]", *BASE, *overrides])
    called = _spy_on_the_registries(monkeypatch)
    assert main([*toy_train_args(tmp_path, kk_data, tiny_model), *BASE, *overrides]) == 0
    # the run used what the config chose, and nothing else: a run that ignored the chosen estimator,
    # loss or KL kind (or fell back to a default) would show another name here
    assert set(called["estimator"]) == {cfg.algorithm.adv_estimator}, called
    assert called["estimator"][cfg.algorithm.adv_estimator] >= 2  # once a step
    assert set(called["policy_loss"]) == {cfg.actor.policy_loss}, called
    assert called["policy_loss"][cfg.actor.policy_loss] >= 4  # 2 mini-batches a step
    kinds = {cfg.actor.kl_loss_type} if cfg.actor.use_kl_loss else set()
    kinds |= {cfg.algorithm.kl_penalty} if cfg.algorithm.use_kl_in_reward else set()
    assert set(called["kl"]) == kinds, called
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    drawn = 0  # prompt batches taken from the loader: 32 train prompts in batches of 4, 8 per epoch
    for r in records:
        assert math.isfinite(r["actor/pg_loss"]) and r["actor/grad_norm"] > 0, r
        assert r["critic/advantages/max"] > r["critic/advantages/min"]
        assert r["actor/entropy"] > 0
        drawn += int(r.get("dapo/gen_rounds", 1))
        assert r["training/epoch"] == (drawn - 1) // 8, (drawn, r["training/epoch"])
    last = records[-1]
    if _has(overrides, "algorithm.adv_estimator=gae") and _has(overrides, "algorithm.use_kl_in_reward=true"):
        assert math.isfinite(last["critic/vf_loss"]) and "critic/vf_explained_var" in last
        assert last["actor/reward_kl_penalty_coeff"] == pytest.approx(0.001)
    if _has(overrides, "algorithm.kl_ctrl.type=adaptive"):
        assert last["actor/reward_kl_penalty_coeff"] != pytest.approx(0.05)  # the controller moved it
    if _has(overrides, "algorithm.filter_groups.enable=true"):
        assert records[0]["dapo/gen_rounds"] >= 1 and "reward/overlong_penalty/mean" in records[0]
        for r in records:  # 4 prompts a round; the mixed groups beyond the batch's 4 are the surplus
            generated = 4 * r["dapo/gen_rounds"]
            mixed = generated - r["dapo/groups_dropped_all_same"]
            assert r["dapo/groups_surplus_unused"] == max(0, mixed - 4)
            assert r["dapo/filled_with_tied_groups"] == max(0, 4 - mixed)
        assert (
            records[0]["critic/groups_with_mixed_scores"] == 1.0
            or records[0]["dapo/filled_with_tied_groups"] > 0
        )
    bypass = _has(overrides, "algorithm.rollout_correction.bypass_mode=true")
    if not bypass and (
        _has(overrides, "algorithm.rollout_correction.rollout_is=")
        or _has(overrides, "algorithm.rollout_correction.rollout_rs=")
    ):
        # the same weights sampled and trained in float32: the engine's and the actor's log-probs agree,
        # so the weights are 1 and nothing is rejected
        assert last["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
        assert last["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-4)
        if _has(overrides, "algorithm.rollout_correction.rollout_rs="):
            assert last["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    if bypass:
        assert "rollout/logprob_diff_mean" not in last  # no actor pass to compare with
        assert 0.0 <= last["rollout_corr/rollout_rs_masked_fraction"] <= 1.0  # from the bypass_mode loss
    if _has(overrides, "actor.policy_loss=clip_cov") or _has(overrides, "actor.policy_loss=kl_cov"):
        assert all(r["actor/pg_clipfrac"] > 0 for r in records)  # some tokens were cut off or penalised
    if _has(overrides, "actor.kl_loss_type=k3+"):
        # step 1 starts at the reference (KL 0 on its first mini-batch) and each update moves the actor
        # away from it: a KL taken against the actor itself, or a reference that follows the actor, is 0
        assert 0.0 < records[0]["actor/kl_loss"] < last["actor/kl_loss"], records
