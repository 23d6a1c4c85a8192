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


def test_the_swap_benchmarks_every_part_written_still_writes_every_part(monkeypatch):
    # benchmarks/swap.py times a swap with no part taken whole by replacing one method of the
    # rewrite: that method must still be the one, or the benchmark fails (or, worse, times the
    # same swap twice) only when someone runs it
    import copy

    import torch

    import graphsurgeon as gs
    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.rewrite import _builder, _parts

    spec = importlib.util.spec_from_file_location("benchmark_swap", SCRIPTS[0].parent / "swap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = TinyGPT(n_layers=8).eval()
    ep = gs.export(model, (model.example_input(),), preserve=[f"layers.{i}" for i in range(8)])
    request = {"layers.3": copy.deepcopy(model.layers[3])}
    gs.swap(ep, request)  # the parts it left alone are kept for the next swap
    written = []
    original = _parts.PartCache.compiled
    monkeypatch.setattr(_parts, "CHECK_KEPT_PARTS", False)  # what a user runs
    monkeypatch.setattr(_builder, "CHECK_FOOTPRINT", False)
    monkeypatch.setattr(
        _parts.PartCache,
        "compiled",
        lambda self, text: written.append(text) or original(self, text),
    )
    counts = []  # parts written by each swap the benchmark times
    timed = module.timed

    def counting(function, *args):
        before = len(written)
        result = timed(function, *args)
        counts.append(len(written) - before)
        return result

    monkeypatch.setattr(module, "timed", counting)
    module.kept_parts_ratio(ep, request, rounds=2)
    assert len(counts) == 4
    assert 0 < min(counts) < max(counts), f"parts written by the benchmark's swaps: {counts}"
