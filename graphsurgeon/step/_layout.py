"""The layout of a graph for stepping: its nodes in order, the module calls around each, the
nodes of each call, where a move stops (before a node that computes: an op, a swapped or fused
call; never the glue around them), the calls a stepper can enter, and what a node or module
name stands for in it. Computed once per stepper (:class:`Layout`)."""

from __future__ import annotations

import bisect
from typing import NoReturn

from torch.fx import GraphModule, Node

from .. import _meta
from ..checks._exec import value_lifetimes
from ..errors import (
    AlreadyRanError,
    StepError,
    UnknownModuleError,
    UnknownNameError,
    UnknownNodeError,
    unknown_name,
)
from ..partition import call_index, program_index, split_call_name
from ..rewrite import swap_info

__all__ = ["Layout", "next_text", "op_text"]


def op_text(node: Node) -> str:
    """What a node runs, as every view writes it: ``aten.div.Tensor(other=8.0)``."""
    if node.op in ("placeholder", "output"):
        return node.op
    weights = {n.name for n in node.all_input_nodes if n.op in ("get_attr", "placeholder")}
    return _meta.node_call_text(node, "full", weights)


def next_text(node: Node) -> str:
    """The node about to run, every argument of its op written out (those left at their
    default too: ``is_causal=False``), tensors by their node names: the full form, for the
    one node a stepper's user is looking at."""
    if node.op != "call_function":
        return op_text(node)
    arguments = _meta.arguments_text(node, "full")
    name = _meta.op_text(node, "full")
    return f"{name}({arguments})" if arguments else name


class Layout:
    """Everything about one graph that stepping needs, computed once per stepper: its nodes
    in order, the module calls around each (the one node -> call index every view reads), the
    nodes of each call, where moves stop, the swapped and fused calls a stepper can enter,
    when each value is last read, and what a node or module name stands for here."""

    def __init__(self, gm: GraphModule, depth: int = 0):
        nodes = list(gm.graph.nodes)
        self.nodes = nodes
        self.names = [n.name for n in nodes]
        self.by_name = {n.name: n for n in nodes}
        self.position = {n: i for i, n in enumerate(nodes)}
        info = swap_info(gm)
        swapped_types = {}
        if info is not None:
            swapped_types = {c: type(m).__name__ for c, m in info.calls.items()}
        self.swapped = swapped_types
        # the module calls enclosing each node, outermost first: the one index every view reads
        # (a fused call's graph keeps the program's module stacks: ``depth`` calls around it
        # are the call itself and its parents, which its stepper does not step through)
        chains = call_index(gm).chains
        own = [chains[node.name][depth:] for node in nodes]
        self.stacks: list[tuple[str, ...]] = own
        self.members: dict[str, list[int]] = {}
        for i, calls in enumerate(self.stacks):
            for call in calls:
                self.members.setdefault(call, []).append(i)
        self.fqn_calls: dict[str, list[str]] = {}
        for call in self.members:
            fqn, _ = split_call_name(call)
            self.fqn_calls.setdefault(fqn, []).append(call)
        self._op_texts: dict[Node, str] = {}
        # where moves stop: nodes that compute (ops, swapped and fused calls), never the glue
        # around them, inputs, state or checks (the one rule the pictures draw by)
        self.stops: list[int] = [i for i, node in enumerate(nodes) if _meta.computes(node)]
        # the swapped and fused calls, which a stepper can enter: position -> call name
        self.calls_at: dict[int, str] = {
            i: node.meta.get(_meta.FUSED) or node.meta[_meta.SWAPPED]
            for i, node in enumerate(nodes)
            if node.op == "call_module" and (_meta.FUSED in node.meta or _meta.SWAPPED in node.meta)
        }
        self.call_position: dict[str, int] = {call: i for i, call in self.calls_at.items()}
        for i, call in self.calls_at.items():  # a region's call is no module's: its node alone
            if call not in self.members:
                self.members[call] = [i]
                self.fqn_calls.setdefault(call, [call])
        self.program_fqns: frozenset[str] = frozenset()
        # the program's index, where names are read as every entry point reads them
        self.index = None
        if info is not None:
            self.index = program_index(info.program)
            self.program_fqns = self.index.fqn_set
        # the position after which each node's value is no longer needed, and the values to
        # drop after each position in memory-light mode
        self.last_use, self.frees = value_lifetimes(nodes)

    def span(self, call: str) -> tuple[int, int]:
        """The positions of the first and the last node of ``call``."""
        members = self.members[call]
        return members[0], members[-1]

    def entry(self, call: str) -> int:
        """Where a move into ``call`` stops: its first op (its first node when it has none;
        the weights it reads come before)."""
        start, end = self.span(call)
        first = self.next_stop(start)
        return first if first <= end else start

    def common_depth(self, position: int) -> int:
        """How many module calls the last op run before ``position`` and the node there share
        (the frame a stepper at ``position`` is in). The last op, not the last node: the
        weights a call reads run before its first op, and standing at that op is standing at
        the call's entry."""
        here = self.stacks[position]
        k = bisect.bisect_left(self.stops, position) - 1
        before = self.stacks[self.stops[k]] if k >= 0 else ()
        depth = 0
        for a, b in zip(before, here):
            if a != b:
                break
            depth += 1
        return depth

    def op_text(self, node: Node) -> str:
        """:func:`op_text` of ``node``, written once per stepper (a memory-light run writes
        one summary per node, every run)."""
        text = self._op_texts.get(node)
        if text is None:
            text = self._op_texts[node] = op_text(node)
        return text

    def next_stop(self, position: int) -> int:
        """The first stop at or after ``position`` (the end when none is left)."""
        k = bisect.bisect_left(self.stops, position)
        return self.stops[k] if k < len(self.stops) else len(self.nodes)

    def stop_after(self, position: int, n: int) -> int:
        """The ``n``-th stop after ``position`` (the end when fewer are left)."""
        k = bisect.bisect_right(self.stops, position) + n - 1
        return self.stops[k] if k < len(self.stops) else len(self.nodes)

    def inner_target(self, name: str) -> tuple[str, str] | None:
        """``"call/node"``, a node inside a swapped or fused call, as ``(call, node)``."""
        if not isinstance(name, str) or name in self.by_name:
            return None
        for call in self.call_position:
            if name.startswith(call + "/") and len(name) > len(call) + 1:
                return call, name[len(call) + 1 :]
        return None

    # -- names: what a node or module name stands for in this graph ------------------------

    def node(self, name: str) -> Node:
        """The node named ``name``, or :class:`UnknownNodeError` with the closest names."""
        node = self.by_name.get(name) if isinstance(name, str) else None
        if node is None:
            raise UnknownNodeError(unknown_name(name, self.by_name, kind="node", where="the graph"))
        return node

    def node_position(self, name: str, here: int) -> int:
        """The position of node ``name``, which must not have run (the stepper is at ``here``)."""
        position = self.position[self.node(name)]
        if position < here:
            raise AlreadyRanError(
                f"node {name!r} already ran (position {position}; the stepper is at {here})"
            )
        return position

    def is_module(self, name: str) -> bool:
        """Whether ``name`` names module calls of this graph (a module, one call ``"fqn@k"``,
        a region's call, or a container: the calls it covers)."""
        if name in self.members or name in self.fqn_calls:
            return True
        fqn, index = split_call_name(name)
        if index == 0 and fqn in self.members:
            return True
        if self.index is not None and fqn in self.index.fqn_set and fqn != "":
            try:
                return any(c in self.members for c in self.index.calls_covered(name))
            except UnknownModuleError:
                return False
        return False

    def calls_named(self, module: str) -> list[str]:
        """The calls of this graph a module or call name stands for, in call order: read by
        the program's index as every entry point reads it (``"blk@0"`` is ``"blk"``; a
        container such as nn.ModuleList stands for the outermost calls of its submodules,
        :meth:`graphsurgeon.partition.ProgramIndex.calls_covered`)."""
        if not isinstance(module, str):
            raise StepError(f"expected a module name such as 'layers.0', got {module!r}")
        if module in self.call_position and module not in self.program_fqns:
            return [module]  # a region made one call (Surgery.replace, swap_region)
        if module == "":
            raise UnknownModuleError("the root module '' is the whole program; name a submodule")
        covered: tuple[str, ...] = ()
        if self.index is not None:
            covered = self.index.calls_covered(module)  # an unknown name: UnknownModuleError
            calls = [call for call in covered if call in self.members]
            if calls:
                return calls
            module = self.index.resolve(module).name
        else:  # a GraphModule made elsewhere: the calls its graph records
            fqn, index = split_call_name(module)
            if index == 0:
                module = fqn
            if module in self.fqn_calls:  # an fqn: every call of it
                return list(self.fqn_calls[module])
            if module in self.members:  # one call, "fqn@k"
                return [module]
        for call, kind in self.swapped.items():
            if _meta.inside(module, call, strictly=True):
                raise UnknownModuleError(
                    f"module {module!r} runs inside the swapped call {call!r} ({kind}), which "
                    f"is one node here: run_to({call!r}), then step_into() steps through the "
                    "replacement's own graph."
                )
        if self.index is not None:
            fqn = split_call_name(module)[0]
            why = self.index.why_no_calls(fqn) if not covered else "its calls are not in it"
            raise UnknownModuleError(f"module {module!r} has no call in this graph: {why}")
        choices = list(self.fqn_calls) + [c for c in self.members if "@" in c]
        raise UnknownModuleError(unknown_name(module, choices, where="the graph"))

    def next_entry(self, module: str, here: int) -> int:
        """Where the first call of ``module`` that starts at or after ``here`` is entered."""
        starts = sorted(self.entry(call) for call in self.calls_named(module))
        later = [s for s in starts if s >= here]
        if not later:
            raise AlreadyRanError(
                f"no call of {module!r} starts at or after the stepper's position {here} "
                f"(its calls start at {starts})"
            )
        return later[0]

    def refuse(self, target: str) -> NoReturn:
        """Say why ``target``, neither a node nor a module call of this graph, is no target."""
        inside_swap = any(_meta.inside(target, call, strictly=True) for call in self.swapped)
        if split_call_name(target)[0] in self.program_fqns or inside_swap:
            self.calls_named(target)  # raises, saying why this module has no nodes here
        choices = list(self.by_name) + list(self.fqn_calls)
        raise UnknownNameError(
            unknown_name(target, choices, kind="node or module", where="the graph")
        )
