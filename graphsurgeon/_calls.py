"""Which module calls each node of a graph belongs to: the :class:`CallIndex`, decided here
once and read by every stage (partition, swap, fuse, render, the stepper and compare), so a node
sits in the same module in the picture and in the stepper. :func:`call_index` builds it once
per graph. Imported from :mod:`graphsurgeon.partition` too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from . import _derived, _meta
from ._meta import (
    CALL_SUFFIX,
    traced_path_fqn,
)
from ._program import _info

__all__ = ["Call", "CallIndex", "call_index", "call_name"]


def call_name(fqn: str, index: int) -> str:
    """The name of the ``index``-th call of ``fqn``: ``"fqn"`` for the first, ``"fqn@k"`` after."""
    return fqn if index == 0 else f"{fqn}@{index}"


def _type_text(type_: object) -> str:
    if isinstance(type_, str):
        return type_
    return f"{getattr(type_, '__module__', '')}.{getattr(type_, '__qualname__', type_)}"


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

    Only names are kept (never nodes), so a cached index does not keep its graph alive; once
    the index of a swap of it was read, also the stack objects of its nodes (which the swap's
    copies share), by their ids.
    Internal; :func:`call_index` builds it once per graph.
    """

    def __init__(
        self,
        graph: torch.fx.Graph,
        state: frozenset[str] = frozenset(),
        copied_from: tuple[CallIndex, torch.fx.Graph] | None = None,
    ):
        """``copied_from``: ``(index, graph)`` of the program ``graph`` was copied from (a swap
        or fuse result's): a node that carries the very stack object of a node there (copies
        share their meta's values) sits in the calls that index found for it, read instead of
        worked out again, with the same rules for every other node; when that cannot be
        (calls numbered by the order the graph reaches them, an entry it never saw) the
        index is built from ``graph`` alone. The same index either way (tests/test_derived.py and
        the fuzzer check it): a swap's index then costs a lookup per node, not a read of each
        node's stack."""
        nodes = list(graph.nodes)
        if copied_from is not None:
            try:
                self._build(nodes, state, copied_from)
                return
            except _NotCopied:
                pass
        self._build(nodes, state, None)

    def _build(
        self,
        nodes: list[Node],
        state: frozenset[str],
        copied_from: tuple[CallIndex, torch.fx.Graph] | None,
    ) -> None:
        self.size = len(nodes)
        self.root_type = ""
        self.calls: dict[str, Call] = {}
        # modules whose own name ends in "@k", as graphsurgeon names repeated calls
        self.ambiguous: list[str] = []
        interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        # the chain of each stack object of the graph copied from, by id (those objects are
        # alive: that graph holds them), and its calls
        known: dict[int, tuple[str, ...]] = {}
        if copied_from is None:
            # (stack key, recorded path) of every stack entry -> (fqn, call index)
            self._entries, self._numbered_alone = _number_calls(nodes)
        else:
            base, base_graph = copied_from
            if not base._numbered_alone:
                raise _NotCopied  # numbered by the order the graph reaches them: anew
            self._entries, self._numbered_alone = base._entries, True
            known, shared = base._chains_by_stack(base_graph)
            # a chain worked out here is the one object of its value, as a read of this graph
            # alone makes it (a picture cuts its vertices into runs by that identity)
            interned = dict(shared)
            base_calls = base.calls
        chains: dict[str, tuple[str, ...]] = {}
        pending: list[Node] = []  # placed by their users, once those are settled
        # thousands of nodes record a few hundred distinct stacks: each is read once
        read: dict[tuple, tuple[str, ...]] = {}
        adopted: tuple[str, ...] | None = None  # the last known chain whose calls were taken
        for node in nodes:
            stack = node.meta.get("nn_module_stack")
            if stack:
                chain = known.get(id(stack)) if known else None
                if chain is not None:
                    if chain is not adopted:
                        # its calls, in the order a read of this graph would meet them
                        for name in chain:
                            if name not in self.calls:
                                self._adopt(base_calls[name], base.root_type)
                        adopted = chain
                    chains[node.name] = chain
                    continue
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

    @functools.cached_property
    def members(self) -> dict[str, list[str]]:
        """Each call's nodes, nested calls' included, in graph order (made when first asked:
        a swap's index is read for its chains)."""
        chains = self.chains
        members: dict[str, list[str]] = {name: [] for name in self.calls}
        for name in self.order:
            for call in chains[name]:
                members[call].append(name)
        return members

    def _chains_by_stack(
        self, graph: torch.fx.Graph
    ) -> tuple[dict[int, tuple[str, ...]], dict[tuple[str, ...], tuple[str, ...]]]:
        """The chain of each stack object of ``graph``, the graph this index was built from
        (and is kept with), by the object's id, and those chains by value (each one object);
        made once. The stack objects are kept too (not the graph: that would keep it alive),
        so no id names another object while this lives."""
        kept = self.__dict__.get("_by_stack")
        if kept is None:
            stacks: list[Any] = []
            by_id: dict[int, tuple[str, ...]] = {}
            shared: dict[tuple[str, ...], tuple[str, ...]] = {}
            chains = self.chains
            for node in graph.nodes:
                stack = node.meta.get("nn_module_stack")
                if stack and node.name in chains:
                    stacks.append(stack)
                    chain = chains[node.name]
                    by_id[id(stack)] = shared.setdefault(chain, chain)
            kept = self._by_stack = (by_id, shared, stacks)
        return kept[0], kept[1]

    def _adopt(self, call: Call, root_type: str) -> None:
        """Take ``call`` as the index copied from found it (see ``_chain``)."""
        if not self.root_type:
            self.root_type = root_type  # every stack records the root first
        if CALL_SUFFIX.search(call.fqn) and call.fqn not in self.ambiguous:
            self.ambiguous.append(call.fqn)
        self.calls[call.name] = call

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
            found = entries.get((str(key), path))
            if found is None:  # an entry the graph copied from never had
                raise _NotCopied
            fqn, index, name = found
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

    #: whether module or call ``name`` is ``outer`` or inside it (:func:`graphsurgeon._meta.inside`)
    inside = staticmethod(_meta.inside)

    def chain(self, node: str) -> tuple[str, ...]:
        """The calls around node ``node``, outermost first (``()`` at the top level)."""
        return self.chains[node]

    def call_of(self, node: str) -> str:
        """The innermost call node ``node`` belongs to ('' at the top level)."""
        chain = self.chains[node]
        return chain[-1] if chain else ""


class _NotCopied(Exception):
    """A graph's index cannot be read from the index of the graph it was copied from."""


# A key torch's strict tracer (dynamo) writes: the module's id, "@k" from its second call on.
_ID_KEY = re.compile(r"\d+(?:@\d+)?")


def _number_calls(
    nodes: list[Node],
) -> tuple[dict[tuple[str, str], tuple[str, int, str]], bool]:
    """The module call each ``nn_module_stack`` entry of ``nodes`` records: ``(key, path)`` ->
    ``(fqn, call index, call name)``, numbered as torch's non-strict export numbers them; and
    whether every entry was numbered by itself alone (no module reached by two spellings), so
    that the numbering holds for any graph whose entries are among these.

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
    return numbered, not ranks


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
        return CallIndex(graph, state, _copied_from(program))

    # kept with the graph, not the program object: what it says depends on the graph (and, for
    # an ExportedProgram, on which placeholders are state), so copies of a program share it
    kind = "call index of a program" if isinstance(program, ExportedProgram) else "call index"
    return _derived.cached(graph, kind, build)


def _copied_from(program: Any) -> tuple[CallIndex, torch.fx.Graph] | None:
    """The index and graph of the program a swap or fuse result was copied from (its
    ``SwapInfo``), when that program is still alive; None for anything else."""
    if not isinstance(program, torch.fx.GraphModule):
        return None
    # (the SwapInfo is read by what it has: this module sits below the rewrite that makes it)
    source = getattr(_info(program), "program_if_alive", None)
    if not isinstance(source, ExportedProgram):
        return None
    return call_index(source), source.graph
