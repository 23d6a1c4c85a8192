"""Test modules take their models from tests/helpers (models.py and one ``*_models.py`` per
theme); a model class at the top of a test module is a habit this test stops from coming back.

The few that stay are the ones whose own file or module is what the test reads: the line a
check names, the module path a drawing shows."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from torch import nn

TESTS = Path(__file__).parent

# module: {class: why it must be written in that module}
STAY = {
    "test_compare.py": dict.fromkeys(
        [
            "SdpaAttention",
            "WrittenOutAttention",
            "StepMLP",
            "StepLayerNorm",
            "LlamaSdpa",
            "StackedRope",
            "InterleavedLlama",
            "Gpt2Attention",
            "PlantedRMSNorm",
            "PlantedLayerNorm",
            "DetachedRMSNorm",
            "StraightThroughReLU",
        ],
        "locate() must name the line of the planted bug in this file",
    ),
    "test_render.py": dict.fromkeys(
        ["Inner", "Outer", "Doubler", "Looped"],
        "the expected drawings name them <tests>.Class, this module's path",
    ),
    "test_surgery.py": {"DataDependent": "the export error names test_surgery.py"},
    "test_widget.py": {"DoubledMLP": "the compare panel names test_widget.py"},
}


def _imported(tree: ast.Module, name: str):
    """The object ``name`` is bound to by the module's top-level imports, or None."""
    head, _, rest = name.partition(".")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if (alias.asname or alias.name) == head:
                    value = getattr(importlib.import_module(node.module), alias.name, None)
                    for part in filter(None, rest.split(".")):
                        value = getattr(value, part, None)
                    return value
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.partition(".")[0]) == head:
                    value = importlib.import_module((alias.asname and alias.name) or head)
                    for part in filter(None, rest.split(".")):
                        value = getattr(value, part, None)
                    return value
    return None


def model_classes(path: Path) -> list[str]:
    """The top-level classes of the test module at ``path`` that are ``nn.Module`` subclasses."""
    tree = ast.parse(path.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def is_model(node: ast.ClassDef) -> bool:
        for base in node.bases:
            text = ast.unparse(base)
            if text in classes:
                if is_model(classes[text]):
                    return True
                continue
            value = _imported(tree, text)
            if isinstance(value, type) and issubclass(value, nn.Module):
                return True
        return False

    return [name for name, node in classes.items() if is_model(node)]


def test_test_modules_take_their_models_from_helpers():
    found = {path.name: set(model_classes(path)) for path in sorted(TESTS.glob("test_*.py"))}
    extra = {name: sorted(classes - set(STAY.get(name, {}))) for name, classes in found.items()}
    assert not {name: classes for name, classes in extra.items() if classes}, (
        "put these in tests/helpers (models.py, or the *_models.py of their theme) and import them"
    )
    gone = {name: sorted(set(why) - found.get(name, set())) for name, why in STAY.items()}
    assert not {name: classes for name, classes in gone.items() if classes}, "update STAY"


def test_the_check_sees_a_model_class_and_its_subclasses(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from torch import nn\n"
        "class Base(nn.Module): pass\n"
        "class Child(Base): pass\n"
        "class Plain: pass\n"
    )
    assert model_classes(probe) == ["Base", "Child"]
