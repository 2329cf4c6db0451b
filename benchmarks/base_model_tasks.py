"""What a pretrained model can already do on candidate RL tasks, and in which answer format.

RL needs a task where the base model is partly right (a 10-60% greedy base) and where samples of one
prompt at temperature 1 often disagree (GRPO learns only from groups that mix right and wrong). This
script measures, per task and answer format, with lucidrl's own rollout (HFRollout) and rule rewards:

  greedy    accuracy of one greedy response per prompt
  sampled   accuracy of k samples per prompt at temperature T
  mixed     share of prompts whose k samples hold both a right and a wrong answer
  format    share of sampled responses whose answer could be extracted in the asked format
  length    mean sampled response length (tokens); cut: share of all responses that hit the limit
  tok/s     generated tokens per second of generation (greedy and sampled together)

Tasks: add1 (single-digit sums), add2 (two-digit sums and differences), word (one-step word problems,
lucidrl.data.word_problems), in each answer format: free (the question alone, scored by the last
number in the response), answer_is ("The answer is N."), gsm8k ("#### N") and boxed (\\boxed{N});
--shots 1 puts one worked example in that format before the question (a fixed one per task). And in
their own formats, scored by their registered rewards: word_problems (the val rows of `lucidrl data
word-problems`, with --shots 1 a drawn worked example each), countdown (TinyZero's, 3 numbers) and kk
(Knights & Knaves, 2-3 people, Logic-RL's prompt).

    python benchmarks/base_model_tasks.py --model outputs/smollm2              # every task and format
    python benchmarks/base_model_tasks.py --tasks word --formats gsm8k --shots 1 --n 16
    python benchmarks/base_model_tasks.py --tasks countdown,kk --n 16 --max-new-tokens 256

Build the model first with `lucidrl model get smollm2-135m-instruct --out outputs/smollm2`.
The table of this script is in docs/tasks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lucidrl.data.countdown import generate_puzzles, prompt_text
from lucidrl.data.dataset import collate, load_prompts
from lucidrl.data.kk.generator import generate_dataset
from lucidrl.data.word_problems import generate_problems, write_word_problems_parquet
from lucidrl.models import load_model, load_tokenizer
from lucidrl.rewards import gsm8k
from lucidrl.rewards.manager import RuleRewardManager
from lucidrl.rewards.math import last_boxed
from lucidrl.rewards.registry import default_compute_score
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout

# ---------------------------------------------------------------- answer formats: instruction, extractor

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"


def _last_number(text: str) -> str | None:
    found = re.findall(_NUMBER, text)
    return found[-1] if found else None


def _answer_is(text: str) -> str | None:
    found = re.findall(rf"answer is:?\s*\**\s*\$?\s*({_NUMBER})", text, flags=re.IGNORECASE)
    return found[-1] if found else None


def _boxed(text: str) -> str | None:
    inner = last_boxed(text)
    return inner.strip().strip("$") if inner is not None else None


FORMATS: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "free": ("", _last_number),
    "answer_is": ('\nEnd your reply with "The answer is N." where N is the number.', _answer_is),
    "gsm8k": ("\nWrite the final answer as a number after ####.", gsm8k.extract_answer),
    "boxed": ("\nPut the final answer in \\boxed{}.", _boxed),
}
# how a worked example (--shots 1) ends in each format, after its working
_EXAMPLE_ENDINGS = {
    "free": "",
    "answer_is": "\nThe answer is {n}.",
    "gsm8k": "\n#### {n}",
    "boxed": "\n\\boxed{{{n}}}",
}
# one worked example per task: (question, working, answer); its numbers are outside the tasks' draws
_EXAMPLES = {
    "add1": ("What is 4 + 3?", "4 + 3 = 7.", 7),
    "add2": ("What is 25 + 17?", "25 + 17 = 42.", 42),
    "word": ("Lily has 25 pencils. She buys 17 more. How many pencils does Lily have now?", "Lily has 25 + 17 = 42 pencils.", 42),
}  # fmt: skip


def messages(task: str, fmt: str, question: str, shots: int) -> list[dict[str, str]]:
    """The chat for one question: `shots` (0 or 1) worked examples as earlier turns, then the question,
    each followed by the format's instruction."""
    instruction = FORMATS[fmt][0]
    chat = []
    if shots:
        q, working, n = _EXAMPLES[task]
        chat += [
            {"role": "user", "content": q + instruction},
            {"role": "assistant", "content": working + _EXAMPLE_ENDINGS[fmt].format(n=n)},
        ]
    return chat + [{"role": "user", "content": question + instruction}]


def _same_number(answer: str | None, truth: str) -> bool:
    if answer is None:
        return False
    try:
        return float(answer.replace(",", "").rstrip(".")) == float(truth)
    except ValueError:
        return False


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None) -> dict[str, float]:
    """bench/<task>/<format> rows: the format's extractor; word_problems, countdown and kk: their built-in
    rules (lucidrl/rewards/registry.py)."""
    if not data_source.startswith("bench/"):
        raw = default_compute_score(data_source, solution_str, ground_truth, extra_info)
        if isinstance(raw, dict):  # kk: acc and format_ok
            return raw
        # countdown: 1 right, 0.1 a well-formed wrong equation, 0 none
        return {"score": raw, "acc": float(raw == 1.0), "format_ok": float(raw > 0)}
    extract = FORMATS[data_source.split("/")[2]][1]
    answer = extract(solution_str)
    right = _same_number(answer, str(ground_truth))
    return {"score": float(right), "acc": float(right), "format_ok": float(answer is not None)}


# ---------------------------------------------------------------- tasks: verl-schema rows


def _row(data_source: str, chat: list[dict[str, str]], truth, extra: dict | None = None) -> dict:
    return {
        "data_source": data_source,
        "prompt": chat,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": extra or {"index": 0},
    }


def _add1(n: int, seed: int) -> list[tuple[str, int, str]]:
    rng = random.Random(f"add1-{seed}")
    pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(n)]
    return [(f"What is {a} + {b}?", a + b, "add") for a, b in pairs]


def _add2(n: int, seed: int) -> list[tuple[str, int, str]]:
    rng = random.Random(f"add2-{seed}")
    out = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if i % 2:
            a, b = max(a, b), min(a, b)
            out.append((f"What is {a} - {b}?", a - b, "sub"))
        else:
            out.append((f"What is {a} + {b}?", a + b, "add"))
    return out


def _word(n: int, seed: int) -> list[tuple[str, int, str]]:
    return [(p.question, p.answer, p.op) for p in generate_problems(n, seed=seed)]


QUESTION_TASKS = {"add1": _add1, "add2": _add2, "word": _word}
NATIVE_TASKS = ("word_problems", "countdown", "kk")
TASKS = (*QUESTION_TASKS, *NATIVE_TASKS)


def task_rows(task: str, fmt: str, n: int, seed: int, shots: int) -> list[dict]:
    if task in QUESTION_TASKS:
        return [
            _row(f"bench/{task}/{fmt}", messages(task, fmt, question, shots), str(answer), {"op": op})
            for question, answer, op in QUESTION_TASKS[task](n, seed)
        ]
    if task == "word_problems":  # the val rows of `lucidrl data word-problems`, as the demo would use them
        with tempfile.TemporaryDirectory() as tmp:
            info = write_word_problems_parquet(tmp, n_train=1, n_val=n, seed=seed, shots=shots)
            return pq.read_table(info["val"]).to_pylist()
    if task == "countdown":
        puzzles = generate_puzzles(n, numbers=(3, 3), seed=seed)
        return [
            _row(
                "countdown",
                [{"role": "user", "content": prompt_text(p["numbers"], p["target"])}],
                {"target": p["target"], "numbers": p["numbers"]},
            )
            for p in puzzles
        ]
    _, val = generate_dataset((2, 3), n_train=0, n_val=n, seed=seed)
    return [
        {k: r[k] for k in ("data_source", "prompt", "ability", "reward_model", "extra_info")} for r in val
    ]


# ---------------------------------------------------------------- measuring


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def measure(rollout: HFRollout, reward: RuleRewardManager, rows: list[dict], args) -> dict:
    """Greedy and k sampled responses per row, scored; the table's numbers and a few responses."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        samples, _ = load_prompts([str(path)], rollout.tokenizer, max_prompt_length=10**9)
    pad = rollout.tokenizer.pad_token_id
    result: dict = {"prompt_tokens": sum(len(s.input_ids) for s in samples) / len(samples)}
    tokens, seconds = 0, 0.0
    for mode, params in (
        ("greedy", SamplingParams(n=1, do_sample=False, max_new_tokens=args.max_new_tokens)),
        ("sampled", SamplingParams(n=args.k, do_sample=True, temperature=args.temperature, max_new_tokens=args.max_new_tokens)),
    ):  # fmt: skip
        acc, fmt_ok, lengths, cut, texts, ops = [], [], [], [], [], []
        per_call = max(1, args.batch_size // params.n)
        torch.manual_seed(args.seed)
        for start in range(0, len(samples), per_call):
            batch = collate(samples[start : start + per_call], pad)
            t0 = time.perf_counter()
            out = rollout.generate(batch, params)
            seconds += time.perf_counter() - t0
            scored, extras = reward.score(out)
            n_tokens = out["response_mask"].sum(-1)
            tokens += int(n_tokens.sum())
            last = out["responses"].gather(-1, (n_tokens - 1)[:, None]).squeeze(-1)
            ended = torch.isin(last, torch.tensor(rollout.eos_ids))
            acc += extras["acc"]
            ops += [info.get("op") for info in out["extra_info"]]
            fmt_ok += extras["format_ok"]
            lengths += n_tokens.tolist()
            cut += (~ended).float().tolist()
            texts += scored["response_text"]
        result[mode] = {
            "acc": sum(acc) / len(acc),
            "format": sum(fmt_ok) / len(fmt_ok),
            "length": sum(lengths) / len(lengths),
            "cut": sum(cut) / len(cut),
            "acc_by_op": {op: _mean([a for a, o in zip(acc, ops, strict=True) if o == op]) for op in sorted(set(ops) - {None})},
            "examples": [{"prompt": rows[i]["prompt"][-1]["content"], "response": texts[i * params.n]} for i in range(min(3, len(rows)))],
        }  # fmt: skip
        if mode == "sampled":
            groups = [acc[i : i + params.n] for i in range(0, len(acc), params.n)]
            result[mode]["mixed"] = sum(0 < sum(g) < len(g) for g in groups) / len(groups)
            result[mode]["pass_at_k"] = sum(sum(g) > 0 for g in groups) / len(groups)
    result["cut"] = (result["greedy"]["cut"] + args.k * result["sampled"]["cut"]) / (1 + args.k)
    result["tokens_per_s"] = tokens / seconds
    result["seconds"] = seconds
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="outputs/smollm2", help="a HuggingFace model folder")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {', '.join(TASKS)}")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"for add1/add2/word: {', '.join(FORMATS)}")
    p.add_argument(
        "--shots",
        default="0,1",
        help="worked examples before the question, a comma list of 0 and 1 (default 0,1)",
    )
    p.add_argument("--n", type=int, default=32, help="prompts per task and format (default 32)")
    p.add_argument("--k", type=int, default=4, help="samples per prompt (default 4)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=64, help="sequences per generate call (default 64)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16", help="compute dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write every result, with example responses, here")
    args = p.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    formats = [f for f in args.formats.split(",") if f]
    shots = [int(x) for x in args.shots.split(",") if x]
    if not set(shots) <= {0, 1}:
        raise SystemExit(f"--shots {args.shots!r}: 0, 1 or 0,1")
    for name, known in (("task", TASKS), ("format", FORMATS)):
        for value in tasks if name == "task" else formats:
            if value not in known:
                raise SystemExit(f"unknown {name} {value!r}; choose among {', '.join(known)}")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model)
    compute = torch.bfloat16 if args.dtype == "bfloat16" else None
    rollout = HFRollout(model, tokenizer, micro_batch_size=args.batch_size, compute_dtype=compute)
    reward = RuleRewardManager(tokenizer, compute_score, name="base_model_tasks.compute_score")
    print(
        f"# {args.model}: {args.n} prompts per row, greedy + {args.k} samples at T={args.temperature:g}, "
        f"<= {args.max_new_tokens} new tokens, {args.dtype} compute, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}"
    )
    print(
        f"| task | format | shots | greedy | sampled | mixed | pass@{args.k} | format ok | length | cut | tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for task in tasks:
        for fmt in formats if task in QUESTION_TASKS else ["own"]:
            for shot in shots if task in (*QUESTION_TASKS, "word_problems") else [0]:
                r = measure(rollout, reward, task_rows(task, fmt, args.n, args.seed, shot), args)
                g, s = r["greedy"], r["sampled"]
                print(
                    f"| {task} | {fmt} | {shot} | {g['acc']:.2f} | {s['acc']:.2f} | {s['mixed']:.2f} "
                    f"| {s['pass_at_k']:.2f} | {s['format']:.2f} | {s['length']:.0f} | {r['cut']:.2f} "
                    f"| {r['tokens_per_s']:.0f} |",
                    flush=True,
                )
                results.append({"task": task, "format": fmt, "shots": shot, **r})
                if args.json:  # after every row: a long run interrupted keeps what it measured
                    Path(args.json).write_text(
                        json.dumps({"args": vars(args), "results": results}, indent=1) + "\n"
                    )


if __name__ == "__main__":
    main()
