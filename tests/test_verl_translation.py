"""verl command lines run unchanged: verl's own example scripts, translated key by key and trained for a step.

tests/fixtures/verl_scripts/ holds 13 scripts of volcengine/verl (and Logic-RL's and TinyZero's
training scripts) unchanged, each naming its source and commit. A script runs in bash with `python3`
replaced by a function that writes its arguments out, so the overrides are exactly what the user's
shell passes verl (variables, $((...)) and quotes resolved). Each override must be translated,
accepted with a note or refused with a reason; the refused ones are asserted per script.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lucidrl.config import ConfigError, load_config
from lucidrl.config.verl import ROWS, looks_like_verl, translate, verl_row
from lucidrl.config.verl_docs import markdown_table

SCRIPTS = Path(__file__).parent / "fixtures" / "verl_scripts"
FIXTURE_CONFIG = Path(__file__).parent / "fixtures" / "verl_ppo_trainer_keys.txt"

# the environment TinyZero's README has its users export before its script
SCRIPT_ENV = {
    "HOME": "/home/user",
    "DATA_DIR": "/home/user/data/countdown",
    "BASE_MODEL": "/home/user/models/Qwen2.5-3B",
    "ROLLOUT_TP_SIZE": "2",
    "N_GPUS": "2",
    "EXPERIMENT_NAME": "countdown-qwen2.5-3b",
}


def script_overrides(name: str, tmp_path: Path) -> list[str]:
    """The overrides `python3 -m verl.trainer.main_ppo` receives when the user runs the script."""
    out = tmp_path / f"{name}.args"
    shell = 'python3() { printf "%s\\0" "$@" > "$ARGS_OUT"; }; huggingface-cli() { :; }; f="$1"; shift; source "$f"'
    env = {"PATH": os.environ["PATH"], **SCRIPT_ENV, "ARGS_OUT": str(out)}
    done = subprocess.run(
        ["bash", "-c", shell, "bash", str(SCRIPTS / name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.is_file(), done.stderr[-2000:]
    args = out.read_text().split("\0")[:-1]
    assert args[:1] == ["-m"] and args[1] in ("verl.trainer.main_ppo", "recipe.dapo.main_dapo"), args[:2]
    return args[2:]


# script: (overrides, of them translated, refused verl keys); verl's 13 first, then Logic-RL's and
# TinyZero's. The rest are accepted: dropped as verl's default or as nothing to do in lucidrl, so a key
# that stops being translated (and would be dropped) changes the count.
EXPECTED = {
    "grpo_trainer__run_qwen2-7b.sh": (37, 32, set()),
    "grpo_trainer__run_qwen2-7b_math.sh": (37, 32, set()),
    "grpo_trainer__run_qwen2_5-3b_gsm8k_grpo_lora.sh": (43, 36, set()),
    "grpo_trainer__run_deepseek7b_llm_seq_balance.sh": (36, 31, set()),
    "grpo_trainer__run_qwen3-8b.sh": (37, 32, set()),
    "ppo_trainer__run_deepseek7b_llm.sh": (39, 30, set()),
    "ppo_trainer__run_gemma.sh": (37, 29, set()),
    "ppo_trainer__run_qwen2-7b_rm.sh": (
        51,
        35,
        {"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "critic.optim.lr_warmup_steps_ratio"},
    ),
    "reinforce_plus_plus_trainer__run_qwen2-7b_math_rf.sh": (37, 32, set()),
    "reinforce_plus_plus_trainer__run_qwen2-7b_math_rf_baseline.sh": (37, 32, set()),
    "rloo_trainer__run_qwen2-7b.sh": (36, 31, set()),
    "special_e2e__run_dapo.sh": (46, 38, {"data.gen_batch_size"}),
    "gmpo_trainer__test_dapo_7b_math.sh": (
        72,
        54,
        {
            "actor_rollout_ref.model.override_config.max_position_embeddings",
            "trainer.log_val_generations",
        },
    ),
    "logic_rl__main_grpo.sh": (38, 31, set()),
    "tinyzero__train_tiny_zero.sh": (30, 27, set()),
}


def test_every_fixture_script_has_an_expectation():
    assert sorted(p.name for p in SCRIPTS.glob("*.sh")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_override_of_verls_scripts_is_translated_or_refused_with_a_reason(name, tmp_path):
    overrides = script_overrides(name, tmp_path)
    assert looks_like_verl(overrides)
    out = translate(overrides, cuda=False)
    n, translated, refused = EXPECTED[name]
    assert len(overrides) == n
    assert {line.key for line in out.refused} == refused
    # every key is verl's own (none "lucidrl"), each counted once, and as many translated as before
    assert out.counts() == {
        "translated": translated, "accepted": n - translated - len(refused), "refused": len(refused), "lucidrl": 0
    }  # fmt: skip
    for line in out.lines:
        assert line.result, line  # a lucidrl key=value, or the reason
        if line.status == "refused":
            assert line.result.startswith(("not built yet", "GPU-only")), line
    described = out.describe()
    assert all(line.given in described for line in out.lines)  # printed once, each
    # nothing refused runs: the error lists every refused override at once
    if refused:
        with pytest.raises(ConfigError) as info:
            load_config(None, overrides, echo=None)
        assert all(key in str(info.value) for key in refused)


def test_what_the_translation_sets(tmp_path):
    """The values land on the lucidrl keys, verl's defaults first; a CPU machine generates with hf."""
    overrides = script_overrides("grpo_trainer__run_qwen2-7b.sh", tmp_path)
    out = translate(overrides, cuda=False)
    got = {k: v for k, v, _ in out.assignments}
    assert got["model.path"] == "Qwen/Qwen2-7B-Instruct"
    assert got["actor.ppo_micro_batch_size"] == 40 and got["actor.log_prob_micro_batch_size"] == 40
    assert got["rollout.name"] == "hf" and got["rollout.n"] == 5
    assert got["placement.pools.global.devices_per_node"] == 8 and got["trainer.backend"] == "ray"
    assert got["trainer.logger"] == ["console", "wandb"] and got["trainer.device"] == "cpu"
    assert got["data.train_files"] == ["/home/user/data/gsm8k/train.parquet"]
    assert got["actor.optim.weight_decay"] == 0.01  # verl's default, not lucidrl's 0
    on_gpu = {k: v for k, v, _ in translate(overrides, cuda=True).assignments}
    assert on_gpu["rollout.name"] == "vllm" and on_gpu["trainer.device"] == "cuda"
    printed: list[str] = []
    cfg = load_config(None, overrides, echo=printed.append)  # the script as it is: a valid config
    assert (cfg.rollout.n, cfg.actor.use_kl_loss, cfg.actor.kl_loss_type, cfg.data.max_response_length) == (
        5,
        True,
        "low_var_kl",
        1024,
    )
    assert cfg.placement.pools["global"].devices_per_node == 8 and cfg.trainer.save_freq == 20
    assert len(printed) == 1 and printed[0].startswith("lucidrl: a verl command line (37 overrides")
    # with a lucidrl config file the file is the base: verl's defaults are not applied
    assert "actor.optim.weight_decay" not in {
        k for k, _, _ in translate(overrides, from_file=True, cuda=False).assignments
    }


@pytest.mark.parametrize(
    ("override", "status", "fragment"),
    [
        ("trainer.save_freq=-1", "translated", "trainer.save_freq=-1"),
        (
            "trainer.test_freq=0",
            "translated",
            "trainer.test_freq=-1",
        ),  # verl: never; lucidrl's 0 is "at the end"
        ("actor_rollout_ref.model.path=~/m", "translated", f"model.path={os.path.expanduser('~/m')}"),
        ("actor_rollout_ref.model.path=hdfs://x/m", "refused", "lucidrl reads local files only"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "translated", "actor.policy_loss=gspo"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "translated", "actor.policy_loss=sapo"),
        ("actor_rollout_ref.actor.loss_scale_factor=512", "translated", "actor.loss_scale_factor=512"),
        ("actor_rollout_ref.actor.loss_scale_factor=null", "translated", "actor.loss_scale_factor=null"),
        ("algorithm.adv_estimator=gpg", "translated", "algorithm.adv_estimator=gpg"),
        ("algorithm.adv_estimator=grpo_vectorized", "translated", "algorithm.adv_estimator=grpo"),
        (
            "algorithm.rollout_correction.rollout_is=token",
            "translated",
            "algorithm.rollout_correction.rollout_is=token",
        ),
        (
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
            "translated",
            "model.attn_implementation=eager",
        ),
        ("+actor_rollout_ref.model.override_config.rope_theta=1e6", "refused", "model config overrides"),
        ("data.gen_batch_size=64", "refused", "not built yet"),
        ("actor_rollout_ref.rollout.name=sglang", "refused", "GPU-only"),
        ("actor_rollout_ref.actor.strategy=megatron", "refused", "GPU-only"),
        ("actor_rollout_ref.rollout.multi_turn.enable=false", "accepted", "verl's default"),
        ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3", "accepted", "multi_turn.enable on"),
        (
            "actor_rollout_ref.actor.clip_ratio=0.3",
            "translated",
            "actor.clip_ratio_low=0.3, actor.clip_ratio_high=0.3",
        ),
        ("actor_rollout_ref.actor.ppo_micro_batch_size=16", "translated", "actor.ppo_micro_batch_size=16"),
        ("trainer.logger=[console,file]", "translated", "trainer.logger=[console, jsonl]"),
        ("custom_reward_function.path=/r.py", "translated", "reward.custom_function.path=/r.py"),
        ("+custom_reward_function.reward_kwargs.strict=true", "translated", "reward_kwargs.strict=true"),
        ("actor_rollout_ref.actor.ppo_epochs=2", "translated", "actor.ppo_epochs=2"),
        ("~trainer.logger", "translated", "trainer.logger=[console, jsonl]"),
        ("rollout.top_k=5", "lucidrl", "rollout.top_k=5"),  # a lucidrl key among verl's
        ("actor_rollout_ref.actor.optimm.lr=1", "refused", "Did you mean 'actor_rollout_ref.actor.optim.lr'"),
    ],
)
def test_single_overrides(override, status, fragment):
    out = translate([override], cuda=False)
    (line,) = [line for line in out.lines if not line.derived]
    assert line.status == status, line
    assert fragment in f"{line.result} {line.why}", line


def test_global_micro_batches_are_divided_over_the_ranks_and_several_keys_agree_or_take_the_smallest():
    out = translate(
        [
            "actor_rollout_ref.actor.ppo_micro_batch_size=16",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20",
            "trainer.n_gpus_per_node=4",
        ],
        cuda=False,
    )
    got = {k: v for k, v, _ in out.assignments}
    assert got["actor.ppo_micro_batch_size"] == 4  # 16 over 4 ranks
    assert got["actor.log_prob_micro_batch_size"] == 20  # each bounds memory: the smaller keeps both
    clash = translate(["trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=3"], cuda=False)
    assert clash.refused and "make them agree" in clash.refused[0].result


def test_a_key_given_twice_is_said_and_the_later_one_used():
    out = translate(["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.n=8"], cuda=False)
    assert [line.status for line in out.lines] == ["accepted", "translated"]
    assert "given again later (actor_rollout_ref.rollout.n=8)" in out.lines[0].result
    assert {k: v for k, v, _ in out.assignments}["rollout.n"] == 8


def test_hydra_syntax_errors_say_what_to_write():
    with pytest.raises(ConfigError, match="Hydra sweep"):
        translate(["trainer.logger=console,wandb"])
    with pytest.raises(ConfigError, match="interpolation"):
        translate(["trainer.experiment_name=${trainer.project_name}"])
    with pytest.raises(ConfigError, match="no value"):
        translate(["trainer.nnodes"])


def test_save_freq_minus_one_is_never_in_lucidrls_own_key_too():
    cfg = load_config(
        None, ["model.path=x", "data.train_files=[a]", "trainer.save_freq=-1", "trainer.test_freq=-1"]
    )
    assert cfg.trainer.save_freq == -1 and cfg.trainer.test_freq == -1
    with pytest.raises(ConfigError, match="trainer.save_freq"):
        load_config(None, ["trainer.save_freq=-2"])


def test_a_verl_key_in_a_lucidrl_command_line_says_how_verl_keys_are_read():
    with pytest.raises(ConfigError, match=r"'trainer.n_gpus_per_node' .* is a verl key .*placement.pools"):
        load_config(None, ["trainer.n_gpus_per_node=8"])
    cfg = load_config(None, ["trainer.n_gpus_per_node=1", "data.train_files=[a]"], verl=True, echo=None)
    assert cfg.placement.pools["global"].devices_per_node == 1 and cfg.algorithm.adv_estimator == "gae"


def test_every_key_of_verls_config_has_a_row():
    """Every key of verl's generated ppo_trainer.yaml (its 556 leaves, tests/fixtures) finds a row: none
    falls through to 'unknown'."""
    keys = [k for k in FIXTURE_CONFIG.read_text().splitlines() if k and not k.startswith("#")]
    assert len(keys) > 500
    assert [k for k in keys if verl_row(k) is None] == []


def test_map_rows_name_lucidrl_keys_or_pending_ones():
    """A map row's lucidrl key exists, or is one issue 34 adds (then its overrides are 'not built yet')."""
    from lucidrl.config.verl import resolve_target

    pending = [r.lucidrl for r in ROWS if r.kind == "map" and resolve_target(r.target("x")) is None]
    assert all(
        p.startswith(
            ("actor.policy_loss.", "actor.loss_scale_factor", "actor.tau_", "algorithm.rollout_correction")
        )
        for p in pending
    ), pending


def test_the_migration_page_holds_the_table():
    page = (Path(__file__).parents[1] / "docs" / "migration.md").read_text()
    assert markdown_table() in page, "run: python -m lucidrl.config.verl_docs --write-docs docs/migration.md"


# ---- each script, on a laptop: one step on the tiny model ---------------------------------------------
GSM8K_QUESTIONS = [
    ("Tom has 3 apples and buys 5 more. How many apples does he have?", "8"),
    ("A box holds 6 eggs. How many eggs are in 4 boxes?", "24"),
    ("Sara read 12 pages on Monday and 9 on Tuesday. How many pages did she read?", "21"),
    ("A pen costs 2 dollars. How much do 7 pens cost?", "14"),
]


def _gsm8k(path: Path) -> str:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {
                    "role": "user",
                    "content": q + ' Let\'s think step by step and output the final answer after "####".',
                }
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a},
            "extra_info": {"split": "train", "index": i, "answer": f"#### {a}", "question": q},
        }
        for i, (q, a) in enumerate(GSM8K_QUESTIONS)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _math(path: Path, source: str) -> str:
    """Rows as verl's math_dataset.py (MATH) or the DAPO data set (math_dapo: an "Answer:" instruction) hold them."""
    rows = []
    for i, (q, a) in enumerate(GSM8K_QUESTIONS):
        if source == "math_dapo":
            text = (
                "Solve the following math problem step by step. The last line of your response should be of the form "
                f"Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\nRemember to "
                'put your answer on its own line after "Answer:".'
            )
        else:
            text = q + " Let's think step by step and output the final answer within \\boxed{}."
        rows.append(
            {
                "data_source": source,
                "prompt": [{"role": "user", "content": text}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {"split": "train", "index": i},
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _laptop(overrides: list[str], refused: set[str], paths: dict[str, str]) -> list[str]:
    """What a user changes to try a verl script on a laptop: the model and data paths, the sizes, one GPU and
    one step; the refused lines dropped, as the error says. Everything else stays as written."""
    sizes = {
        "data.train_batch_size": "2",
        "data.max_prompt_length": "1000",  # the tiny model has 1024 positions
        "data.max_response_length": "8",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
        "actor_rollout_ref.actor.ppo_micro_batch_size": "2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size": "8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size": "8",
        "critic.ppo_micro_batch_size_per_gpu": "2",
        "critic.ppo_micro_batch_size": "2",
        "trainer.n_gpus_per_node": "1",
        "trainer.nnodes": "1",
        "trainer.total_training_steps": "1",
        "trainer.default_local_dir": paths["run"],
        "reward_model.overlong_buffer.len": "4",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len": "4",
        "+reward_model.reward_kwargs.max_resp_len": "8",
        "algorithm.filter_groups.max_num_gen_batches": "2",
        "actor_rollout_ref.model.path": paths["model"],
        "critic.model.path": paths["model"],
        "reward_model.model.path": paths["rm"],
    }
    out = []
    for text in overrides:
        key = text.split("=", 1)[0]
        if key.lstrip("+~") in refused:
            continue
        if key == "data.train_files" or key == "data.val_files":
            files = paths["val" if key == "data.val_files" else "train"]
            out.append(f"{key}=[{', '.join(files)}]")
        elif key in sizes:
            out.append(f"{key}={sizes.pop(key)}")
        else:
            out.append(text)
    for key in (
        "trainer.total_training_steps",
        "trainer.n_gpus_per_node",
        "trainer.nnodes",
        "trainer.default_local_dir",
    ):
        if key in sizes:  # not in the script: added
            out.append(f"{key}={sizes[key]}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED)[:13])
def test_each_script_trains_one_step_on_a_laptop(name, tmp_path, tiny_model, monkeypatch, capsys):
    from test_reward_model import _save_reward_model

    from lucidrl.cli import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    overrides = script_overrides(name, tmp_path)
    n_files = next(len(load_config_value(o)) for o in overrides if o.startswith("data.train_files="))
    if "dapo" in name:
        train = [_math(tmp_path / "dapo.parquet", "math_dapo")]
    else:
        train = [
            _gsm8k(tmp_path / "gsm8k.parquet"),
            _math(tmp_path / "math.parquet", "DigitalLearningGmbH/MATH-lighteval"),
        ]
        train = train[:n_files]
    paths = {
        "model": str(tiny_model["path"]),
        "rm": str(_save_reward_model(tiny_model, tmp_path / "rm")) if "_rm" in name else "unused",
        "train": train,
        "val": train,
        "run": str(tmp_path / "run"),
    }
    laptop = _laptop(overrides, EXPECTED[name][2], paths)
    assert main(["train", *laptop]) == 0
    printed = capsys.readouterr().out
    assert "lucidrl: a verl command line" in printed and "actor_rollout_ref.model.path=" in printed
    assert "step 1 " in printed and "pg_loss=" in printed  # the console logger's line of the step
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def load_config_value(override: str):
    from lucidrl.config.values import parse_override

    value = parse_override(override)[1]
    return value if isinstance(value, list) else [value]


def test_a_per_sequence_loss_gets_the_aggregation_verl_gives_it_whatever_the_line_says():
    """verl's geo_mean and sapo average per sequence and ignore loss_agg_mode (its GMPO script sets
    token-mean); lucidrl's loader asks for the mode to say so, so the translation sets it, and notes it."""
    from lucidrl.config.verl import translate

    for given in ([], ["actor_rollout_ref.actor.loss_agg_mode=token-mean"]):
        out = translate(["actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean", *given], cuda=False)
        modes = [v for k, v, _ in out.assignments if k == "actor.loss_agg_mode"]
        assert modes == ["seq-mean-token-mean"]
        assert any("verl aggregates it per sequence" in n for n in out.notes)
    vanilla = translate(["actor_rollout_ref.actor.loss_agg_mode=token-mean"], cuda=False)
    assert [v for k, v, _ in vanilla.assignments if k == "actor.loss_agg_mode"] == ["token-mean"]
