"""A program's forward generated in parts, each part compiled once and reused by later programs.

Swapping one layer of a 384-layer program changes a few dozen of its 16,000 nodes, but fx's
code generation writes, and Python compiles, one function of all of them: most of a swap's
time. Here the nodes are cut into parts at points chosen by the nodes' own names (a node whose
name hashes to 0 modulo :data:`_SPACING` ends a part, as content-defined chunking cuts a file),
so a part's text depends only on its own nodes and on which of its values later parts read:
the same text in every program built from one ExportedProgram but near what changed. Each part
is a function ``part(self, <values it reads>) -> <values later parts read>``; the forward calls
them in order. The code object of a part is kept by its text (in a :class:`PartCache` that the
programs built from one ExportedProgram share), so a swap compiles only the parts it changed;
the statement of each node copied from the program is kept too (by that node), so a swap
writes afresh only the statements of the nodes it changed, or that read what it changed.
A part whose nodes are all copies the edit left alone (the rewrite says which program nodes
it disturbed: :func:`write_in_parts`'s ``disturbed``) is not written at all: its text, code
and the values it reads and returns are kept by the program nodes it copies, in order.

The generated code is fx's, line for line (the same op calls, the same attribute reads, values
freed after their last use), in parts; a called module is read from ``_modules`` along its path
(:func:`_called_module`). A graph this writer does not cover (a node kind or an
argument it does not spell, a name it would shadow) is written by fx's own generator, whole.
"""

from __future__ import annotations

import builtins
import functools
import keyword
import linecache
import operator
import types
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node
from torch.fx.graph import (
    PythonCode,
    _custom_builtins,
    _format_target,
    _get_qualified_name,
    _is_from_torch,
    magic_methods,
)

from . import _turns

__all__ = ["PartCache", "Unsupported", "forget_lines", "write_in_parts"]

#: Tests set this: every part taken from the cache is also written afresh and the two compared.
CHECK_KEPT_PARTS = False

# A node whose name hashes to 0 modulo this ends its part (parts of at least _SMALLEST nodes,
# at most _LARGEST): ~80 nodes a part. Larger parts compile more per edit; smaller ones cost
# the forward a call each (~1 µs: 0.5% of a small decoder's forward at ~40 nodes a part).
_SPACING = 64
_SMALLEST = 16
_LARGEST = 384
_PART = "_gs_part_"
_NAMES_KEPT = 1 << 20  # node names a cache remembers as checked, at most


def forget_lines(filename: str) -> None:
    """Let go of the source lines ``linecache`` holds for generated code (a part, a program's
    forward), keeping its entry: ``linecache.checkcache()`` lists the entries, then reads each,
    and one removed meanwhile by another thread raises KeyError in it (in a doctest, pdb, a
    traceback). Parts are dropped on a warm-up's thread and programs when the collector frees
    them, on any thread. The entry left holds no lines (a few dozen bytes)."""
    if filename in linecache.cache:
        linecache.cache[filename] = (0, None, [], filename)


def _has_lines(filename: str) -> bool:
    entry = linecache.cache.get(filename)
    return entry is not None and (len(entry) == 1 or bool(entry[2]))


class Unsupported(Exception):
    """The graph holds something the part writer does not spell: fx writes it whole."""


class PartCache:
    """Compiled parts by their text and the global name of each object the code calls, shared
    by the programs built from one ExportedProgram (kept with its derived data).

    At most ``limit`` parts are kept, least recently used dropped first: a session of many
    edits keeps the parts of its recent programs, not of every program it made."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self.code: OrderedDict[str, types.CodeType] = OrderedDict()
        self._names: dict[int, str] = {}  # id(object) -> its global name (the object held below)
        self.globals: dict[str, Any] = {name: b.obj for name, b in _custom_builtins.items()}
        self._spelled: dict[int, str] = {}  # id(callable) -> how the code names it
        self._serial = 0
        # program node -> the statement a copy of it was written as, with what that statement
        # depends on: (the node's args and kwargs objects, the copy's target and name, the names
        # of the values it reads, the text). A later copy that matches is the same statement.
        self.lines: dict[Node, tuple] = {}
        self.names: set[str] = set()  # node names known to be Python names (not keywords)
        # the program nodes a part copies, in order -> _KeptPart: a part no edit disturbed is
        # the same part in every program made from these nodes (see write_in_parts)
        self.parts: OrderedDict[tuple[Node, ...], _KeptPart] = OrderedDict()

    def __deepcopy__(self, memo: dict) -> PartCache:
        return self  # what it holds is addressed by content: copies of a program may share it

    def global_name(self, obj: Any) -> str:
        """The name the generated code calls ``obj`` by: ``torch.…`` for torch's own (as fx
        writes it), else a name of its own, the same for the same object every time."""
        key = id(obj)
        spelled = self._spelled.get(key)
        if spelled is not None:
            return spelled
        try:
            qualified = _get_qualified_name(obj)
        except Exception as error:  # a lambda, an object fx cannot name: fx's own refusal
            raise Unsupported(f"a target fx cannot name: {error}") from None
        if _is_from_torch(obj) and obj is not torch.device:
            spelled = qualified
        else:
            base = "".join(c if c.isalnum() or c == "_" else "_" for c in qualified) or "_f"
            if base[0].isdigit():
                base = "_" + base
            spelled, k = base, 0
            while spelled in self.globals and self.globals[spelled] is not obj:
                k += 1
                spelled = f"{base}_{k}"
            self.globals[spelled] = obj
        self._spelled[key] = spelled
        self._names[key] = spelled
        return spelled

    def compiled(self, text: str) -> types.CodeType:
        code = self.code.get(text)
        if code is not None:
            self.code.move_to_end(text)
            return code
        self._serial += 1
        filename = f"<graphsurgeon part {id(self):x}.{self._serial}>"
        module = compile(text, filename, "exec")
        code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
        # the source of a part, for tracebacks through it (dropped with the part)
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        self.code[text] = code
        while len(self.code) > self.limit:
            _, dropped = self.code.popitem(last=False)
            forget_lines(dropped.co_filename)
        return code

    def kept_part(self, origins: tuple[Node, ...]) -> _KeptPart | None:
        """The part written before for copies of ``origins``, if the program nodes are as
        they were then (fx replaces a node's args on every edit of it)."""
        kept = self.parts.get(origins)
        if kept is None:
            return None
        if not (
            all(map(operator.is_, kept.args, map(_ARGS, origins)))
            and all(map(operator.is_, kept.kwargs, map(_KWARGS, origins)))
            and kept.names == tuple(map(_NAME, origins))
        ):
            del self.parts[origins]
            return None
        self.parts.move_to_end(origins)
        filename = kept.code.co_filename
        if not _has_lines(filename):  # its code left `code` since: its source, again
            linecache.cache[filename] = (len(kept.text), None, kept.text.splitlines(True), filename)
        return kept

    def keep_part(self, origins: tuple[Node, ...], kept: _KeptPart) -> None:
        self.parts[origins] = kept
        while len(self.parts) > self.limit:
            _, dropped = self.parts.popitem(last=False)
            if self.code.get(dropped.text) is not dropped.code:  # nothing else shows its source
                forget_lines(dropped.code.co_filename)


_ARGS = operator.attrgetter("args")
_KWARGS = operator.attrgetter("kwargs")
_NAME = operator.attrgetter("name")


class _KeptPart:
    """A part as written for copies of some program nodes: its text and code, the names of
    the values it reads (its parameters after ``self``) and returns, and what the program
    nodes were then (their args and kwargs, compared by identity, and names)."""

    __slots__ = ("args", "code", "kwargs", "names", "params", "returned", "text")

    def __init__(self, text, code, params, returned, origins):
        self.text, self.code = text, code
        self.params, self.returned = params, returned
        self.args = tuple(map(_ARGS, origins))
        self.kwargs = tuple(map(_KWARGS, origins))
        self.names = tuple(map(_NAME, origins))


def _repr(arg: Any, cache: PartCache) -> str:
    """An argument as fx's generator writes it; what it would not write runnably: Unsupported."""
    if isinstance(arg, Node):
        return arg.name
    kind = type(arg)
    if kind in (int, bool, str, float) or arg is None:
        return repr(arg)  # inf and nan are globals of the generated code, as in fx
    if isinstance(arg, tuple) and not hasattr(arg, "_fields"):  # a named tuple: fx's own
        if len(arg) == 1:
            return f"({_repr(arg[0], cache)},)"
        return "(" + ", ".join(_repr(a, cache) for a in arg) + ")"
    if isinstance(arg, list):  # fx's immutable_list too
        return "[" + ", ".join(_repr(a, cache) for a in arg) + "]"
    if kind is slice:
        return (
            f"slice({_repr(arg.start, cache)}, {_repr(arg.stop, cache)}, {_repr(arg.step, cache)})"
        )
    if isinstance(arg, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return repr(arg)  # torch.float32, device(type='cpu'), torch.strided: fx's globals
    if isinstance(arg, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return cache.global_name(arg)
    raise Unsupported(f"argument of type {kind.__name__}")


def _arguments(node: Node, cache: PartCache, skip: int = 0) -> str:
    parts = [_repr(a, cache) for a in node.args[skip:]]
    parts.extend(f"{k} = {_repr(v, cache)}" for k, v in node.kwargs.items())
    return ", ".join(parts)


@functools.lru_cache(maxsize=1 << 16)
def _attribute(target: str) -> str:
    """``self.<target>`` as fx writes it (a program reads the same attributes edit after edit)."""
    return _format_target("self", target)


@functools.lru_cache(maxsize=1 << 16)
def _called_module(target: str) -> str:
    """The module a ``call_module`` node calls, read from the ``_modules`` of each module on its
    path: ``self._modules['layers']._modules['0']``. fx writes ``getattr(self.layers, "0")``,
    two calls of ``nn.Module.__getattr__`` (1.5 µs; the dict reads take 0.08): in a program
    with every layer swapped that was most of what a call cost over eager's loop over its
    layers. The modules on the path are the program's own plain modules (the rewrite installs
    each replacement under modules it makes), which hold their children in ``_modules`` only;
    a module set on a program later (``setattr``, ``add_submodule``) is filed there too."""
    return "self" + "".join(f"._modules[{part!r}]" for part in target.split("."))


def _line(node: Node, cache: PartCache, fast: Any) -> str:
    """The statement computing ``node`` (fx's text for it, without type annotations)."""
    op, target, name = node.op, node.target, node.name
    if op == "get_attr":
        return f"{name} = {_attribute(target)}"
    if op == "call_module":
        return f"{name} = {_called_module(target)}({_arguments(node, cache)})"
    if op == "call_method":
        if not node.args:
            raise Unsupported("a method call without a receiver")
        receiver = _repr(node.args[0], cache)
        return f"{name} = {_format_target(receiver, target)}({_arguments(node, cache, 1)})"
    if op != "call_function":
        raise Unsupported(f"a {op} node inside the graph")
    if node.meta.get("is_wrapped", False):
        raise Unsupported("a wrapped function")
    if getattr(target, "__module__", "") == "_operator":
        text = magic_methods.get(target.__name__)
        if text is None or node.kwargs or text.count("{}") != len(node.args):
            raise Unsupported(f"operator {target.__name__}")
        return f"{name} = " + text.format(*(_repr(a, cache) for a in node.args))
    if (
        target is getattr
        and len(node.args) == 2
        and isinstance(node.args[1], str)
        and node.args[1].isidentifier()
    ):
        return f"{name} = {_format_target(_repr(node.args[0], cache), node.args[1])}"
    function = fast(target) or target
    return f"{name} = {cache.global_name(function)}({_arguments(node, cache)})"


def _ends_part(name: str) -> bool:
    return zlib.crc32(name.encode()) % _SPACING == 0


def _copied_line(node: Node, old: Node, cache: PartCache, fast: Any) -> str:
    """The statement of ``node``, a copy of the program's node ``old``: the one written for an
    earlier copy of ``old`` when this copy has the same target and name and reads values of
    the same names (its arguments are ``old``'s, mapped node for node: the same text), else
    written now and kept for the next copy. Untouched nodes are written once per program,
    not once per edit."""
    reads = tuple([value.name for value in node._input_nodes])
    known = cache.lines.get(old)
    if (
        known is not None
        and known[0] is old.args  # the program's node is unchanged (fx replaces args on edit)
        and known[1] is old.kwargs
        and known[4] == reads
        and known[3] == node.name
        and known[2] == node.target
    ):
        return known[5]
    line = _line(node, cache, fast)
    cache.lines[old] = (old.args, old.kwargs, node.target, node.name, reads, line)
    return line


def write_in_parts(
    nodes: Any,
    cache: PartCache,
    fast: Any,
    origins: Any = None,
    disturbed: frozenset | set | None = None,
) -> PythonCode:
    """The forward of a graph (its ``nodes``) as a chain of cached parts (module docstring).

    ``fast``: op -> the Python binding to call it by, or None (see :mod:`._codegen`).
    ``origins``: node -> the program node it was copied from, argument for argument (a
    rewrite's first compile of its graph): the statements of copies are reused from the
    earlier copies of the same program nodes (:func:`_copied_line`).
    ``disturbed``: with ``origins``, the program nodes whose part the rewrite may change:
    the nodes it removed or renamed and what reads them, and what the removed and the new
    nodes read (where such a value is last read may have moved). A part whose every node is a
    copy of a program node outside it is taken whole from the cache when one was written for
    the same program nodes before (its statements, the values it reads and returns are then
    the same: they follow from the copied nodes, their names and where their values are last
    read, which are unchanged).

    Only the parts written are read node by node: where one of their values is last read comes
    from its readers, and which values the forward frees after each part call from the lists
    of values the parts read. A part taken whole costs a look-up of its nodes, no more."""
    order = list(nodes)
    names = {n.name for n in order}
    unchecked = names - cache.names  # the names of earlier programs were checked then
    if any(not n.isidentifier() or keyword.iskeyword(n) for n in unchecked):
        raise Unsupported("a node name that is not a Python name")
    if len(cache.names) > _NAMES_KEPT:  # the names of very many programs: start over
        cache.names.clear()
    cache.names |= unchecked
    placeholders = [n for n in order if n.op == "placeholder"]
    outputs = [n for n in order if n.op == "output"]
    if len(outputs) != 1 or order[-1] is not outputs[0]:
        raise Unsupported("no single output node at the end")
    for node in placeholders:
        if node.args or not isinstance(node.target, str) or node.target.startswith("*"):
            raise Unsupported("a placeholder with a default or a star")
    body = [n for n in order if n.op not in ("placeholder", "output")]
    # the parts: content-defined cut points
    parts: list[list[Node]] = []
    current: list[Node] = []
    for node in body:
        current.append(node)
        if len(current) >= _LARGEST or (len(current) >= _SMALLEST and _ends_part(node.name)):
            parts.append(current)
            current = []
    if current:
        parts.append(current)
    where: dict[Node, int] = dict.fromkeys(placeholders, -1)  # node -> its part (-1: a placeholder)
    for i, part in enumerate(parts):
        where.update(dict.fromkeys(part, i))
    end = len(parts)  # what the output node reads is read after every part
    last_parts: dict[Node, int] = {}

    def last_part(value: Node) -> int:
        """The last part reading ``value`` (``end``: the output; -1: nothing reads it), from
        its readers: only the values of the parts written, and the values they read, are
        asked for, so a part taken whole costs nothing here."""
        found = last_parts.get(value)
        if found is None:
            found = max((where.get(user, end) for user in value.users), default=-1)
            last_parts[value] = found
        return found

    for value in outputs[0]._input_nodes:
        if value not in where:
            raise Unsupported("the output reads a node of another graph")
    part_names = [f"{_PART}{i}" for i in range(len(parts))]
    reserved = set(cache.globals) | {"self", "getattr"}
    arguments = [n.target for n in placeholders]
    functions: dict[str, Any] = {}
    # each part's name, the values it reads and returns, in order: its call is written once
    # every part is known (a value is freed after the last part that reads it)
    calls: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
    for i, part in enumerate(parts):
        _turns.pause_point()  # a warm-up's turn to wait (see _turns)
        key = None
        if disturbed is not None and origins:
            key = tuple(map(origins.get, part))
            if None in key or not disturbed.isdisjoint(key):
                key = None  # a new node, or a copy the edit reaches: written afresh
        kept = cache.kept_part(key) if key is not None else None
        if kept is not None and not CHECK_KEPT_PARTS:
            functions[part_names[i]] = kept.code
            calls.append((part_names[i], kept.params, kept.returned))
            continue
        text, params, returned = _part_text(part, i, where, last_part, cache, fast, origins)
        code = cache.compiled(text)
        functions[part_names[i]] = code
        calls.append((part_names[i], params, returned))
        if kept is not None:  # CHECK_KEPT_PARTS: the kept part must be the one written now
            if (kept.text, kept.params, kept.returned, kept.code) != (
                text,
                params,
                returned,
                code,
            ):
                raise AssertionError(f"a kept part differs from the part written now:\n{text}")
        elif key is not None:
            cache.keep_part(key, _KeptPart(text, code, params, returned, key))
    # the forward: each part called in order; a value passed between parts is freed after the
    # last part that reads it, unless the forward returns it
    last_call: dict[str, int] = {}
    for i, (_, params, _) in enumerate(calls):
        for name in params:
            last_call[name] = i
    for value in outputs[0]._input_nodes:
        last_call[value.name] = end
    forward_lines: list[str] = [
        f"{node.name} = {node.target}" for node in placeholders if node.target != node.name
    ]
    for i, (name, params, returned) in enumerate(calls):
        freed = [value for value in params if last_call[value] == i]
        forward_lines.append(_call_line(name, params, returned, freed))
    forward_lines.append(f"return {_repr(outputs[0].args[0], cache)}")
    if names & (reserved | set(cache.globals) | set(part_names)):
        raise Unsupported("a node named as a global of the generated code")
    # the builtins named, as exec would add them: torch.compile reads a function's globals' own
    scope = {"__builtins__": builtins, **cache.globals}
    for name, code in functions.items():
        scope[name] = types.FunctionType(code, scope, name)
    source = f"\n\ndef forward({', '.join(['self', *arguments])}):\n" + "".join(
        f"    {line}\n" for line in forward_lines
    )
    return PythonCode(source, scope, None)


def _part_text(
    part: list[Node],
    i: int,
    where: dict[Node, int],
    last_part: Callable[[Node], int],
    cache: PartCache,
    fast: Any,
    origins: Any,
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """Part ``i`` written: ``(its text, the values it reads, the values it returns)``. It reads
    the values of earlier parts it uses (in the order it first reads them), returns those of
    its values that a later part or the output reads, and frees each of its other values after
    its last reader in it (in the order they were first read), or at once if nothing reads it."""
    local = {node: k for k, node in enumerate(part)}
    reads: dict[Node, None] = {}
    first_read: dict[Node, None] = {}  # this part's own values, in the order first read
    for node in part:
        for value in node._input_nodes:
            if value in local:
                first_read[value] = None
            elif value in where:
                reads[value] = None
            else:
                raise Unsupported(f"node {node.name!r} reads a node of another graph")
    freed_at: dict[Node, list[str]] = {}  # node -> the values freed after it
    for value in first_read:
        if last_part(value) == i:
            last = max((user for user in value.users if user in local), key=local.__getitem__)
            freed_at.setdefault(last, []).append(value.name)
    lines: list[str] = []
    for node in part:
        old = origins.get(node) if origins else None
        line = _line(node, cache, fast) if old is None else _copied_line(node, old, cache, fast)
        freed = freed_at.get(node, [])
        if not node.users:  # nothing reads it (kept for its effect): freed at once, as fx does
            freed = [*freed, node.name]
        if freed:
            line += ";  " + " = ".join(freed) + " = None"
        lines.append("    " + line)
    returned = tuple(node.name for node in part if node.users and last_part(node) > i)
    params = tuple(value.name for value in reads)
    header = f"def part({', '.join(['self', *params])}):"
    if len(returned) == 1:
        lines.append(f"    return {returned[0]}")
    elif returned:
        lines.append(f"    return ({', '.join(returned)},)")
    return "\n".join([header, *lines]) + "\n", params, returned


def _call_line(name: str, params: Any, returned: Any, freed: list[str]) -> str:
    """The forward's statement calling part ``name``: it passes ``params``, binds ``returned``,
    and frees ``freed`` (the values no later part reads)."""
    call = f"{name}({', '.join(['self', *params])})"
    if len(returned) == 1:
        call = f"{returned[0]} = {call}"
    elif returned:
        call = f"{', '.join(returned)}, = {call}"
    if freed:
        call += ";  " + " = ".join(freed) + " = None"
    return call
