import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lucidrl.data.dataset import DatasetError, PromptLoader, collate, load_prompts


def test_kk_rows_become_prompts_with_prefilled_think(kk_data, tiny_tokenizer):
    samples, report = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=1024)
    assert len(samples) == 32 and report.overlong_filtered == 0
    s = samples[0]
    assert s.data_source == "kk_logic" and s.assistant_prefix == "<think>"
    text = tiny_tokenizer.decode(s.input_ids)
    assert text.endswith("<|im_start|>assistant\n<think>")
    assert "knights and knaves" in text


def test_overlong_prompt_is_an_error_naming_file_and_row(kk_data, tiny_tokenizer):
    with pytest.raises(
        DatasetError,
        match=r"train.parquet row 0: prompt is \d+ tokens, longer than data.max_prompt_length=10",
    ):
        load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=10)


def test_overlong_prompts_filtered_and_counted(kk_data, tiny_tokenizer):
    samples, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=100_000)
    lengths = sorted(len(s.input_ids) for s in samples)
    cut = lengths[len(lengths) // 2]
    kept, report = load_prompts(
        [kk_data["train"]], tiny_tokenizer, max_prompt_length=cut, filter_overlong=True
    )
    assert report.overlong_filtered == sum(n > cut for n in lengths) > 0
    assert len(kept) == 32 - report.overlong_filtered
    assert all(len(s.input_ids) <= cut for s in kept)


def test_missing_column_names_column_and_file(tmp_path, tiny_tokenizer):
    path = tmp_path / "bad.parquet"
    pq.write_table(
        pa.table({"data_source": ["kk_logic"], "prompt": [[{"role": "user", "content": "hi"}]]}), path
    )
    with pytest.raises(DatasetError, match=r"bad.parquet' has no column 'reward_model'"):
        load_prompts([str(path)], tiny_tokenizer, max_prompt_length=100)
    with pytest.raises(DatasetError, match=r"has no column 'question'.*data.prompt_key"):
        load_prompts([str(path)], tiny_tokenizer, max_prompt_length=100, prompt_key="question")


def test_missing_file_and_bad_messages(tmp_path, tiny_tokenizer):
    with pytest.raises(DatasetError, match="'nope.parquet' does not exist"):
        load_prompts(["nope.parquet"], tiny_tokenizer, max_prompt_length=100)
    path = tmp_path / "msg.parquet"
    pq.write_table(
        pa.table(
            {"data_source": ["x"], "prompt": [[{"role": "user"}]], "reward_model": [{"ground_truth": "1"}]}
        ),
        path,
    )
    with pytest.raises(DatasetError, match="msg.parquet row 0: message"):
        load_prompts([str(path)], tiny_tokenizer, max_prompt_length=100)


def test_message_fields_reach_the_template_and_a_none_content_is_refused():
    from lucidrl.data.prompt_format import check_messages as _check_messages

    # parquet fills a key only some messages have with None: dropped; the rest passes as the data says
    messages = [{"role": "user", "content": "a", "name": "bob", "tool_calls": None}]
    assert _check_messages(messages, "f row 0", "prompt") == [{"role": "user", "content": "a", "name": "bob"}]
    with pytest.raises(
        DatasetError, match="f row 3: message .* needs a 'role' and a 'content' that are not None"
    ):
        _check_messages([{"role": "user", "content": None}], "f row 3", "prompt")
    # a role of None: parquet fills in a key that only other rows have (it failed inside the chat template)
    with pytest.raises(DatasetError, match="f row 4: message .* needs a 'role'"):
        _check_messages([{"role": None, "content": "hi"}], "f row 4", "prompt")


def test_collate_left_pads_and_loader_is_seeded(kk_data, tiny_tokenizer):
    samples, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=1024)
    batch = collate(samples[:3], tiny_tokenizer.pad_token_id)
    lengths = [len(s.input_ids) for s in samples[:3]]
    assert batch["prompt_mask"].sum(-1).tolist() == lengths
    row = batch["prompts"][0][batch["prompt_mask"][0].bool()].tolist()
    assert row == samples[0].input_ids
    assert batch["prompt_mask"][:, -1].tolist() == [1, 1, 1]  # left padding: last column always real
    a = [b["uid"] for b in PromptLoader(samples, 8, 0, shuffle=True, seed=3).epoch(0)]
    b = [b["ground_truth"] for b in PromptLoader(samples, 8, 0, shuffle=True, seed=3).epoch(0)]
    c = [b["ground_truth"] for b in PromptLoader(samples, 8, 0, shuffle=True, seed=4).epoch(0)]
    assert len(a) == 4 and b != c
    loader = PromptLoader(samples[:10], 4, 0, shuffle=False, seed=0)
    assert loader.steps_per_epoch == 2 and loader.dropped_per_epoch == 2
    with pytest.raises(DatasetError, match="larger than the 10 training prompts"):
        PromptLoader(samples[:10], 16, 0, shuffle=False, seed=0)


def test_loader_drawn_is_the_samples_of_the_first_batches_across_epochs(kk_data, tiny_tokenizer):
    """What the demo evaluates as the prompts GRPO drew: the batches' own samples, in order, the
    incomplete last batch of each epoch left out as epoch() leaves it out."""
    samples, _ = load_prompts([kk_data["train"]], tiny_tokenizer, max_prompt_length=1024)
    loader = PromptLoader(samples[:10], 4, 0, shuffle=True, seed=3)  # 2 batches an epoch, 2 left out
    batches = [b["ground_truth"] for e in range(3) for b in loader.epoch(e)]
    for n in (1, 2, 3, 5):
        assert [s.ground_truth for s in loader.drawn(n)] == [g for b in batches[:n] for g in b]
    assert loader.drawn(0) == [] and loader.order(1) != loader.order(0)


def test_a_raw_prompt_that_prefills_think_in_the_user_message_is_refused_as_chat():
    """Rendered with the chat template (data.prompt_format=chat), a template in a user message would put the
    model after the template's own assistant header and hide the <think> from the reward."""
    from lucidrl.data.prompt_format import check_messages, render_prompt

    raw = "<|im_start|>user\nA very special island...<|im_end|>\n<|im_start|>assistant\n<think>"
    with pytest.raises(DatasetError, match=r"f row 2: .*user message ending in '<think>'.*prompt_format=raw"):
        render_prompt(None, [{"role": "user", "content": raw}], "f row 2", prompt_format="chat")
    with pytest.raises(DatasetError, match="user message ending in '<think>'"):
        render_prompt(None, "quiz <think>", "f row 0", prompt_format="auto")  # no markup: chat, refused
    ok = [{"role": "user", "content": "quiz"}, {"role": "assistant", "content": "<think>"}]
    assert check_messages(ok, "f row 0", "prompt") == ok
    assert check_messages("quiz", "f row 0", "prompt") == [{"role": "user", "content": "quiz"}]
