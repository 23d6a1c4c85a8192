"""find(): where the ops of a function or a module occur in a program, and why not elsewhere.

The pattern is traced to aten ops the way ``gs.export`` traces a model (torch.export's training
IR, non-strict), with every tensor size symbolic, and looked for in the program's graph by
dataflow and op:

* an op matches an op with the same aten overload whose constant arguments are equal (numbers,
  bools, dtypes, dims, lists of ints); devices are not compared, so a pattern traced on the CPU
  matches a program on another device;
* a size is a wildcard: where the pattern read a size off a tensor (a symbol, or arithmetic on
  symbols: ``x.shape[-1] // 2``), the program may have any int or symbol, the same one for the
  same pattern size within one match. So a pattern traced at one shape matches at others
  (batch, sequence length, heads, head size);
* an input of the pattern matches any value of the program (an input used twice must be one
  value there); a parameter, buffer or tensor constant of a pattern module matches a parameter,
  buffer or constant of the program with the same shape and dtype;
* ``add`` and ``mul`` of two tensors match with their operands either way round;
* bookkeeping (``aten._assert_tensor_metadata``, the pattern's ``sym_size`` and size
  arithmetic) is not compared.

Matches do not overlap: the program is searched in graph order and the first match takes its
nodes. A match is only a match if it can be replaced as one call: a value inside it that the
rest of the program reads (other than the pattern's results), or a node outside it that both
reads its results and feeds it (not convex), makes it a near-miss with that reason. Where most
of the pattern is found but a constant or an op differs, the near-miss says where and how:
``23 of 24 ops match; differs at `mul_9` (aten.mul, other): constant 0.5, pattern 0.25``.

Example:
    >>> import torch, graphsurgeon as gs
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         x = self.a(x)
    ...         x = x * torch.sigmoid(x)
    ...         x = self.b(x)
    ...         return x * torch.sigmoid(x)
    >>> from graphsurgeon.patterns.find import find  # also gs.find
    >>> ep = gs.export(Net(), (torch.randn(2, 4),))
    >>> matches = find(ep, lambda t: t * torch.sigmoid(t), (torch.randn(3, 5),))
    >>> len(matches), [m.outputs for m in matches]
    (2, [('mul',), ('mul_1',)])
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from .._program import not_a_program
from ..partition import call_index, returned_root
from ._matcher import BUDGET, GaveUp, Search, difference_text, program_view
from ._pattern import BOOKKEEPING, Pattern, traced_pattern

__all__ = ["Match", "Matches", "NearMiss", "find"]


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """One place where the pattern occurs and can be replaced as one call.

    Attributes:
        index: its position in :attr:`Matches.matches` (graph order).
        call: the innermost module call that holds all its nodes (``"model.layers.0.self_attn"``;
            ``""`` at the top level).
        nodes: the program's nodes it covers, in graph order (the pattern's ops, and
            bookkeeping that reads them, such as ``_assert_tensor_metadata``).
        inputs: the program values bound to the pattern's inputs, in the pattern's argument
            order (flattened; ``None`` for an input the pattern does not read as a value, such
            as an int, which is traced as a constant).
        outputs: the program nodes that compute the pattern's results, in order.
        num_ops: how many ops of the pattern it matches (all of them).
        mapping: ``(pattern node, program node)`` for every op and input of the pattern.
        state: ``(pattern parameter or buffer, program node)`` for a pattern module's state.
        aliases: ``(node, input)`` for a node of the match that the program reads after it
            and that is, at run time, the match's input itself (a conversion to the dtype the
            tensor has, as LlamaRMSNorm's ``.to(float32)``): those reads are reads of the input.
    """

    index: int
    call: str
    nodes: tuple[str, ...]
    inputs: tuple[str | None, ...]
    outputs: tuple[str | None, ...]
    num_ops: int
    mapping: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    state: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    aliases: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    input_names: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __str__(self) -> str:
        return f"{_call_text(self.call)}: {_count(self.num_ops, 'op')}, {self.signature()}"

    def signature(self) -> str:
        """``(q=transpose, k=transpose_1) → (add_4, add_5)``: what the match reads and makes."""
        names = self.input_names or tuple(f"arg{i}" for i in range(len(self.inputs)))
        inputs = ", ".join(
            f"{name}={value}" for name, value in zip(names, self.inputs) if value is not None
        )
        outputs = ", ".join("-" if o is None else o for o in self.outputs)
        return f"({inputs}) → ({outputs})"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        rows = [["call", _call_text(self.call)], ["inputs → outputs", self.signature()]]
        if self.state:
            rows.append(["state", ", ".join(f"{p}={g}" for p, g in self.state)])
        body = (
            f'<div class="gs-title">match {self.index} {d.badge(_count(self.num_ops, "op"), "ok")}'
            "</div>"
            + d.table(["", ""], rows)
            + d.details(_count(len(self.nodes), "node"), d.names(self.nodes))
        )
        return d.bundle(body, str(self), include, exclude)


@dataclass(frozen=True)
class NearMiss:
    """A place where the pattern almost occurs, and why it is not a match.

    Attributes:
        call: the innermost module call holding the nodes found (``""``: the top level).
        nodes: the program's nodes that correspond to ops of the pattern, in graph order.
        matched: how many of the pattern's ops match there; ``num_ops``: how many it has.
        kind: ``"differs"`` (an op, a constant, an input or a size differs),
            ``"read outside"`` (a value inside is read elsewhere than the pattern's results),
            ``"not convex"`` or ``"overlaps"`` (an earlier match took some of its nodes).
        reason: one sentence, e.g. ``23 of 24 ops match; differs at `mul_9` (aten.mul,
            other): constant 0.5, pattern 0.25``.
        differences: every difference found, one sentence each (``kind == "differs"``).
        inputs / outputs: as in :class:`Match`, where they were found (``None`` elsewhere).
    """

    call: str
    nodes: tuple[str, ...]
    matched: int
    num_ops: int
    kind: str
    reason: str
    differences: tuple[str, ...] = ()
    inputs: tuple[str | None, ...] = ()
    outputs: tuple[str | None, ...] = ()

    def __str__(self) -> str:
        return f"{_call_text(self.call)}: {self.reason}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        rows = [["call", _call_text(self.call)], ["why not a match", self.reason]]
        rows += [["difference", text] for text in self.differences[1:]]
        badge = d.badge(f"{self.matched} of {_count(self.num_ops, 'op')}", "warn")
        body = (
            f'<div class="gs-title">near-miss ({d.escape(self.kind)}) {badge}</div>'
            + d.table(["", ""], rows)
            + d.details(_count(len(self.nodes), "node"), d.names(self.nodes))
        )
        return d.bundle(body, str(self), include, exclude)


@dataclass(frozen=True)
class Matches:
    """What :func:`find` found: every match, in graph order, and the near-misses with reasons.

    ``len(matches)``, ``for match in matches``, ``matches[0]`` go over the matches;
    ``matches.calls`` lists the module call of each. ``print(matches)`` writes a short report;
    in a notebook the result shows itself as a table.

    Attributes:
        pattern: the pattern's name (``"apply_rotary_pos_emb"``).
        num_ops: how many ops the traced pattern has (bookkeeping and size arithmetic left out).
        input_names: the pattern's inputs, as its signature names them, flattened.
        matches / near_misses: tuples of :class:`Match` / :class:`NearMiss`, in graph order.
        notes: how the pattern was traced, and searches that gave up, when worth saying.
        pattern_program: the pattern as traced (an ExportedProgram): its graph is what was
            looked for.
    """

    pattern: str
    num_ops: int
    input_names: tuple[str, ...]
    matches: tuple[Match, ...]
    near_misses: tuple[NearMiss, ...]
    notes: tuple[str, ...] = ()
    pattern_program: ExportedProgram | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.matches)

    def __iter__(self) -> Iterator[Match]:
        return iter(self.matches)

    def __getitem__(self, index: int) -> Match:
        return self.matches[index]

    @property
    def calls(self) -> tuple[str, ...]:
        """The module call of each match, in order (``""`` for the top level)."""
        return tuple(m.call for m in self.matches)

    def _head(self) -> str:
        found = _count(len(self.matches), "match")
        near = _count(len(self.near_misses), "near-miss")
        return f"find {self.pattern} ({_count(self.num_ops, 'op')}): {found}, {near}"

    def __str__(self) -> str:
        lines = [self._head()]
        lines += [f"  {m.index}. {m}" for m in self.matches[:20]]
        if len(self.matches) > 20:
            lines.append(f"  … and {len(self.matches) - 20} more matches")
        if self.near_misses:
            lines.append("near-misses:")
            lines += [f"  {n}" for n in self.near_misses[:10]]
            if len(self.near_misses) > 10:
                lines.append(f"  … and {len(self.near_misses) - 10} more")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<{self._head().replace('find ', 'Matches of ', 1)}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        count = len(self.matches)
        found = d.badge(f"{count} match{'es' if count != 1 else ''}", "ok" if count else "warn")
        near = len(self.near_misses)
        near_badge = d.badge(f"{near} near-miss{'es' if near != 1 else ''}", "warn") if near else ""
        inputs = ", ".join(self.input_names) or "none"
        body = (
            f'<div class="gs-title">find <code>{d.escape(self.pattern)}</code> {found} '
            f'{near_badge} <span class="gs-muted">{self.num_ops} ops; inputs '
            f"{d.escape(inputs)}</span></div>"
        )
        limit = 200
        if self.matches:
            rows = [
                [m.index, _call_text(m.call), m.num_ops, m.signature()]
                for m in self.matches[:limit]
            ]
            table = d.table(["#", "call", "ops", "inputs → outputs"], rows, numeric=(0, 2))
            if count > limit:
                table += f'<div class="gs-muted">… and {count - limit:,} more</div>'
            body += d.details(f"{count} match{'es' if count != 1 else ''}", table, open_=True)
        if self.near_misses:
            rows = [
                [_call_text(n.call), f"{n.matched} of {n.num_ops}", n.kind, n.reason]
                for n in self.near_misses[:limit]
            ]
            table = d.table(["call", "ops matched", "kind", "why not a match"], rows, numeric=(1,))
            if near > limit:
                table += f'<div class="gs-muted">… and {near - limit:,} more</div>'
            body += d.details(
                f"{near} near-miss{'es' if near != 1 else ''}", table, open_=count == 0
            )
        for note in self.notes:
            body += f'<div class="gs-muted">{d.escape(note)}</div>'
        return d.bundle(body, repr(self), include, exclude)


def _call_text(call: str) -> str:
    return call or "(top level)"


def _count(number: int, word: str) -> str:
    """``1 op``, ``2 ops``, ``1 match``, ``3 near-misses``."""
    plural = word + ("es" if word.endswith(("ch", "ss")) else "s")
    return f"{number} {word if number == 1 else plural}"


class _Finder:
    """One find(): the program scanned in graph order from each node of the pattern's first op."""

    def __init__(self, ep: ExportedProgram, pattern: Pattern):
        self.ep = ep
        self.pattern = pattern
        self.view = program_view(ep.graph)
        self.calls = call_index(ep)
        by_name = {n.name: n for n in self.view.nodes if n.op in ("placeholder", "get_attr")}
        state: dict[Node, tuple] = {}
        for spec in ep.graph_signature.input_specs:
            node = by_name.get(getattr(spec.arg, "name", ""))
            if spec.kind.name != "USER_INPUT" and node is not None:
                state[node] = _shape_of(node)
        for node in by_name.values():
            if node.op == "get_attr":
                state[node] = _shape_of(node)
        self.search = Search(pattern, self.view, state)
        self.matches: list[Match] = []
        self.near: list[tuple[set[Node], NearMiss]] = []
        self.near_nodes: set[Node] = set()
        self.gave_up: list[str] = []

    def run(self) -> Matches:
        pattern = self.pattern
        search = self.search
        for anchor in self.view.by_target.get(pattern.anchor.target, []):
            # a node of a near-miss may still start a match; it starts no second near-miss
            known = anchor in self.near_nodes
            try:
                if anchor in search.claimed:
                    if not known:
                        self._overlap(anchor)
                    continue
                if search.run(anchor):
                    self._found()
                    continue
                if known or (search.claimed and self._overlap(anchor)):
                    continue
            except (GaveUp, RecursionError):  # too many choices, or a pattern of thousands of ops
                self.gave_up.append(anchor.name)
                continue
            self._tolerant(anchor)
        claimed = set(search.claimed)
        near = [
            miss
            for nodes, miss in self.near
            if miss.kind != "overlaps" or nodes - claimed  # a later match took the rest
        ]
        notes = []
        if pattern.mode != "symbolic":
            notes.append(_MODE_NOTES[pattern.mode])
        if self.gave_up:
            notes.append(
                f"the search from {len(self.gave_up)} node(s) ({', '.join(self.gave_up[:3])}"
                f"{', …' if len(self.gave_up) > 3 else ''}) gave up after {BUDGET:,} "
                "candidates (or at Python's recursion limit): the pattern's parts connect only "
                "through values read in many places, or it is very large; a smaller pattern, "
                "or one whose parts share more than their inputs, is found faster"
            )
        return Matches(
            pattern=pattern.name,
            num_ops=pattern.num_ops,
            input_names=tuple(pattern.input_names),
            matches=tuple(self.matches),
            near_misses=tuple(miss for miss in near),
            notes=tuple(notes),
            pattern_program=pattern.program,
        )

    # a structural match ---------------------------------------------------------------------

    def _found(self) -> None:
        search, pattern = self.search, self.pattern
        ops = set(search.rev)
        region = set(ops)
        call_of = self.calls.call_of
        for node in ops:
            for user in node.users:
                # a check the module call of the op made goes with it; one another call made
                # (a norm's cast of its input checks the dtype of what it was given) is that
                # call's read of a result, not part of the match
                bookkeeping = user.op == "call_function" and user.target in BOOKKEEPING
                if bookkeeping and call_of(user.name) == call_of(node.name):
                    region.add(user)
        inputs, outputs = self._ends()
        order = self.view.order
        results = {search.m[o] for o in pattern.output_ops}
        total = pattern.num_ops
        aliases = []
        for node in sorted(ops - results, key=order.__getitem__):
            outside = [u for u in node.users if u not in region]
            root = returned_root(node, ops)
            if outside and root not in ops:
                # at run time this node is the match's input itself (a conversion to the
                # dtype it has: LlamaRMSNorm's .to(float32)); torch.export records later reads
                # of that input as reads of it, and they stay reads of the input
                aliases.append((node.name, root.name))
                continue
            if outside:
                reader = min(outside, key=order.__getitem__)
                reader_text = (
                    "the program's output" if reader.op == "output" else f"`{reader.name}`"
                )
                reason = (
                    f"all {_count(total, 'op')} match, but `{node.name}` (the pattern's "
                    f"`{search.rev[node].name}`) is also read by {reader_text} outside the "
                    "match and is not one of the pattern's results, so the match cannot be "
                    "replaced as one call (return it from the pattern to make it a result)"
                )
                self._near_miss(region, "read outside", reason, total, inputs, outputs)
                return
        blocker = self._convexity_breaker(region)
        if blocker is not None:
            reason = (
                f"all {_count(total, 'op')} match, but the match is not convex: "
                f"`{blocker.name}` outside it reads its results and feeds it, so it cannot "
                "become one call"
            )
            self._near_miss(region, "not convex", reason, total, inputs, outputs)
            return
        index = len(self.matches)
        for node in region:
            search.claimed[node] = index
        self.matches.append(
            Match(
                index=index,
                call=self._call(ops),
                nodes=self._names(region),
                inputs=inputs,
                outputs=outputs,
                num_ops=total,
                mapping=self._mapping(),
                state=tuple(
                    (pattern.state[p], g.name) for p, g in search.bind.items() if p in pattern.state
                ),
                aliases=tuple(aliases),
                input_names=tuple(pattern.input_names),
            )
        )

    def _overlap(self, anchor: Node) -> bool:
        """Whether the pattern occurs from ``anchor`` if earlier matches are ignored: then a
        near-miss that says which match took its nodes (dropped at the end when later matches
        cover the rest)."""
        search = self.search
        if not search.run(anchor, ignore_claimed=True):
            return False
        ops = set(search.rev)
        taken = sorted((n for n in ops if n in search.claimed), key=self.view.order.__getitem__)
        if not taken or not ops - set(search.claimed):
            return bool(taken)
        first = taken[0]
        index = search.claimed[first]
        inputs, outputs = self._ends()
        total = self.pattern.num_ops
        reason = (
            f"all {_count(total, 'op')} match, but `{first.name}` is already in match {index} "
            f"({_call_text(self.matches[index].call)}): matches do not overlap, the first in "
            "graph order takes its nodes"
        )
        self._near_miss(ops, "overlaps", reason, total, inputs, outputs)
        return True

    def _tolerant(self, anchor: Node) -> None:
        pattern = self.pattern
        status, differences = self.search.tolerant(anchor)
        counted = [p for p in pattern.ops if p.target is not operator.getitem]
        matched = sum(1 for p in counted if status.get(p) == "match")
        present = sum(1 for p in counted if status.get(p) in ("match", "differs"))
        if not differences or present * 2 <= pattern.num_ops:
            return
        texts = []
        for p, g, argument, d in differences:
            text = difference_text(pattern, p, g, argument, d)
            if text not in texts:
                texts.append(text)
        more = f"; and {len(texts) - 1} more difference{'s' if len(texts) > 2 else ''}"
        reason = (
            f"{matched} of {_count(pattern.num_ops, 'op')} "
            f"{'matches' if pattern.num_ops == 1 else 'match'}; {texts[0]}"
            f"{more if len(texts) > 1 else ''}"
        )
        search = self.search
        nodes = {g for p, g in search.m.items() if status.get(p) in ("match", "differs", "op")}
        inputs, outputs = self._ends()
        self._near_miss(
            nodes, "differs", reason, matched, inputs, outputs, differences=tuple(texts)
        )

    def _near_miss(
        self,
        nodes: set[Node],
        kind: str,
        reason: str,
        matched: int,
        inputs: tuple,
        outputs: tuple,
        differences: tuple[str, ...] = (),
    ) -> None:
        if any(nodes == seen for seen, _ in self.near):
            return  # the same place, found again from another of its nodes
        miss = NearMiss(
            call=self._call(nodes),
            nodes=self._names(nodes),
            matched=matched,
            num_ops=self.pattern.num_ops,
            kind=kind,
            reason=reason,
            differences=differences,
            inputs=inputs,
            outputs=outputs,
        )
        self.near.append((set(nodes), miss))
        self.near_nodes |= nodes

    # helpers --------------------------------------------------------------------------------

    def _ends(self) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
        search, pattern = self.search, self.pattern
        inputs = tuple(search.bind[p].name if p in search.bind else None for p in pattern.inputs)
        outputs: list[str | None] = []
        for value in pattern.outputs:
            found = (
                search.m.get(value) or search.bind.get(value) if isinstance(value, Node) else None
            )
            outputs.append(found.name if found is not None else None)
        return inputs, tuple(outputs)

    def _mapping(self) -> tuple[tuple[str, str], ...]:
        search, pattern = self.search, self.pattern
        pairs = [(p.name, search.m[p].name) for p in pattern.ops if p in search.m]
        names = dict(zip(pattern.inputs, pattern.input_names))
        pairs += [(names.get(p, p.name), g.name) for p, g in search.bind.items() if p in names]
        return tuple(pairs)

    def _names(self, nodes: set[Node]) -> tuple[str, ...]:
        return tuple(n.name for n in sorted(nodes, key=self.view.order.__getitem__))

    def _call(self, nodes: set[Node]) -> str:
        """The innermost module call around every node (``""``: the top level)."""
        chains = [self.calls.chain(n.name) for n in nodes if n.op == "call_function"]
        if not chains:
            return ""
        common = chains[0]
        for chain in chains[1:]:
            length = 0
            for a, b in zip(common, chain):
                if a != b:
                    break
                length += 1
            common = common[:length]
            if not common:
                return ""
        return common[-1] if common else ""

    def _convexity_breaker(self, region: set[Node]) -> Node | None:
        """A node outside ``region`` that depends on it and that it depends on, if any."""
        order = self.view.order
        positions = [order[n] for n in region]
        tainted: set[Node] = set()
        for node in self.view.nodes[min(positions) : max(positions) + 1]:
            inputs = node.all_input_nodes
            if node in region:
                for value in inputs:
                    if value in tainted:
                        return value
            elif any(value in region or value in tainted for value in inputs):
                tainted.add(node)
        return None


_MODE_NOTES = {
    "symbolic (size-1 dims fixed)": (
        "the pattern was traced with its example's size-1 dims fixed at 1 (torch could not keep "
        "them symbolic): where it passes such a size to an op, it matches only 1; trace it on "
        "examples whose sizes are all 2 or more to match any"
    ),
    "static": (
        "the pattern could not be traced with symbolic sizes, only at the example's sizes: an "
        "int where an op takes a size is taken as a size (it matches any int)"
    ),
}


def _shape_of(node: Node) -> tuple | None:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    return None


def find(
    ep: ExportedProgram,
    pattern: Callable,
    example_args: tuple,
    example_kwargs: Mapping[str, Any] | None = None,
) -> Matches:
    """Where the ops of ``pattern`` occur in ``ep``, and where they almost do, and why not.

    Args:
        ep: the program to search (any ExportedProgram: from ``gs.export`` or
            ``torch.export.export``). It is not modified.
        pattern: a function or an ``nn.Module``, traced to aten on the example arguments as
            ``gs.export`` traces a model. A module's parameters and buffers match the
            program's of the same shape.
        example_args: the positional arguments to call the pattern with when tracing it.
            Any shapes will do: sizes read off tensors match any size in the program. An int
            or a float is traced as a constant, and compared as one.
        example_kwargs: its keyword arguments, likewise.

    Returns:
        :class:`Matches`: every match in graph order (its nodes, inputs, outputs and module
        call) and the near-misses with their reasons.

    Raises:
        NotAProgramError: ``ep`` is not an ExportedProgram.
        InputStructureError: ``example_args`` is not a tuple (a list: ``tuple(args)``), or
            ``example_kwargs`` not a mapping.
        PatternError: the pattern is not callable, cannot be traced on the example arguments,
            or computes nothing.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> from graphsurgeon.patterns.find import find  # also gs.find
        >>> found = find(ep, torch.nn.functional.silu, (torch.randn(8),))
        >>> found[0].call, found[0].inputs, found[0].outputs
        ('1', ('linear',), ('silu',))
    """
    if not isinstance(ep, ExportedProgram):
        raise not_a_program(ep, "find")
    traced = traced_pattern(pattern, example_args, example_kwargs)
    return _Finder(ep, traced).run()
