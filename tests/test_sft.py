"""`lucidrl sft`: checkpoints and resuming with the RL trainer's keys; a resumed run ends where an
uninterrupted one does."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lucidrl.cli import main
from lucidrl.config import ConfigError, SFTConfig, load_config
from lucidrl.trainer import checkpoint
from lucidrl.trainer.sft import SFTTrainer
from lucidrl.workers.training.train_state import CheckpointError


def _cfg(tmp_path, kk_data, tiny_model, run: str, *extra: str) -> SFTConfig:
    return load_config(
        None,
        [
            f"model.path={tiny_model['path']}",
            f"data.train_files=[{kk_data['train']}]",
            f"data.val_files=[{kk_data['val']}]",
            "data.batch_size=8",  # 32 rows: 4 steps an epoch, so 6 steps cross into a reshuffled epoch
            "micro_batch_size=4",
            "optim.lr=1e-3",
            "optim.warmup_steps=4",  # the LR schedule is part of the state
            "trainer.logger=[jsonl]",
            f"trainer.run_dir={tmp_path / run}",
            *extra,
        ],
        schema=SFTConfig,
    )


def _sft(tmp_path, kk_data, tiny_model, run: str, *extra: str) -> SFTTrainer:
    trainer = SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, run, *extra))
    trainer.fit()
    return trainer


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_stopped_and_resumed_sft_run_ends_where_an_uninterrupted_one_does(
    tmp_path, kk_data, tiny_model, capsys
):
    straight = _sft(tmp_path, kk_data, tiny_model, "straight", "trainer.total_training_steps=6")
    _sft(tmp_path, kk_data, tiny_model, "resumed", "trainer.total_training_steps=3", "trainer.save_freq=3")
    resumed = _sft(
        tmp_path, kk_data, tiny_model, "resumed", "trainer.total_training_steps=6", "trainer.save_freq=3"
    )
    assert resumed.resumed_from == tmp_path / "resumed" / "checkpoints" / "global_step_3"
    assert resumed.resume_changes == {"trainer.total_training_steps": (3, 6)}
    out = capsys.readouterr().out
    assert "resumed from" in out and "after step 3" in out and "global_step_6 (" in out

    a = load_file(straight.run_dir / "final" / "model.safetensors")
    b = load_file(resumed.run_dir / "final" / "model.safetensors")
    start = load_file(f"{tiny_model['path']}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
    assert any(not torch.equal(a[k], start[k]) for k in a)
    ra, rb = _records(straight.run_dir), _records(resumed.run_dir)
    assert [r["step"] for r in rb] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(ra, rb, strict=True):
        for key in ("sft/loss", "sft/grad_norm", "sft/lr", "perf/tokens"):
            assert x[key] == y[key], (x["step"], key, x[key], y[key])


@pytest.mark.slow
def test_an_sft_checkpoint_is_a_model_folder_and_exports(tmp_path, kk_data, tiny_model, capsys):
    from transformers import AutoModelForCausalLM

    trainer = _sft(
        tmp_path,
        kk_data,
        tiny_model,
        "run",
        "trainer.total_training_steps=3",
        "trainer.save_freq=2",
        "trainer.max_ckpt_to_keep=1",
    )
    root = checkpoint.checkpoints_dir(trainer.run_dir)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_3", "latest"]  # the last step saves too
    assert json.loads((root / "global_step_3" / "trainer_state.json").read_text())["kind"] == "sft"
    final = load_file(trainer.run_dir / "final" / "model.safetensors")
    direct = AutoModelForCausalLM.from_pretrained(
        str(root / "global_step_3" / "actor" / "model"), local_files_only=True
    ).state_dict()
    assert all(torch.equal(final[k], direct[k]) for k in final)
    out = tmp_path / "exported"
    assert main(["export", str(trainer.run_dir), str(out)]) == 0
    exported = load_file(out / "model.safetensors")
    assert sorted(final) == sorted(exported) and all(torch.equal(final[k], exported[k]) for k in final)
    # more steps with the batch changed: refused, naming the key; an RL run cannot resume it either
    with pytest.raises(CheckpointError, match=r"data.batch_size: 8 in the checkpoint, 4 now"):
        SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, "run", "data.batch_size=4"))
    with pytest.raises(
        CheckpointError, match=r"is a checkpoint of `lucidrl sft`, and this is `lucidrl train`"
    ):
        checkpoint.resumable(root / "global_step_3", {}, kind="rl")


def test_the_old_sft_checkpoint_key_says_what_replaced_it():
    with pytest.raises(ConfigError, match=r"'trainer.checkpoint_freq' .* is gone: write trainer.save_freq"):
        load_config(
            None, ["model.path=/m", "data.train_files=[/t]", "trainer.checkpoint_freq=5"], schema=SFTConfig
        )
    with pytest.raises(ConfigError, match=r"'trainer.save_freq' .* must be >= -1"):
        load_config(
            None, ["model.path=/m", "data.train_files=[/t]", "trainer.save_freq=-2"], schema=SFTConfig
        )


def test_micro_batches_cover_every_row_once_sorted_and_within_the_token_budget():
    from lucidrl.data.dataset import DatasetError
    from lucidrl.data.sft_dataset import SFTSample, sft_micro_batches

    rows = [SFTSample(list(range(n)), 1) for n in (9, 3, 7, 3, 12, 5, 1, 8)]
    plain = sft_micro_batches(rows, 3, length_sorted=False)
    assert [[len(r.input_ids) for r in p] for p in plain] == [[9, 3, 7], [3, 12, 5], [1, 8]]
    ordered = sft_micro_batches(rows, 3, length_sorted=True)
    assert [[len(r.input_ids) for r in p] for p in ordered] == [[1, 3, 3], [5, 7, 8], [9, 12]]
    assert ordered[0][1] is rows[1] and ordered[0][2] is rows[3]  # ties keep batch order
    budget = sft_micro_batches(rows, 3, length_sorted=True, max_tokens=16)
    assert sorted(id(r) for p in budget for r in p) == sorted(id(r) for r in rows)
    # each piece at most 16 padded tokens (rows x longest row), and cut only where the next row would not fit
    assert [[len(r.input_ids) for r in p] for p in budget] == [[1, 3, 3], [5, 7], [8], [9], [12]]
    with pytest.raises(DatasetError, match=r"13 tokens, more than data.max_token_len_per_gpu=12"):
        sft_micro_batches([SFTSample(list(range(13)), 1)], 3, length_sorted=True, max_tokens=12)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize(
    "cutting",
    [
        ("micro_batch_size=2", "length_sorted_micro_batches=true"),
        ("micro_batch_size=8", "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=1024"),
    ],
)
@pytest.mark.slow
def test_sorted_or_token_budget_micro_batches_give_the_gradient_of_one_forward(
    tmp_path, kk_data, tiny_model, cutting
):
    whole = SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, "whole", "micro_batch_size=8"))
    cut = SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, "cut", *cutting))
    rows = next(whole._batches())
    lengths = {len(r.input_ids) for r in rows}
    assert len(lengths) > 2  # rows of different lengths, so the cut pieces are padded differently
    pieces = cut._micro_batches(rows)
    assert len(pieces) > 1 and [len(r.input_ids) for p in pieces for r in p] == sorted(
        len(r.input_ids) for r in rows
    )
    for trainer in (whole, cut):
        trainer.optimizer.step = lambda: None  # keep the weights: compare the gradients
        trainer.step(rows)
    for (name, a), b in zip(whole.model.named_parameters(), cut.model.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), name


def test_a_token_budget_below_max_length_is_refused(tmp_path, kk_data, tiny_model):
    with pytest.raises(ConfigError, match=r"data.max_token_len_per_gpu=100 is below data.max_length=1024"):
        _cfg(
            tmp_path, kk_data, tiny_model, "r", "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=100"
        )
    # the budget only binds when it cuts: with rows as the cut, the same budget is not looked at
    assert (
        _cfg(tmp_path, kk_data, tiny_model, "r", "data.max_token_len_per_gpu=100").data.max_token_len_per_gpu
        == 100
    )
    # a budget of exactly data.max_length fits the longest row the data allows
    _cfg(tmp_path, kk_data, tiny_model, "r", "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=1024")


def test_rows_must_divide_the_batch_unless_the_cut_is_by_tokens(tmp_path, kk_data, tiny_model):
    with pytest.raises(
        ConfigError, match=r"data.batch_size=8 is not divisible by micro_batch_size=3; .*use_dynamic_bsz"
    ):
        _cfg(tmp_path, kk_data, tiny_model, "r", "micro_batch_size=3")
    assert _cfg(
        tmp_path, kk_data, tiny_model, "r", "micro_batch_size=3", "data.use_dynamic_bsz=true"
    ).data.use_dynamic_bsz


@pytest.mark.slow
def test_rows_left_out_of_each_epoch_are_announced(tmp_path, kk_data, tiny_model, capsys):
    # 32 rows in batches of 5: 2 rows do not fill a batch
    _sft(tmp_path, kk_data, tiny_model, "run", "data.batch_size=5", "micro_batch_size=5",
         "data.shuffle=false", "trainer.total_training_steps=1")  # fmt: skip
    out = capsys.readouterr().out
    assert "2 of the 32 training rows do not fill a batch of data.batch_size=5" in out
    assert "the same rows every epoch: data.shuffle=false" in out


def test_a_response_that_ends_with_the_eos_gets_no_second_one(tmp_path, tiny_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lucidrl.data.dataset import DatasetError
    from lucidrl.data.sft_dataset import load_sft_rows

    eos = tiny_tokenizer.eos_token
    path = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"prompt": ["q", "q"], "response": ["A knight", f"A knight{eos}"]}), path)
    kw = dict(max_length=100, prompt_key="prompt", response_key="response", what="data.train_files")
    plain, ends = load_sft_rows([str(path)], tiny_tokenizer, **kw)
    assert plain.input_ids == ends.input_ids and plain.input_ids[-1] == tiny_tokenizer.eos_token_id
    assert plain.input_ids[-2] != tiny_tokenizer.eos_token_id
    (tmp_path / "not.parquet").write_text("a,b\n1,2\n")
    with pytest.raises(DatasetError, match="'.*not.parquet' is not a readable parquet file"):
        load_sft_rows([str(tmp_path / "not.parquet")], tiny_tokenizer, **kw)


def test_the_loss_is_on_response_tokens_only_and_over_long_rows_are_all_counted(
    tmp_path, tiny_tokenizer, tiny_model
):
    """No test looked at the labels: labelling the prompt too passed every SFT test. And an over-long row
    was an error naming only the first, so raising data.max_length ran into the next one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lucidrl.data.dataset import DatasetError
    from lucidrl.data.sft_dataset import IGNORE, collate_sft, load_sft_rows
    from lucidrl.models import load_model
    from lucidrl.trainer.sft import response_loss_sum

    path = tmp_path / "sft.parquet"
    prompts = [
        [{"role": "user", "content": "Who is a knight?"}],
        [{"role": "user", "content": "And a knave?"}],
    ]
    pq.write_table(pa.table({"prompt": prompts, "response": ["Ava is a knight", "Bo"]}), path)
    kw = dict(prompt_key="prompt", response_key="response", what="data.train_files")
    samples = load_sft_rows([str(path)], tiny_tokenizer, max_length=200, **kw)
    batch = collate_sft(samples, tiny_tokenizer.pad_token_id)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        assert (batch["labels"][i, : s.n_prompt] == IGNORE).all() and (batch["labels"][i, n:] == IGNORE).all()
        assert batch["labels"][i, s.n_prompt : n].tolist() == s.input_ids[s.n_prompt :]
        assert s.input_ids[-1] == tiny_tokenizer.eos_token_id
        assert tiny_tokenizer.decode(s.input_ids[s.n_prompt : -1]).strip() == ["Ava is a knight", "Bo"][i]
    # the summed loss is the response tokens' cross-entropy, token by token, computed here by hand
    model = load_model(tiny_model["path"]).eval()
    with torch.no_grad():
        loss, count, _ = response_loss_sum(model, batch)
        logp = torch.log_softmax(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float(), -1
        )
    by_hand = -sum(
        logp[i, t - 1, s.input_ids[t]]
        for i, s in enumerate(samples)
        for t in range(s.n_prompt, len(s.input_ids))
    )
    assert count == sum(len(s.input_ids) - s.n_prompt for s in samples)
    assert abs(float(loss) - float(by_hand)) < 1e-4 * abs(float(by_hand))
    # every over-long row is counted, the longest named
    lengths = sorted(len(s.input_ids) for s in samples)
    with pytest.raises(DatasetError) as info:
        load_sft_rows([str(path)], tiny_tokenizer, max_length=lengths[0] - 1, **kw)
    text = str(info.value)
    assert f"2 of 2 rows are longer than data.max_length={lengths[0] - 1}" in text
    assert f"the longest {lengths[1]} tokens" in text and f"Raise data.max_length to {lengths[1]}" in text
    with pytest.raises(DatasetError, match=f"1 of 2 rows are longer than data.max_length={lengths[0]}"):
        load_sft_rows([str(path)], tiny_tokenizer, max_length=lengths[0], **kw)


@pytest.mark.parametrize(
    "chunk", [7, 4096]
)  # chunks that cut the labelled tokens, and one that holds them all
def test_the_chunked_lm_head_gives_the_loss_gradient_and_accuracy_of_the_whole_logits(
    tmp_path, kk_data, tiny_model, chunk
):
    whole = SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, "whole"))
    chunked = SFTTrainer(_cfg(tmp_path, kk_data, tiny_model, "chunked", f"head_chunk_tokens={chunk}"))
    batches = whole._batches()
    for _ in range(8):  # a model that gets some tokens right, so the accuracies say something
        whole.step(next(batches))
    chunked.model.load_state_dict(whole.model.state_dict())
    # the chunked trainer runs the decoder and the head itself: the model's own forward (whole logits)
    # is never called, so a setting that did not reach the loss fails here
    chunked.model.forward = lambda *a, **k: pytest.fail("the chunked trainer formed the whole logits")
    rows = next(batches)
    metrics = {}
    for name, trainer in (("whole", whole), ("chunked", chunked)):
        trainer.optimizer.step = lambda: None  # keep the weights: compare the gradients
        metrics[name] = {**trainer.step(rows), **trainer.validate()}
    for key in ("sft/loss", "val/loss", "val/token_acc"):
        assert metrics["chunked"][key] == pytest.approx(metrics["whole"][key], rel=1e-5), key
    assert 0 < metrics["whole"]["val/token_acc"] < 1
    for (name, a), b in zip(whole.model.named_parameters(), chunked.model.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6), name


def test_a_chunked_head_on_a_model_whose_logits_are_scaled_is_refused_naming_the_key(
    tmp_path, kk_data, tiny_model
):
    import shutil

    folder = tmp_path / "scaled_model"
    shutil.copytree(tiny_model["path"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    with pytest.raises(
        ConfigError, match=r"head_chunk_tokens > 0.*final_logit_softcapping.*head_chunk_tokens=0"
    ):
        SFTTrainer(_cfg(tmp_path, kk_data, {"path": folder}, "scaled", "head_chunk_tokens=64"))
