"""The benchmarks stay runnable: each script imports (what it uses of graphsurgeon exists).

They are run by `make bench`, not by the test suite (minutes on two cores); this only keeps
a refactoring from breaking them unnoticed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_imports_and_has_a_main(script):
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs only definitions: each script's work is in main()
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"


def test_there_are_benchmarks():
    assert {p.name for p in SCRIPTS} >= {"swap.py", "render.py", "step.py", "export.py"}


def test_no_script_is_named_like_a_standard_module():
    # `python benchmarks/bisect.py` would put benchmarks/ first on sys.path, and torch's own
    # `import bisect` would then import the script
    import sys

    assert not {p.stem for p in SCRIPTS} & set(sys.stdlib_module_names)
