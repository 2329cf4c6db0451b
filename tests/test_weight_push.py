"""What a weight push sends (weight_push.rollout_weights): plain HF names, LoRA merged, tied heads,
FSDP2 shards gathered."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from helpers import end_rank

from lucidrl.models import load_model
from lucidrl.workers.rollout.weight_push import probe_ids, probe_log_probs, rollout_weights


def test_tied_head_is_sent_under_both_names_when_asked(tiny_model):
    model = load_model(tiny_model["path"])
    assert model.config.tie_word_embeddings
    once = dict(rollout_weights(model, tied_copies=False))
    both = dict(rollout_weights(model))
    assert set(once) == {n for n, _ in model.named_parameters()} and "lm_head.weight" not in once
    assert set(both) - set(once) == {"lm_head.weight"}
    assert torch.equal(both["lm_head.weight"], both["model.embed_tokens.weight"])
    # cast before sending (bf16 engines)
    assert {t.dtype for t in dict(rollout_weights(model, torch.bfloat16)).values()} == {torch.bfloat16}


def test_lora_actor_is_sent_merged_under_the_base_names(tiny_model):
    from peft import LoraConfig, get_peft_model

    actor = get_peft_model(
        load_model(tiny_model["path"]), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    sent = dict(rollout_weights(actor, tied_copies=False))
    import copy

    merged = dict(copy.deepcopy(actor).merge_and_unload().named_parameters())
    assert set(sent) == set(merged)
    for name, tensor in merged.items():
        assert torch.allclose(sent[name], tensor, atol=1e-6), name
    base = dict(load_model(tiny_model["path"]).named_parameters())
    moved = [n for n in sent if not torch.equal(sent[n], base[n])]
    assert "model.layers.0.self_attn.q_proj.weight" in moved  # the adapters' delta is in
    assert all(".self_attn." in n or ".mlp." in n for n in moved)  # nothing else changed


def test_probe_log_probs_are_the_models_own(tiny_model):
    model = load_model(tiny_model["path"])
    ids = probe_ids(model.config.vocab_size, length=10)
    assert ids == probe_ids(model.config.vocab_size, length=10)  # fixed: every push probes the same
    lp = probe_log_probs(model, ids, None)
    logits = model(torch.tensor([ids])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1)[torch.arange(9), torch.tensor(ids[1:])]
    assert lp.shape == (9,) and torch.allclose(lp, expected.detach(), atol=1e-6)


def _fsdp_rank(rank: int, path: str, port: int, out: str) -> None:
    import torch.distributed as dist

    from lucidrl.workers.common.distributed import wrap_for_training

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = wrap_for_training(load_model(path), "fsdp2", "cpu")
    shapes = {n: tuple(p.to_local().shape) for n, p in model.named_parameters() if hasattr(p, "to_local")}
    assert shapes, "FSDP2 left no parameter sharded"
    sent = dict(rollout_weights(model))
    if rank == 0:
        torch.save({"sent": sent, "local_shapes": shapes}, out)
    end_rank()


@pytest.mark.slow
def test_fsdp2_shards_are_gathered_one_tensor_at_a_time(tiny_model, tmp_path):
    from lucidrl.workers.common.distributed import pick_port

    out = str(tmp_path / "sent.pt")
    mp.spawn(_fsdp_rank, args=(tiny_model["path"], pick_port("127.0.0.1", None), out), nprocs=2)
    got = torch.load(out)
    full = dict(load_model(tiny_model["path"]).named_parameters(remove_duplicate=False))
    assert set(got["sent"]) == set(full)
    for name, tensor in full.items():
        assert torch.equal(got["sent"][name], tensor.detach()), name
    # the ranks held halves: the push gathered them
    emb = "model.embed_tokens.weight"
    assert got["local_shapes"][emb][0] == full[emb].shape[0] // 2
