"""lucidrl's algorithm math against verl 0.9.1's own functions, on the same random inputs.

Every advantage estimator, policy loss (value, gradient and metrics), KL kind (value and gradient),
aggregation mode and rollout-correction setting (weights, mask and metrics) that both register is run
on both sides; the script prints one line per case with the largest absolute difference, and the cases
over the tolerance. It is a check to run by hand, not a test: verl is not a dependency of lucidrl.

Set-up, outside lucidrl's environment (verl's wheel is pure Python; a few of its imports need packages
lucidrl does not install):

    pip download verl==0.9.1 --no-deps -d /tmp/verl && unzip -q /tmp/verl/verl-0.9.1-*.whl -d /tmp/verl/src
    pip install --target /tmp/verl/deps --no-deps tensordict==0.15.3 omegaconf antlr4-python3-runtime==4.9.3 \
        pyvers cloudpickle orjson codetiming
    PYTHONPATH=.:/tmp/verl/src:/tmp/verl/deps python benchmarks/verl_parity.py

Known differences (documented where lucidrl chose them) are listed as such, not as failures:
GRPO-family estimators give a tied group exactly 0 where verl gives float noise; rloo_vectorized keeps a
single-sample group's raw score (verl's vectorized version gives it 0); geo_mean averages over non-empty
responses (the inputs here have none empty, so it must agree).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

try:
    import verl.trainer.ppo.core_algos as V
    import verl.trainer.ppo.rollout_corr_helper as VRC
    from verl.trainer.config import AlgoConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig
except ImportError as e:  # pragma: no cover - a manual script
    sys.exit(f"verl 0.9.1 is not importable ({e}); see this file's docstring for the set-up")

import lucidrl.algos as L
from lucidrl.algos.rollout_correction import rollout_correction

TOL = 1e-5
results: list[tuple[str, float]] = []


def record(name: str, ours, theirs) -> None:
    if isinstance(ours, dict):
        keys = sorted(set(ours) | set(theirs))
        missing = [k for k in keys if k not in ours or k not in theirs]
        if missing:
            results.append((f"{name} (keys only on one side: {missing[:4]})", float("inf")))
            return
        diff = max((abs(float(ours[k]) - float(theirs[k])) for k in keys), default=0.0)
    else:
        a, b = torch.as_tensor(ours).double(), torch.as_tensor(theirs).double()
        diff = (a - b).abs().max().item() if a.numel() else 0.0
    results.append((name, diff))


def inputs(seed: int, bs: int = 8, T: int = 7, gaps: bool = False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (bs,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    if gaps:  # a masked span inside some responses (tool output)
        mask[::2, 2:4] = 0
        mask[:, 0] = 1
    rewards = torch.zeros(bs, T)
    last = torch.arange(T)[None, :].expand(bs, T).masked_fill(mask == 0, -1).max(-1).values
    rewards[torch.arange(bs), last] = torch.randint(0, 3, (bs,), generator=g).float() * 0.5
    old = -torch.rand(bs, T, generator=g) * 3 - 0.05
    log_prob = old + 0.3 * torch.randn(bs, T, generator=g)
    adv = torch.randn(bs, T, generator=g)
    index = np.array([f"u{i // 4}" for i in range(bs)], dtype=object)
    return rewards, mask, index, old, log_prob, adv


def estimators() -> None:
    for seed in range(3):
        for gaps in (False, True):
            r, m, idx, old, _, _ = inputs(seed, gaps=gaps)
            tag = f"seed {seed}{' gaps' if gaps else ''}"
            cfg = AlgoConfig(gamma=0.9)
            pairs = {
                "grpo": (
                    L.compute_grpo_outcome_advantage(r, m, idx),
                    V.compute_grpo_outcome_advantage(r, m, idx),
                ),
                "grpo_vectorized": (
                    L.get_advantage_estimator("grpo_vectorized")(r, m, idx),
                    V.compute_grpo_vectorized_outcome_advantage(r, m, idx),
                ),
                "rloo": (
                    L.compute_rloo_outcome_advantage(r, m, idx),
                    V.compute_rloo_outcome_advantage(r, m, idx),
                ),
                "rloo_vectorized": (
                    L.get_advantage_estimator("rloo_vectorized")(r, m, idx),
                    V.compute_rloo_vectorized_outcome_advantage(r, m, idx),
                ),
                "opo": (
                    L.compute_opo_outcome_advantage(r, m, idx),
                    V.compute_opo_outcome_advantage(r, m, idx),
                ),
                "gpg": (
                    L.compute_gpg_outcome_advantage(r, m, idx),
                    V.compute_gpg_outcome_advantage(r.clone(), m, idx),
                ),
                "gdpo (total)": (
                    L.compute_gdpo_outcome_advantage(r, m, idx),
                    V.compute_gdpo_outcome_advantage(r, m, idx),
                ),
                "reinforce_plus_plus": (
                    L.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.9),
                    V.compute_reinforce_plus_plus_outcome_advantage(r, m, config=cfg),
                ),
                "reinforce_plus_plus_baseline": (
                    L.compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, idx),
                    V.compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, idx),
                ),
            }
            values = torch.randn(r.shape, generator=torch.Generator().manual_seed(seed))
            pairs["gae"] = (
                L.compute_gae_advantage_return(r, values, m, gamma=0.9, lam=0.8),
                V.compute_gae_advantage_return(r, values, m, torch.tensor(0.9), torch.tensor(0.8)),
            )
            spsq = torch.rand(r.shape, generator=torch.Generator().manual_seed(seed + 9)) * 0.5 + 0.1
            for name, ours_fn, theirs_fn in (
                ("optimal_token_baseline", L.compute_optimal_token_baseline_advantage,
                 V.compute_optimal_token_baseline_advantage),
                ("tir_optimal_token_baseline", L.compute_multi_turn_optimal_token_baseline_advantage,
                 V.compute_multi_turn_optimal_token_baseline_advantage),
            ):  # fmt: skip
                w = torch.rand(r.shape) + 0.5
                pairs[name] = (ours_fn(r, m, idx, old, spsq), theirs_fn(r, m, idx, old, spsq))
                pairs[name + " +IS"] = (ours_fn(r, m, idx, old, spsq, w), theirs_fn(r, m, idx, old, spsq, w))
            for name, ((a, ra), (b, rb)) in pairs.items():
                record(f"adv {name} {tag}: advantages", a, b * m)
                if "optimal" not in name:  # verl leaves returns unmasked inside gaps
                    record(f"adv {name} {tag}: returns", ra * m, rb * m)
            # GDPO with two reward components on the last token, as verl reads them from the batch
            comps = torch.stack([r.sum(-1), torch.randint(0, 2, (len(r),)).float()], -1)
            prompt_len = 3
            attn = torch.cat([torch.ones(len(r), prompt_len), m], -1).long()
            if not gaps:
                ours, _ = L.compute_gdpo_outcome_advantage(
                    r, m, idx, reward_components=comps, reward_weights=[1.0, 0.5]
                )
                theirs, _ = V.compute_gdpo_outcome_advantage(
                    r, m, idx, config={"gdpo_reward_keys": ["a", "b"], "gdpo_reward_weights": [1.0, 0.5]},
                    non_tensor_batch={"a": comps[:, 0].numpy(), "b": comps[:, 1].numpy()},
                    batch={"prompts": torch.zeros(len(r), prompt_len), "attention_mask": attn},
                )  # fmt: skip
                record(f"adv gdpo (2 components) {tag}", ours, theirs)


def actor_config(**kw) -> ActorConfig:
    pl = {k: kw.pop(k) for k in list(kw) if k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio",
                                                   "ppo_kl_coef", "dro_beta", "rollout_correction")}  # fmt: skip
    return ActorConfig(
        strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(**pl), **kw
    )


def losses() -> None:
    common = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    cases = {
        "vanilla": ({}, {}),
        "gspo": ({}, {}),
        "cispo": ({}, {}),
        "sapo": ({"tau_pos": 1.0, "tau_neg": 1.05}, {"tau_pos": 1.0, "tau_neg": 1.05}),
        "geo_mean": ({}, {}),
        "dppo_tv": ({}, {}),
        "dppo_kl": ({}, {}),
        "clip_cov": ({"clip_cov_ratio": 0.2, "clip_cov_lb": -5.0, "clip_cov_ub": 5.0},
                     {"clip_cov_ratio": 0.2, "clip_cov_lb": -5.0, "clip_cov_ub": 5.0}),
        "kl_cov": ({"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5}, {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5}),
        "dro": ({"dro_beta": 0.3}, {"dro_beta": 0.3}),
        "gpg": ({}, {}),
    }  # fmt: skip
    for seed in range(3):
        _, m, _, old, lp0, adv = inputs(seed)
        for with_w in (False, True):
            w = torch.rand(m.shape, generator=torch.Generator().manual_seed(seed)) + 0.5 if with_w else None
            for name, (ours_kw, verl_kw) in cases.items():
                mode = "seq-mean-token-mean" if name in ("sapo", "geo_mean", "gspo") else "token-mean"
                ours_fn = L.get_policy_loss(name)
                import inspect

                params = inspect.signature(ours_fn).parameters
                kw = {k: v for k, v in {**common, **ours_kw, "loss_agg_mode": mode, "rollout_is_weights": w}.items()
                      if k in params}  # fmt: skip
                a = lp0.clone().requires_grad_(True)
                torch.manual_seed(seed)
                loss_a, met_a = ours_fn(old, a, adv, m, **kw)
                loss_a.backward()
                b = lp0.clone().requires_grad_(True)
                torch.manual_seed(seed)
                cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, **verl_kw)
                loss_b, met_b = V.get_policy_loss_fn(name)(old, b, adv, m, loss_agg_mode=mode, config=cfg,
                                                           rollout_is_weights=w)  # fmt: skip
                loss_b.backward()
                tag = f"loss {name} seed {seed}{' +IS' if with_w else ''}"
                record(f"{tag}: value", loss_a.detach(), loss_b.detach())
                record(f"{tag}: gradient", a.grad, b.grad)
                shared = {k: v for k, v in met_a.items() if f"actor/{k}" in met_b}
                record(f"{tag}: metrics", shared, {k: met_b[f"actor/{k}"] for k in shared})


def kl_and_aggregation() -> None:
    _, m, _, ref, lp0, loss_mat = inputs(5)
    for kind in L.KL_PENALTY_KINDS:
        a, b = lp0.clone().requires_grad_(True), lp0.clone().requires_grad_(True)
        ka, kb = L.kl_penalty(a, ref, kind), V.kl_penalty(b, ref, kind)
        (ka * m).sum().backward()
        (kb * m).sum().backward()
        record(f"kl {kind}: value", ka.detach() * m, kb.detach() * m)
        record(f"kl {kind}: gradient", a.grad, b.grad)
    for mode in L.LOSS_AGG_MODES:
        for factor in (None, 16):
            if factor is not None and mode != "seq-mean-token-sum-norm":
                continue
            record(f"agg {mode} loss_scale_factor={factor}", L.agg_loss(loss_mat, m, mode, factor),
                   V.agg_loss(loss_mat, m, mode, loss_scale_factor=factor))  # fmt: skip


def correction() -> None:
    settings = [
        {"rollout_is": "token", "rollout_is_threshold": 2.0},
        {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
        {"rollout_is": "token", "rollout_is_threshold": "0.5_1.5"},
        {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_is_batch_normalize": True},
        {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True},
        {"rollout_rs": "token_k1", "rollout_rs_threshold": 1.3},
        {"rollout_rs": "token_k2,seq_mean_k3", "rollout_rs_threshold": "0.02,0.01"},
        {"rollout_rs": "seq_sum_k1,seq_max_k2", "rollout_rs_threshold": "0.5_2.0,0.05"},
        {"rollout_rs": "seq_sum_k2,seq_sum_k3,seq_mean_k1,seq_mean_k2,seq_max_k3,token_k3", "rollout_rs_threshold": "0.05,0.05,1.2,0.05,0.05,0.05"},
        {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1", "rollout_rs_threshold": 1.5},
    ]  # fmt: skip
    for seed in range(2):
        _, m, _, old, rollout, _ = inputs(seed + 20)
        for s in settings:
            wa, ka, ma = rollout_correction(old, rollout, m, **s)
            pb, kb, mb = VRC.compute_rollout_correction_and_rejection_mask(old, rollout, m, **s)
            tag = f"rollout_corr {s} seed {seed}"
            if wa is not None:
                record(f"{tag}: weights", wa, pb.batch["rollout_is_weights"])
            record(f"{tag}: mask", ka, kb)
            record(f"{tag}: metrics", ma, mb)
        # bypass_mode: the loss against the rollout log-probs, both loss types
        _, _, _, _, lp0, adv = inputs(seed + 30)
        for loss_type in ("ppo_clip", "reinforce"):
            rc = {"loss_type": loss_type, "rollout_is": "token", "rollout_is_threshold": 2.0,
                  "rollout_rs": "token_k1", "rollout_rs_threshold": 2.0}  # fmt: skip
            a, b = lp0.clone().requires_grad_(True), lp0.clone().requires_grad_(True)
            la, met_a = L.compute_policy_loss_bypass_mode(rollout, a, adv, m, clip_ratio_high=0.28, **rc)
            cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, rollout_correction=rc)
            # as verl's trainer sets it: the mini-batch's tokens before the loss rejects any
            cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(m.sum()), global_batch_size=len(m))
            lb, met_b = V.compute_policy_loss_bypass_mode(rollout, b, adv, m, config=cfg)
            la.backward()
            lb.backward()
            tag = f"bypass_mode {loss_type} seed {seed}"
            record(f"{tag}: value", la.detach(), lb.detach())
            record(f"{tag}: gradient", a.grad, b.grad)
            corr = {k: v for k, v in met_a.items() if k.startswith("rollout_corr/")}
            record(
                f"{tag}: rollout_corr metrics",
                corr,
                {k: v for k, v in met_b.items() if k.startswith("rollout_corr/")},
            )


def main() -> int:
    estimators()
    losses()
    kl_and_aggregation()
    correction()
    bad = [(n, d) for n, d in results if not d <= TOL]
    for name, diff in results:
        print(f"{diff:10.2e}  {name}")
    print(f"\n{len(results) - len(bad)} of {len(results)} cases within {TOL:g}")
    for name, diff in bad:
        print(f"OVER: {diff:.3g}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
