"""Micro-batches on data-parallel ranks: every rank must run as many forwards and backwards, since each
is a collective under FSDP2 (all-gathers, reduce-scatters) and DDP (gradient all-reduces).

A token-budget cut (`actor.use_dynamic_bsz`) depends on each rank's response lengths, so two ranks
cut their shares into different numbers of micro-batches; before `micro_batches.match_count` such a
run hung at the first unmatched collective. Here two gloo ranks hold shares of very different
lengths (cut on their own into 3 and 4 micro-batches) and must finish the log-prob pass
and the update with the weights one process gets from the whole batch. With bfloat16 compute FSDP2
gathers bf16 parameters and reduces float32 gradients (MixedPrecisionPolicy) over float32 shards:
measured against one process under bf16 autocast, log-probs within 1e-2 (3.9e-3 measured) and
weights after one Adam step (lr 1e-2) 4e-5 apart on average.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import end_rank

from lucidrl.batch import Batch
from lucidrl.config.schema import ActorConfig, OptimConfig
from lucidrl.workers.training.micro_batches import match_count, token_budget_micro_batches
from lucidrl.workers.training.rank_metrics import combine_ranks

WIDTH = 12  # response columns
N = 4  # samples per prompt


def _batch() -> Batch:
    """16 samples of 4 left-padded prompts: the first two prompts' responses 1-3 tokens, the last two's 9-12."""
    g = torch.Generator().manual_seed(0)
    prompt_lengths = torch.tensor([6, 9, 7, 8]).repeat_interleave(N)
    prompt_mask = (torch.arange(9)[None, :] >= 9 - prompt_lengths[:, None]).long()
    lengths = torch.tensor([1, 2, 3, 2, 3, 1, 2, 3, 9, 12, 10, 11, 12, 9, 10, 12])
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    tensors = {
        "prompts": torch.randint(3, 200, (4, 9), generator=g).repeat_interleave(N, 0) * prompt_mask,
        "prompt_mask": prompt_mask,
        "responses": torch.randint(3, 200, (16, WIDTH), generator=g) * mask.long(),
        "response_mask": mask,
        "old_log_probs": -torch.rand(16, WIDTH, generator=g) * mask,
        "advantages": torch.randn(16, 1, generator=g).expand(-1, WIDTH) * mask,
    }
    return Batch(tensors, {"uid": [f"p{i // N}" for i in range(16)]})


def _config(budget: int) -> ActorConfig:
    return ActorConfig(
        optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=16, use_kl_loss=False,
        use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget, log_prob_max_token_len_per_gpu=budget,
    )  # fmt: skip


def _budget(batch: Batch) -> int:
    return 2 * (batch["prompts"].shape[1] + WIDTH)  # two long samples, or many short ones, per forward


def _rank(rank: int, port: int, model_path: str, strategy: str, out: str) -> None:
    from lucidrl.models import load_model
    from lucidrl.workers.common.distributed import full_state_dict, wrap_for_training
    from lucidrl.workers.training.actor import ActorWorker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # a short timeout: a collective left unmatched fails the test instead of hanging it
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    batch = _batch()
    share = batch.slice(rank * 8, rank * 8 + 8)  # rank 0: the short responses, rank 1: the long ones
    compute = torch.bfloat16 if strategy == "fsdp2-bf16" else None
    model = wrap_for_training(load_model(model_path), strategy.removesuffix("-bf16"), "cpu", compute)
    actor = ActorWorker(
        model,
        _config(_budget(batch)),
        temperature=1.0,
        samples_per_prompt=N,
        world_size=2,
        compute_dtype=compute,
    )
    counts = [len(actor._micro_batches(share))]
    log_probs = actor.compute_log_prob(share)["old_log_probs"]
    if strategy.startswith(
        "fsdp2"
    ):  # the reference is sharded like the actor: its forwards are collectives too
        from lucidrl.workers.training.actor import ReferenceWorker

        reference = ReferenceWorker(
            wrap_for_training(load_model(model_path).requires_grad_(False), "fsdp2", "cpu", compute),
            micro_batch_size=16, temperature=1.0, max_tokens=_budget(batch), world_size=2, compute_dtype=compute,
        )  # fmt: skip
        assert reference.compute_log_prob(share)["ref_log_probs"].allclose(log_probs, atol=1e-5)
    actor.update(share)
    if strategy.startswith("fsdp2"):
        # a no-grad forward leaves FSDP2's root gathered; saving (with optimizer state) must still work
        from pathlib import Path

        from lucidrl.workers.training.train_state import save_train_state

        actor.compute_log_prob(share)
        save_train_state(
            actor.model, actor.optimizer, actor.scheduler, Path(out) / "ckpt", {}, hf_model=model
        )
    state = full_state_dict(actor.model)
    if rank == 0:
        torch.save({"counts": counts, "state": state}, f"{out}/rank0.pt")
    torch.save({"log_probs": log_probs}, f"{out}/lp{rank}.pt")
    end_rank()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_match_count_halves_the_largest_micro_batch_in_order():
    batch = _batch().slice(0, 8)
    chunks = token_budget_micro_batches(batch, 8 * (batch["prompts"].shape[1] + 3), length_sorted=True)
    assert [len(idx) for idx, _ in chunks] == [8]
    split = match_count(batch, chunks, 3, trim=True)
    order = chunks[0][0].tolist()  # 8 -> 4 + 4 -> 2 + 2 + 4, each part in the cut's order
    assert [idx.tolist() for idx, _ in split] == [order[:2], order[2:4], order[4:]]
    assert sorted(torch.cat([idx for idx, _ in split]).tolist()) == list(range(8))
    assert all(mb["responses"].shape[1] == int(mb["response_mask"].sum(-1).max()) for _, mb in split)
    with pytest.raises(ValueError, match="cannot cut 8 samples into 9"):
        match_count(batch, chunks, 9, trim=True)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", "ddp", "fsdp2-bf16"])
def test_token_budget_cuts_agree_across_ranks_and_match_one_process(strategy, tiny_model, tmp_path):
    from lucidrl.models import load_model
    from lucidrl.workers.training.actor import ActorWorker

    path = str(tiny_model["path"])
    mp.start_processes(
        _rank, args=(_free_port(), path, strategy, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    batch = _batch()
    budget = _budget(batch)
    # each rank on its own would cut its share into 1 (short) and 4 (long) micro-batches
    cut = [len(token_budget_micro_batches(batch.slice(r * 8, r * 8 + 8), budget, True)) for r in (0, 1)]
    assert cut[0] < cut[1]
    rank0 = torch.load(tmp_path / "rank0.pt")
    assert rank0["counts"] == [cut[1]]  # rank 0 ran as many as rank 1 needed

    torch.manual_seed(0)
    model = load_model(path)
    bf16 = strategy == "fsdp2-bf16"  # against one process with bf16 autocast over float32 weights
    actor = ActorWorker(
        copy.deepcopy(model), _config(budget), temperature=1.0, samples_per_prompt=N,
        compute_dtype=torch.bfloat16 if bf16 else None,
    )  # fmt: skip
    expected_lp = actor.compute_log_prob(batch)["old_log_probs"]
    got_lp = torch.cat([torch.load(tmp_path / f"lp{r}.pt")["log_probs"] for r in (0, 1)])
    torch.testing.assert_close(got_lp, expected_lp, atol=1e-2 if bf16 else 1e-5, rtol=0)
    actor.update(batch)
    expected = actor.model.state_dict()
    moved = max((expected[k] - v).abs().max().item() for k, v in model.state_dict().items())
    diffs = torch.cat([(rank0["state"][k] - expected[k]).abs().flatten() for k in expected])
    assert all(v.dtype == torch.float32 for v in rank0["state"].values())  # float32 master weights
    if bf16:  # Adam's first step is about lr x sign(gradient): rounding flips it only where it is ~0
        assert moved > 1e-3 and diffs.mean() < 0.05 * 1e-2, (moved, diffs.mean())
    else:
        assert moved > 1e-3 and diffs.max() < 5e-5, (moved, diffs.max())


def _tied(batch: Batch, groups: tuple[int, ...]) -> Batch:
    """`batch` with the groups (prompts) in `groups` tied: advantage 0 on every sample."""
    out = copy.deepcopy(batch)
    adv = out["advantages"].clone()
    for g in groups:
        adv[g * N : g * N + N] = 0.0
    out.set("advantages", adv)
    return out


# rank 0 holds prompts 0-1, rank 1 prompts 2-3: first rank 0 has nothing to learn, then half as much as
# rank 1, then neither has (AdamW still steps, on a zero gradient)
SKIP_UPDATES = [(0, 1), (1,), (0, 1, 2, 3)]


def _skip_config(skip: bool) -> ActorConfig:
    return ActorConfig(
        optim=OptimConfig(lr=1e-2), ppo_mini_batch_size=4, ppo_micro_batch_size=2, use_kl_loss=False,
        skip_zero_advantage=skip,
    )  # fmt: skip


def _skip_rank(rank: int, port: int, model_path: str, strategy: str, out: str) -> None:
    from lucidrl.models import load_model
    from lucidrl.workers.common.distributed import full_state_dict, wrap_for_training
    from lucidrl.workers.training.actor import ActorWorker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = wrap_for_training(load_model(model_path), strategy, "cpu", None)
    actor = ActorWorker(model, _skip_config(True), temperature=1.0, samples_per_prompt=N, world_size=2)
    forwards, micro_step = [], actor._micro_step

    def counted(ub, weight, *args, **kwargs):
        forwards[-1].append((len(ub), weight))
        return micro_step(ub, weight, *args, **kwargs)

    actor._micro_step = counted
    metrics = []
    for tied in SKIP_UPDATES:
        forwards.append([])
        metrics.append(actor.update(_tied(_batch(), tied).slice(rank * 8, rank * 8 + 8)))
    state = full_state_dict(actor.model)
    torch.save(
        {"forwards": forwards, "metrics": metrics, "state": state if rank == 0 else None},
        f"{out}/skip{rank}.pt",
    )
    end_rank()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_skipping_tied_groups_on_ranks_that_keep_different_numbers_matches_one_process(
    strategy, tiny_model, tmp_path
):
    """actor.skip_zero_advantage on two ranks: a rank that kept fewer samples (or none) runs as many
    forwards as the other, on a zero-advantage sample of loss weight zero, and the weights after the
    updates are one process's full updates'."""
    from lucidrl.models import load_model
    from lucidrl.workers.training.actor import ActorWorker

    path = str(tiny_model["path"])
    mp.start_processes(
        _skip_rank, args=(_free_port(), path, strategy, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    ranks = [torch.load(tmp_path / f"skip{r}.pt", weights_only=False) for r in (0, 1)]
    # update 1: rank 0 kept nothing, rank 1 all 8 samples (4 micro-batches of 2); update 2: 4 and 8;
    # update 3: neither rank runs a forward
    assert [[n for n, _ in f] for f in ranks[1]["forwards"]] == [[2, 2, 2, 2], [2, 2, 2, 2], []]
    assert ranks[0]["forwards"][2] == []
    assert ranks[0]["forwards"][0] == [(1, 0.0)] * 4
    assert [n for n, _ in ranks[0]["forwards"][1]] == [2, 2, 1, 1]
    assert [w for _, w in ranks[0]["forwards"][1][2:]] == [0.0, 0.0] and ranks[0]["forwards"][1][0][1] > 0

    torch.manual_seed(0)
    model = load_model(path)
    one = {}  # one process, the skip off and on
    for skip in (False, True):
        actor = ActorWorker(copy.deepcopy(model), _skip_config(skip), temperature=1.0, samples_per_prompt=N)
        one[skip] = ([actor.update(_tied(_batch(), tied)) for tied in SKIP_UPDATES], actor.model.state_dict())
    expected = one[False][1]
    moved = max((expected[k] - v).abs().max().item() for k, v in model.state_dict().items())
    diffs = torch.cat([(ranks[0]["state"][k] - expected[k]).abs().flatten() for k in expected])
    assert moved > 1e-3 and diffs.max() < 5e-5, (moved, diffs.max())
    for step in range(len(SKIP_UPDATES)):  # the ranks' metrics combine to the whole batch's
        got = combine_ranks([r["metrics"][step] for r in ranks])
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert got[key] == pytest.approx(one[False][0][step][key], rel=1e-4, abs=1e-6), (step, key)
        # the entropy of the kept samples, and the share left out, as one process with the skip logs them
        for key in ("actor/entropy", "actor/zero_advantage_skipped"):
            if key in one[True][0][step] or key in got:  # no entropy where nothing was kept
                assert got[key] == pytest.approx(one[True][0][step][key], rel=1e-4, abs=1e-6), (step, key)
        assert got["actor/zero_advantage_skipped"] == len(SKIP_UPDATES[step]) / 4
