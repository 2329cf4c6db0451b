import pytest

from lucidrl.config import ConfigError, config_from_dict, load_config, parse_override


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  path: /m\nactor:\n  optim:\n    lr: 1e-4\nrollout:\n  n: 8\n")
    cfg = load_config(f, ["rollout.temperature=0.7", "data.train_files=a.parquet", "trainer.logger=[jsonl]"])
    assert cfg.model.path == "/m"
    assert cfg.actor.optim.lr == pytest.approx(1e-4)
    assert cfg.rollout.n == 8 and cfg.rollout.temperature == 0.7
    assert cfg.data.train_files == ["a.parquet"]
    assert cfg.trainer.logger == ["jsonl"]


def test_unknown_key_names_closest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.temprature'.*'rollout.temperature'"):
        load_config(None, ["rollout.temprature=0.5"])
    with pytest.raises(
        ConfigError, match=r"unknown config key 'actor.clip_ratio'.*did you mean 'actor.clip_ratio_\w+'"
    ):
        load_config(None, ["actor.clip_ratio=0.2"])


def test_unknown_key_in_file_names_the_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  max_prompt_lenght: 10\n")
    with pytest.raises(ConfigError, match=r"data.max_prompt_lenght.*file .*c.yaml.*data.max_prompt_length"):
        load_config(f)


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.n=two", "rollout.n.*must be an integer, got 'two'"),
        ("actor.use_kl_loss=1", "must be true or false"),
        ("model.dtype=float16", "must be one of 'float32', 'bfloat16'"),
        ("rollout.top_p=1.5", r"rollout.top_p.*\(0, 1\]"),
        (
            "rollout.val_kwargs={do_sample: true, temperature: 0}",
            r"val_kwargs.temperature must be > 0.*do_sample=false",
        ),
        ("actor.clip_ratio_c=1.0", "'actor.clip_ratio_c' .* must be > 1 .the dual-clip bound"),
        ("algorithm.adv_estimator=grpoo", "algorithm.adv_estimator.*grpo"),
        ("actor.loss_agg_mode=token_mean", "actor.loss_agg_mode.*token-mean"),
        ("rollout.n=0", "'rollout.n' .* must be >= 1, got 0"),
        ("trainer.logger=[neptune]", "unknown backend"),
        ("rollout=3", "is a section"),
    ],
)
def test_bad_values_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_batch_arithmetic_is_checked():
    with pytest.raises(ConfigError, match="not divisible by actor.ppo_mini_batch_size=3"):
        config_from_dict({"data": {"train_batch_size": 8}, "actor": {"ppo_mini_batch_size": 3}})
    with pytest.raises(ConfigError, match="larger than data.train_batch_size"):
        config_from_dict({"data": {"train_batch_size": 4}, "actor": {"ppo_mini_batch_size": 8}})
    with pytest.raises(ConfigError, match="4 x 2 = 8 samples, not divisible by actor.ppo_micro_batch_size=3"):
        config_from_dict(
            {
                "data": {"train_batch_size": 4},
                "rollout": {"n": 2},
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 3},
            }
        )
    with pytest.raises(ConfigError, match="rollout.n must be >= 2"):
        config_from_dict({"rollout": {"n": 1}})


def test_token_budgets_must_hold_one_whole_sample():
    small = {"data": {"max_prompt_length": 300, "max_response_length": 200}}
    with pytest.raises(
        ConfigError, match=r"actor.ppo_max_token_len_per_gpu=400 .* 300 \+ 200 = 500 tokens; set .* >= 500"
    ):
        config_from_dict({**small, "actor": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 400}})
    with pytest.raises(
        ConfigError, match=r"critic.ppo_max_token_len_per_gpu=300 .* \(or critic.use_dynamic_bsz=false\)"
    ):
        config_from_dict({**small, "critic": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 300}})
    with pytest.raises(ConfigError, match="actor.log_prob_max_token_len_per_gpu=499 "):
        config_from_dict({**small, "actor": {"use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 499}})
    # the budget replaces the sample count: a micro-batch size that does not divide is not an error then
    cfg = config_from_dict(
        {
            **small,
            "data": {**small["data"], "train_batch_size": 4},
            "rollout": {"n": 2},
            "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 3, "use_dynamic_bsz": True},
        }
    )
    assert cfg.actor.use_dynamic_bsz and cfg.actor.ppo_max_token_len_per_gpu == 16384


def test_an_override_inside_a_mapping_changes_that_key_alone(tmp_path):
    """`placement.pools.global.devices_per_node=2 placement.pools.global.nodes=1` meant one device: each
    override replaced the whole mapping, resetting what the file and earlier overrides had set."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "trainer: {backend: ray}\nplacement: {pools: {global: {nodes: 1, devices_per_node: 4}}}\n"
    )
    cfg = load_config(
        path,
        [
            "placement.pools.global.nodes=2",
            "placement.pools.extra.devices_per_node=3",
            "placement.critic.pool=extra",
        ],
    )
    assert {k: (p.nodes, p.devices_per_node) for k, p in cfg.placement.pools.items()} == {
        "global": (2, 4),
        "extra": (1, 3),
    }
    cfg = load_config(
        None,
        [
            "trainer.backend=ray",
            "placement.pools.global.devices_per_node=2",
            "placement.pools.global.nodes=1",
        ],
    )
    assert cfg.placement.pools["global"].devices_per_node == 2
    # the whole mapping, or a whole entry, is still replaced when it is what the override names
    cfg = load_config(path, ["placement.pools={global: {devices_per_node: 2}}"])
    assert (cfg.placement.pools["global"].nodes, cfg.placement.pools["global"].devices_per_node) == (1, 2)
    cfg = load_config(path, ["placement.pools.global={devices_per_node: 2}"])
    assert (cfg.placement.pools["global"].nodes, cfg.placement.pools["global"].devices_per_node) == (1, 2)
    kw = ["reward.custom_function.reward_kwargs.a=1", "reward.custom_function.reward_kwargs.b.c=2"]
    cfg = load_config(None, [*kw, "reward.custom_function.reward_kwargs.b.d=3"])
    assert cfg.reward.custom_function.reward_kwargs == {"a": 1, "b": {"c": 2, "d": 3}}
    with pytest.raises(ConfigError, match="unknown config key 'placement.pools.global.nodez'"):
        load_config(None, ["placement.pools.global.nodez=1"])


def test_parse_override_types():
    assert parse_override("a.b=8") == ("a.b", 8)
    assert parse_override("a.b=1e-4") == ("a.b", 1e-4)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=null") == ("a.b", None)
    assert parse_override("a.b=x=y") == ("a.b", "x=y")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("rollout.n")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a=012", 12),  # YAML 1.1: octal 10
        ("a=1:30", "1:30"),  # 1.1: sexagesimal 90
        ("a=yes", "yes"),  # 1.1: True (trainer.logger=yes was ['True'])
        ("a=run #2", "run #2"),  # a YAML comment: 'run'
        ("a='1e-4'", "1e-4"),  # quoted: the string (it became a float)
        ("a=1e-4", 1e-4),
        ("a=.5", 0.5),
        ("a=0x10", 16),
        ("a=-.inf", float("-inf")),
        ("a=[x, y]", ["x", "y"]),
        ("a={b: 1}", {"b": 1}),
    ],
)
def test_override_values_mean_what_they_say(text, value):
    """YAML 1.2's core schema, as OmegaConf reads overrides; YAML 1.1 turned each of the first five
    into something else without a word."""
    assert parse_override(text) == ("a", value)


def test_a_string_is_a_one_item_list_only_as_the_keys_own_value(tmp_path):
    """`placement.colocate=[actor, rollout]` made each role a colocate group of its own (the error then
    spoke of devices); now it says a list of lists is needed."""
    assert load_config(None, ["data.train_files=a.parquet"]).data.train_files == ["a.parquet"]
    with pytest.raises(
        ConfigError, match=r"placement.colocate\[0\]' .* must be a list, got 'actor' \(a list of lists"
    ):
        load_config(None, ["placement.colocate=[actor, rollout]"])
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  optim: {lr: 1e-4}\ntrainer: {experiment_name: '1e3'}\n")
    cfg = load_config(path)
    assert cfg.actor.optim.lr == 1e-4 and cfg.trainer.experiment_name == "1e3"


def test_missing_config_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/c.yaml")


def test_shipped_example_configs_load():
    from pathlib import Path

    examples = sorted(Path(__file__).parent.parent.glob("examples/*.yaml"))
    assert examples
    for path in examples:
        load_config(path)


def test_help_config_lists_every_key_the_unknown_key_error_points_to(capsys):
    """The error for an unknown key said `lucidrl train --help-config`, which did not exist."""
    from lucidrl.cli import main
    from lucidrl.config.fields import all_keys
    from lucidrl.config.schema import LucidConfig, SFTConfig

    with pytest.raises(ConfigError, match="see `lucidrl train --help-config` for every key"):
        load_config(None, ["zzzz.qqqq=1"])
    for command, schema in (("train", LucidConfig), ("sft", SFTConfig)):
        assert main([command, "--help-config"]) == 0
        lines = capsys.readouterr().out.splitlines()
        listed = {line.split(" = ")[0] for line in lines}
        leaves = {k for k in all_keys(schema) if not any(o.startswith(k + ".") for o in all_keys(schema))}
        assert listed == leaves, leaves ^ listed
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert (
        "actor.optim.lr = 1.0e-06  (float in [0, inf))" in out
        and "reward.custom_function.reward_kwargs = {}  (dict)" in out
    )
    assert "placement.pools = {global: {devices_per_node: 1, nodes: 1}}  (dict)" in out


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor.optim.grad_clip=0", r"'actor.optim.grad_clip' .* must be > 0 .*0 zeroes every gradient"),
        ("critic.optim.grad_clip=-1", "'critic.optim.grad_clip' .* must be > 0"),
        (
            "actor.optim.lr=-1",
            r"'actor.optim.lr' .* must be in \[0, inf\) \(a finite learning rate\), got -1",
        ),
        ("actor.optim.betas=[0.9, 0.999, 0.5]", r"betas must be two numbers in \[0, 1\)"),
        ("actor.optim.betas=[2, 3]", r"'actor.optim.betas\[0\]' .* must be in \[0, 1\) .Adam's., got 2"),
        ("actor.optim.warmup_steps=-3", "'actor.optim.warmup_steps' .* must be >= 0 .0: no warm-up., got -3"),
        ("actor.clip_ratio_c=.nan", "actor.clip_ratio_c' .* must be a number, got NaN"),
        ("trainer.max_time_s=.nan", "must be a number, got NaN"),
        ("algorithm.kl_ctrl.horizon=0", "'algorithm.kl_ctrl.horizon' .* must be >= 1, got 0"),
        (
            "reward.overlong_buffer.penalty_factor=-1",
            "'reward.overlong_buffer.penalty_factor' .* must be >= 0 .a penalty.",
        ),
        ("trainer.device=gpu", "trainer.device='gpu' must be cpu, cuda or cuda:N"),
        ("trainer.num_threads=-2", "'trainer.num_threads' .* must be >= 1, got -2"),
        (
            "trainer.master_port=99999",
            r"'trainer.master_port' .* must be in \[1, 65535\] .a TCP port., got 99999",
        ),
        ("rollout.server.port=-1", r"'rollout.server.port' .* must be in \[1, 65535\] .a TCP port., got -1"),
        ("trainer.experiment_name=../precious", "must be one folder name"),
        ("trainer.experiment_name=", "must be one folder name"),
        ("trainer.experiment_name=..", "must be one folder name"),
        (
            "trainer.max_restarts=2",
            "restarts the run when a Ray worker process dies; with trainer.backend=local",
        ),
        ("trainer.max_restarts=-1", "'trainer.max_restarts' .* must be >= 0"),
        ("reward.on_error=skip", "reward.on_error"),
        ("reward.timeout_s=0", "'reward.timeout_s' .* must be > 0"),
        (
            "placement.pools.glboal.devices_per_node=2",
            r"placement.pools.glboal is defined but no role.*did you mean placement.pools.global",
        ),
    ],
)
def test_values_that_would_train_wrongly_or_fail_late_are_refused(override, message):
    """From a review: each of these was accepted, then trained silently wrong (a grad_clip of 0 zeroes the
    gradients, -1 reverses them; NaN passes every `x <= 0` check), failed with a raw traceback after the
    model loaded, or made an unused pool out of a typo."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_sft_checks_its_optimizer_and_run_settings_too():
    from lucidrl.config.schema import SFTConfig

    for override, message in (
        ("optim.grad_clip=0", "'optim.grad_clip' .* must be > 0"),
        ("trainer.max_time_s=-5", "'trainer.max_time_s' .* must be > 0 .seconds."),
        ("trainer.experiment_name=a/b", "must be one folder name"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [override], schema=SFTConfig)
    assert load_config(None, ["optim.grad_clip=.inf"], schema=SFTConfig).optim.grad_clip == float("inf")


def test_a_key_given_twice_in_a_file_is_an_error_naming_both_lines(tmp_path):
    """yaml.safe_load kept the last: a second `actor:` section silently dropped the first's lr."""
    path = tmp_path / "dup.yaml"
    path.write_text(
        "actor:\n  optim: {lr: 1.0e-5}\ndata: {train_batch_size: 8}\nactor:\n  ppo_mini_batch_size: 8\n"
    )
    with pytest.raises(ConfigError, match=r"key 'actor' is given twice in one mapping \(lines 1 and 4\)"):
        load_config(path)


def test_sft_refuses_lora_keys_it_would_not_read_and_a_config_path_may_hold_an_equals_sign(tmp_path):
    from lucidrl.cli.common import split_config_args as _split_config_args
    from lucidrl.config.schema import SFTConfig

    with pytest.raises(
        ConfigError, match="model.lora_alpha=32.0 configures LoRA, which `lucidrl sft` does not do"
    ):
        load_config(None, ["model.lora_alpha=32"], schema=SFTConfig)
    folder = tmp_path / "lr=1e-4"
    folder.mkdir()
    (folder / "config.yaml").write_text("{}\n")
    path = str(folder / "config.yaml")
    assert _split_config_args([path, "rollout.n=2"]) == (path, ["rollout.n=2"])  # was read as an override
    assert _split_config_args(["rollout.n=2"]) == (None, ["rollout.n=2"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=remax"],
            "a tied group still has advantages",
        ),
        (
            ["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=reinforce_plus_plus"],
            "a tied group still has advantages",
        ),
        (["trainer.collapse.max_kl=0.5"], "which this run does not compute .* the sign could never fire"),
        (
            ["critic.warmup_steps=5"],
            r"adv_estimator=grpo has no critic: the actor would not update for 5 steps",
        ),
    ],
)
def test_settings_that_would_do_nothing_or_discard_signal_are_refused(overrides, message):
    """From a review: DAPO's filter dropped tied groups that remax and REINFORCE++ still learn from (a
    tied group's advantage 1.0 under remax), a max_kl sign with no KL computed could never fire, and a
    critic warm-up with no critic froze the actor while rollouts ran."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.path=x", *overrides])
    load_config(None, ["model.path=x", "algorithm.filter_groups.enable=true"])  # grpo: the filter's home
    load_config(None, ["model.path=x", "trainer.collapse.max_kl=0.5", "actor.use_kl_loss=true"])
    load_config(None, ["model.path=x", "critic.warmup_steps=5", "algorithm.adv_estimator=gae"])


def test_restarts_without_checkpoints_are_warned_about():
    from lucidrl.trainer.config_warnings import config_warnings

    cfg = load_config(None, ["trainer.backend=ray", "trainer.max_restarts=1"])
    assert any("starts again from step 0" in line for line in config_warnings(cfg))
    cfg = load_config(None, ["trainer.backend=ray", "trainer.max_restarts=1", "trainer.save_freq=5"])
    assert not any("max_restarts" in line for line in config_warnings(cfg))
