r"""Find a program's modules and ops by what a person types: a name, a type, an op, initials or
a regular expression.

:func:`search` is the one reading of such a text, for the widget's search box, the command
line and the report alike. A text matches a module when it is part of the module's name, of
its type (``LayerNorm``, or the qualified ``torch.nn.modules.normalization.LayerNorm``) or the
initials of its type (``bn`` for ``BatchNorm2d``); an op (an fx node that computes) when it is
part of the node's name or of its op (``aten.gelu``, ``aten.gelu.default``) or the initials of
its op (``sdpa`` for ``scaled_dot_product_attention``). A text with a character of a regular
expression (``layers\.\d+\.mlp$``) is also tried as one. Case is ignored.

The modules are those of the original program (its module tree); the ops those of the program
as it is now (a Surgery's current module, a swap result's graph). A module that a swap or a
fuse made one node is found once: as the module, not again as the node that calls it.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.patterns.search import search
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    >>> ep = gs.export(model.eval(), (torch.randn(2, 4),))
    >>> search(ep, "bn")[0]  # the initials of BatchNorm1d (and of aten.batch_norm)
    Match(name='1', kind='module', what='BatchNorm1d')
    >>> [(m.name, m.kind) for m in search(ep, "^lin")]  # the Linear, then its op
    [('0', 'module'), ('linear', 'node')]
"""

from __future__ import annotations

import bisect
import heapq
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import _derived, _meta
from .._program import as_program
from ..partition import module_tree

__all__ = ["Match", "prepare", "search"]

# Characters that make a text a regular expression too.
_REGEX = frozenset("\\^$[]()*+?|{}")


@dataclass(frozen=True)
class Match:
    """One place a search found.

    Attributes:
        name: the module's name (``"layers.1.attn"``) or the fx node's (``"gelu"``).
        kind: ``"module"`` or ``"node"``.
        what: the module's type (``"LayerNorm"``) or the node's op (``"aten.gelu"``).
    """

    name: str
    kind: str
    what: str


def search(program: Any, text: str, limit: int | None = None) -> list[Match]:
    """Every module and op of ``program`` that ``text`` matches (see the module docstring): a
    name equal to ``text`` first, then the modules in the order of the module tree, then the
    ops in graph order. A blank text matches nothing.

    Args:
        program: an ExportedProgram, a GraphModule made by :func:`graphsurgeon.swap` or
            :func:`graphsurgeon.fuse`, or a :class:`~graphsurgeon.Surgery` (its current state).
        text: a name, a type, an op, initials or a regular expression.
        limit: at most this many matches, the first ones of the full list (None: all). The
            rows past them are not read, so a search that keeps a screenful costs what it
            keeps, not what the program holds (``"linear"`` matches 2,300 ops at 384 layers).

    Returns:
        The matches, each a :class:`Match`.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(3)])
        >>> ep = gs.export(model, (torch.randn(1, 2),))
        >>> [m.name for m in search(ep, "lin", limit=4)]
        ['0', '1', '2', 'linear']
        >>> [m.name for m in search(ep, "linear_1", limit=1)]  # an exact name comes first
        ['linear_1']
    """
    text = (text or "").strip()
    if not text or (limit is not None and limit <= 0):
        return []
    read = as_program(program, verb="search")
    matches = _Matcher(text)
    modules_read = _modules(read.ep)
    ops_read = _ops(read.module if read.module is not None else read.ep)
    # a name equal to the text comes first: looked up, so a limit never leaves it out
    exact: list[Match] = []
    if text in modules_read.row_of:
        exact.append(Match(text, "module", modules_read.whats[modules_read.row_of[text]]))
    modules: list[Match] = []
    wanted = None if limit is None else limit - len(exact)
    for fqn, type_name in modules_read.matching(matches):
        if wanted is not None and len(modules) >= wanted:
            break
        if fqn != text:
            modules.append(Match(fqn, "module", type_name))
    found = {m.name for m in exact + modules}
    info = read.info
    call_of_node = {node: call for call, node in info.call_nodes.items()} if info else {}

    def shown_as_node(name: str) -> bool:
        call = call_of_node.get(name)
        # a swapped or fused module's call: found once, as the module
        return call is None or _meta.split_call_name(call)[0] not in found

    if text in ops_read.row_of and shown_as_node(text):
        exact.append(Match(text, "node", ops_read.whats[ops_read.row_of[text]]))
    nodes: list[Match] = []
    wanted = None if limit is None else limit - len(exact) - len(modules)
    for name, short in ops_read.matching(matches):
        if wanted is not None and len(nodes) >= wanted:
            break
        if name != text and shown_as_node(name):
            nodes.append(Match(name, "node", short))
    return (exact + modules + nodes)[:limit]


def prepare(program: Any) -> None:
    """Read what a search of ``program`` looks in, ahead of its first search: :func:`search`
    reads a program's module and op texts once, on its first call (~45 ms at 384 layers,
    16,500 nodes), and every later search of that program finds them read.

    Args:
        program: what :func:`search` takes.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.patterns.search import prepare, search
        >>> ep = gs.export(torch.nn.Sequential(torch.nn.Linear(4, 4)), (torch.randn(2, 4),))
        >>> prepare(ep)
        >>> [m.name for m in search(ep, "lin")]  # the Linear, then its op: nothing read now
        ['0', 'linear']
    """
    read = as_program(program, verb="search")
    _modules(read.ep)
    _ops(read.module if read.module is not None else read.ep)


class _Matcher:
    """Whether some fields (or the initials of some words) match a search text."""

    def __init__(self, text: str):
        self.lowered = text.lower()
        self.regex = None
        if _REGEX & set(text):
            try:
                self.regex = re.compile(text, re.IGNORECASE)
            except re.error:  # not a valid expression: a plain text only
                self.regex = None

    def __call__(self, fields: Iterable[str], initial: bool = False) -> bool:
        """Whether one of ``fields`` matches, or (``initial``) the text is the initials of a
        word of them."""
        for field in fields:
            if self.lowered in field.lower() or (self.regex and self.regex.search(field)):
                return True
        return initial


def initials(word: str) -> str:
    """What an abbreviation of ``word`` is: ``scaled_dot_product_attention`` -> ``sdpa``,
    ``BatchNorm2d`` -> ``bn``; '' for a word of one part.

    Example:
        >>> initials("scaled_dot_product_attention"), initials("BatchNorm2d"), initials("gelu")
        ('sdpa', 'bn', '')
    """
    if "_" in word:
        return "".join(part[0] for part in word.lower().split("_") if part)
    parts = re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z]+", word)
    return "".join(part[0] for part in parts).lower() if len(parts) > 1 else ""


# What separates the fields, and the rows, of _Texts.text: no search text holds them.
_FIELD, _ROW = "\x00", "\x01"


class _Texts:
    """The rows a search reads, each a name, what it is (a type, an op), the fields searched
    and the initials of a word, with the rows' lowered fields joined into one text: a plain
    search text is found by ``str.find`` over all of them at once (a search as one types costs
    its matches, not the program), a regular expression row by row.

    Everything is kept in strings and flat lists of them, not in a tuple per row: strings are
    no work for Python's cyclic garbage collector, and a tuple per row and per field made the
    first search of a 384-layer program (20,000 rows) set off a collection of the whole heap
    (0.7 s of its 1.5 s)."""

    def __init__(self, rows: Iterable[tuple[str, str, tuple[str, ...], str]]):
        self.names: list[str] = []
        self.whats: list[str] = []
        self.fields: list[str] = []  # each row's fields, joined by _FIELD
        self.starts: list[int] = []  # where each row's lowered fields begin in self.text
        self.by_initials: dict[str, list[int]] = {}
        self.row_of: dict[str, int] = {}  # a name's row (the first, for a repeated name)
        at = 0
        for i, (name, what, fields, initial) in enumerate(rows):
            joined = _FIELD.join(field for field in fields if field)
            self.names.append(name)
            self.whats.append(what)
            self.fields.append(joined)
            self.starts.append(at)
            self.row_of.setdefault(name, i)
            at += len(joined) + 1
            if initial:
                self.by_initials.setdefault(initial, []).append(i)
        self.text = _ROW.join(self.fields).lower() + _ROW
        if len(self.text) != at:  # lower() changed a length (a rare character): find by row
            self.text = None

    def matching(self, matches: _Matcher) -> Iterator[tuple[str, str]]:
        """``(name, what)`` of the rows ``matches`` matches, in order, read as they are asked
        for (a caller that keeps the first few stops the reading there)."""
        lowered = matches.lowered
        initial = self.by_initials.get(lowered, ())
        if self.text is None or matches.regex is not None or _FIELD in lowered or _ROW in lowered:
            chosen = set(initial)
            found: Iterable[int] = (
                i
                for i, fields in enumerate(self.fields)
                if matches(fields.split(_FIELD), i in chosen)
            )
        else:
            # the rows whose text holds it, and those whose initials it is: both ascending
            found = _unique(heapq.merge(self._holding(lowered), initial))
        for i in found:
            yield self.names[i], self.whats[i]

    def _holding(self, lowered: str) -> Iterator[int]:
        """The rows whose lowered fields hold ``lowered``, ascending."""
        text, starts = self.text, self.starts
        at = text.find(lowered)
        while at != -1:
            row = bisect.bisect_right(starts, at) - 1
            yield row
            at = text.find(lowered, starts[row + 1] if row + 1 < len(starts) else len(text))


def _unique(rows: Iterable[int]) -> Iterator[int]:
    """``rows`` (ascending) without repeats."""
    last = -1
    for row in rows:
        if row != last:
            yield row
            last = row


def _modules(ep: Any) -> _Texts:
    """(name, type, the fields searched, the initials of its type) of every module of ``ep``
    but the root, in the order of its module tree: read once per program."""

    def read() -> _Texts:
        return _Texts(
            (
                fqn,
                info.type_name,
                (fqn, info.type_name, info.qualified_type or ""),
                initials(info.type_name) if info.type_name else "",
            )
            for fqn, info in module_tree(ep).items()
            if fqn
        )

    return _derived.cached(ep, "search: modules", read)


def _ops(owner: Any) -> _Texts:
    """(name, op, the fields searched, the initials of its op) of every node of ``owner``'s
    graph that computes, in graph order: read once per graph (a search as one types reads
    the program's texts, not its nodes)."""

    def rows() -> Iterator[tuple[str, str, tuple[str, ...], str]]:
        for node in owner.graph.nodes:
            if _meta.computes(node):
                short, full = _meta.op_text(node, "short"), _meta.op_text(node, "full")
                yield node.name, short, (node.name, short, full), initials(short.rpartition(".")[2])

    def read() -> _Texts:
        return _Texts(rows())  # one row at a time: no list of them all to outlive the build

    return _derived.cached(owner, "search: ops", read)
