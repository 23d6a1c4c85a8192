"""module_tree() and partition(): which fx nodes each module call owns, and whether it can be swapped.

Every node torch.export records carries ``meta["nn_module_stack"]``: the chain of module calls
it was traced in, outermost first. A call's key ends in ``@k`` for the k-th repeated call of the
same module (k >= 1), so a module called twice has two partitions, ``"shared"`` and
``"shared@1"``, each with its own signature in ``ep.module_call_graph``.
"""

from __future__ import annotations

import functools
import re
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
from ._meta import CALL_SUFFIX, ambiguous_name_message, split_call_name, traced_path_fqn
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
        return self.signature is not None

    @property
    def num_nodes(self) -> int:
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


def in_place_alias(node: Node) -> Node | None:
    """For an in-place or ``out=`` op, the argument node its result aliases (and writes); else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    written = _written_argument(target)
    if written is None:
        return None
    position, name, kwarg_only = written
    if kwarg_only or position >= len(node.args):
        value = node.kwargs.get(name)
    else:
        value = node.args[position]
    return value if isinstance(value, Node) else None


@functools.lru_cache(maxsize=1024)  # asked of every node a swap or a partition reads
def _written_argument(op: torch._ops.OpOverload) -> tuple[int, str, bool] | None:
    """(position, name, keyword-only) of the argument an op writes and returns, by its schema
    (read once per op: each read of ``_schema`` makes its Python objects anew); else None."""
    schema = op._schema
    if not schema.returns or schema.returns[0].alias_info is None:
        return None
    if not schema.returns[0].alias_info.is_write:
        return None
    alias_set = schema.returns[0].alias_info.before_set
    for position, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write or info.before_set != alias_set:
            continue
        return position, argument.name, argument.kwarg_only
    return None


def aliased_input(node: Node) -> Node | None:
    """The argument node whose storage ``node``'s result shares: a view (``t``, ``view``,
    ``select``, ``expand``...), an in-place op, or a conversion that may return the tensor
    itself (``to`` the dtype it has); else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if target in _CONVERSIONS:
        first = node.args[0] if node.args else None
        return first if isinstance(first, Node) else None
    aliased = _aliased_argument(target)
    if aliased is None:
        return None
    position, name, kwarg_only = aliased
    value = (
        node.kwargs.get(name) if kwarg_only or position >= len(node.args) else node.args[position]
    )
    return value if isinstance(value, Node) else None


@functools.lru_cache(maxsize=1024)
def _aliased_argument(op: torch._ops.OpOverload) -> tuple[int, str, bool] | None:
    """(position, name, keyword-only) of the argument whose storage an op's first result
    shares, by its schema; else None."""
    schema = op._schema
    if not schema.returns or schema.returns[0].alias_info is None:
        return None
    alias_set = schema.returns[0].alias_info.before_set
    for position, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is not None and info.before_set == alias_set:
            return position, argument.name, argument.kwarg_only
    return None


_aten = torch.ops.aten
# Ops that return their first argument itself (the very tensor object, not a view) when they
# have nothing to do: a conversion to the dtype, device and layout the tensor already has.
_CONVERSIONS = frozenset(
    {
        _aten.to.dtype,
        _aten.to.dtype_layout,
        _aten.to.device,
        _aten.to.other,
        _aten.type_as.default,
    }
)
_DROPOUTS = frozenset(
    {
        _aten.dropout.default,
        _aten.feature_dropout.default,
        _aten.alpha_dropout.default,
        _aten.feature_alpha_dropout.default,
    }
)


def op_argument(node: Node, name: str, default: Any = None) -> Any:
    """The value of argument ``name`` of an op node, by its schema (positional or keyword;
    the schema's default when not given)."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = node.target._schema
    for position, argument in enumerate(schema.arguments):
        if argument.name == name:
            if not argument.kwarg_only and position < len(node.args):
                return node.args[position]
            return argument.default_value if argument.has_default_value() else default
    return default


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _converts_nothing(node: Node, source: Node) -> bool:
    """Whether a ``to``/``type_as`` node returns ``source`` itself: as ``aten.to`` decides
    (same dtype, layout and device, no ``copy=True``, a memory format the tensor has)."""
    before, after = _val(source), _val(node)
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    if (before.dtype, before.layout, before.device) != (after.dtype, after.layout, after.device):
        return False
    if node.target is _aten.type_as.default:
        return True
    if op_argument(node, "copy", False):
        return False
    memory_format = op_argument(node, "memory_format")
    if memory_format in (None, torch.preserve_format):
        return True
    try:
        return bool(before.is_contiguous(memory_format=memory_format))
    except (RuntimeError, TypeError):  # a symbolic stride: cannot tell, so not the same
        return False


def returned_object(node: Node) -> Node | None:
    """The node whose very tensor object ``node`` returns at run time, or None when it returns
    a tensor of its own (views are tensors of their own).

    Eager code sees these as one tensor: an in-place or ``out=`` op returns the tensor it wrote;
    a conversion with nothing to do (``x.to(torch.float32)`` of a float32 ``x``, ``.float()``,
    ``.type_as``, ``.to("cpu")``) and dropout in eval mode (or with ``p=0``) return their input.
    torch.export records such an op as a node of its own and reads every later use of that
    tensor from it, also uses that are, in the model's code, uses of the op's input.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> class Norm(torch.nn.Module):
        ...     def forward(self, x):
        ...         return x.to(torch.float32) * 2
        >>> ep = gs.export(Norm(), (torch.randn(2, 4),))
        >>> to = next(n for n in ep.graph.nodes if n.name == "to")
        >>> returned_object(to).name
        'x'
    """
    written = in_place_alias(node)
    if written is not None:
        return written
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], Node):
        return None
    target, source = node.target, node.args[0]
    if target in _CONVERSIONS:
        return source if _converts_nothing(node, source) else None
    if target in _DROPOUTS:
        train, p = op_argument(node, "train", True), op_argument(node, "p", 0.5)
        return source if train is False or p == 0 else None
    if target in (_aten.flatten.using_ints, _aten.contiguous.default):
        value = _val(source)
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return None
        if target is _aten.contiguous.default:
            memory_format = op_argument(node, "memory_format", torch.contiguous_format)
            try:
                return source if value.is_contiguous(memory_format=memory_format) else None
            except (RuntimeError, TypeError):
                return None
        start, end = op_argument(node, "start_dim", 0), op_argument(node, "end_dim", -1)
        if not isinstance(start, int) or not isinstance(end, int):
            return None
        return source if start % value.dim() == end % value.dim() else None
    return None


# Ops that return their input at run time (eval-mode dropout) but that torch.export traces as a
# tensor of their own: later reads of the input are recorded as reads of the input.
_TRACED_APART = frozenset({_aten.dropout.default, _aten.feature_dropout.default})


def merges_reads(node: Node) -> Node | None:
    """The node whose reads torch.export recorded as reads of ``node`` too: the input of an op
    that returned it (traced as the same tensor object), or None."""
    if node.op == "call_function" and node.target in _TRACED_APART:
        return None
    return returned_object(node)


def returned_root(node: Node, members: set[Node] | frozenset[Node] = frozenset()) -> Node:
    """Follow :func:`returned_object` from ``node`` while it stays among ``members`` (or as far
    as it goes): the first node whose tensor ``node`` is at run time."""
    for _ in range(10_000):  # a chain of in-place ops, bounded against a malformed graph
        source = returned_object(node)
        if source is None:
            return node
        node = source
        if members and node not in members:
            return node
    return node


def _type_text(type_: object) -> str:
    if isinstance(type_, str):
        return type_
    return f"{getattr(type_, '__module__', '')}.{getattr(type_, '__qualname__', type_)}"


def _short_type(qualified: str) -> str:
    return qualified.rsplit(".", 1)[-1] if qualified else ""


# -- which module call each node belongs to ---------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One module call seen in a graph (internal: what :class:`CallIndex` knows of it).

    ``parent`` is the enclosing call ('' for the root), ``depth`` 1 for a top-level module,
    ``type`` the module's qualified type name as the graph recorded it.
    """

    name: str
    fqn: str
    index: int
    parent: str
    depth: int
    type: str


class CallIndex:
    """Which module calls each node of one fx graph belongs to: decided here, read everywhere.

    Partition, swap, fuse, render, the stepper and compare all read this index, so a node sits
    in the same module in the picture and in the stepper. The rules:

    * a node with ``meta["nn_module_stack"]`` belongs to the calls its stack records, outermost
      first (the root entry and torch's bookkeeping entries name no module and are skipped); a
      key ending in ``@k`` is the k-th repeated call, named ``"fqn@k"``;
    * the program's inputs and the output node belong to the top level;
    * a ``call_module`` node without a stack (a symbolically traced graph) is a call of its
      target;
    * any other node without a stack (a parameter or buffer, pytree glue made by a swap) belongs
      to the innermost call that all its users share, and to the top level when unused.

    Only names are kept (never nodes), so a cached index does not keep its graph alive.
    Internal; :func:`call_index` builds it once per graph.
    """

    def __init__(self, graph: torch.fx.Graph, state: frozenset[str] = frozenset()):
        nodes = list(graph.nodes)
        self.size = len(nodes)
        self.root_type = ""
        self.calls: dict[str, Call] = {}
        # modules whose own name ends in "@k", as graphsurgeon names repeated calls
        self.ambiguous: list[str] = []
        # (stack key, recorded path) of every stack entry -> (fqn, call index)
        self._entries = _number_calls(nodes)
        interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        chains: dict[str, tuple[str, ...]] = {}
        pending: list[Node] = []  # placed by their users, once those are settled
        # thousands of nodes record a few hundred distinct stacks: each is read once
        read: dict[tuple, tuple[str, ...]] = {}
        for node in nodes:
            stack = node.meta.get("nn_module_stack")
            if stack:
                try:
                    recorded: tuple | None = tuple(stack.items())
                    chain = read.get(recorded)  # type: ignore[arg-type]
                except TypeError:  # an entry that cannot be hashed: read this stack itself
                    recorded, chain = None, None
                if chain is None:
                    chain = self._chain(stack)
                    chain = interned.setdefault(chain, chain)
                    if recorded is not None:
                        read[recorded] = chain
                chains[node.name] = chain
            elif node.op == "output" or (node.op == "placeholder" and node.name not in state):
                chains[node.name] = ()
            elif node.op == "call_module" and isinstance(node.target, str):
                # a module call in a symbolically traced graph: the call of its target
                if node.target not in self.calls:
                    self.calls[node.target] = Call(node.target, node.target, 0, "", 1, "")
                chains[node.name] = (node.target,)
            else:
                pending.append(node)
        for node in reversed(pending):  # users come later in the graph: settle them first
            users = [chains[user.name] for user in node.users if user.name in chains]
            chains[node.name] = _common_prefix(users) if users else ()
        self.chains = chains
        self.order = [node.name for node in nodes]
        members: dict[str, list[str]] = {name: [] for name in self.calls}
        for name in self.order:
            for call in chains[name]:
                members[call].append(name)
        self.members = members

    def _chain(self, stack: Mapping) -> tuple[str, ...]:
        names: list[str] = []
        entries = self._entries
        for key, value in stack.items():
            if not isinstance(value, tuple) or not value:
                continue
            path = value[0]
            if not isinstance(path, str) or path == _meta.EMPTY_STACK_KEY:
                continue
            if path == "":
                if not self.root_type:
                    self.root_type = _type_text(value[1]) if len(value) > 1 else ""
                continue
            fqn, index, name = entries[(str(key), path)]
            if name in names:
                continue
            if name not in self.calls:
                if CALL_SUFFIX.search(fqn) and fqn not in self.ambiguous:
                    self.ambiguous.append(fqn)
                parent = names[-1] if names else ""
                type_ = _type_text(value[1]) if len(value) > 1 else ""
                self.calls[name] = Call(name, fqn, index, parent, len(names) + 1, type_)
            names.append(name)
        return tuple(names)

    def chain(self, node: str) -> tuple[str, ...]:
        """The calls around node ``node``, outermost first (``()`` at the top level)."""
        return self.chains[node]

    def call_of(self, node: str) -> str:
        """The innermost call node ``node`` belongs to ('' at the top level)."""
        chain = self.chains[node]
        return chain[-1] if chain else ""


# A key torch's strict tracer (dynamo) writes: the module's id, "@k" from its second call on.
_ID_KEY = re.compile(r"\d+(?:@\d+)?")


def _number_calls(nodes: list[Node]) -> dict[tuple[str, str], tuple[str, int, str]]:
    """The module call each ``nn_module_stack`` entry of ``nodes`` records: ``(key, path)`` ->
    ``(fqn, call index, call name)``, numbered as torch's non-strict export numbers them.

    Both exports write ``@k`` on the key of the k-th repeated call, but the strict one counts the
    calls of each *spelling* of the path (``layers.1`` and ``getattr(L['self'].layers, '1')`` are
    one module reached two ways, each counted from 0). When a module is reached by one spelling
    only, its ``@k`` is the call index (and stays right when a call left no node). When by
    several, its calls are numbered again in the order the graph first reaches them, which is
    the order they ran in."""
    seen: dict[tuple[str, str], tuple[str, str, int]] = {}  # in order of first appearance
    stacks: set[tuple] = set()  # thousands of nodes record a few hundred distinct stacks
    for node in nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            continue
        try:
            recorded = tuple(stack.items())
            if recorded in stacks:
                continue
            stacks.add(recorded)
        except TypeError:  # an entry that cannot be hashed: read this stack itself
            pass
        for key, value in stack.items():
            if isinstance(value, tuple) and value and isinstance(value[0], str):
                entry = (str(key), value[0])
                if entry not in seen:
                    seen[entry] = _read_entry(*entry)
    spellings: dict[str, set[str]] = {}
    for fqn, spelling, _ in seen.values():
        spellings.setdefault(fqn, set()).add(spelling)
    numbered: dict[tuple[str, str], tuple[str, int, str]] = {}
    ranks: dict[str, dict[tuple[str, int], int]] = {}
    for entry, (fqn, spelling, k) in seen.items():
        if len(spellings[fqn]) > 1:
            rank = ranks.setdefault(fqn, {})
            k = rank.setdefault((spelling, k), len(rank))
        numbered[entry] = (fqn, k, call_name(fqn, k))
    return numbered


def _read_entry(key: str, path: str) -> tuple[str, str, int]:
    """One stack entry as ``(fqn, the path as recorded, torch's call number)``.

    * non-strict export writes the key as a prefix, the fqn and ``@k``: ``L__self__blk@1`` is
      the second call of ``blk``, or the first of a module registered as ``"blk@1"``, whose
      path says which (a symbolically traced graph writes the fqn alone);
    * strict export keys the entry by the module's id (``140534481052752@1``) and records the
      path as the Python expression that reached the module (:func:`_meta.traced_path_fqn`)."""
    match = CALL_SUFFIX.search(key)
    if not _ID_KEY.fullmatch(key):
        if key.endswith(path):
            return path, path, 0
        if match is not None and key[: match.start()].endswith(path):
            return path, path, int(match.group(1))
    return traced_path_fqn(path), path, int(match.group(1)) if match else 0


def _common_prefix(chains: list[tuple[str, ...]]) -> tuple[str, ...]:
    first = chains[0]
    length = len(first)
    for chain in chains[1:]:
        length = min(length, len(chain))
        for i in range(length):
            if chain[i] != first[i]:
                length = i
                break
    return first[:length]


def call_index(program: ExportedProgram | torch.fx.GraphModule | torch.fx.Graph) -> CallIndex:
    """The :class:`CallIndex` of a program's graph, built once (kept by
    :mod:`graphsurgeon._derived`, under its one rule). For an ExportedProgram, its lifted
    parameters and buffers are placed with the nodes that read them; its user inputs are
    top-level."""
    graph = (
        program.graph if isinstance(program, (ExportedProgram, torch.fx.GraphModule)) else program
    )

    def build() -> CallIndex:
        # the program's lifted state, read only when the index is built: a walk of every input
        # spec on each lookup cost 1.3 ms on a 96-layer program, paid per call the widget asks
        state: frozenset[str] = frozenset()
        if isinstance(program, ExportedProgram):
            state = frozenset(
                spec.arg.name
                for spec in program.graph_signature.input_specs
                if spec.kind.name != "USER_INPUT" and getattr(spec.arg, "name", None)
            )
        return CallIndex(graph, state)

    # kept with the graph, not the program object: what it says depends on the graph (and, for
    # an ExportedProgram, on which placeholders are state), so copies of a program share it
    kind = "call index of a program" if isinstance(program, ExportedProgram) else "call index"
    return _derived.cached(graph, kind, build)


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
        # A module the graph records but module_call_graph lost (a transformed or hand-made
        # program) is still a module of the program: "not preserved", not "no module".
        for call in calls.calls.values():
            if call.fqn not in self.fqns:
                self.fqns.append(call.fqn)
        if "" not in self.fqns:
            self.fqns.insert(0, "")
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
        for name in called + list(self.call_nodes):
            fqn, _ = split_call_name(name)
            if not fqn:
                continue
            names = self.calls_of.setdefault(fqn, [])
            if name not in names:
                names.append(name)
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
        self._mutation_outputs = self._find_mutation_outputs(ep)
        self._in_subgraphs: dict[str, str] | None = None
        self._outside_reads: dict[str, tuple[OutsideRead, ...]] | None = None

    def known_names(self) -> list[str]:
        """Every module fqn and every repeated call (``blk@1``): the names :meth:`resolve`
        takes, in model order (for "did you mean")."""
        repeated = [name for names in self.calls_of.values() for name in names if "@" in name]
        return [fqn for fqn in self.fqns if fqn] + repeated

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
        if fqn not in self.fqns:
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
                if owner not in self.calls_of and owner not in self.fqns:
                    continue
                if any(n != target and not n.startswith(owner + ".") for n in names):
                    continue  # tied to a name outside the module: see the docstring
                # inside: in a call of the owner, or of a module between it and the tensor
                # (a container's child reading its own weight reads nothing of the outside)
                holders_of = {".".join(parts[:i]) for i in range(end, len(parts))}
                inside = [
                    n
                    for n in tensor_nodes
                    if n is node
                    or any(split_call_name(c)[0] in holders_of for c in self.calls.chain(n.name))
                ]
                users = [
                    (user, n)
                    for n in inside
                    for user in n.users
                    if user.op != "output" or n is node or n.name in user_outputs
                ]
                for user, _ in users:
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
        placeholders = {n.name: n for n in self.nodes if n.op == "placeholder"}
        by_target = {
            spec.target: placeholders.get(spec.arg.name)
            for spec in self.ep.graph_signature.input_specs
            if spec.target is not None and hasattr(spec.arg, "name")
        }
        written: dict[Node, list[Node]] = {}
        for node in self.nodes:
            if node.op != "placeholder":
                root = returned_root(node)
                if root is not node and root.op == "placeholder":
                    written.setdefault(root, []).append(node)
        for spec in self.ep.graph_signature.output_specs:
            if spec.kind.name in ("BUFFER_MUTATION", "PARAMETER_MUTATION"):
                placeholder = by_target.get(spec.target)
                value = self.by_name.get(getattr(spec.arg, "name", ""))
                if placeholder is not None and value is not None:
                    written.setdefault(placeholder, []).append(value)
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
                if node.name in self._mutation_outputs:
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
            elif first.target in _DROPOUTS:
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


def program_index(ep: ExportedProgram) -> ProgramIndex:
    """The :class:`ProgramIndex` of ``ep``, made once (kept by :mod:`graphsurgeon._derived`,
    under its one rule: made again when the graph changed)."""
    if not isinstance(ep, ExportedProgram):
        raise not_a_program(ep)
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
