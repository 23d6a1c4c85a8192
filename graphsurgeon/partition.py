"""module_tree() and partition(): which fx nodes each module call owns, and whether it can be swapped.

Every node torch.export records carries ``meta["nn_module_stack"]``: the chain of module calls
it was traced in, outermost first. A call's key ends in ``@k`` for the k-th repeated call of the
same module (k >= 1), so a module called twice has two partitions, ``"shared"`` and
``"shared@1"``, each with its own signature in ``ep.module_call_graph``.

Which call each node belongs to is the :class:`CallIndex` (:mod:`graphsurgeon._calls`), what an
op's result is at run time :mod:`graphsurgeon._aliases`: both imported from here too.
``graphsurgeon.partition`` is the function; the module's names are imported by name, as in
``from graphsurgeon.partition import call_index``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._ops import HigherOrderOperator
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallSignature
from torch.fx import Node

from . import _derived, _meta
from ._aliases import (  # the stage's rooms, read by this path too (re-exported: noqa)
    DROPOUTS,
    aliased_input,  # noqa: F401
    in_place_alias,
    merges_reads,
    op_argument,  # noqa: F401
    returned_object,  # noqa: F401
    returned_root,
)
from ._calls import Call, CallIndex, call_index, call_name  # noqa: F401
from ._meta import (
    ambiguous_name_message,
    inside,
    split_call_name,
)
from ._program import not_a_program
from .errors import (
    PartitionError,
    UnknownModuleError,
    a_type,
    did_you_mean,
    unknown_name,
)
from .export import export_notes

__all__ = [
    "ModuleInfo",
    "ModuleTree",
    "OutsideRead",
    "Partition",
    "module_tree",
    "partition",
    "split_call_name",
]


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
        call_text: how the program calls the module, which is what a replacement's ``forward``
            must accept and return: ``(x: f32[1, 16, 64], scale=2.5) → f32[1, 16, 64]``
            ('' when the signature was not preserved).
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
    call_text: str = field(default="", compare=False)

    @property
    def preserved(self) -> bool:
        """Whether torch.export preserved the call's signature (so it can be swapped)."""
        return self.signature is not None

    @property
    def num_nodes(self) -> int:
        """How many nodes of the program the call owns."""
        return len(self.nodes)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display as d

        verdict = d.badge("swappable", "ok") if self.swappable else d.badge("not swappable", "bad")
        rows = [
            ["module", f"{self.fqn} ({self.qualified_type or self.type_name})"],
            ["inputs", ", ".join(self.input_names) or "none"],
            ["outputs", ", ".join(self.output_names) or "none"],
        ]
        if self.call_text:
            rows.insert(1, ["called as", self.call_text])
        if self.reason:
            rows.append(["why not", self.reason])
        body = (
            f'<div class="gs-title">partition <code>{d.escape(self.call_name)}</code> {verdict} '
            f'<span class="gs-muted">{self.num_nodes:,} nodes</span></div>'
            + d.table(["", ""], rows)
            + d.details(f"{self.num_nodes:,} nodes", d.names(self.nodes))
        )
        plain = f"<Partition {self.call_name!r}: {self.num_nodes} nodes, " + (
            "swappable>" if self.swappable else f"not swappable: {self.reason}>"
        )
        return d.bundle(body, plain, include, exclude)


@dataclass(frozen=True)
class OutsideRead:
    """A parameter, buffer or constant tensor of a module that the program reads outside every
    call of that module (a parent's ``self.child.scale``): after the module is swapped, eager
    PyTorch reads the replacement's attribute of that name there, so the swapped program does.

    Attributes:
        target: the state's full name (``"c.s"``).
        attribute: its name inside the module (``"s"``; ``"inner.w"`` for a submodule's).
        kind: ``"parameter"``, ``"buffer"`` or ``"constant"``.
        reader: the first node outside the module that reads it.
        reader_call: the call that node sits in (``""``: the top level).
        value: the value as exported (shape and dtype: what a replacement's attribute must be).
    """

    target: str
    attribute: str
    kind: str
    reader: str
    reader_call: str
    value: Any = field(repr=False, compare=False)

    @property
    def where(self) -> str:
        """``"in 'p'"``, or ``"at the top level"``: where the read is."""
        return f"in {self.reader_call!r}" if self.reader_call else "at the top level"


@dataclass(frozen=True)
class ModuleInfo:
    """One module of the program: its type, its calls, its nodes, and whether it can be swapped.

    ``swappable`` is true when every call of the module can be swapped; ``reason`` names the
    first call that cannot and why. ``children`` are the fqns of the direct submodules.
    ``num_parameters`` counts the parameter elements of the module and its submodules.
    ``note`` says what a replacement must hold beyond its call: the attributes the program
    reads outside the module's calls (:class:`OutsideRead`), or None.
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
    num_parameters: int = 0
    note: str | None = None

    def __repr__(self) -> str:
        calls = f"{self.calls} call{'s' if self.calls != 1 else ''}"
        verdict = "swappable" if self.swappable else f"not swappable: {self.reason}"
        if self.swappable and self.note:
            verdict += f" ({self.note})"
        return (
            f"<ModuleInfo {self.fqn or '(root)'!r}: {self.type_name}, {calls}, "
            f"{self.num_nodes} nodes, {verdict}>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display as d

        verdict = d.badge("swappable", "ok") if self.swappable else d.badge("not swappable", "bad")
        rows = [
            ["type", self.qualified_type or self.type_name],
            ["calls", ", ".join(self.call_names) or "0"],
            ["nodes", f"{self.num_nodes:,}"],
            ["parameters", f"{self.num_parameters:,}"],
            ["submodules", ", ".join(self.children) or "none"],
        ]
        if self.reason:
            rows.append(["why not", self.reason])
        if self.note:
            rows.append(["note", self.note])
        body = (
            f'<div class="gs-title"><code>{d.escape(self.fqn or "(root)")}</code> {verdict}</div>'
            + d.table(["", ""], rows)
        )
        return d.bundle(body, repr(self), include, exclude)


@dataclass(frozen=True)
class Resolved:
    """What a module or call name stands for (:meth:`ProgramIndex.resolve`).

    Attributes:
        name: the name as every view writes it: ``"blk"``, ``"blk@1"`` (``"blk@0"`` is ``"blk"``).
        fqn: the module's fqn.
        calls: the calls it covers, in call order: every call of a module (none for a container
            never called), or the one call named.
        one_call: whether one call was named (``"blk@k"``).
    """

    name: str
    fqn: str
    calls: tuple[str, ...]
    one_call: bool


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
            raise UnknownModuleError(unknown_name(fqn, [f for f in self._infos if f])) from None

    def __contains__(self, fqn: object) -> bool:
        return fqn in self._infos  # (Mapping's would call __getitem__, which raises)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    @property
    def root(self) -> ModuleInfo:
        """The root module (fqn ``""``): the model itself."""
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

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        """A foldable table: each module's type, calls, nodes, parameters, swappable or why not
        (top-level modules open, deeper ones folded)."""
        from . import display

        parameters = {fqn: info.num_parameters for fqn, info in self._infos.items()}
        body = display.module_tree_html(self, parameters)
        return display.bundle(body, repr(self), include, exclude)


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
        # torch's symbol of a dynamic size -> the user's Dim name, for every text of sizes
        self.dims: Mapping[str, str] = dict(notes.dims) if notes is not None else {}
        calls = call_index(ep)
        if calls.ambiguous:
            raise PartitionError(ambiguous_name_message(calls.ambiguous[0], "the program"))
        self.calls = calls
        self.signatures: dict[str, ModuleCallSignature | None] = {}
        fqns: dict[str, None] = {}  # in order; a dict, so each look-up is O(1)
        for entry in ep.module_call_graph:
            self.signatures[entry.fqn] = entry.signature
            fqns.setdefault(split_call_name(entry.fqn)[0], None)
        if notes is not None:
            for fqn in notes.module_types:
                fqns.setdefault(fqn, None)
        # A module the graph records but module_call_graph lost (a transformed or hand-made
        # program) is still a module of the program: "not preserved", not "no module".
        for call in calls.calls.values():
            fqns.setdefault(call.fqn, None)
        self.fqns: list[str] = list(fqns) if "" in fqns else ["", *fqns]
        # "is this a module of the program": read as often as there are nodes and state
        self.fqn_set: frozenset[str] = frozenset(self.fqns)
        self._covered: dict[str, tuple[str, ...]] = {}  # name -> calls_covered (made once)
        # call name -> nodes (graph order); fqn -> qualified type
        self.types: dict[str, str] = dict(notes.module_types) if notes is not None else {}
        if "" not in self.types and calls.root_type:
            self.types[""] = calls.root_type  # a loaded program has no notes
        for call in calls.calls.values():
            self.types.setdefault(call.fqn, call.type)
        self.call_nodes: dict[str, list[Node]] = {
            name: [self.by_name[n] for n in members if self.by_name[n].op != "placeholder"]
            for name, members in calls.members.items()
        }
        self.calls_of: dict[str, list[str]] = {}
        called = [n for n, sig in self.signatures.items() if sig is not None]
        for name in dict.fromkeys(called + list(self.call_nodes)):
            fqn, _ = split_call_name(name)
            if fqn:
                self.calls_of.setdefault(fqn, []).append(name)
        for names in self.calls_of.values():
            names.sort(key=lambda n: split_call_name(n)[1] or 0)
        # lifted parameters, buffers and constants: placeholder name -> its input spec
        self.state_specs = {
            spec.arg.name: spec
            for spec in ep.graph_signature.input_specs
            if spec.kind.name != "USER_INPUT" and hasattr(spec.arg, "name")
        }
        self.lifted = set(self.state_specs)
        self._partitions: dict[str, Partition] | None = None
        # functional graphs: the written value's node name -> the placeholder it writes
        self.mutation_targets = self._find_mutation_targets(ep)
        self._in_subgraphs: dict[str, str] | None = None
        self._outside_reads: dict[str, tuple[OutsideRead, ...]] | None = None

    def known_names(self) -> list[str]:
        """Every module fqn and every repeated call (``blk@1``): the names :meth:`resolve`
        takes, in model order (for "did you mean")."""
        repeated = [name for names in self.calls_of.values() for name in names if "@" in name]
        return [fqn for fqn in self.fqns if fqn] + repeated

    def knows(self, name: str) -> bool:
        """Whether :meth:`resolve` reads ``name`` as a module or call of the program (asked
        before resolving a name that may be an fx node's: no error, no "did you mean")."""
        fqn, k = split_call_name(name)
        return fqn in self.fqn_set and (
            k is None or call_name(fqn, k) in self.calls_of.get(fqn, ())
        )

    def resolve(self, name: object) -> Resolved:
        """What a module or call name stands for: the one reading every entry point uses.

        ``"blk"`` is every call of module ``blk`` (none for a container such as nn.ModuleList),
        ``"blk@1"`` its second call, ``"blk@0"`` its first (named ``"blk"``); ``""`` is the
        root. Anything else raises :class:`~graphsurgeon.errors.UnknownModuleError` with the
        closest names.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> from graphsurgeon.partition import program_index
            >>> class Twice(torch.nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.blk = torch.nn.Linear(2, 2)
            ...     def forward(self, x):
            ...         return self.blk(self.blk(x))
            >>> index = program_index(gs.export(Twice(), (torch.randn(1, 2),)))
            >>> index.resolve("blk").calls, index.resolve("blk@0").calls, index.resolve("blk@1").name
            (('blk', 'blk@1'), ('blk',), 'blk@1')
        """
        if not isinstance(name, str):
            raise UnknownModuleError(
                f"expected a module name such as 'blocks.0' (or 'blocks.0@1' for one call of "
                f"a module called more than once), got {a_type(name)}"
            )
        fqn, k = split_call_name(name)
        if fqn not in self.fqn_set:
            raise UnknownModuleError(unknown_name(name, self.known_names()))
        calls = tuple(self.calls_of.get(fqn, ()))
        if k is None:
            return Resolved(fqn, fqn, calls, False)
        wanted = call_name(fqn, k)
        if wanted not in calls:
            times = f"called {len(calls)} time{'s' if len(calls) != 1 else ''} ({', '.join(calls)})"
            raise UnknownModuleError(
                f"module {fqn!r} was {times if calls else 'never called'}; there is no call "
                f"{name!r}.{did_you_mean(name, calls)}"
            )
        return Resolved(wanted, fqn, (wanted,), True)

    def calls_covered(self, name: object) -> tuple[str, ...]:
        """The calls a module or call name stands for, in graph order: the one reading of a
        name that every view and verb shares (a highlight, opening a module, running to it).

        ``"blk@1"`` is that call; ``"blk"`` every call of ``blk``; a module without calls of
        its own (a container such as nn.ModuleList: ``"layers"``) the outermost calls of its
        submodules; the root ``""`` every top-level call. Unknown names raise as
        :meth:`resolve` raises; a container none of whose submodules is called gives ``()``.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> from graphsurgeon.partition import program_index
            >>> model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.ReLU()]))
            >>> model.forward = lambda x: model[0][0](x)
            >>> index = program_index(gs.export(model, (torch.randn(2),)))
            >>> index.calls_covered("0"), index.calls_covered("0.0")
            (('0.0',), ('0.0',))
        """
        covered = self._covered.get(name) if isinstance(name, str) else None
        if covered is not None:  # a view resolves every call it collapses: once per name
            return covered
        resolved = self.resolve(name)
        if resolved.calls:
            covered = resolved.calls
        else:
            covered = self._covered.get(resolved.fqn)
            if covered is None:
                covered = self._covered[resolved.fqn] = self._outermost_calls_in(resolved.fqn)
        self._covered[name] = covered
        return covered

    def _outermost_calls_in(self, fqn: str) -> tuple[str, ...]:
        """The outermost calls inside module ``fqn`` (one pass over every call: made once per
        name, see :meth:`calls_covered`)."""
        found: dict[str, None] = {}
        for call in self.call_nodes:
            if not _meta.inside(call, fqn, strictly=True):
                continue
            parent = self.calls.calls[call].parent if call in self.calls.calls else ""
            while parent and not _meta.inside(parent, fqn, strictly=True):
                parent = self.calls.calls[parent].parent if parent in self.calls.calls else ""
            if not parent:  # no call between it and the container: outermost
                found[call] = None
        first = {c: self.order[nodes[0]] for c, nodes in self.call_nodes.items() if nodes}
        return tuple(sorted(found, key=lambda c: first.get(c, len(self.order))))

    def parameter_names(self, fqn: str, count: int) -> list[str]:
        """The names of the first ``count`` positional parameters of module ``fqn``'s forward,
        as recorded at export (``arg0``, ``arg1``... where unknown)."""
        known = list(self.notes.parameters.get(fqn, ())) if self.notes is not None else []
        return (known + [f"arg{i}" for i in range(len(known), count)])[:count]

    def call_text(
        self,
        name: str,
        parameters: list[str] | None = None,
        *,
        module: Any = None,
        wrap: int | None = None,
    ) -> str:
        """How the program calls ``name``: ``(x: f32[batch, 16], scale=2.5) → f32[batch, 16]``
        (dynamic sizes by the ``Dim`` names export recorded).

        The positional arguments are named by ``parameters``, else as ``module``'s forward
        names them (a replacement's), else as the original forward did; past ``wrap``
        characters, one argument a line."""
        signature = self.signatures.get(name)
        if signature is None:
            return "(?)"
        if parameters is None and module is not None:
            args_spec, _ = signature.in_spec.children()
            parameters = _meta.parameter_names(module, args_spec.num_children)
        dims = self.dims

        def leaf(argument: Any) -> str:
            node = None if _meta.is_constant(argument) else self.by_name.get(argument.name)
            return _meta.signature_leaf_text(argument, node, dims)

        args_spec, _ = signature.in_spec.children()
        names = parameters or self.parameter_names(split_call_name(name)[0], args_spec.num_children)
        return _meta.module_call_text(
            signature.in_spec,
            signature.out_spec,
            [leaf(a) for a in signature.inputs],
            [leaf(a) for a in signature.outputs],
            list(names),
            wrap=wrap,
        )

    def why_no_calls(self, fqn: str) -> str:
        """Why module ``fqn`` has no call in the graph (a container, unused, or hidden in a
        ``torch.cond`` branch)."""
        if self._in_subgraphs is None:
            # Nodes of torch.cond branches live in subgraphs of the program, not in its graph.
            self._in_subgraphs = self._called_in_subgraphs()
        if fqn in self._in_subgraphs:
            operator = self._in_subgraphs[fqn]
            return (
                f"called only inside a torch.{operator} branch: its nodes live in the branch's "
                f"subgraph, not in the program's graph. Swap the module that calls "
                f"torch.{operator}, or replace it in the model before exporting"
            )
        readers = list(dict.fromkeys(read.reader_call for read in self.outside_reads(fqn)))
        if readers:
            reads = self.outside_reads(fqn)
            whose = ", ".join(repr(r.attribute) for r in reads[:3])
            swap = [split_call_name(r)[0] for r in readers if r]
            by = " and ".join(repr(r) if r else "the root module" for r in readers[:3])
            advice = (
                f"swap {' or '.join(map(repr, dict.fromkeys(swap)))}"
                if swap
                else ("replace it in the model before exporting")
            )
            return (
                f"never called during export: its weights ({whose}) are read by {by} directly "
                f"(as {_attribute_path(fqn, reads[0])} in its code), so it has no call to "
                f"swap; {advice}"
            )
        return "never called during export (a container such as nn.ModuleList, or unused)"

    def outside_reads(self, fqn: str) -> tuple[OutsideRead, ...]:
        """The state of module ``fqn`` (its own and its submodules') that nodes outside every
        call of ``fqn`` read: what a parent reads as ``self.child.weight``. The one answer to
        "what does such a read mean after a swap": the rewrite reads the replacement's attribute
        of that name (as eager does), the module tree says a replacement must hold it.

        A tensor the model holds under another name too (a tied weight, such as a language
        model's head sharing its embedding's) is not listed: export names it once, so the
        graph cannot tell which name the code read it by, and the module that keeps the other
        name keeps reading the original, as in eager."""
        if self._outside_reads is None:
            self._outside_reads = self._find_outside_reads()
        return self._outside_reads.get(fqn, ())

    def _find_outside_reads(self) -> dict[str, tuple[OutsideRead, ...]]:
        ep = self.ep
        holders: dict[int, list[str]] = {}  # a tensor -> every name the model holds it by
        for source in (ep.state_dict, ep.constants):
            for key, value in source.items():
                if isinstance(value, torch.Tensor):
                    holders.setdefault(id(value), []).append(key)
        kinds = {"PARAMETER": "parameter", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant"}
        written = self._state_as_written()
        user_outputs = {
            spec.arg.name
            for spec in ep.graph_signature.output_specs
            if spec.kind.name == "USER_OUTPUT" and hasattr(spec.arg, "name")
        }
        found: dict[str, list[OutsideRead]] = {}
        for name, spec in self.state_specs.items():
            kind = kinds.get(spec.kind.name)
            target = spec.target
            node = self.by_name.get(name)
            if kind is None or not target or node is None or "." not in target:
                continue
            value = (ep.constants if target in ep.constants else ep.state_dict).get(target)
            names = holders.get(id(value), [target])
            tensor_nodes = [node, *written.get(node, ())]
            parts = target.split(".")
            for end in range(1, len(parts)):
                owner = ".".join(parts[:end])
                if owner not in self.calls_of and owner not in self.fqn_set:
                    continue
                if any(not inside(n, owner, strictly=True) for n in names):
                    continue  # tied to a name outside the module: see the docstring
                # inside: in a call of the owner, or of a module between it and the tensor
                # (a container's child reading its own weight reads nothing of the outside)
                holders_of = {".".join(parts[:i]) for i in range(end, len(parts))}
                # the tensor as its holders leave it: the placeholder, or written in their call
                as_left = [
                    n
                    for n in tensor_nodes
                    if n is node
                    or any(split_call_name(c)[0] in holders_of for c in self.calls.chain(n.name))
                ]
                users = [
                    user
                    for n in as_left
                    for user in n.users
                    if user.op != "output" or n is node or n.name in user_outputs
                ]
                for user in users:
                    chain = self.calls.chain(user.name)
                    if any(split_call_name(c)[0] in holders_of for c in chain):
                        continue
                    read = OutsideRead(
                        target=target,
                        attribute=".".join(parts[end:]),
                        kind=kind,
                        reader=user.name,
                        reader_call=chain[-1] if chain else "",
                        value=node.meta.get("val"),
                    )
                    found.setdefault(owner, []).append(read)
                    break  # one reader names the read
        return {fqn: tuple(reads) for fqn, reads in found.items()}

    def _state_as_written(self) -> dict[Node, list[Node]]:
        """A state placeholder -> the nodes that are that tensor as written in place: an
        in-place op on it (``total.add_(x)``: eager code reading ``self.total`` after it reads
        that node), or, in a functional graph, its new value (the node its ``*_MUTATION``
        output returns). A read of such a node outside the writer's call is a read of the
        state: after a swap it is the replacement's, as written by the replacement."""
        written: dict[Node, list[Node]] = {}
        for node in self.nodes:
            if node.op != "placeholder":
                root = returned_root(node)
                if root is not node and root.op == "placeholder":
                    written.setdefault(root, []).append(node)
        for name, placeholder in self.mutation_targets.items():
            if name in self.by_name:
                written.setdefault(placeholder, []).append(self.by_name[name])
        return written

    def _called_in_subgraphs(self) -> dict[str, str]:
        """fqn -> the control-flow operator (``cond``, ``while_loop``) whose branch calls it.

        A branch's nodes carry the module stack when torch traced it that way; when they do not
        (non-strict export of a lambda branch), the parameters and buffers the operator passes
        into its branches still say whose state the branch reads."""
        found: dict[str, str] = {}
        state = {
            spec.arg.name: spec.target
            for spec in self.ep.graph_signature.input_specs
            if spec.target is not None and hasattr(spec.arg, "name")
        }
        for node in self.ep.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, HigherOrderOperator):
                continue
            operator = getattr(node.target, "__name__", "cond")
            for value in pytree.tree_leaves((node.args, node.kwargs)):
                if not isinstance(value, Node):
                    continue
                if value.op == "get_attr":
                    branch = getattr(self.ep.graph_module, str(value.target), None)
                    if isinstance(branch, torch.fx.GraphModule):
                        for call in call_index(branch).calls.values():
                            found.setdefault(call.fqn, operator)
                elif value.name in state:
                    parts = state[value.name].split(".")[:-1]
                    for end in range(1, len(parts) + 1):
                        found.setdefault(".".join(parts[:end]), operator)
        return found

    @property
    def ep(self) -> ExportedProgram:
        ep = self._ep()
        if ep is None:  # pragma: no cover - callers hold the program while they use its index
            raise PartitionError("the program of this index no longer exists")
        return ep

    def _find_mutation_targets(self, ep: ExportedProgram) -> dict[str, Node]:
        """In a functional graph, which input each written value is the new value of: the name
        of the node a ``*_MUTATION`` output returns -> the placeholder (user input, parameter,
        buffer) it writes. The one reading of the program's mutation outputs."""
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        by_target = {
            spec.target: node
            for node, spec in zip(placeholders, ep.graph_signature.input_specs)
            if spec.target is not None
        }
        targets: dict[str, Node] = {}
        for spec in ep.graph_signature.output_specs:
            kind, name = spec.kind.name, getattr(spec.arg, "name", None)
            if kind == "USER_INPUT_MUTATION" and name is not None:
                targets[name] = self.by_name[spec.target]
            elif kind in ("BUFFER_MUTATION", "PARAMETER_MUTATION") and name is not None:
                targets[name] = by_target[spec.target]
        return targets

    # -- analysis ---------------------------------------------------------------------------

    def why_not_swappable(self, name: str, nodes: list[Node]) -> str | None:
        fqn, _ = split_call_name(name)
        signature = self.signatures.get(name)
        if signature is None:
            dropped = self.notes.dropped.get(fqn) if self.notes else None
            if dropped:
                return f"not preserved: {dropped}"
            if self.notes is not None:  # made by gs.export, with a narrowed preserve= list
                return (
                    f"not preserved: it was left out of preserve=; export with "
                    f"gs.export(model, args, preserve=[..., {fqn!r}]) to swap it"
                )
            return (
                f"not preserved: export with gs.export(model, args) or add {fqn!r} to "
                "torch.export.export(..., preserve_module_call_signature=...)"
            )
        members = set(nodes)
        outputs = list(_meta.graph_names(signature.outputs))
        if not nodes:
            returned = [self.by_name[out] for out in outputs if out in self.by_name]
            if returned:
                like = "" if returned[0].name in self.state_specs else " (like nn.Identity)"
                return (
                    f"it has no nodes of its own: it returns {self._what(returned[0])} as it "
                    f"is{like}, so the program does not record where it is called. Export with "
                    "gs.export(model, args), which records such calls, or swap the module that "
                    "calls it"
                )
            return (
                "it has no nodes of its own: it computes nothing in the graph (its outputs are "
                "constants or unused), so there is nothing to replace"
            )
        last = max(self.order[n] for n in nodes)
        for out in outputs:
            node = self.by_name.get(out)
            if node is None:
                continue
            if node in members:
                root = node
                while root in members and merges_reads(root) is not None:
                    root = merges_reads(root)
                if root in members:
                    continue  # a tensor of its own, in the graph as in eager code
                readers = [u for u in node.users if u not in members]
            else:
                # an input returned unchanged: if nothing after the call reads it, the output is
                # simply unused and the call can be swapped
                root = node
                readers = [u for u in node.users if u.op == "output" or self.order[u] > last]
            if readers:
                return self._aliased_output(node, root, members, readers)
        if nodes:
            blocker = self.convexity_breaker(nodes, members)
            if blocker is not None:
                return (
                    f"not convex: node {blocker.name!r} outside it both uses its results and "
                    "feeds it, so it cannot become one call"
                )
        foreign = self._foreign_input(nodes, members, signature)
        if foreign is not None:
            reader, value = foreign
            inputs = ", ".join(repr(n) for n in _meta.graph_names(signature.inputs)) or "none"
            if not signature.inputs and not signature.outputs:
                return (
                    f"torch.export recorded an empty call signature for it (no inputs, no "
                    f"outputs), though node {reader.name!r} reads {value.name!r}: strict export "
                    "does this for some module names (ones holding quotes, backslashes or "
                    "newlines). Export with strict=False, or register the module under a "
                    "plain name"
                )
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
                if returned_root(node, members) not in members:
                    # at run time this node is a tensor from before the call (the call's input
                    # written in place, or converted to the dtype it has): its readers read that
                    # tensor as the call leaves it
                    continue
                if node.name in self.mutation_targets:
                    continue
                return (
                    f"node {node.name!r} inside it is read after the call (by {user.name!r}) "
                    "but is not one of its outputs: the module hands a value out some other "
                    "way than its return value (an attribute, a list, a global). Return it "
                    "from forward, or swap the module that reads it"
                )
        return None

    def _what(self, node: Node) -> str:
        """A tensor of the program in the user's words: its input 'x', its parameter 'w'."""
        spec = self.state_specs.get(node.name)
        if spec is not None:
            kind = {"PARAMETER": "parameter", "BUFFER": "buffer"}.get(spec.kind.name, "constant")
            return f"the {kind} {spec.target!r}"
        return f"its input {node.name!r}"

    def _aliased_output(
        self, node: Node, root: Node, members: set[Node], readers: list[Node]
    ) -> str:
        """Why a call that returns a tensor from before it ran (its input, its parameter)
        cannot be swapped: the graph cannot tell its result from that tensor."""
        what = self._what(root)
        if node not in members:
            how = "it has no op of its own"
        else:
            step, chain = node, []
            while step in members and merges_reads(step) is not None:
                chain.append(step)
                step = merges_reads(step)
            first = chain[-1] if chain else node
            if in_place_alias(first) is not None:
                how = f"node {first.name!r} writes it in place and returns it"
            elif first.target in DROPOUTS:
                how = f"node {first.name!r} is dropout in eval mode (or with p=0)"
            else:
                how = f"node {first.name!r} converts it to the dtype and device it already has"
        names = ", ".join(
            "the program's output" if u.op == "output" else repr(u.name) for u in readers[:3]
        )
        more = f" and {len(readers) - 3} more" if len(readers) > 3 else ""
        exported = self.notes is not None
        fix = (
            "Export with strict=False (gs.export's default), which keeps the two apart"
            if exported
            else "Export with gs.export(model, args), which keeps the two apart"
        )
        return (
            f"it returns {what} itself, not a tensor of its own ({how}), and {names}{more} "
            f"after the call read{'s' if len(readers) == 1 else ''} it: in this program a "
            f"read of the module's result cannot be told from a read of {what}, so a "
            f"replacement returning a new tensor could be read in the wrong place. {fix}, or "
            "make the module return a new tensor (x.clone())"
        )

    def _foreign_input(self, nodes, members, signature) -> tuple[Node, Node] | None:
        """A value the call reads from outside that its signature does not pass in, if any.

        Lifted state (parameters, buffers, constants) and symbolic sizes are read from
        outside legitimately: the replacement brings its own. So is state an earlier call
        wrote in place (a buffer's ``add_`` in the first call of a module called twice): the
        value read is the buffer, as the earlier call left it.
        """
        declared = set(_meta.graph_names(signature.inputs))
        for node in nodes:
            for value in node.all_input_nodes:
                if value in members or value.name in declared or value.name in self.lifted:
                    continue
                if self._written_state(value):
                    continue
                if value.op == "get_attr" or isinstance(
                    value.meta.get("val"),
                    (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool),
                ):
                    continue
                return node, value
        return None

    def _written_state(self, value: Node) -> bool:
        """Whether ``value`` is lifted state written in place (its alias chain ends there)."""
        seen = 0
        while seen < 1000:
            alias = in_place_alias(value)
            if alias is None:
                return False
            value, seen = alias, seen + 1
            if value.op == "placeholder" and value.name in self.lifted:
                return True
        return False

    def convexity_breaker(self, nodes: list[Node], members: set[Node]) -> Node | None:
        """A node outside ``members`` (``nodes``, in graph order) that reads their values and
        feeds them, if any: then they cannot be one call."""
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
                inputs = _meta.graph_names(signature.inputs) if signature else ()
                outputs = _meta.graph_names(signature.outputs) if signature else ()
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
                    call_text=self.call_text(name) if signature is not None else "",
                )
        self._partitions = result
        return result


def program_index(ep: ExportedProgram, verb: str = "") -> ProgramIndex:
    """The :class:`ProgramIndex` of ``ep``, made once (kept by :mod:`graphsurgeon._derived`,
    under its one rule: made again when the graph changed). Anything but an ExportedProgram
    raises the one refusal, naming ``verb``."""
    if not isinstance(ep, ExportedProgram):
        raise not_a_program(ep, verb)
    return _derived.cached(ep, "program index", lambda: ProgramIndex(ep))


def partition(ep: ExportedProgram) -> dict[str, Partition]:
    """Every module call of ``ep`` as a :class:`Partition`, keyed by call name, in model order.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> parts = gs.partition(gs.export(model, (torch.randn(2, 4),)))
        >>> parts["0"].nodes, parts["0"].input_names, parts["0"].output_names
        (('linear',), ('input',), ('linear',))
    """
    return dict(program_index(ep, "partition").partitions())


def module_tree(ep: ExportedProgram) -> ModuleTree:
    """Every module of ``ep``: type, calls, nodes, preserved, swappable and why not.

    Modules that were never called (containers such as ``nn.ModuleList``) have 0 calls and
    are not swappable; their children are. Made once per program (kept by
    :mod:`graphsurgeon._derived`, as its index is): the Surgery, the search and the report
    read the same tree.
    """
    index = program_index(ep, "module_tree")
    return _derived.cached(ep, "module tree", lambda: _module_tree(ep, index))


def _module_tree(ep: ExportedProgram, index: ProgramIndex) -> ModuleTree:
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
    parameters = _parameters_by_module(ep, known)
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
                num_parameters=parameters.get("", 0),
            )
            continue
        names = index.calls_of.get(fqn, [])
        calls = [parts[n] for n in names]
        blocking = next((p for p in calls if not p.swappable), None)
        if not calls:
            reason = index.why_no_calls(fqn)
        elif blocking is not None:
            where = f"call {blocking.call_name!r}: " if len(calls) > 1 else ""
            reason = where + (blocking.reason or "")
        else:
            reason = None
        note = _outside_read_note(index, fqn) if reason is None else None
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
            num_parameters=parameters.get(fqn, 0),
            note=note,
        )
    return ModuleTree(infos)


def _outside_read_note(index: ProgramIndex, fqn: str) -> str | None:
    """What a replacement for ``fqn`` must hold because the program reads it outside its
    calls (see :meth:`ProgramIndex.outside_reads`), or None."""
    reads = index.outside_reads(fqn)
    if not reads:
        return None
    held = ", ".join(
        f"{r.kind} {r.attribute!r} ({_meta.value_text(r.value)})" for r in reads[:3]
    ) + (f" and {len(reads) - 3} more" if len(reads) > 3 else "")
    return (
        f"the program reads its {held} outside its calls ({reads[0].where}, as "
        f"{_attribute_path(fqn, reads[0])}): a replacement must hold the same, which those "
        "reads then take, as in eager"
    )


def _attribute_path(fqn: str, read: OutsideRead) -> str:
    """How the parent's code reads it: ``self.c.s`` (names that are no Python name quoted)."""
    path = [fqn.rsplit(".", 1)[-1], *read.attribute.split(".")]
    if all(part.isidentifier() for part in path):
        return "self." + ".".join(path)
    return f"the parent's {read.target!r}"


def _parameters_by_module(ep: ExportedProgram, fqns: set[str]) -> dict[str, int]:
    """Parameter elements in each module and its submodules (a tied weight counts once)."""
    counts: dict[str, int] = {}
    seen: set[int] = set()
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name != "PARAMETER" or spec.target not in ep.state_dict:
            continue
        tensor = ep.state_dict[spec.target]
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        owner = spec.target.rsplit(".", 1)[0] if "." in spec.target else ""
        while True:  # every module on the path counts it
            if owner in fqns:
                counts[owner] = counts.get(owner, 0) + tensor.numel()
            if not owner:
                break
            owner = owner.rsplit(".", 1)[0] if "." in owner else ""
    return counts
