"""Tests for lucidrl.models: the tiny local Qwen2 builder and the offline loaders."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from lucidrl.models import (
    ModelLoadError,
    build_tiny_model,
    check_tokenizer_matches_model,
    load_model,
    load_tokenizer,
    train_tokenizer,
)

NAMES = ["Zoey", "Oliver", "Emily", "Jacob", "Sofia", "Liam", "Zoë", "René"]
CORPUS = [
    "A very special island is inhabited only by knights and knaves. "
    "Knights always tell the truth, and knaves always lie.",
    *(
        f'You meet 2 inhabitants: {a} and {b}. {a} says, "{b} is a knave if and only if {a} is a knight."'
        for a, b in zip(NAMES, NAMES[1:] + NAMES[:1], strict=True)
    ),
    "<think>If Zoey is a knight, then Oliver is a knave, which is consistent.</think>"
    "<answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>",
    "<think>Suppose Emily lies; then Jacob tells the truth.</think><answer>(1) Emily is a knave\n"
    "(2) Jacob is a knight</answer>",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 42 2024 and punctuation: (a), [b]; c! d? e's f're.",
]

VARIED_TEXTS = [
    "Zoey is a knight.",
    "(1) Zoey is a knight\n(2) Oliver is a knave",
    "  leading spaces,\ttabs\r\nand CRLF\n\n\n",
    "digits 12345 67890 3.14159 -7",
    "café, naïve, Zoë, René, e\u0301 (combining accent), Ünïcödé, 日本語, 🙂",
    "<|im_start|>user\nWho is a knight?<|im_end|>\n<|im_start|>assistant\n<think>hmm</think>"
    "<answer>(1) Zoey is a knight</answer><|im_end|>\n<|endoftext|>",
    "words the corpus never saw: xylophone quizzically",
    "",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_model(out, CORPUS, seed=0)
    return out


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir), local_files_only=True)


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_reloaded_tokenizer_gives_identical_ids(tiny_dir: Path, tokenizer, text: str) -> None:
    trained = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == trained.encode(text).ids
    assert tokenizer.decode(trained.encode(text).ids) == text.replace("e\u0301", "\u00e9")  # NFC


def test_reload_is_qwen2_tokenizer(tokenizer) -> None:
    # The pitfall the builder guards against only exists for this class; make sure we exercised it.
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"


def test_special_and_tag_tokens_are_single_ids(tokenizer) -> None:
    expected_ids = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for token, token_id in expected_ids.items():
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [token_id]
    for token in ("<think>", "</think>", "<answer>", "</answer>"):
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] >= 3, (token, ids)
        # Tags are not special: decoding with skip_special_tokens keeps them.
        assert tokenizer.decode(ids, skip_special_tokens=True) == token
    assert tokenizer.decode([1, 2, 0], skip_special_tokens=True) == ""


def test_pad_eos_and_config_ids(tiny_dir: Path, tokenizer) -> None:
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (2, 0, 0)
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] % 64 == 0 and config["vocab_size"] >= len(tokenizer)
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)


def test_chat_template_chatml(tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who lies?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho lies?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_continue_final_message(tokenizer) -> None:
    messages = [{"role": "user", "content": "Who lies?"}, {"role": "assistant", "content": "<think>"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert text == "<|im_start|>user\nWho lies?<|im_end|>\n<|im_start|>assistant\n<think>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<think>")


def test_model_loads_runs_forward_and_generates(tiny_dir: Path, tokenizer) -> None:
    model = load_model(str(tiny_dir))
    check_tokenizer_matches_model(model, tokenizer, str(tiny_dir))
    assert model.dtype == torch.float32
    ids = tokenizer(["Zoey is a knight", "Oliver"], add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([ids[0]])
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    assert logits.shape == (1, len(ids[0]), model.config.vocab_size)
    assert torch.isfinite(logits).all()
    out = model.generate(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=4, do_sample=False
    )
    assert out.shape[0] == 1 and len(ids[0]) < out.shape[1] <= len(ids[0]) + 4


def test_param_count_matches_reference(tmp_path: Path) -> None:
    # A full 1024-token vocabulary needs a corpus with enough distinct pairs; a list of words suffices.
    corpus = [
        " ".join(f"w{i}x{j} {chr(0x61 + i % 26)}{chr(0x61 + j % 26)}" for j in range(60)) for i in range(60)
    ]
    info = build_tiny_model(tmp_path, corpus, hidden_size=128, num_layers=2)
    assert info["vocab_size"] == 1024
    # REFERENCE.md: hidden 128 / 2 layers ≈ 0.6M parameters (embedding tied with the LM head).
    assert 550_000 < info["num_parameters"] < 700_000
    assert info["path"] == str(tmp_path)


def test_build_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    same = build_tiny_model(tmp_path / "same", CORPUS, seed=0)
    other = build_tiny_model(tmp_path / "other", CORPUS, seed=1)
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        assert (Path(same["path"]) / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    assert (Path(other["path"]) / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert (Path(other["path"]) / "model.safetensors").read_bytes() != (
        tiny_dir / "model.safetensors"
    ).read_bytes()


def test_build_leaves_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path, CORPUS[:3], seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_train_tokenizer_rejects_empty_corpus_and_tiny_vocab() -> None:
    with pytest.raises(ValueError, match="empty corpus"):
        train_tokenizer(["", ""])
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_tokenizer(CORPUS, vocab_size=100)


def _tokenizer_without_pad(tiny_dir: Path, out: Path) -> Path:
    out.mkdir()
    shutil.copy(tiny_dir / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    config["pad_token"] = None
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_load_tokenizer_without_pad_uses_eos_and_warns_once(tiny_dir: Path, tmp_path: Path) -> None:
    folder = _tokenizer_without_pad(tiny_dir, tmp_path / "nopad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok = load_tokenizer(str(folder))
    assert tok.pad_token == "<|im_end|>" == tok.eos_token
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "model.pad_token" in str(caught[0].message)


def test_load_tokenizer_keeps_existing_pad_without_warning(tiny_dir: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = load_tokenizer(str(tiny_dir))
    assert tok.pad_token == "<|endoftext|>"


def test_load_tokenizer_explicit_pad_token(tiny_dir: Path, tmp_path: Path) -> None:
    folder = _tokenizer_without_pad(tiny_dir, tmp_path / "nopad")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = load_tokenizer(str(folder), pad_token="<|endoftext|>")
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0


def test_load_tokenizer_unknown_pad_token(tiny_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"model\.pad_token='<pad>'"):
        load_tokenizer(str(tiny_dir), pad_token="<pad>")


def test_load_tokenizer_missing_folder_and_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError, match=r"model\.tokenizer_path=.*does not exist.*lucidrl model tiny"):
        load_tokenizer(str(missing), config_key="model.tokenizer_path")
    with pytest.raises(ModelLoadError, match=r"model\.path=.*no tokenizer files"):
        load_tokenizer(str(tmp_path))


def test_load_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"model\.path=.*does not exist.*no model hub"):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match=r"no config\.json.*not a HuggingFace model folder"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 64}))
    with pytest.raises(ModelLoadError, match=r"AutoModelForCausalLM could not load") as info:
        load_model(str(tmp_path))
    assert info.value.__cause__ is not None


def test_check_tokenizer_matches_model_names_sizes(tokenizer) -> None:
    class SmallModel(torch.nn.Module):
        def get_input_embeddings(self) -> torch.nn.Embedding:
            return torch.nn.Embedding(10, 4)

    with pytest.raises(ModelLoadError, match=rf"10 embedding rows.*{len(tokenizer)} tokens"):
        check_tokenizer_matches_model(SmallModel(), tokenizer, "some/dir")


def test_an_unset_model_path_is_named_not_read_as_the_working_directory(tiny_dir: Path, monkeypatch) -> None:
    """Path("") is the working directory: run from inside a model folder, model.path='' loaded that model."""
    monkeypatch.chdir(tiny_dir)
    with pytest.raises(ModelLoadError, match=r"model\.path is not set"):
        load_tokenizer("")
    with pytest.raises(ModelLoadError, match=r"model\.path is not set"):
        load_model("")


def test_model_tiny_refuses_sizes_that_make_no_model_and_keeps_an_existing_folder(
    tmp_path: Path, capsys
) -> None:
    """Raw ValueError / ZeroDivisionError tracebacks, half-written folders, a head dimension rotary
    embeddings cannot rotate, and an existing model silently replaced."""
    from lucidrl.cli import main

    for args, words in (
        (["--hidden", "6"], "not divisible by num_heads"),
        (["--hidden", "12"], "odd head dimension"),
        (["--hidden", "0"], "must be >= 1"),
        (["--layers", "0"], "must be >= 1"),
    ):
        out = tmp_path / f"m{args[1]}{args[0]}"
        assert main(["model", "tiny", "--out", str(out), *args]) == 2
        assert words in capsys.readouterr().err and not out.exists()
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "model.safetensors").write_text("an earlier model")
    assert main(["model", "tiny", "--out", str(keep)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert (keep / "model.safetensors").read_text() == "an earlier model"


def test_a_critic_of_another_vocabulary_is_refused_naming_critic_model_path(
    tmp_path: Path, tiny_model, kk_data
) -> None:
    """It loaded, then indexed past its embedding at the first values forward (IndexError, after a rollout)."""
    from lucidrl.config import load_config
    from lucidrl.data.kk.corpus import kk_tokenizer_corpus
    from lucidrl.models import build_tiny_model
    from lucidrl.trainer.ppo import PPOTrainer

    small = build_tiny_model(
        tmp_path / "small",
        kk_tokenizer_corpus(seed=0, n_puzzles=5),
        hidden_size=16,
        num_layers=1,
        vocab_size=300,
    )
    assert small["vocab_size"] < tiny_model["vocab_size"]
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model['path']}",
            f"critic.model_path={small['path']}",
            "algorithm.adv_estimator=gae",
            f"data.train_files=[{kk_data['train']}]",
            "data.max_prompt_length=1000",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(
        ModelLoadError, match=r"the model at critic\.model_path=.*has \d+ embedding rows but its tokenizer"
    ):
        PPOTrainer(cfg)


def test_a_broken_safetensors_index_is_a_model_load_error(tiny_dir: Path, tmp_path: Path) -> None:
    from lucidrl.models.inspection import inspect_model_folder

    folder = tmp_path / "indexed"
    shutil.copytree(tiny_dir, folder)
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')  # no weight_map: a KeyError
    with pytest.raises(
        ModelLoadError, match=r"model.safetensors.index.json is not a safetensors index .*weight_map"
    ):
        inspect_model_folder(str(folder))


def test_trust_remote_code_reaches_the_tokenizer(tiny_dir: Path, monkeypatch) -> None:
    """model.trust_remote_code applied to the model only: a custom tokenizer class loaded as the generic one."""
    import transformers

    seen = []
    real = transformers.AutoTokenizer.from_pretrained

    def recording(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", recording)
    load_tokenizer(str(tiny_dir), trust_remote_code=True)
    load_tokenizer(str(tiny_dir))
    assert seen == [True, False]


def test_model_attn_implementation_reaches_the_actor_and_reference_and_keeps_their_numbers(
    tiny_model,
) -> None:
    """model.attn_implementation (verl's override_config.attn_implementation) picks the attention code of
    the actor and reference; the log-probs are the same numbers either way."""
    from lucidrl.batch import Batch
    from lucidrl.config import ConfigError, load_config
    from lucidrl.workers.policy import PolicyWorker

    base = [f"model.path={tiny_model['path']}", "data.train_files=[x.parquet]", "actor.use_kl_loss=true"]
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (4, 14))
    batch = Batch(
        tensors={
            "prompts": ids[:, :6],
            "prompt_mask": torch.tensor([[0, 0, 1, 1, 1, 1]] * 2 + [[1] * 6] * 2),
            "responses": ids[:, 6:],
            "response_mask": torch.ones(4, 8, dtype=torch.long),
        },
        non_tensors={"uid": ["a", "a", "b", "b"]},
    )
    log_probs, kinds = {}, {}
    for impl in (None, "eager"):
        extra = [] if impl is None else [f"model.attn_implementation={impl}"]
        worker = PolicyWorker(
            load_config(None, [*base, *extra]), frozenset({"actor", "rollout", "reference"})
        )
        kinds[impl] = (
            worker.actor.model.config._attn_implementation,
            worker.reference.model.config._attn_implementation,
        )
        log_probs[impl] = worker.actor.compute_log_prob(batch)["old_log_probs"]
    assert kinds == {None: ("sdpa", "sdpa"), "eager": ("eager", "eager")}
    torch.testing.assert_close(log_probs["eager"], log_probs[None], atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match=r"model\.attn_implementation.*eager"):
        load_config(None, [*base, "model.attn_implementation=flash"])


def test_an_attention_kind_the_machine_cannot_run_names_the_key(tiny_dir: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    with pytest.raises(
        ModelLoadError, match=r"model\.attn_implementation='flash_attention_2'.*eager or sdpa"
    ):
        load_model(str(tiny_dir), attn_implementation="flash_attention_2")
    assert load_model(str(tiny_dir), attn_implementation="eager").config._attn_implementation == "eager"
