"""The public surface: every exported name resolves and says what it is; importing is cheap."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from helpers.imports import circles_but_surgery_widget

import graphsurgeon as gs
from graphsurgeon import errors, types

PUBLIC_MODULES = [gs, errors, types]


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_every_exported_name_resolves_and_has_a_docstring(module):
    assert module.__all__, "precondition: the module exports names"
    assert len(set(module.__all__)) == len(module.__all__), "no name exported twice"
    for name in module.__all__:
        value = getattr(module, name)  # AttributeError: exported but missing
        if inspect.ismodule(value) or callable(value) or inspect.isclass(value):
            assert (value.__doc__ or "").strip(), f"{module.__name__}.{name} has no docstring"


def test_the_top_level_stays_small():
    # verbs, a few result types and the common errors; the rest lives in types and errors
    assert len(gs.__all__) <= 30, sorted(gs.__all__)
    public = {name for name in vars(gs) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(gs, name))}
    # nothing public beyond __all__ but the stage modules themselves
    assert public - set(gs.__all__) - modules == set(), sorted(public - set(gs.__all__) - modules)


def test_a_name_that_moved_says_where_it_is():
    with pytest.raises(AttributeError, match=r"from graphsurgeon\.swap import swap_info"):
        gs.swap_info  # noqa: B018
    assert set(errors.__all__) >= {n for n in gs.__all__ if n.endswith("Error")}


def test_every_error_is_a_graphsurgeon_error_in_the_errors_module():
    for name in errors.__all__:
        value = getattr(errors, name)
        if inspect.isclass(value) and issubclass(value, Exception):
            assert issubclass(value, errors.GraphSurgeonError), name
            assert value.__module__ == "graphsurgeon.errors", name
    drawn = errors.__doc__
    for name in errors.__all__:
        if inspect.isclass(getattr(errors, name)):
            assert name in drawn, f"{name} is missing from the tree in the errors docstring"


def test_importing_graphsurgeon_loads_no_notebook_packages():
    code = (
        "import sys, graphsurgeon\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'IPython', 'ipywidgets', 'ipykernel', 'graphviz', 'anywidget'} "
        "or m.startswith('graphsurgeon.widget'))\n"
        "print(','.join(loaded))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "", f"import graphsurgeon loaded {result.stdout.strip()}"


def test_no_import_circle_in_the_package_but_surgery_widget():
    assert circles_but_surgery_widget() == []


def test_a_module_that_moved_is_imported_by_its_old_path_and_shadows_no_function():
    """The checks and the patterns are packages now (graphsurgeon.checks.verify, ...); the old
    paths are the same modules, and importing one never puts a module over ``gs.verify``."""
    script = (
        "import importlib, graphsurgeon as gs\n"
        "from graphsurgeon._moved import MOVED\n"
        "for old, new in MOVED.items():\n"
        "    assert importlib.import_module(old) is importlib.import_module(new), old\n"
        "from graphsurgeon.verify import eager_reference\n"
        "from graphsurgeon.bisect import Bisection\n"
        "import graphsurgeon.find\n"
        "assert callable(gs.verify) and callable(gs.compare) and callable(gs.find)\n"
        "assert gs.verify.__module__ == 'graphsurgeon.checks.verify'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr
