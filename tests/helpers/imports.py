"""The package's import graph, read from its source (imports inside functions count): for the
tests that the package has no import circle and that a stage reaches nothing private."""

from __future__ import annotations

import ast
from pathlib import Path

import graphsurgeon as gs

PACKAGE = Path(gs.__file__).parent
MODULES = {
    ".".join(["graphsurgeon", *p.relative_to(PACKAGE).with_suffix("").parts]).removesuffix(
        ".__init__"
    ): p
    for p in PACKAGE.rglob("*.py")
}


def imports_of(module: str, source: str) -> list[tuple[str, str, str, int]]:
    """Every import in the ``source`` of graphsurgeon ``module``, inside functions too:
    (module imported, name imported from it or '' for the module itself, the function or
    class it is in or '' at the top, line)."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str, str, int]] = []
    scope: list[str] = []

    class Walker(ast.NodeVisitor):
        def visit_FunctionDef(self, node):
            scope.append(node.name)
            self.generic_visit(node)
            scope.pop()

        visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

        def visit_Import(self, node):
            for alias in node.names:
                found.append((alias.name, "", ".".join(scope), node.lineno))

        def visit_ImportFrom(self, node):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                if whole in MODULES:  # "from . import x": module x itself
                    found.append((whole, "", ".".join(scope), node.lineno))
                else:
                    found.append((base, alias.name, ".".join(scope), node.lineno))

    Walker().visit(ast.parse(source))
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, counting imports inside functions (and
    the package ``__init__`` that importing a submodule runs)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = name.split(".") if is_package else name.split(".")[:-1]
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    targets.append(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                parts = target.split(".")
                for i in range(2, len(parts) + 1):
                    module = ".".join(parts[:i])
                    own_package = name.startswith(module + ".") and i < len(parts)
                    if module in modules and module != name and not own_package:
                        edges[name].add(module)
    return edges


def circles_but_surgery_widget() -> list[list[str]]:
    """The import circles of the package, the one allowed (``Surgery.widget()`` importing
    the widget, its optional front end) left out."""
    graph = import_graph(PACKAGE)
    surgery = imports_of("graphsurgeon.surgery", MODULES["graphsurgeon.surgery"].read_text())
    # imports inside functions count: Surgery.widget() importing the widget is one, and the
    # one circle allowed (the widget is an optional front end of the Surgery)
    assert ("graphsurgeon.widget", "SurgeryWidget", "Surgery.widget") in [i[:3] for i in surgery]
    assert any({"graphsurgeon.surgery", "graphsurgeon.widget"} <= set(c) for c in circles(graph))
    graph["graphsurgeon.surgery"].discard("graphsurgeon.widget")
    return circles(graph)
