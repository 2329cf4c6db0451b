"""Exported model folders load the same in transformers 5.x and in the 4.5x range verl's vLLM versions pin,
and their files have a normal file's permissions.

transformers 4.x itself is not in the test environment: the JSON shapes 4.x needs are checked here,
and with LUCIDRL_TF4_PYTHON pointing at a Python that has transformers 4.5x (a throwaway venv), the
folder is loaded there too and compared.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from lucidrl.models import load_tokenizer
from lucidrl.models.saving import make_portable, save_hf_folder

TEXT = "<|im_start|>user\nZoey is a knight<|im_end|>\n<|im_start|>assistant\n<think> so </think>"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _export(tiny_model, out, rope_theta: float | None = None):
    model = AutoModelForCausalLM.from_pretrained(tiny_model["path"])
    if rope_theta is not None:
        model.config.rope_parameters = {"rope_theta": rope_theta, "rope_type": "default"}
    return save_hf_folder(model, load_tokenizer(str(tiny_model["path"])), out)


def test_the_tokenizer_config_has_the_shape_transformers_4_reads(tiny_model, tmp_path):
    out = _export(tiny_model, tmp_path / "m")
    data = json.loads((out / "tokenizer_config.json").read_text())
    # 4.x reads extra_special_tokens as a mapping: a list made AutoTokenizer fail ("'list' object has no
    # attribute 'keys'")
    assert not isinstance(data.get("extra_special_tokens", {}), list)
    assert {"<|im_start|>", "<|im_end|>"} <= set(data["additional_special_tokens"])
    assert data["tokenizer_class"] == "Qwen2Tokenizer"
    before, after = load_tokenizer(str(tiny_model["path"])), AutoTokenizer.from_pretrained(out)
    assert after(TEXT)["input_ids"] == before(TEXT)["input_ids"]
    assert sorted(after.all_special_tokens) == sorted(before.all_special_tokens)
    assert (after.pad_token, after.eos_token) == (before.pad_token, before.eos_token)
    chat = [{"role": "user", "content": "hi"}]
    assert after.apply_chat_template(chat, tokenize=False) == before.apply_chat_template(chat, tokenize=False)


def test_rope_is_written_in_the_form_transformers_4_reads(tiny_model, tmp_path):
    """4.x ignores rope_parameters and builds the model with rope_theta 10000 unless told otherwise."""
    out = _export(tiny_model, tmp_path / "m", rope_theta=1e6)
    data = json.loads((out / "config.json").read_text())
    assert data["rope_theta"] == data["rope_parameters"]["rope_theta"] == 1e6
    assert "rope_scaling" not in data or data["rope_scaling"] is None
    assert AutoConfig.from_pretrained(out).rope_parameters["rope_theta"] == 1e6  # 5.x reads the same
    scaled = {"rope_parameters": {"rope_theta": 5e5, "rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(scaled))
    make_portable(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["rope_theta"] == 5e5 and data["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}


def test_a_generic_fast_tokenizer_gets_a_class_name_transformers_4_has(tiny_model, tmp_path):
    generic = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(tiny_model["path"], "tokenizer.json"), eos_token="<|im_end|>"
    )
    generic.save_pretrained(tmp_path)
    assert (
        json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    )
    make_portable(tmp_path)
    assert (
        json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )
    assert AutoTokenizer.from_pretrained(tmp_path)(TEXT)["input_ids"] == generic(TEXT)["input_ids"]


def test_files_get_a_normal_files_permissions(tiny_model, tmp_path, umask_027):
    """save_pretrained wrote model.safetensors 0600; a plain write under umask 027 gives 0640 (0644 under 022)."""
    out = _export(tiny_model, tmp_path / "m")
    modes = {p.name: _mode(p) for p in out.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes
    os.umask(0o022)
    out = _export(tiny_model, tmp_path / "n")
    assert {_mode(p) for p in out.iterdir() if p.is_file()} == {0o644}


def test_the_model_weights_round_trip(tiny_model, tmp_path):
    out = _export(tiny_model, tmp_path / "m")
    a = AutoModelForCausalLM.from_pretrained(tiny_model["path"])
    b = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[1, 5, 9, 2]])
    assert torch.equal(a(ids).logits, b(ids).logits)


_TF4_CHECK = """
import json, sys, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
m = AutoModelForCausalLM.from_pretrained(sys.argv[1])
print(json.dumps({"version": transformers.__version__, "ids": t(sys.argv[2])["input_ids"],
                  "special": sorted(t.all_special_tokens), "rope_theta": AutoConfig.from_pretrained(sys.argv[1]).rope_theta}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("LUCIDRL_TF4_PYTHON"), reason="set LUCIDRL_TF4_PYTHON to a transformers 4.5x Python"
)
def test_transformers_4_loads_the_export(tiny_model, tmp_path):
    out = _export(tiny_model, tmp_path / "m", rope_theta=1e6)
    done = subprocess.run(
        [os.environ["LUCIDRL_TF4_PYTHON"], "-c", _TF4_CHECK, str(out), TEXT], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["version"].startswith("4.")
    tokenizer = load_tokenizer(str(out))
    assert got["ids"] == tokenizer(TEXT)["input_ids"]
    assert got["special"] == sorted(tokenizer.all_special_tokens)
    assert got["rope_theta"] == 1e6
