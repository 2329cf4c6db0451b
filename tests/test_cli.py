def test_the_closing_line_names_only_what_the_run_folder_holds():
    from types import SimpleNamespace

    from lucidrl.cli.common import run_dir_contents as _run_dir_contents

    full = SimpleNamespace(logger=["console", "jsonl"], save_final_model=True)
    assert _run_dir_contents(full) == "metrics.jsonl, config.yaml, final/ HuggingFace model"
    bare = SimpleNamespace(logger=["console"], save_final_model=False)
    assert _run_dir_contents(bare) == "config.yaml"
