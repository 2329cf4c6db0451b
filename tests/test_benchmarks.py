"""The benchmark scripts still import what they name from lucidrl (CI does not run them: this catches
a rename or a move that left one behind)."""

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def _lucidrl_imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of every `from lucidrl... import name`, inside functions too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lucidrl"):
            out += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.startswith("lucidrl")]
    return out


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_every_lucidrl_name_a_benchmark_imports_exists(path):
    missing = []
    for module, name, line in _lucidrl_imports(path):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"line {line}: {module} ({e})")
            continue
        if name and not hasattr(mod, name):
            try:  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"line {line}: {module}.{name}")
    assert not missing, f"{path.name} imports what lucidrl no longer has: {missing}"
