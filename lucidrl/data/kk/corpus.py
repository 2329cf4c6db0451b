"""Text to train a tiny model's tokenizer on, drawn from the K&K generator (lucidrl model tiny)."""

from __future__ import annotations

from collections.abc import Iterator

from lucidrl.data.kk.generator import generate_dataset


def kk_tokenizer_corpus(seed: int = 0, n_puzzles: int = 400) -> Iterator[str]:
    """Text to train the tiny model's tokenizer on: K&K prompts, direct answers and reasoning traces.

    The traces (`lucidrl data kk --trace`) are in so the tokenizer learns their pieces (" K", ":N",
    "=F", " ok", ...) as single tokens, which keeps traced responses short.
    """
    rows, _ = generate_dataset((2, 5), n_puzzles, 0, seed=seed + 10_000, trace=True)
    for row in rows:
        for m in row["prompt"]:
            yield m["content"]
        yield (
            "<think> </think> <answer> "
            + row["reward_model"]["ground_truth"]["solution_text_format"]
            + " </answer>"
        )
        yield "<think>" + row["response"]
