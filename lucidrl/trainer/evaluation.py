"""`lucidrl eval`: accuracy of a saved model on held-out prompts, greedy and sampled, as Logic-RL reports it.

Greedy accuracy is one deterministic answer per prompt; sampled accuracy is the mean over k samples
per prompt at a temperature (Logic-RL's evaluation), and pass@k the fraction of prompts with at least
one correct sample. Accuracy is the reward function's "acc" metric when it returns one (K&K does), else
the score itself (0/1 rewards such as GSM8K). K&K rows also report it per number of people.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import torch

from lucidrl.batch import Batch
from lucidrl.config.errors import ConfigError
from lucidrl.config.rollout_checks import check_stop_regex
from lucidrl.data.dataset import DatasetError, PromptSample, collate, load_prompts, row_of
from lucidrl.diagnostics.errors import UsageError
from lucidrl.rewards.kk import people_count
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.rewards.registry import check_data_sources, check_ground_truths
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.rollout.stop_rule import STOPPED_FIELD

MODES = ("greedy", "sampled")


class EvaluationError(UsageError):
    """An evaluation setting that cannot work (a bad count, a prompt too long for the model)."""


def _refuse_run_folder(model_path: str) -> None:
    """EvaluationError when MODEL is a run folder or a training checkpoint, not a model folder: it said
    only that the folder has no tokenizer files (with model.path, a key eval has not)."""
    from pathlib import Path

    folder = Path(model_path).expanduser()
    if not folder.is_dir() or (folder / "config.json").is_file():
        return
    if (folder / "trainer_state.json").is_file() and (folder / "actor").is_dir():
        raise EvaluationError(
            f"MODEL='{model_path}' is a training checkpoint, not a model folder: write its actor as one with "
            f"`lucidrl export {model_path} OUT`, then `lucidrl eval OUT ...`"
        )
    if not (folder / "config.yaml").is_file() or not any(
        (folder / name).exists() for name in ("checkpoints", "final", "metrics.jsonl")
    ):
        return
    final = folder / "final"
    if (final / "config.json").is_file():
        how = f"evaluate the model it ended with: `lucidrl eval {final} ...`"
    else:
        how = (
            "it has no final model (the run has not ended, or trainer.save_final_model=false): write a "
            f"checkpoint's actor as one with `lucidrl export {folder / 'checkpoints' / 'global_step_N'} OUT`, "
            "then `lucidrl eval OUT ...`"
        )
    raise EvaluationError(f"MODEL='{model_path}' is a run folder, not a model folder: {how}")


# --compute-dtype: the autocast dtype of decoding over float32 weights (None: none)
COMPUTE_DTYPES: dict[str, torch.dtype | None] = {"float32": None, "bfloat16": torch.bfloat16}


def _check_settings(
    k: int, temperature: float, max_new_tokens: int, limit: int | None, batch_size: int
) -> None:
    """Raise EvaluationError naming the first impossible setting and the CLI flag that sets it."""
    for flag, value in (("--k", k), ("--max-new-tokens", max_new_tokens), ("--batch-size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EvaluationError(f"{flag}={value!r}: must be an integer >= 1")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise EvaluationError(f"--limit={limit!r}: must be an integer >= 1 (or left out for every row)")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
        raise EvaluationError(
            f"--temperature={temperature!r}: must be a number > 0 (greedy decoding is always evaluated too)"
        )


def _mean(values: list[float]) -> float | None:
    """The mean of the non-NaN values, or None when there are none (JSON null)."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else None


def _generate_and_score(
    rollout: HFRollout,
    reward: RuleRewardManager,
    samples: list[PromptSample],
    params: SamplingParams,
    *,
    pad_token_id: int,
    batch_size: int,
) -> dict[str, list[Any]]:
    """Per generated sample (prompt-major, n per prompt): prompt index, data_source, n_people, acc, format,
    length, and whether it was cut at max_new_tokens before an eos."""
    per_sample: dict[str, list[Any]] = defaultdict(list)
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        batch: Batch = rollout.generate(collate(chunk, pad_token_id), params)
        scores, extras = reward.score(batch)
        seq_scores = scores["token_level_scores"].sum(-1).tolist()
        n = len(batch)
        per_sample["prompt"].extend(start + i // params.n for i in range(n))
        per_sample["data_source"].extend(batch["data_source"])
        per_sample["n_people"].extend(
            people_count(ds, gt, info)
            for ds, gt, info in zip(
                batch["data_source"], batch["ground_truth"], batch["extra_info"], strict=True
            )
        )
        per_sample["score"].extend(seq_scores)
        # a built-in rule without an "acc" metric scores accuracy itself (not a custom function: its score
        # may be a format bonus or +-1); in a chunk mixing sources, the rows of such a source have NaN
        # there (the manager fills keys other sources return), row by row
        accs = extras.get("acc", [float("nan")] * n)
        per_sample["acc"].extend(
            s if math.isnan(a) and reward.score_is_accuracy else a
            for a, s in zip(accs, seq_scores, strict=True)
        )
        per_sample["format_ok"].extend(extras.get("format_ok", [float("nan")] * n))
        per_sample["trace_ok"].extend(extras.get("trace_ok", [float("nan")] * n))
        lengths = batch["response_mask"].sum(-1)
        per_sample["length"].extend(float(x) for x in lengths.tolist())
        # no eos within the budget: the response was cut (one that ends exactly at the limit with its eos
        # was not); every response holds at least one token, the mask taking in the first eos
        last = batch["responses"].gather(-1, (lengths - 1)[:, None]).squeeze(-1)
        ended = torch.isin(last, torch.tensor(rollout.eos_ids))
        if STOPPED_FIELD in batch:  # ended by the stop rule (--stop-regex)
            ended |= batch[STOPPED_FIELD]
        per_sample["truncated"].extend(float(x) for x in (~ended).tolist())
    return per_sample


def _summarise(per_sample: dict[str, list[Any]], idx: list[int], n: int) -> dict[str, Any]:
    """Accuracy (overall and per people), pass@n, format-pass rate, score and length over samples `idx`."""
    acc = per_sample["acc"]
    by_people: dict[int, list[int]] = defaultdict(list)
    by_prompt: dict[int, list[float]] = defaultdict(list)
    for i in idx:
        if per_sample["n_people"][i] is not None:
            by_people[int(per_sample["n_people"][i])].append(i)
        by_prompt[per_sample["prompt"][i]].append(acc[i])
    return {
        "acc": _mean([acc[i] for i in idx]),
        "acc_by_people": {p: _mean([acc[i] for i in ids]) for p, ids in sorted(by_people.items())},
        # prompts whose samples have an accuracy (a custom reward without "acc" has none)
        f"pass_at_{n}": _mean(
            [float(any(a >= 1.0 for a in accs)) for accs in by_prompt.values() if any(a == a for a in accs)]
        ),
        "format_ok": _mean([per_sample["format_ok"][i] for i in idx]),
        # K&K truth-table traces only: the share of traced responses whose every step is right
        "trace_ok": _mean([per_sample["trace_ok"][i] for i in idx]),
        "score": _mean([per_sample["score"][i] for i in idx]),
        "response_length": _mean([per_sample["length"][i] for i in idx]),
        # cut at max_new_tokens before an eos: scored as format failures (raise --max-new-tokens)
        "truncated": _mean([per_sample["truncated"][i] for i in idx]),
        "n_samples": len(idx),
    }


def evaluate(
    model_path: str,
    data_files: list[str],
    *,
    k: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    limit: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    prompt_key: str = "prompt",
    reward_function: str | None = None,
    sampled: bool = True,
    compute_dtype: str = "float32",
    stop_regex: str | None = None,
) -> dict[str, Any]:
    """Generate greedily and k samples per prompt with the model at `model_path`; score; summarise.

    `sampled=False` generates greedily only: no "sampled" entries (a learning curve's points).

    `limit` keeps the first rows (K&K files interleave sizes, so every size stays represented);
    `batch_size` counts sequences per `generate` call. Returns::

        {"model", "data", "k", "temperature", "max_new_tokens", "seed", "n_prompts",
         "seconds": {"greedy": s, "sampled": s},
         "data_sources": {ds: {"n_prompts", "n_prompts_by_people": {n_people: count},
                               "greedy":  {"acc", "acc_by_people": {n_people: acc}, "pass_at_1",
                                           "format_ok", "trace_ok", "score", "response_length",
                                           "truncated", "n_samples"},
                               "sampled": {... "pass_at_<k>" ...}}}}

    Means over no values (e.g. format_ok from a reward without that metric) are None. The global torch
    RNG is left as it was; sampling draws from it seeded with `seed`, in batch order, so sampled
    results also depend on `batch_size`. `reward_function` is "PATH" or "PATH:NAME" of a custom reward
    function (as the trainer's reward.custom_function; NAME defaults to compute_score): a model trained
    with one is scored by it, not by the built-in rule of its data_source. `compute_dtype="bfloat16"`
    decodes under bf16 autocast over float32 weights, as a run with model.compute_dtype=bfloat16
    validates: greedy decoding can pick other tokens in bf16, so compare a model with a run's own
    validation in the run's compute dtype. `stop_regex` ends each response as a run's rollout.stop_regex
    does: evaluate a model trained with one under the same rule.
    """
    from lucidrl.models import check_tokenizer_matches_model, load_model, load_tokenizer

    _check_settings(k, temperature, max_new_tokens, limit, batch_size)
    if stop_regex is not None:
        try:
            check_stop_regex(stop_regex, "--stop-regex")
        except ConfigError as e:
            raise EvaluationError(str(e)) from None
    if compute_dtype not in COMPUTE_DTYPES:
        raise EvaluationError(
            f"--compute-dtype={compute_dtype!r}: must be one of {', '.join(COMPUTE_DTYPES)} (float32 weights "
            "computing in float32, or under bf16 autocast as model.compute_dtype=bfloat16 trains)"
        )
    _refuse_run_folder(str(model_path))
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path)
    check_tokenizer_matches_model(model, tokenizer, model_path)
    samples, _ = load_prompts(
        list(data_files),
        tokenizer,
        max_prompt_length=10**9,
        prompt_key=prompt_key,
        what="--data",
        prompt_key_option="--prompt-key",
    )
    samples = samples[:limit] if limit is not None else samples
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None:
        for s in samples:
            if len(s.input_ids) + max_new_tokens > positions:
                raise DatasetError(
                    f"{s.source}: the prompt is {len(s.input_ids)} tokens; with --max-new-tokens={max_new_tokens} "
                    f"that passes the model's {positions} positions (max_position_embeddings); lower "
                    f"--max-new-tokens to at most {positions - len(s.input_ids)} or evaluate shorter prompts"
                )
    rollout = HFRollout(
        model, tokenizer, micro_batch_size=batch_size, compute_dtype=COMPUTE_DTYPES[compute_dtype]
    )
    path, _, name = (reward_function or "").partition(":")
    reward = RuleRewardManager.from_config(tokenizer, path or None, name or "compute_score")
    if not path:  # the built-in rules: every row's data_source needs one, checked before generating
        check_data_sources(((s.data_source, row_of(s)) for s in samples), "--data")
        check_ground_truths(((s.data_source, s.ground_truth, row_of(s)) for s in samples), "--data")
    modes = {
        "greedy": SamplingParams(n=1, do_sample=False, max_new_tokens=max_new_tokens, stop_regex=stop_regex)
    }
    if sampled:
        modes["sampled"] = SamplingParams(
            n=k, do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens, stop_regex=stop_regex
        )
    per_mode: dict[str, dict[str, list[Any]]] = {}
    seconds: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for mode, params in modes.items():
            start = time.perf_counter()
            # prompts per generate call, so each call holds about batch_size sequences
            prompts_per_call = max(1, batch_size // params.n)
            per_mode[mode] = _generate_and_score(
                rollout,
                reward,
                samples,
                params,
                pad_token_id=tokenizer.pad_token_id,
                batch_size=prompts_per_call,
            )
            seconds[mode] = time.perf_counter() - start

    by_source: dict[str, dict[str, Any]] = {}
    for ds in sorted({s.data_source for s in samples}):
        prompts = [s for s in samples if s.data_source == ds]
        people = [people_count(s.data_source, s.ground_truth, s.extra_info) for s in prompts]
        entry: dict[str, Any] = {
            "n_prompts": len(prompts),
            "n_prompts_by_people": {
                int(p): people.count(p) for p in sorted({p for p in people if p is not None})
            },
        }
        for mode, params in modes.items():
            rows = per_mode[mode]
            idx = [i for i, d in enumerate(rows["data_source"]) if d == ds]
            entry[mode] = _summarise(rows, idx, params.n)
        by_source[ds] = entry
    return {
        "model": str(model_path),
        "data": [str(f) for f in data_files],
        "k": k,
        "temperature": float(temperature),
        "max_new_tokens": max_new_tokens,
        "stop_regex": stop_regex,
        "seed": seed,
        "compute_dtype": compute_dtype,
        "reward": reward.name,
        "n_prompts": len(samples),
        "seconds": seconds,
        "data_sources": by_source,
    }


def results_table(result: dict[str, Any], data_source: str) -> Any:
    """A rich Table for one data source, like Logic-RL's: rows greedy / sampled@k, columns people + overall.

    Columns are the numbers of people present in the data (2..8 for K&K), then overall accuracy,
    pass@k, format-pass rate, the share of truth-table traces right in every step (when the responses
    are traces) and mean response length (tokens).
    """
    from rich.markup import escape
    from rich.table import Table

    entry = result["data_sources"][data_source]
    k = result["k"]
    people = list(entry["n_prompts_by_people"])
    table = Table(
        title=escape(f"{data_source}: {entry['n_prompts']} prompts, {result['model']}"),
        caption=f"sampled: {k} samples per prompt at temperature {result['temperature']:g}; "
        f"up to {result['max_new_tokens']} new tokens"
        + (
            ""
            if result.get("compute_dtype", "float32") == "float32"
            else f"; {result['compute_dtype']} compute"
        ),
    )
    table.add_column("mode")
    for p in people:
        table.add_column(f"{p} people\n({entry['n_prompts_by_people'][p]})", justify="right")
    modes = [m for m in MODES if m in entry]
    traced = any(entry[mode]["trace_ok"] is not None for mode in modes)
    cut = any(entry[mode]["truncated"] for mode in modes)  # a column only when some response was cut
    for column in ("overall", "pass@k", "format", *(["trace ok"] if traced else []), "length"):
        table.add_column(column, justify="right")
    if cut:
        table.add_column("cut", justify="right")
    for mode, label, n in (("greedy", "greedy", 1), ("sampled", f"sampled@{k}", k)):
        if mode not in entry:
            continue
        stats = entry[mode]
        cells = [_cell(stats["acc_by_people"].get(p)) for p in people]
        cells += [_cell(stats["acc"]), _cell(stats[f"pass_at_{n}"]), _cell(stats["format_ok"])]
        if traced:
            cells.append(_cell(stats["trace_ok"]))
        length = stats["response_length"]
        cells.append("-" if length is None else f"{length:.1f}")
        if cut:
            cells.append(_cell(stats["truncated"]))
        table.add_row(label, *cells)
    return table


def truncation_warnings(result: dict[str, Any]) -> list[str]:
    """One line per data source and mode whose responses were cut at max_new_tokens before an eos."""
    lines = []
    for ds, entry in result["data_sources"].items():
        for mode in MODES:
            share = entry.get(mode, {}).get("truncated")
            if share:
                lines.append(
                    f"{ds}: {share:.0%} of the {mode} responses reached --max-new-tokens="
                    f"{result['max_new_tokens']} without an eos and were scored cut off (a reasoning trace "
                    "cut before its </answer> fails the format rule); raise --max-new-tokens to score them whole"
                )
    return lines


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
