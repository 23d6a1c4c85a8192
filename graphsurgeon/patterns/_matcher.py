"""The matcher of a find: the program's graph as the search reads it, and the search itself.

:class:`Search` matches a :class:`~graphsurgeon.patterns._pattern.Pattern` from one node of the
program by the pattern's plan: strictly (backtracking, failing at the first difference) for a
match, or tolerantly (the best local choice, every difference written down) to say why a
near-miss is one; :func:`difference_text` says a difference in words.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch.fx import Node

from .. import _meta
from ._pattern import (
    SIZE_TYPES,
    Pattern,
    argument_kinds,
    constant_text,
    node_arguments,
    size_expression,
)

__all__ = ["BUDGET", "GaveUp", "Search", "difference_text", "program_view"]

# A search from one place of the program gives up after this many candidate nodes: a pattern
# whose parts connect only through an input used everywhere could otherwise try them all.
BUDGET = 20_000
# The tolerant search (for near-misses) tries at most this many readers of a value per step.
_TOLERANT_CANDIDATES = 8


# -- the program ----------------------------------------------------------------------------------


class _ProgramView:
    """What the search needs of a program's graph, built once per graph (cached): node order,
    nodes by op, each node's arguments in schema order."""

    def __init__(self, graph: torch.fx.Graph):
        self.nodes = list(graph.nodes)
        self.size = len(self.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self.by_target: dict[Any, list[Node]] = {}
        for node in self.nodes:
            if node.op == "call_function":
                self.by_target.setdefault(node.target, []).append(node)
        self._args: dict[Node, tuple[Any, ...]] = {}

    def args(self, node: Node) -> tuple[Any, ...]:
        found = self._args.get(node)
        if found is None:
            found = self._args[node] = node_arguments(node)
        return found

    def users(self, node: Node, target: Any) -> list[Node]:
        found = [u for u in node.users if u.op == "call_function" and u.target is target]
        if len(found) > 1:
            found.sort(key=self.order.__getitem__)
        return found


_VIEWS: weakref.WeakKeyDictionary[torch.fx.Graph, _ProgramView] = weakref.WeakKeyDictionary()


def program_view(graph: torch.fx.Graph) -> _ProgramView:
    view = _VIEWS.get(graph)
    if view is None or view.size != len(graph.nodes):
        view = _VIEWS[graph] = _ProgramView(graph)
    return view


def _program_size_key(value: Any) -> Any:
    """A program value as a size (``("i", 8)``, a symbol's expression), or None if it is not
    one: an int, a float or a node computing one."""
    if isinstance(value, Node):
        value = value.meta.get("val")
        if isinstance(value, SIZE_TYPES):
            return ("s", str(value))
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return ("i", value)
    if isinstance(value, float):
        return ("f", value)
    return None


def _same_constant(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an == that does not answer True or False
        return False


# -- the search -------------------------------------------------------------------------------


class GaveUp(Exception):
    """A search from one place of the program spent its :data:`BUDGET` of candidate nodes."""


class Search:
    """Matches the pattern from one program node, by the pattern's plan.

    The strict search backtracks over the choices (readers of a value, the operand order of
    ``add``/``mul``) and fails at the first difference; the tolerant one makes the best local
    choice, writes every difference down and goes on, to say why a near-miss is one."""

    def __init__(self, pattern: Pattern, view: _ProgramView, state: dict[Node, tuple]):
        self.pattern = pattern
        self.view = view
        self.program_state = state  # program state node -> (shape, dtype)
        self.static = pattern.mode == "static"  # sizes are ints in the pattern's graph
        self.claimed: dict[Node, int] = {}  # program node -> the match that took it
        self.ignore_claimed = False
        self.reset()

    def reset(self) -> None:
        self.m: dict[Node, Node] = {}  # pattern op -> program node
        self.rev: dict[Node, Node] = {}  # program node -> pattern op
        self.bind: dict[Node, Node] = {}  # pattern input or state -> program value
        self.sizes: dict[Any, Any] = {}  # pattern size expression -> program size key
        self.trail: list[tuple[dict, Any]] = []
        self.budget = BUDGET

    # strict ---------------------------------------------------------------------------------

    def run(self, anchor: Node, ignore_claimed: bool = False) -> bool:
        self.reset()
        self.ignore_claimed = ignore_claimed
        return self._step(0, anchor)

    def _set(self, table: dict, key: Any, value: Any) -> None:
        table[key] = value
        self.trail.append((table, key))

    def _undo(self, mark: int) -> None:
        trail = self.trail
        while len(trail) > mark:
            table, key = trail.pop()
            del table[key]

    def _taken(self, node: Node) -> bool:
        return node in self.rev or (not self.ignore_claimed and node in self.claimed)

    def _step(self, index: int, anchor: Node | None = None) -> bool:
        plan = self.pattern.plan
        if index == len(plan):
            return self._inputs_outside()
        step = plan[index]
        p = step.node
        if step.how == "arg":
            g = self.m[p]  # set by the op that reads it
            if g.target is not p.target:
                return False
            if not self.ignore_claimed and g in self.claimed:
                return False
            for args in self.pattern.variants[p]:
                mark = len(self.trail)
                if self._strict(p, args, g) and self._step(index + 1):
                    return True
                self._undo(mark)
            return False
        if step.how == "anchor":
            candidates: list[Node] = [anchor]
        elif step.how == "user":
            found = self.m.get(step.ref) or self.bind.get(step.ref)
            candidates = self.view.users(found, p.target) if found is not None else []
        else:
            candidates = self.view.by_target.get(p.target, [])
        for g in candidates:
            self.budget -= 1
            if self.budget < 0:
                raise GaveUp
            if self._taken(g) or g.op != "call_function" or g.target is not p.target:
                continue
            for args in self.pattern.variants[p]:
                mark = len(self.trail)
                self._set(self.m, p, g)
                self._set(self.rev, g, p)
                if self._strict(p, args, g) and self._step(index + 1):
                    return True
                self._undo(mark)
        return False

    def _inputs_outside(self) -> bool:
        """An input of the pattern cannot be a value the match itself computes."""
        return not any(value in self.rev for value in self.bind.values())

    def _strict(self, p: Node, pattern_args: tuple, g: Node) -> bool:
        program_args = self.view.args(g)
        if len(pattern_args) != len(program_args):
            return False
        kinds = argument_kinds(p.target)
        for position, (pv, gv) in enumerate(zip(pattern_args, program_args)):
            if position < len(kinds) and kinds[position] == "device":
                continue
            sized = self.static and position < len(kinds) and kinds[position] == "size"
            if self._value(pv, gv, True, sized) is not None:
                return False
        return True

    # both -------------------------------------------------------------------------------------

    def _value(self, pv: Any, gv: Any, strict: bool, sized: bool = False) -> tuple | None:
        """None when the program value ``gv`` matches the pattern value ``pv`` (binding what
        the pattern names), else a difference: ``(kind, pattern value, program value, ...)``.
        ``sized``: ``pv`` is an int where the op takes a size, in a pattern traced at fixed
        sizes, so it may have been read off a tensor: it matches any size."""
        if isinstance(pv, Node):
            kind = self.pattern.kind.get(pv)
            if kind == "op":
                if not isinstance(gv, Node):
                    return ("value", pv, gv)
                have = self.m.get(pv)
                if have is not None:
                    return None if have is gv else ("elsewhere", pv, gv, have)
                if gv.op != "call_function" or (strict and gv.target is not pv.target):
                    return ("op", pv, gv)
                if gv in self.rev:
                    return ("twice", pv, gv, self.rev[gv])
                if not self.ignore_claimed and gv in self.claimed:
                    return ("claimed", pv, gv, self.claimed[gv])
                self._set(self.m, pv, gv)
                self._set(self.rev, gv, pv)
                return None
            if kind in ("input", "state"):
                if not isinstance(gv, Node) or gv.op == "output":
                    return ("value", pv, gv)
                have = self.bind.get(pv)
                if have is not None:
                    return None if have is gv else ("input", pv, gv, have)
                expected = pv.meta.get("val")
                found = gv.meta.get("val")
                if isinstance(expected, torch.Tensor) and not isinstance(
                    found, (torch.Tensor, type(None))
                ):
                    return ("value", pv, gv)
                if kind == "state":
                    shape = self.program_state.get(gv)
                    if shape is None or (
                        isinstance(expected, torch.Tensor)
                        and shape != (tuple(expected.shape), expected.dtype)
                    ):
                        return ("state", pv, gv)
                self._set(self.bind, pv, gv)
                return None
            if kind == "size":
                found = _program_size_key(gv)
                if found is None:
                    return ("size", pv, gv)
                key = size_expression(pv)
                have = self.sizes.get(key)
                if have is None:
                    self._set(self.sizes, key, found)
                    return None
                return None if have == found else ("resize", pv, gv, have)
            return ("value", pv, gv)
        if isinstance(pv, (list, tuple)):
            if not isinstance(gv, (list, tuple)) or len(gv) != len(pv):
                return ("constant", pv, gv)
            first = None
            for p_item, g_item in zip(pv, gv):
                difference = self._value(p_item, g_item, strict, sized)
                if difference is not None:
                    if strict:
                        return difference
                    if first is None:
                        first = difference
            if first is not None and first[0] in ("constant", "value", "size"):
                return ("constant", pv, gv)  # said of the whole list: [1, 8, -1, 8]
            return first
        if sized and isinstance(pv, int) and not isinstance(pv, bool):
            found = _program_size_key(gv)
            if found is not None and found[0] in ("i", "s"):
                return None
        if isinstance(gv, Node):
            return ("value", pv, gv)
        if _same_constant(pv, gv):
            return None
        return ("constant", pv, gv)

    # tolerant ---------------------------------------------------------------------------------

    def tolerant(self, anchor: Node) -> tuple[dict[Node, str], list[tuple]]:
        """The pattern matched from ``anchor`` as far as it goes: each pattern op's status
        (``"match"``, ``"differs"``, ``"op"``: another op there, ``"missing"``) and the
        differences, ``(pattern node, program node, argument, difference)``."""
        self.reset()
        self.ignore_claimed = False
        status: dict[Node, str] = {}
        differences: list[tuple] = []
        origin = self.view.order[anchor]
        for step in self.pattern.plan:
            p = step.node
            if step.how == "anchor":
                g = anchor
                self._set(self.m, p, g)
                self._set(self.rev, g, p)
            elif step.how == "arg":
                g = self.m.get(p)
                if g is None:
                    status[p] = "missing"
                    continue
            elif step.how == "user":
                found = self.m.get(step.ref) or self.bind.get(step.ref)
                if found is None or status.get(step.ref, "match") in ("missing", "op"):
                    status[p] = "missing"
                    continue
                candidates = [
                    u
                    for u in self.view.users(found, p.target)
                    if u not in self.rev and u not in self.claimed
                ]
                candidates.sort(key=lambda u: abs(self.view.order[u] - origin))
                g = self._best(p, candidates[:_TOLERANT_CANDIDATES])
                if g is None:
                    status[p] = "missing"
                    differences.append((p, found, None, ("unread", p, found)))
                    continue
                self._set(self.m, p, g)
                self._set(self.rev, g, p)
            else:
                status[p] = "missing"
                continue
            if g.op != "call_function" or g.target is not p.target:
                status[p] = "op"
                differences.append((p, g, None, ("op", p, g)))
                continue
            found_differences = self._compare(p, g)
            status[p] = "differs" if found_differences else "match"
            differences.extend((p, g, name, d) for name, d in found_differences)
        return status, differences

    def _best(self, p: Node, candidates: list[Node]) -> Node | None:
        """The reader that matches ``p`` with the fewest differences (the first on a tie)."""
        best, fewest = None, None
        for g in candidates:
            saved = (dict(self.m), dict(self.rev), dict(self.bind), dict(self.sizes))
            self._set(self.m, p, g)
            self._set(self.rev, g, p)
            count = len(self._compare(p, g))
            self.m, self.rev, self.bind, self.sizes = saved
            self.trail = []
            if fewest is None or count < fewest:
                best, fewest = g, count
                if count == 0:
                    break
        return best

    def _compare(self, p: Node, g: Node) -> list[tuple[str, tuple]]:
        """The differences between ``p``'s arguments and ``g``'s (``(argument name,
        difference)``), binding as it goes; the operand order with fewer differences wins."""
        best: list[tuple[str, tuple]] = []
        saved = (self.m, self.rev, self.bind, self.sizes)
        for number, args in enumerate(self.pattern.variants[p]):
            before = (dict(self.m), dict(self.rev), dict(self.bind), dict(self.sizes))
            found = self._differences(p, args, self.view.args(g))
            if number == 0 or len(found) < len(best):
                best, saved = found, (self.m, self.rev, self.bind, self.sizes)
            self.m, self.rev, self.bind, self.sizes = before
            if not found:
                break
        self.m, self.rev, self.bind, self.sizes = saved
        self.trail = []
        return best

    def _differences(self, p: Node, pattern_args: tuple, program_args: tuple) -> list:
        names = _argument_names(p.target, len(pattern_args))
        kinds = argument_kinds(p.target)
        if len(pattern_args) != len(program_args):
            return [("", ("arity", p, len(program_args)))]
        found = []
        for position, (pv, gv) in enumerate(zip(pattern_args, program_args)):
            if position < len(kinds) and kinds[position] == "device":
                continue
            sized = self.static and position < len(kinds) and kinds[position] == "size"
            difference = self._value(pv, gv, False, sized)
            if difference is not None:
                found.append((names[position], difference))
        return found


def _argument_names(target: Any, count: int) -> list[str]:
    if isinstance(target, torch._ops.OpOverload):
        names = [a.name for a in target._schema.arguments]
        return names + [f"arg{i}" for i in range(len(names), count)]
    return [f"arg{i}" for i in range(count)]


# -- what the search found, in words ----------------------------------------------------------


def _program_text(value: Any) -> str:
    if isinstance(value, Node):
        if value.op == "placeholder":
            return f"value `{value.name}` (an input)"
        return f"value `{value.name}`"
    return f"constant {constant_text(value)}"


def difference_text(pattern: Pattern, p: Node, g: Node, argument: str | None, d: tuple) -> str:
    """One difference as a sentence: ``differs at `mul_9` (aten.mul, other): constant 0.5,
    pattern 0.25``."""
    kind = d[0]
    if kind == "op" and argument is None:
        return f"differs at `{g.name}`: op {_meta.op_text(g)}, pattern {_meta.op_text(p)}"
    if kind == "unread":
        return f"no {_meta.op_text(p)} reads `{g.name}` as the pattern's `{p.name}` does"
    where = f"differs at `{g.name}` ({_meta.op_text(g)}{', ' + argument if argument else ''})"
    pv, gv = d[1], d[2]
    if kind == "constant":
        return f"{where}: constant {constant_text(gv)}, pattern {pattern.text(pv)}"
    if kind in ("value", "op"):
        return f"{where}: {_program_text(gv)}, pattern {pattern.text(pv)}"
    if kind == "input":
        return (
            f"{where}: the pattern's {pattern.text(pv)} is `{d[3].name}` elsewhere in this "
            f"match, but `{gv.name}` here"
        )
    if kind == "state":
        expected = pv.meta.get("val")
        shape = _meta.value_text(expected) if expected is not None else "?"
        return (
            f"{where}: {_program_text(gv)} is not a parameter, buffer or constant {shape} "
            f"like the pattern's {pattern.text(pv)}"
        )
    if kind == "size":
        return f"{where}: {_program_text(gv)}, pattern {pattern.text(pv)}"
    if kind == "resize":
        have = d[3][1] if isinstance(d[3], tuple) else d[3]
        return (
            f"{where}: size {constant_text(gv)}, but the pattern's size "
            f"({pattern.size_text(pv)}) is {have} elsewhere in this match"
        )
    if kind == "elsewhere":
        return (
            f"{where}: reads `{gv.name}` where the pattern reads its `{pv.name}`, found "
            f"as `{d[3].name}`"
        )
    if kind == "twice":
        return f"{where}: `{gv.name}` would be both the pattern's `{pv.name}` and `{d[3].name}`"
    if kind == "claimed":
        return f"{where}: `{gv.name}` is already in match {d[3]}"
    if kind == "arity":
        return f"{where}: {d[2]} arguments, pattern {len(pattern.args[p])}"
    return f"{where}: {kind}"  # pragma: no cover - every kind is written above
