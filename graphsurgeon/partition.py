"""module_tree() and partition(): which fx nodes each module call owns, and whether it can be swapped.

Every node torch.export records carries ``meta["nn_module_stack"]``: the chain of module calls
it was traced in, outermost first. A call's key ends in ``@k`` for the k-th repeated call of the
same module (k >= 1), so a module called twice has two partitions, ``"shared"`` and
``"shared@1"``, each with its own signature in ``ep.module_call_graph``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallSignature
from torch.fx import Node

from ._errors import PartitionError, UnknownModuleError, did_you_mean
from .export import export_notes

__all__ = ["ModuleInfo", "ModuleTree", "Partition", "module_tree", "partition", "split_call_name"]

_CALL_SUFFIX = re.compile(r"@(\d+)$")


def split_call_name(name: str) -> tuple[str, int | None]:
    """``"blocks.0@1"`` -> ``("blocks.0", 1)``; ``"blocks.0"`` -> ``("blocks.0", None)``."""
    match = _CALL_SUFFIX.search(name)
    if match is None:
        return name, None
    return name[: match.start()], int(match.group(1))


def call_name(fqn: str, index: int) -> str:
    """The name of the ``index``-th call of ``fqn``: ``"fqn"`` for the first, ``"fqn@k"`` after."""
    return fqn if index == 0 else f"{fqn}@{index}"


@dataclass(frozen=True)
class Partition:
    """The nodes of one call of one module, in graph order.

    Attributes:
        call_name: ``"blocks.0"``, or ``"shared@1"`` for the second call of ``shared``.
        fqn: the module's fully qualified name.
        call_index: 0 for the first call, k for ``fqn@k``.
        type_name: the module's class name (``"Linear"``); ``qualified_type`` has the module path.
        nodes: names of the fx nodes the call owns, in graph order (nested calls included).
        input_names / output_names: the call signature's graph values, by node name
            (constants have no node and are not listed).
        signature: the preserved ``ModuleCallSignature``, or None when not preserved.
        swappable: whether :func:`graphsurgeon.swap` can replace this call; ``reason`` says why not.
    """

    call_name: str
    fqn: str
    call_index: int
    type_name: str
    qualified_type: str
    nodes: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    signature: ModuleCallSignature | None = field(repr=False, compare=False)
    swappable: bool
    reason: str | None

    @property
    def preserved(self) -> bool:
        return self.signature is not None

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class ModuleInfo:
    """One module of the program: its type, its calls, its nodes, and whether it can be swapped.

    ``swappable`` is true when every call of the module can be swapped; ``reason`` names the
    first call that cannot and why. ``children`` are the fqns of the direct submodules.
    """

    fqn: str
    type_name: str
    calls: int
    num_nodes: int
    preserved: bool
    swappable: bool
    reason: str | None
    children: tuple[str, ...]
    call_names: tuple[str, ...] = ()
    qualified_type: str = ""


class ModuleTree(Mapping[str, ModuleInfo]):
    """Every module of an exported program, by fqn (the root is ``""``), in model order.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> tree = gs.module_tree(gs.export(model, (torch.randn(2, 4),)))
        >>> tree["0"].type_name, tree["0"].calls, tree["0"].swappable
        ('Linear', 1, True)
    """

    def __init__(self, infos: dict[str, ModuleInfo]):
        self._infos = infos

    def __getitem__(self, fqn: str) -> ModuleInfo:
        try:
            return self._infos[fqn]
        except KeyError:
            raise UnknownModuleError(
                f"the program has no module {fqn!r}.{did_you_mean(fqn, self._infos)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    @property
    def root(self) -> ModuleInfo:
        return self._infos[""]

    def table(self) -> str:
        """The tree as an indented text table: module, type, calls, nodes, swappable or why not."""
        rows = [("module", "type", "calls", "nodes", "swappable")]
        for fqn, info in self._infos.items():
            depth = 0 if not fqn else fqn.count(".") + 1
            name = "  " * depth + (fqn.rsplit(".", 1)[-1] if fqn else "(root)")
            verdict = "yes" if info.swappable else f"no: {info.reason}"
            rows.append((name, info.type_name, str(info.calls), str(info.num_nodes), verdict))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = []
        for row in rows:
            cells = [row[i].ljust(widths[i]) for i in range(4)] + [row[4]]
            lines.append("  ".join(cells).rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        swappable = sum(1 for i in self._infos.values() if i.swappable)
        return f"<ModuleTree: {len(self._infos)} modules, {swappable} swappable>"


def in_place_alias(node: Node) -> Node | None:
    """For an in-place or ``out=`` op, the argument node its result aliases (and writes); else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    schema = target._schema
    if not schema.returns or schema.returns[0].alias_info is None:
        return None
    if not schema.returns[0].alias_info.is_write:
        return None
    alias_set = schema.returns[0].alias_info.before_set
    for position, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write or info.before_set != alias_set:
            continue
        if argument.kwarg_only or position >= len(node.args):
            value = node.kwargs.get(argument.name)
        else:
            value = node.args[position]
        return value if isinstance(value, Node) else None
    return None


def _type_text(type_: object) -> str:
    if isinstance(type_, str):
        return type_
    return f"{type_.__module__}.{type_.__qualname__}"


def _short_type(qualified: str) -> str:
    return qualified.rsplit(".", 1)[-1] if qualified else ""


class ProgramIndex:
    """One pass over a program's graph: the node order and the nodes of every module call.

    Internal; built once per program and graph (cached) and shared by partition, swap and render.
    """

    def __init__(self, ep: ExportedProgram):
        graph = ep.graph
        # A weak reference: the index is cached in a WeakKeyDictionary keyed by the program,
        # and a strong one here would keep every program alive forever.
        self._ep = weakref.ref(ep)
        self.graph = graph
        self.nodes: list[Node] = list(graph.nodes)
        self.order: dict[Node, int] = {n: i for i, n in enumerate(self.nodes)}
        self.by_name: dict[str, Node] = {n.name: n for n in self.nodes}
        notes = export_notes(ep)
        self.notes = notes
        self.signatures: dict[str, ModuleCallSignature | None] = {}
        self.fqns: list[str] = []
        for entry in ep.module_call_graph:
            self.signatures[entry.fqn] = entry.signature
            fqn, _ = split_call_name(entry.fqn)
            if fqn not in self.fqns:
                self.fqns.append(fqn)
        if notes is not None:
            for fqn in notes.module_types:
                if fqn not in self.fqns:
                    self.fqns.append(fqn)
        if "" not in self.fqns:
            self.fqns.insert(0, "")
        # call name -> nodes (graph order); fqn -> qualified type
        self.call_nodes: dict[str, list[Node]] = {}
        self.types: dict[str, str] = dict(notes.module_types) if notes is not None else {}
        known = set(self.fqns)
        for node in self.nodes:
            stack = node.meta.get("nn_module_stack")
            if not stack:
                continue
            for key, value in stack.items():
                path, type_ = value
                if not path and "" not in self.types:
                    self.types[""] = _type_text(type_)  # a loaded program has no notes
                if not path or path not in known:
                    continue  # the root, or a bookkeeping entry that names no module
                _, index = split_call_name(str(key))
                name = call_name(path, index or 0)
                self.call_nodes.setdefault(name, []).append(node)
                if path not in self.types:
                    self.types[path] = _type_text(type_)
        self.calls_of: dict[str, list[str]] = {}
        called = [n for n, sig in self.signatures.items() if sig is not None]
        for name in called + list(self.call_nodes):
            fqn, index = split_call_name(name)
            if not fqn:
                continue
            names = self.calls_of.setdefault(fqn, [])
            if name not in names:
                names.append(name)
        for names in self.calls_of.values():
            names.sort(key=lambda n: split_call_name(n)[1] or 0)
        self.lifted = {
            spec.arg.name
            for spec in ep.graph_signature.input_specs
            if spec.kind.name != "USER_INPUT" and hasattr(spec.arg, "name")
        }
        self._partitions: dict[str, Partition] | None = None
        self._mutation_outputs = self._find_mutation_outputs(ep)

    @property
    def ep(self) -> ExportedProgram:
        ep = self._ep()
        if ep is None:  # pragma: no cover - callers hold the program while they use its index
            raise PartitionError("the program of this index no longer exists")
        return ep

    @staticmethod
    def _find_mutation_outputs(ep: ExportedProgram) -> set[str]:
        kinds = {"BUFFER_MUTATION", "USER_INPUT_MUTATION", "PARAMETER_MUTATION"}
        names = set()
        for spec in ep.graph_signature.output_specs:
            if spec.kind.name in kinds and hasattr(spec.arg, "name"):
                names.add(spec.arg.name)
        return names

    # -- analysis ---------------------------------------------------------------------------

    def why_not_swappable(self, name: str, nodes: list[Node]) -> str | None:
        fqn, _ = split_call_name(name)
        signature = self.signatures.get(name)
        if signature is None:
            dropped = self.notes.dropped.get(fqn) if self.notes else None
            if dropped:
                return f"not preserved: torch.export could not keep its signature ({dropped})"
            return (
                f"not preserved: export with gs.export(model, args) or add {fqn!r} to "
                "torch.export.export(..., preserve_module_call_signature=...)"
            )
        members = set(nodes)
        outputs = [a.name for a in signature.outputs if _has_name(a)]
        for out in outputs:
            node = self.by_name.get(out)
            if node is not None and node not in members:
                return (
                    f"it returns {out!r}, a value computed outside it (an input passed through), "
                    "so the graph cannot tell which later uses are its output"
                )
        if nodes:
            blocker = self._convexity_breaker(nodes, members)
            if blocker is not None:
                return (
                    f"not convex: node {blocker.name!r} outside it both uses its results and "
                    "feeds it, so it cannot become one call"
                )
        foreign = self._foreign_input(nodes, members, signature)
        if foreign is not None:
            reader, value = foreign
            inputs = ", ".join(repr(a.name) for a in signature.inputs if _has_name(a)) or "none"
            return (
                f"node {reader.name!r} reads {value.name!r}, which is not one of its inputs "
                f"({inputs}): the preserved signature does not describe this graph (was the "
                "program transformed after export? swap before run_decompositions)"
            )
        output_set = set(outputs)
        for node in nodes:
            if node.name in output_set:
                continue
            for user in node.users:
                if user in members:
                    continue
                if self._resolves_outside(node, members) or node.name in self._mutation_outputs:
                    continue
                return (
                    f"node {node.name!r} is used outside it (by {user.name!r}) but is not "
                    "one of its outputs"
                )
        return None

    def _foreign_input(self, nodes, members, signature) -> tuple[Node, Node] | None:
        """A value the call reads from outside that its signature does not pass in, if any.

        Lifted state (parameters, buffers, constants) and symbolic sizes are read from
        outside legitimately: the replacement brings its own.
        """
        declared = {a.name for a in signature.inputs if _has_name(a)}
        for node in nodes:
            for value in node.all_input_nodes:
                if value in members or value.name in declared or value.name in self.lifted:
                    continue
                if value.op == "get_attr" or isinstance(
                    value.meta.get("val"),
                    (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool),
                ):
                    continue
                return node, value
        return None

    def _resolves_outside(self, node: Node, members: set[Node]) -> bool:
        """True when ``node`` is an in-place write whose alias chain ends outside the call."""
        seen = 0
        while node in members and seen < 1000:
            alias = in_place_alias(node)
            if alias is None:
                return False
            node, seen = alias, seen + 1
        return node not in members

    def _convexity_breaker(self, nodes: list[Node], members: set[Node]) -> Node | None:
        lo, hi = self.order[nodes[0]], self.order[nodes[-1]]
        tainted: set[Node] = set()
        for node in self.nodes[lo : hi + 1]:
            inputs = node.all_input_nodes
            if node in members:
                for arg in inputs:
                    if arg in tainted:
                        return arg
                continue
            if any(arg in members or arg in tainted for arg in inputs):
                tainted.add(node)
        return None

    def partitions(self) -> dict[str, Partition]:
        if self._partitions is not None:
            return self._partitions
        result: dict[str, Partition] = {}
        for fqn in self.fqns:
            for name in self.calls_of.get(fqn, []):
                nodes = self.call_nodes.get(name, [])
                signature = self.signatures.get(name)
                reason = self.why_not_swappable(name, nodes)
                inputs = (
                    tuple(a.name for a in signature.inputs if _has_name(a)) if signature else ()
                )
                outputs = (
                    tuple(a.name for a in signature.outputs if _has_name(a)) if signature else ()
                )
                qualified = self.types.get(fqn, "")
                result[name] = Partition(
                    call_name=name,
                    fqn=fqn,
                    call_index=split_call_name(name)[1] or 0,
                    type_name=_short_type(qualified),
                    qualified_type=qualified,
                    nodes=tuple(n.name for n in nodes),
                    input_names=inputs,
                    output_names=outputs,
                    signature=signature,
                    swappable=reason is None,
                    reason=reason,
                )
        self._partitions = result
        return result


def _has_name(argument) -> bool:
    # ConstantArgument has a name field too, but it names no graph value.
    return type(argument).__name__ != "ConstantArgument" and bool(getattr(argument, "name", ""))


_INDEX: weakref.WeakKeyDictionary[ExportedProgram, ProgramIndex] = weakref.WeakKeyDictionary()


def program_index(ep: ExportedProgram) -> ProgramIndex:
    """The cached :class:`ProgramIndex` of ``ep`` (rebuilt if its graph was replaced)."""
    if not isinstance(ep, ExportedProgram):
        raise TypeError(
            f"expected a torch.export.ExportedProgram, got {type(ep).__name__}; "
            "make one with gs.export(model, args)"
        )
    index = _INDEX.get(ep)
    if index is None or index.graph is not ep.graph or len(index.nodes) != len(ep.graph.nodes):
        index = ProgramIndex(ep)
        _INDEX[ep] = index
    return index


def partition(ep: ExportedProgram) -> dict[str, Partition]:
    """Every module call of ``ep`` as a :class:`Partition`, keyed by call name, in model order.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> parts = gs.partition(gs.export(model, (torch.randn(2, 4),)))
        >>> parts["0"].nodes, parts["0"].input_names, parts["0"].output_names
        (('linear',), ('input',), ('linear',))
    """
    return dict(program_index(ep).partitions())


def module_tree(ep: ExportedProgram) -> ModuleTree:
    """Every module of ``ep``: type, calls, nodes, preserved, swappable and why not.

    Modules that were never called (containers such as ``nn.ModuleList``) have 0 calls and
    are not swappable; their children are.
    """
    index = program_index(ep)
    parts = index.partitions()
    fqns = list(index.fqns)
    children: dict[str, list[str]] = {f: [] for f in fqns}
    known = set(fqns)
    for fqn in fqns:
        if not fqn:
            continue
        parent = fqn.rsplit(".", 1)[0] if "." in fqn else ""
        while parent not in known:
            parent = parent.rsplit(".", 1)[0] if "." in parent else ""
        children[parent].append(fqn)
    infos: dict[str, ModuleInfo] = {}
    total = sum(1 for n in index.nodes if n.op not in ("placeholder", "output"))
    for fqn in fqns:
        qualified = index.types.get(fqn, "")
        if not fqn:
            infos[fqn] = ModuleInfo(
                fqn="",
                type_name=_short_type(qualified) or "(root)",
                calls=1,
                num_nodes=total,
                preserved=True,
                swappable=False,
                reason="the root is the whole program",
                children=tuple(children[fqn]),
                qualified_type=qualified,
            )
            continue
        names = index.calls_of.get(fqn, [])
        calls = [parts[n] for n in names]
        blocking = next((p for p in calls if not p.swappable), None)
        if not calls:
            reason = "never called during export (a container, or unused)"
        elif blocking is not None:
            where = f"call {blocking.call_name!r}: " if len(calls) > 1 else ""
            reason = where + (blocking.reason or "")
        else:
            reason = None
        infos[fqn] = ModuleInfo(
            fqn=fqn,
            type_name=_short_type(qualified),
            calls=len(calls),
            num_nodes=len({n for p in calls for n in p.nodes}),
            preserved=bool(calls) and all(p.preserved for p in calls),
            swappable=reason is None,
            reason=reason,
            children=tuple(children[fqn]),
            call_names=tuple(names),
            qualified_type=qualified,
        )
    return ModuleTree(infos)
