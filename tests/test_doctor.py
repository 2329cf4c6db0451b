"""`lucidrl doctor`: each check passes on what works and fails, with its fix, on what does not."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import write_train_config

from lucidrl.cli import main
from lucidrl.config import load_config
from lucidrl.doctor import checks, machine, run_checks
from lucidrl.doctor.checks import Check, Needs
from lucidrl.models.loading import ModelLoadError


def test_cgroup_quota_is_read_in_cpus(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")
    assert machine.cgroup_cpu_quota(str(f)) == 1.5
    f.write_text("max 100000\n")
    assert machine.cgroup_cpu_quota(str(f)) is None
    assert machine.cgroup_cpu_quota(str(tmp_path / "absent")) is None


def test_more_torch_threads_than_cpus_is_a_warning_with_the_variable_to_set():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        check = machine.check_torch(cpus=2)
        assert check.status == "warn" and "3 intra-op threads on 2 usable CPUs" in check.detail
        assert "OMP_NUM_THREADS=2" in check.fix
        assert machine.check_torch(cpus=8).status == "ok"
    finally:
        torch.set_num_threads(before)


def test_a_small_dev_shm_is_a_warning(monkeypatch, tmp_path):
    real = machine.os.statvfs

    class Small:
        f_blocks, f_bavail, f_frsize = 16384, 16000, 4096  # 64 MiB, Docker's default

    monkeypatch.setattr(machine.os, "statvfs", lambda path: Small() if path == "/fake/shm" else real(path))
    check = machine.check_shm("/fake/shm")
    assert check.status == "warn" and "0.1 GiB free of 0.1 GiB" in check.detail and "--shm-size" in check.fix
    missing = machine.check_shm(str(tmp_path / "no-such-shm"))
    assert missing.status == "warn" and "is missing" in missing.detail


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks what a CPU build of torch reports")
def test_a_config_that_needs_gpus_fails_on_a_cpu_build_of_torch():
    assert machine.check_cuda(Needs()).status == "ok"
    check = machine.check_cuda(Needs(gpu=True))
    assert check.status == "fail" and "is a CPU build" in check.detail and "CUDA build" in check.fix


def test_vllm_torch_pin_is_compared_with_the_installed_torch():
    assert machine.vllm_torch_conflict(["torch==2.13.0", "numpy"], "2.12.1+cpu") == "torch==2.13.0"
    assert machine.vllm_torch_conflict(["torch==2.13.0"], "2.13.0+cu128") is None
    assert machine.vllm_torch_conflict(["torch>=2.12,<2.14"], "2.13.0") is None
    # a requirement for another platform does not apply here
    assert machine.vllm_torch_conflict(['torch==2.0.0; sys_platform == "nonexistent"'], "2.13.0") is None


def test_vllm_missing_fails_only_when_the_config_uses_it(monkeypatch):
    def absent(name):
        raise machine.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(machine.importlib.metadata, "version", absent)
    assert machine.check_vllm(Needs()).status == "ok"
    check = machine.check_vllm(Needs(vllm=True))
    assert check.status == "fail" and "lucidrl[vllm]" in check.fix


def test_compile_without_a_compiler_warns_and_fails_when_the_config_compiles(monkeypatch):
    monkeypatch.setattr(machine, "cxx_compiler", lambda: None)
    assert machine.check_compile(Needs()).status == "warn"
    check = machine.check_compile(Needs(compile=True))
    assert check.status == "fail" and "apt install g++" in check.fix


def test_a_child_that_aborts_is_reported_with_its_signal_and_stderr():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys; print('about to abort', file=sys.stderr, flush=True); os.abort()",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result, why = machine._collect(proc, timeout=60)
    assert result is None and "signal 6" in why and "about to abort" in why


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor's CPU backend needs a C++ compiler")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compile_probe_really_compiles_and_matches_eager(dtype):
    """bfloat16 logits compile to a graph of their own, which the probe left unchecked."""
    check = machine.check_compile(Needs(compile=True, logits_dtype=dtype))
    assert check.status == "ok", check
    assert f"compiled on cpu for {dtype} logits" in check.detail and "of eager" in check.detail


def test_the_compile_check_takes_the_logits_dtype_from_the_config():
    from lucidrl.config import load_config

    needs, _ = run_checks.needs_of(load_config(None, ["model.compute_dtype=bfloat16"]))
    assert needs.logits_dtype == "bfloat16"
    assert run_checks.needs_of(load_config(None, ["model.dtype=bfloat16"]))[0].logits_dtype == "bfloat16"
    assert run_checks.needs_of(load_config(None, []))[0].logits_dtype == "float32"


@pytest.mark.slow
def test_gloo_across_two_processes():
    check = machine.check_distributed("gloo", world=2, timeout=120)
    assert check.status == "ok", check
    assert "gloo: 2 processes joined" in check.detail


@pytest.mark.slow
def test_a_rendezvous_port_taken_by_someone_else_fails_the_distributed_check(monkeypatch):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    monkeypatch.setattr("lucidrl.workers.common.distributed.pick_port", lambda host, p: port)
    try:
        check = machine.check_distributed("gloo", world=2, timeout=20)
    finally:
        squatter.close()
    assert check.status == "fail" and f"127.0.0.1:{port}" in check.detail
    assert "rank 0:" in check.detail and "GLOO_SOCKET_IFNAME" in check.fix


# ---------------------------------------------------------------------------------------------- config


def _copy_model(tiny_model, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(tiny_model["path"], out)
    return out


def test_model_check_passes_on_a_saved_model_and_counts_its_tensors(tiny_model, tmp_path, kk_data):
    cfg = load_config(write_train_config(tmp_path, kk_data, tiny_model), ["data.max_prompt_length=512"])
    tok = run_checks.check_tokenizer(cfg)[1]
    check = run_checks.check_model(cfg, tok, str(tiny_model["path"]), "model.path")
    assert check.status == "ok", check
    assert "Qwen2ForCausalLM" in check.detail and "tensors match the architecture" in check.detail
    # 1024 + 16 positions of a model trained on 1024: `lucidrl train` refuses it, so doctor fails
    cfg.data.max_prompt_length = 1024
    check = run_checks.check_model(cfg, tok, str(tiny_model["path"]), "model.path")
    assert check.status == "fail" and "max_position_embeddings=1024" in check.detail


def test_model_whose_config_disagrees_with_its_weights_fails_naming_the_tensor(tiny_model, tmp_path, kk_data):
    folder = _copy_model(tiny_model, tmp_path)
    conf = json.loads((folder / "config.json").read_text())
    conf["intermediate_size"] += 8
    (folder / "config.json").write_text(json.dumps(conf))
    cfg = load_config(write_train_config(tmp_path, kk_data, tiny_model), [f"model.path={folder}"])
    tok = run_checks.check_tokenizer(cfg)[1]
    check = run_checks.check_model(cfg, tok, str(folder), "model.path")
    assert check.status == "fail" and "shapes differ from config.json" in check.detail
    assert "mlp.gate_proj.weight" in check.detail


def test_model_with_a_tensor_missing_from_its_file_fails(tiny_model, tmp_path, kk_data):
    from safetensors.torch import load_file, save_file

    folder = _copy_model(tiny_model, tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    dropped = "model.layers.1.self_attn.q_proj.weight"
    del weights[dropped]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = load_config(write_train_config(tmp_path, kk_data, tiny_model), [f"model.path={folder}"])
    tok = run_checks.check_tokenizer(cfg)[1]
    check = run_checks.check_model(cfg, tok, str(folder), "model.path")
    assert check.status == "fail" and "1 tensors missing" in check.detail and dropped in check.detail


def test_weights_the_architecture_does_not_use_are_a_warning(tiny_model, tmp_path, kk_data):
    folder = _copy_model(tiny_model, tmp_path)
    conf = json.loads((folder / "config.json").read_text())
    conf["num_hidden_layers"] -= 1  # the file still holds the last layer
    conf["layer_types"] = conf["layer_types"][:-1]
    (folder / "config.json").write_text(json.dumps(conf))
    cfg = load_config(write_train_config(tmp_path, kk_data, tiny_model), ["data.max_prompt_length=512"])
    tok = run_checks.check_tokenizer(cfg)[1]
    check = run_checks.check_model(cfg, tok, str(folder), "model.path")
    assert (
        check.status == "warn" and "tensors in the files that the architecture does not use" in check.detail
    )
    assert "model.layers.1." in check.detail and "fewer layers" in check.fix


def test_an_architecture_whose_tensors_transformers_converts_is_not_failed(tmp_path):
    """MoE experts are saved one by one and fused on load: their names differ from the module's by design."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from lucidrl.models.inspection import inspect_model_folder

    conf = MixtralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=2, num_experts_per_tok=1,
    )  # fmt: skip
    MixtralForCausalLM(conf).save_pretrained(tmp_path / "moe")
    info = inspect_model_folder(str(tmp_path / "moe"))
    assert info.converted and not info.missing and not info.mismatched


def test_a_truncated_weight_file_is_named(tiny_model, tmp_path):
    from lucidrl.models.inspection import inspect_model_folder

    folder = _copy_model(tiny_model, tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:100])
    with pytest.raises(ModelLoadError, match="/model.safetensors' is not a readable safetensors file"):
        inspect_model_folder(str(folder))


def test_an_embedding_smaller_than_the_tokenizer_fails(tiny_model, tmp_path, kk_data):
    cfg = load_config(write_train_config(tmp_path, kk_data, tiny_model), [])

    class Bigger:
        def __len__(self):
            return 10**6  # more tokens than the embedding has rows

    check = run_checks.check_model(cfg, Bigger(), str(tiny_model["path"]), "model.path")
    assert check.status == "fail" and "embedding rows but the tokenizer has" in check.detail


def _write_rows(path: Path, data_source: str) -> str:
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": "Who is a knight?"}],
        "ability": "logic",
        "reward_model": {"style": "rule", "ground_truth": "x"},
        "extra_info": {"index": 0},
    }
    pq.write_table(pa.Table.from_pylist([row, row]), path)
    return str(path)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(["doctor", *map(str, argv), "--skip", "compile,distributed", "--skip", "ray"])
    return code, capsys.readouterr().out


def test_doctor_on_a_good_config_passes_and_writes_json(tmp_path, kk_data, tiny_model, capsys):
    config = write_train_config(tmp_path, kk_data, tiny_model)
    out = tmp_path / "doctor.json"
    code, text = _run([config, "--json", str(out)], capsys)
    assert code == 0, text
    report = json.loads(out.read_text())
    names = [c["name"] for c in report["checks"]]
    for name in ("config", "torch", "shm", "placement", "tokenizer", "model (model.path)", "data", "rewards"):
        assert name in names
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["compile"] == "skip" and statuses["data"] == "ok" and statuses["rewards"] == "ok"
    assert "kk_logic (40 rows)" in text and "checks passed" in text


def test_doctor_names_a_data_source_without_a_reward_function(tmp_path, kk_data, tiny_model, capsys):
    rows = _write_rows(tmp_path / "rows.parquet", "my_new_task")
    config = write_train_config(tmp_path, kk_data, tiny_model)
    code, text = _run(
        [config, f"data.train_files=[{rows}]", "data.val_files=[]", "reward.custom_function.path=null"],
        capsys,
    )
    assert code == 1
    assert "fail rewards" in text and "no reward function for data_source 'my_new_task'" in text
    assert "@register_reward('my_new_task')" in text and "1 check(s) failed: rewards" in text


def test_doctor_runs_a_custom_reward_and_refuses_its_bad_output(tmp_path, kk_data, tiny_model, capsys):
    bad = tmp_path / "bad_reward.py"
    bad.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 'high'\n"
    )
    config = write_train_config(tmp_path, kk_data, tiny_model)
    code, text = _run([config, f"reward.custom_function.path={bad}"], capsys)
    assert code == 1 and "fail rewards" in text and "'high'" in text


def test_doctor_with_a_missing_model_skips_nothing_silently(tmp_path, kk_data, tiny_model, capsys):
    config = write_train_config(tmp_path, kk_data, tiny_model)
    code, text = _run([config, f"model.path={tmp_path / 'nowhere'}"], capsys)
    assert code == 1
    assert "fail tokenizer" in text and "folder does not exist" in text and "lucidrl model tiny" in text
    for name in ("model (model.path)", "data", "rewards"):
        assert f"skip {name}: needs the tokenizer, which failed" in text


def test_doctor_with_a_bad_config_key_fails_the_config_check(tmp_path, kk_data, tiny_model, capsys):
    config = write_train_config(tmp_path, kk_data, tiny_model)
    code, text = _run([config, "rollout.temprature=0.7"], capsys)
    assert code == 1 and "fail config" in text and "rollout.temprature" in text
    assert "fail tokenizer" not in text  # no config, no config checks


def test_doctor_refuses_to_skip_a_check_that_cannot_be_skipped(capsys):
    assert main(["doctor", "--skip", "rewards"]) == 2
    assert "only compile, distributed, ray can be skipped" in capsys.readouterr().err


def test_a_check_that_crashes_is_a_failure_not_a_crash():
    def broken() -> Check:
        raise KeyError("boom")

    check, value = checks.run_check("broken", broken)
    assert check.status == "fail" and "the check raised KeyError" in check.detail and value is None


@pytest.mark.slow
def test_ray_probe_group_starts_dispatches_and_relays_errors():
    check = machine.check_ray(Needs(), start=True)
    assert check.status == "ok", check
    assert "2 probe actors" in check.detail


def test_doctor_checks_a_rollout_server_answers_and_takes_weights(tmp_path, kk_data, tiny_model, capsys):
    from lucidrl.serving.server import make_server

    config = write_train_config(tmp_path, kk_data, tiny_model)
    for accept, want in ((True, 0), (False, 1)):
        server, handle = make_server(str(tiny_model["path"]), "127.0.0.1", 0, accept_weights=accept)
        with handle:
            code, text = _run(
                [config, "rollout.name=server", f"rollout.server.base_url={handle.url}"], capsys
            )
        assert code == want, text
        if accept:
            assert f"ok rollout server: {handle.url} serves" in text and "takes weight updates" in text
        else:
            assert "fail rollout server" in text and "--accept-weights" in text
    code, text = _run([config, "rollout.name=server", f"rollout.server.base_url={handle.url}"], capsys)
    assert code == 1 and "fail rollout server" in text  # nothing listens there any more


def test_more_ray_cpu_ranks_than_cpus_fails_the_placement_check(tmp_path, kk_data, tiny_model, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    overrides = [
        "trainer.backend=ray",
        "placement.pools.global.devices_per_node=4",
        "trainer.cpus_per_rank=2",
    ]
    cfg = load_config(write_train_config(tmp_path, kk_data, tiny_model), overrides)
    needs, words = run_checks.needs_of(cfg)
    assert needs.ray and needs.ranks == 4 and not needs.gpu
    check = run_checks.check_placement(needs, words, cpus=6)
    assert check.status == "fail" and "4 ranks x trainer.cpus_per_rank=2 CPUs" in check.detail
    assert run_checks.check_placement(needs, words, cpus=8).status == "ok"
    # a run that joins a cluster places its ranks there: by the key, or by RAY_ADDRESS (`ray job submit`)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    needs, words = run_checks.needs_of(cfg)
    assert needs.joins_cluster and run_checks.check_placement(needs, words, cpus=6).status == "ok"
    monkeypatch.delenv("RAY_ADDRESS")
    joined = load_config(
        write_train_config(tmp_path, kk_data, tiny_model), [*overrides, "trainer.ray_address=auto"]
    )
    assert run_checks.check_placement(*run_checks.needs_of(joined), cpus=6).status == "ok"
