"""Modules that moved, still importable by their old paths.

``graphsurgeon.verify`` was a module and is the function ``gs.verify``; the module is
``graphsurgeon.checks.verify``. ``from graphsurgeon.verify import eager_reference`` (the old
path) keeps working: the old names are aliases of the new modules in ``sys.modules``. The ones
whose old name is a function of the top level (``verify``, ``compare``, ``find``) are aliased
when graphsurgeon is imported (they are imported then anyway), so that importing the old path
never puts a module over the function; the others are found on first import by a finder that
loads the new module, so ``import graphsurgeon`` stays as cheap as it was.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["MOVED", "install"]

#: old module path -> where it is now
MOVED = {
    "graphsurgeon.verify": "graphsurgeon.checks.verify",
    "graphsurgeon.compare": "graphsurgeon.checks.compare",
    "graphsurgeon.locate": "graphsurgeon.checks.locate",
    "graphsurgeon.bisect": "graphsurgeon.checks.bisect",
    "graphsurgeon.overlay": "graphsurgeon.checks.overlay",
    "graphsurgeon._exec": "graphsurgeon.checks._exec",
    "graphsurgeon.find": "graphsurgeon.patterns.find",
    "graphsurgeon.region": "graphsurgeon.patterns.region",
}

# old names that are top-level functions too: aliased at once (see the module docstring)
_EAGER = ("graphsurgeon.verify", "graphsurgeon.compare", "graphsurgeon.find")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads the module that is there now, under both names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])  # the very module, not a copy

    def exec_module(self, module) -> None:
        pass  # it ran when it was imported by its own name


def install() -> None:
    """Make the old paths importable (once)."""
    for old in _EAGER:
        sys.modules.setdefault(old, importlib.import_module(MOVED[old]))
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
