"""Models and tokenizers: build a tiny local Qwen2 and load checkpoints from local folders."""

from lucidrl.models.loading import (
    ModelLoadError,
    check_tokenizer_matches_model,
    load_model,
    load_run_model,
    load_run_tokenizer,
    load_tokenizer,
)
from lucidrl.models.tiny import CHATML_TEMPLATE, build_tiny_model, train_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "ModelLoadError",
    "build_tiny_model",
    "check_tokenizer_matches_model",
    "load_model",
    "load_run_model",
    "load_run_tokenizer",
    "load_tokenizer",
    "train_tokenizer",
]
