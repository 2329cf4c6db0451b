"""Helpers shared by several test files (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import torch
import yaml

# a dense toy reward the random tiny model can improve on: the share of the letter 'e' in the response
TOY_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str[len("<think>"):]
    return {"score": text.count("e") / max(len(text), 1), "acc": float("e" in text)}
"""


def end_rank() -> None:
    """The last call of a rank spawned by a test: destroy its process groups and exit at once.

    FSDP2's DTensors and device mesh keep torch's gloo process groups, and their worker threads,
    alive past `destroy_process_group` into the interpreter's shutdown, and tearing them down there
    aborts the process once in a while ("terminate called without an active exception", SIGABRT).
    The rank has saved what the test reads by now; `os._exit` skips that shutdown.
    """
    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def toy_train_args(tmp_path, kk_data, tiny_model) -> list[str]:
    """`lucidrl train` arguments for the tiny model on K&K prompts with TOY_REWARD, run in tmp_path/run."""
    reward = tmp_path / "reward.py"
    reward.write_text(TOY_REWARD)
    return [
        "train",
        f"model.path={tiny_model['path']}",
        f"data.train_files=[{kk_data['train']}]",
        f"reward.custom_function.path={reward}",
        f"trainer.run_dir={tmp_path / 'run'}",
    ]


def outcome_rewards(scores: list[float], lengths: list[int], T: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with each score on the last valid token, and the matching response mask."""
    rewards = torch.zeros(len(scores), T)
    mask = torch.zeros(len(scores), T)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def http_call(
    url: str, body: bytes | None = None, content_type: str = "application/json"
) -> tuple[int, dict]:
    """(status, JSON body) of a GET (no body) or POST; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def write_train_config(tmp_path, kk_data, tiny_model, **sections) -> str:
    """A 2-step GRPO config on the tiny model and the toy reward; `sections` update its top-level keys."""
    reward = tmp_path / "reward.py"
    reward.write_text(TOY_REWARD)
    cfg = {
        "model": {"path": tiny_model["path"]},
        "data": {
            "train_files": [kk_data["train"]],
            "val_files": [kk_data["val"]],
            "max_prompt_length": 1000,
            "max_response_length": 16,
            "train_batch_size": 4,
        },
        "rollout": {"n": 4},
        "actor": {
            "optim": {"lr": 1e-3},
            "ppo_mini_batch_size": 2,
            "ppo_micro_batch_size": 4,
            "use_kl_loss": True,
            "kl_loss_type": "k3",
            "kl_loss_coef": 0.01,
        },
        "reward": {"custom_function": {"path": str(reward), "name": "compute_score"}},
        "trainer": {"run_dir": str(tmp_path / "run"), "total_training_steps": 2, "test_freq": 1},
    }
    for key, value in sections.items():
        cfg[key].update(value)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def lucidrl_train(args: list[str], timeout: int = 600, cwd=None) -> subprocess.CompletedProcess:
    """`python -m lucidrl train ARGS` in a child process (Ray runs get a process of their own), in the
    folder `cwd` if given; a failure shows the tail of its output. Returns the finished process (its
    stdout and stderr)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-m", "lucidrl", "train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def make_stopping_model(src: str, dst, every: int = 3) -> str:
    """A copy of the tiny model at `src` whose generation config lists every `every`-th token id as an
    eos id too (as Qwen2.5's lists two), so sampled responses end after a few tokens and at different
    lengths. A random tiny model never samples its one eos within 10 tokens, and tests that always run
    to the length limit cannot see what differs between ranks whose responses end early. Returns the
    copy's path; its weights are the original's."""
    import shutil

    shutil.copytree(src, dst)
    path = os.path.join(dst, "generation_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(os.path.join(dst, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    first = config["eos_token_id"]
    # ids 0-2 are the special tokens (pad, <|im_start|>, <|im_end|>)
    config["eos_token_id"] = [first, *(i for i in range(3, vocab, every) if i != first)]
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return str(dst)


class ScriptedEngine:
    """A rollout engine (generate(Batch, SamplingParams) over token-id prompts, like HFRollout) whose
    turns come from `script(context_text, turn) -> text`, tokenized canonically and ended with
    <|im_end|>; every token's log-prob is -0.5. Multi-turn tests drive conversations with it."""

    def __init__(self, tokenizer, script, end="<|im_end|>"):
        self.tokenizer = tokenizer
        self.script = script
        self.eos_ids = [tokenizer.convert_tokens_to_ids(end)]
        self.calls = []  # (rows, n, max_new_tokens) per generate call

    def generate(self, batch, params):
        from lucidrl.workers.rollout.responses import batch_from_token_lists

        self.calls.append((len(batch), params.n, params.max_new_tokens))
        ids, logps = [], []
        for row, mask in zip(batch["prompts"], batch["prompt_mask"], strict=True):
            context = self.tokenizer.decode(row[mask.bool()].tolist(), skip_special_tokens=False)
            turn = context.count("<|im_start|>assistant") - 1
            for _ in range(params.n):
                text = self.script(context, turn)
                tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + self.eos_ids
                ids.append(tokens[: params.max_new_tokens])
                logps.append([-0.5] * len(ids[-1]))
        return batch_from_token_lists(batch, params, ids, logps, self.tokenizer.pad_token_id, self.eos_ids)


def prompt_batch(messages_per_prompt, extra_infos=None, data_source="arithmetic", ground_truths=None):
    """A prompt batch as collate makes it, for multi-turn rollouts (which re-render raw_prompt)."""
    import torch

    from lucidrl.batch import Batch

    n = len(messages_per_prompt)
    return Batch(
        tensors={
            "prompts": torch.zeros(n, 1, dtype=torch.long),
            "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        },
        non_tensors={
            "uid": [f"p{i}" for i in range(n)],
            "raw_prompt": list(messages_per_prompt),
            "extra_info": list(extra_infos or [{} for _ in range(n)]),
            "data_source": [data_source] * n,
            "ground_truth": list(ground_truths or ["0"] * n),
            "assistant_prefix": [""] * n,
        },
    )


SLEEP_LOG: list = []


def sleepy(seconds: float) -> str:
    """Sleep, recording when the call started and ended (the multi-turn concurrency test).

    Args:
        seconds: how long
    """
    import threading
    import time

    start = time.monotonic()
    time.sleep(seconds)
    SLEEP_LOG.append((start, time.monotonic(), threading.get_ident()))
    return "slept"


def shout(text: str, *, times: int = 1) -> str:
    """Repeat a text in capitals.

    Args:
        text: what to repeat
    """
    return " ".join([text.upper()] * times)
