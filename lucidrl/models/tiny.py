"""Build a tiny Qwen2-style model and tokenizer from a text corpus, entirely offline.

The folder this writes loads with `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` like any HuggingFace checkpoint, so the whole pipeline (rollout,
rewards, training) can be exercised on a laptop CPU without a model hub.

Pitfall this module exists to avoid: transformers 5 loads the tokenizer of a `model_type=qwen2`
folder as `Qwen2Tokenizer`, which rebuilds the BPE with an NFC normalizer and Qwen2's split regex.
A tokenizer trained with any other pre-tokenizer silently changes its token ids after reload, so we
train with exactly those settings and check the ids survive the round trip before returning.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from lucidrl.models.saving import make_portable

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Reasoning-format tags: added (non-special) tokens so each is one id, yet still visible in decoded text.
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")

# Copied from transformers/models/qwen2/tokenization_qwen2.py (PRETOKENIZE_REGEX); must stay identical.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen-style ChatML without a default system prompt: every turn is `<|im_start|>{role}\n{content}<|im_end|>\n`.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Strings whose ids must survive the save/reload round trip; checked on every build.
_ROUND_TRIP_PROBES = (
    "Hello world! 123 + 4567 = 4690.",
    "line one\nline two\n\n  indented\ttab\r\nwindows",
    "Zoë and René said: café, naïve, e\u0301 (decomposed), 日本語, emoji 🙂.",
    "<|im_start|>user\nWho is a knight?<|im_end|>\n<|im_start|>assistant\n<think>Zoey lies.</think>"
    "<answer>(1) Zoey is a knave</answer><|im_end|>\n<|endoftext|>",
    "it's they're I'LL we've don't",
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> Tokenizer:
    """Train a byte-level BPE tokenizer whose settings match what transformers' Qwen2Tokenizer rebuilds.

    Special tokens get ids 0..2 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`); the reasoning tags
    `<think>`, `</think>`, `<answer>`, `</answer>` are added tokens placed after the BPE vocabulary.
    `vocab_size` counts all of them; a small corpus may stop short of it when no pair is left to merge.
    """
    texts = [text for text in corpus if text]
    if not texts:
        raise ValueError(
            "train_tokenizer got an empty corpus (no non-empty strings); pass the training texts, "
            "e.g. the prompts and solutions of the dataset the tiny model will be trained on."
        )
    min_vocab = 256 + len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    if vocab_size < min_vocab:
        raise ValueError(
            f"vocab_size={vocab_size} is below the {min_vocab} ids a byte-level BPE needs "
            f"(256 bytes + {len(SPECIAL_TOKENS)} special + {len(TAG_TOKENS)} tag tokens); "
            f"use vocab_size >= {min_vocab}, e.g. 1024."
        )
    tokenizer = Tokenizer(
        BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        special_tokens=[AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in TAG_TOKENS])
    return tokenizer


def _write_tokenizer_files(tokenizer: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """Write tokenizer.json and a tokenizer_config.json that make AutoTokenizer build a Qwen2Tokenizer."""
    tokenizer.save(str(out_dir / "tokenizer.json"))
    added_tokens_decoder = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in SPECIAL_TOKENS,
        }
        for token in SPECIAL_TOKENS + TAG_TOKENS
    }
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "split_special_tokens": False,
        # Listed so `all_special_tokens` / `all_special_ids` cover every ChatML marker, as in Qwen's configs.
        "extra_special_tokens": [IM_START, IM_END],
        "chat_template": CHATML_TEMPLATE,
    }
    with open(out_dir / "tokenizer_config.json", "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, ensure_ascii=False)
        handle.write("\n")


def _check_round_trip(tokenizer: Tokenizer, out_dir: Path) -> Any:
    """Reload the written tokenizer with AutoTokenizer and fail loudly if any probe string's ids differ."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True)
    for text in _ROUND_TRIP_PROBES:
        expected = tokenizer.encode(text).ids
        got = reloaded(text, add_special_tokens=False)["input_ids"]
        if got != expected:
            raise RuntimeError(
                f"tokenizer written to {out_dir} changes token ids after AutoTokenizer reload "
                f"({type(reloaded).__name__}) for {text!r}: trained {expected} vs reloaded {got}; "
                "the installed transformers rebuilds Qwen2 tokenizers differently from "
                "lucidrl.models.tiny.train_tokenizer, update its normalizer/pre-tokenizer to match."
            )
    return reloaded


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    corpus: Iterable[str],
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int = 1024,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Train a tokenizer on `corpus` and save a freshly initialised tiny Qwen2 model next to it.

    `vocab_size` is the BPE training target; the model's embedding is `len(tokenizer)` rounded up
    to a multiple of 64. `intermediate_size` defaults to `4 * hidden_size`. Weights depend only on
    the corpus, the sizes and `seed` (the global torch RNG is left untouched).

    Returns {"path": str, "num_parameters": int, "vocab_size": int (the model's embedding rows)}.
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if num_layers < 1 or hidden_size < 1:
        raise ValueError(f"num_layers={num_layers} and hidden_size={hidden_size} must be >= 1")
    if hidden_size % num_heads == 0 and (hidden_size // num_heads) % 2:
        raise ValueError(
            f"hidden_size={hidden_size} / num_heads={num_heads} = {hidden_size // num_heads} is an odd head "
            "dimension, which rotary position embeddings cannot rotate; pick a hidden size that is a multiple "
            f"of {2 * num_heads}"
        )
    if hidden_size % num_heads != 0:
        raise ValueError(
            f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}; "
            "pick sizes where hidden_size / num_heads is a whole head dimension (e.g. 128 / 4)."
        )
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}; "
            "grouped-query attention needs num_kv_heads to divide num_heads (e.g. 4 and 2)."
        )
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    _write_tokenizer_files(tokenizer, path, model_max_length=max_position_embeddings)
    hf_tokenizer = _check_round_trip(tokenizer, path)

    endoftext_id = tokenizer.token_to_id(ENDOFTEXT)
    im_end_id = tokenizer.token_to_id(IM_END)
    model_vocab = -(-len(hf_tokenizer) // 64) * 64
    config = Qwen2Config(
        vocab_size=model_vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size if intermediate_size is not None else 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        # Like Qwen2.5-Instruct: no BOS is prepended, <|endoftext|> doubles as bos and pad id.
        bos_token_id=endoftext_id,
        eos_token_id=im_end_id,
        pad_token_id=endoftext_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext_id, eos_token_id=im_end_id, pad_token_id=endoftext_id
    )
    model.save_pretrained(str(path), safe_serialization=True)
    make_portable(path)
    return {
        "path": str(path),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": model_vocab,
    }
