"""The metadata contract of the programs graphsurgeon makes, and how call signatures are read.

Decided here once, read by every stage:

* the keys a swapped or fused program carries (``gm.meta`` and ``node.meta``);
* which arguments of a preserved call signature are graph values and which are constants;
* how a pytree structure is walked (leaf paths) and printed.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import operator
import os
import re
import sys
import warnings
from collections.abc import Container, Iterator, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

# gm.meta[INFO]: the SwapInfo of a program made by swap() or fuse().
INFO = "graphsurgeon"
# node.meta[SWAPPED]: on the call_module node that runs a replacement: its call name.
SWAPPED = "graphsurgeon_swap"
# node.meta[FUSED]: on the call_module node that runs a fused call: its call name.
FUSED = "graphsurgeon_fused"
# node.meta[CHECK]: on the node that checks what a replacement returned: its call name.
CHECK = "graphsurgeon_check"
# node.meta[GUARD]: on the node that checks the program's inputs.
GUARD = "graphsurgeon_guard"
# node.meta[GLUE]: on every node the rewrite adds around a call that computes nothing: "through"
# (it passes a value on: a getitem taking a structure apart, a check of what a replacement
# returned, a flatten), "build" (it builds a structure from leaves), "constant" (a Python object
# the generated code reads: a spec, a guard, what a call must return). Views draw a "through"
# node as the edge it stands for, and hide the rest.
GLUE = "graphsurgeon_glue"


def is_check(target: Any) -> bool:
    """Whether an op is a run-time assertion torch.export records (dtype, device and range
    checks such as ``aten._assert_tensor_metadata``): it has no result."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    name = target._opname
    return name.startswith("_assert") or name.startswith("sym_constrain_range")


def computes(node: Any) -> bool:
    """Whether a node computes a value of the model: an op, or a swapped or fused call. What
    only carries or checks values does not: inputs, parameters and buffers (``placeholder``,
    ``get_attr``), what the rewrite adds around a call (:data:`GLUE`), the program's input
    guards, ``getitem`` taking a structure apart, pytree flattening and run-time assertions.
    The pictures draw the first kind as ops and the stepper stops only at them."""
    op = node.op
    if op == "call_module":
        return GLUE not in node.meta
    if op != "call_function" or GLUE in node.meta or GUARD in node.meta:
        return False
    target = node.target
    if target is operator.getitem and bool(node.args) and isinstance(node.args[0], torch.fx.Node):
        return False
    if getattr(target, "__module__", "").startswith("torch.utils._pytree"):
        return False
    return not is_check(target)


# torch's metadata hook puts this entry in the stack of nodes a pass created without one.
EMPTY_STACK_KEY = "_empty_nn_module_stack_from_metadata_hook"


def is_constant(argument: Any) -> bool:
    """Whether a signature argument is a constant (``scale=2.5``, ``None``) rather than a value
    of the graph. torch.export's ``ConstantArgument`` has a ``name`` field too, but it names no
    graph value; an argument with an empty name (an unused input optimized away) is none either."""
    return type(argument).__name__ == "ConstantArgument" or not getattr(argument, "name", "")


def graph_names(arguments: Any) -> tuple[str, ...]:
    """The graph value names among signature ``arguments`` (constants left out), in order."""
    return tuple(a.name for a in arguments if not is_constant(a))


def children_keys(spec: pytree.TreeSpec) -> list:
    """The keys that reach each child of a container spec: dict keys, else positions."""
    if spec.type is dict:
        return list(spec.context)
    return list(range(spec.num_children))


def leaf_paths(spec: pytree.TreeSpec) -> list[tuple]:
    """The key path of every leaf of ``spec``, in leaf order: ``[(0,), (1, 'a')]``."""
    paths: list[tuple] = []

    def walk(node: pytree.TreeSpec, path: tuple) -> None:
        if node.is_leaf():
            paths.append(path)
            return
        for key, child in zip(children_keys(node), node.children()):
            walk(child, (*path, key))

    walk(spec, ())
    return paths


def leaf_keystrs(spec: pytree.TreeSpec) -> list[str]:
    """Each leaf's path as ``pytree.keystr`` writes it (``"[0]['logits']"``), in leaf order.
    Works for any registered type (dataclasses, namedtuples), known only by its spec."""
    dummy = pytree.tree_unflatten([0] * spec.num_leaves, spec)
    return [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(dummy)[0]]


def split_arguments(in_spec: pytree.TreeSpec) -> Iterator[tuple[int | str, pytree.TreeSpec, int]]:
    """A call's ``(args, kwargs)`` spec as ``(position or keyword, spec, first leaf)`` each."""
    args_spec, kwargs_spec = in_spec.children()
    offset = 0
    for position, child in enumerate(args_spec.children()):
        yield position, child, offset
        offset += child.num_leaves
    for key, child in zip(kwargs_spec.context, kwargs_spec.children()):
        yield str(key), child, offset
        offset += child.num_leaves


def describe_spec(spec: pytree.TreeSpec) -> str:
    """A compact, readable form of a pytree structure: ``(*, {'a': *})``.

    Example:
        >>> import torch.utils._pytree as pytree
        >>> describe_spec(pytree.tree_structure((1, {"a": 2, "b": [3, 4]})))
        "(*, {'a': *, 'b': [*, *]})"
    """
    return format_structure(spec, ["*"] * spec.num_leaves)


def format_structure(spec: pytree.TreeSpec, leaves: list[str]) -> str:
    """``spec`` written out with ``leaves`` (texts, one per leaf) in place of its leaves."""
    if spec.is_leaf():
        return leaves[0] if leaves else "?"
    kind = spec.type
    if kind is type(None):
        return "None"
    parts, offset = [], 0
    for child in spec.children():
        parts.append(format_structure(child, leaves[offset : offset + child.num_leaves]))
        offset += child.num_leaves
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(spec.context, parts)) + "}"
    if kind is list:
        return "[" + ", ".join(parts) + "]"
    if kind is tuple:
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return f"{getattr(kind, '__name__', kind)}(" + ", ".join(parts) + ")"


_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
    torch.complex128: "c128",
}


def dtype_text(dtype: torch.dtype) -> str:
    """``f32`` for float32, ``i64`` for int64...; the torch name for the rest."""
    return _DTYPES.get(dtype) or str(dtype).removeprefix("torch.")


def size_text(size: Any, names: Mapping[str, str] | None = None) -> str:
    """One size: ``16``, or a dynamic one by the user's ``Dim`` name where ``names`` (torch's
    symbol -> the Dim's name, as :func:`graphsurgeon.export` records them) has it: ``batch``,
    ``2*batch``; else by torch's symbol (``s77``)."""
    if not names or not isinstance(size, (torch.SymInt, torch.SymFloat)):
        return str(size)
    expression = getattr(getattr(size, "node", None), "expr", None)
    if expression is None:
        return str(size)
    symbols = {s: names[str(s)] for s in getattr(expression, "free_symbols", ()) if str(s) in names}
    if not symbols:
        return str(size)
    import sympy  # torch's own dependency; only when a dynamic size is named

    return str(expression.xreplace({s: sympy.Symbol(n) for s, n in symbols.items()}))


def tensor_text(shape: Any, dtype: torch.dtype, names: Mapping[str, str] | None = None) -> str:
    """``f32[1, 16, 64]``; dynamic sizes by their ``Dim`` names where ``names`` has them."""
    if not names:  # every size as str() writes it (a SymInt's repr is its str): one call
        return dtype_text(dtype) + str(list(shape))
    return f"{dtype_text(dtype)}[{', '.join(size_text(d, names) for d in shape)}]"


def number_text(value: float | None) -> str:
    """``1.19e-07``, ``0.504``: an error or a tolerance in few characters; '' for None.

    Example:
        >>> number_text(0.000000119), number_text(0.50412), number_text(None)
        ('1.19e-07', '0.504', '')
    """
    if value is None:
        return ""
    return f"{value:.3g}"


def tolerance_text(ratio: float) -> str:
    """An error as a multiple of what the tolerance allows (a ``tolerance_ratio`` of the
    checks): ``0.41x``, ``37x``, ``1,234x``, ``inf``; '' for NaN (not measured).

    Example:
        >>> [tolerance_text(r) for r in (0.0, 0.00478, 0.41, 37.2, 1234.0, math.inf)]
        ['0x', '0.0048x', '0.41x', '37x', '1,234x', 'inf']
    """
    if math.isnan(ratio):
        return ""
    if math.isinf(ratio):
        return "inf"
    if ratio == 0:
        return "0x"
    if ratio >= 1e6:
        return f"{ratio:.1e}x"
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    return f"{ratio:.2g}x"


def count_text(value: int | None) -> str:
    """``137.2K``, ``7.0B``: a count of parameters or nodes in few characters ('' for none).

    Example:
        >>> count_text(137_200), count_text(7_000_000_000), count_text(12)
        ('137.2K', '7.0B', '12')
    """
    if not value:
        return ""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked ``…``."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def value_text(value: Any, names: Mapping[str, str] | None = None, depth: int = 0) -> str:
    """A value as a picture or a table shows it: ``f32[1, 16, 64]``, ``(f32[2], f32[2])``,
    ``2.5``; '' for None. Short: a container shows its first three items.

    Example:
        >>> import torch
        >>> value_text((torch.zeros(2), torch.zeros(2, dtype=torch.int64), 3, 4))
        '(f32[2], i64[2], 3, … 4 items)'
    """
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return f"nested {dtype_text(value.dtype)}[{value.size(0)} parts]"
        return tensor_text(value.shape, value.dtype, names)
    if isinstance(value, (tuple, list)):
        if depth > 1:
            return "(…)"
        parts = [value_text(v, names, depth + 1) for v in value[:3]]
        if len(value) > 3:
            parts.append(f"… {len(value)} items")
        open_, close = ("(", ")") if isinstance(value, tuple) else ("[", "]")
        return open_ + ", ".join(parts) + close
    if value is None:
        return ""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return shorten(size_text(value, names), 40)
    if isinstance(value, (bool, int, float, str)):
        return shorten(str(value), 40)
    return type(value).__name__


def node_value_text(node: Any, names: Mapping[str, str] | None = None) -> str:
    """What an fx node computes, as :func:`value_text` writes it (from its ``val``), or ''."""
    meta = getattr(node, "meta", {})
    if "val" in meta:
        return value_text(meta["val"], names)
    tensor = meta.get("tensor_meta")
    if tensor is not None and hasattr(tensor, "shape"):
        return tensor_text(tensor.shape, tensor.dtype, names)
    return ""


# -- ops and their arguments -----------------------------------------------------------------


def op_text(node: Any, form: str = "short") -> str:
    """What an fx node calls. ``form="short"``: ``aten.linear``, ``getitem``, ``layers.0``;
    ``"full"``: ``aten.linear.default``, ``operator.getitem``, ``call_module layers.0``. The
    one name every view (picture, widget, stepper, compare) gives an op.

    Example:
        >>> import torch, operator
        >>> graph = torch.fx.Graph()
        >>> x = graph.placeholder("x")
        >>> node = graph.call_function(torch.ops.aten.linear.default, (x, x))
        >>> op_text(node), op_text(node, "full")
        ('aten.linear', 'aten.linear.default')
        >>> op_text(graph.call_function(operator.getitem, (x, 0)), "full")
        'operator.getitem'
    """
    target = node.target
    op = node.op
    if op in ("placeholder", "output"):
        return op if form == "full" else str(node.name)
    if op in ("call_module", "get_attr", "call_method"):
        return f"{op} {target}" if form == "full" else str(target)
    if isinstance(target, torch._ops.OpOverload):
        return _overload_text(target)[form == "full"]
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name()
    name = getattr(target, "__name__", None) or type(target).__name__
    if form != "full":
        return name
    module = getattr(target, "__module__", None) or ""
    module = {"_operator": "operator", "builtins": ""}.get(module, module)
    qualified = getattr(target, "__qualname__", name)
    return f"{module}.{qualified}" if module else qualified


@functools.lru_cache(maxsize=4096)  # a picture names each of its ops' nodes twice
def _overload_text(op: torch._ops.OpOverload) -> tuple[str, str]:
    """(short, full) name of an aten-style op: ``aten.linear``, ``aten.linear.default``."""
    return f"{op.namespace}.{op._opname}", str(op)


_SCALARS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)
_OpOverload, _Node = torch._ops.OpOverload, torch.fx.Node  # looked up once


def _is_edge(value: Any) -> bool:
    """Whether an argument is what a picture draws as an edge: a node that is not a number
    (a tensor, or a value glue passes on), or a list of them."""
    if type(value) in _PLAIN:  # a constant (dims, a scale): asked first, it is common
        return False
    meta = getattr(value, "meta", None)
    if isinstance(meta, dict):  # a node
        return not isinstance(meta.get("val"), _SCALARS)
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_is_edge(v) for v in value)
    return False


# constants written as Python writes them
_PLAIN = frozenset({int, bool, str, type(None)})


def _argument_value_text(value: Any, form: str) -> str:
    if type(value) in _PLAIN:  # the common case, asked first
        text = repr(value)
        return text if form == "full" else shorten(text, 40)
    if hasattr(value, "op") and hasattr(value, "meta"):  # an fx node
        if form == "full" or not isinstance(value.meta.get("val"), (int, float, bool)):
            return str(value.name)
        return repr(value.meta["val"])
    if isinstance(value, (list, tuple)):
        if all(type(v) is int for v in value):  # sizes, dims: as Python writes them
            return str(value)
        inner = ", ".join(_argument_value_text(v, form) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' * (len(value) == 1)})"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return repr(str(value))
    if isinstance(value, float):
        return repr(value) if form == "full" else f"{value:.6g}"
    text = repr(value)
    return text if form == "full" else shorten(text, 40)


def op_arguments(
    node: Any, form: str = "short", state: Container[str] = ()
) -> list[tuple[str | None, str]]:
    """The arguments an op node is called with, as ``(name or None, text)``.

    ``form="short"``: what the picture's edges do not show, as the graph holds it: constants
    (``scale=0.125``, ``is_causal=True``, a divisor, transpose dims) and optional tensors given
    by name (``attn_mask=expand_2``). ``"full"``: every argument of the op's schema, those left
    at their default included (``is_causal=False``, ``attn_mask=None``), tensors by their node
    names. Aten ops name their arguments by their schema; other functions by position.
    ``state``: the names of the nodes that are parameters and buffers, left out of the short
    form (a picture folds them into the node: ``+ weight, bias``).
    """
    args, kwargs = getattr(node, "args", ()), getattr(node, "kwargs", {})
    target = getattr(node, "target", None)
    found: list[tuple[str | None, str]] = []
    schema = _schema_of(target) if isinstance(target, _OpOverload) else None
    if schema is None:
        for value in args:
            if form == "full" or not _is_edge(value):
                found.append((None, _argument_value_text(value, form)))
        for key, value in kwargs.items():
            found.append((str(key), _argument_value_text(value, form)))
        return found
    full = form == "full"
    if not full and not kwargs:  # the common case, a picture's: the arguments given in order
        for value, (name, _, has_default, _, tensor) in zip(args, schema):
            if tensor and not has_default and type(value) is _Node:
                continue  # a tensor the op cannot go without: an edge of the picture
            if _is_edge(value) and (not has_default or getattr(value, "name", None) in state):
                continue  # a weight: drawn already
            found.append((name, _argument_value_text(value, form)))
        return found
    for position, (name, kwarg_only, has_default, default, tensor) in enumerate(schema):
        if name in kwargs:
            value = kwargs[name]
        elif not kwarg_only and position < len(args):
            value = args[position]
        elif full and has_default:
            value = default
        else:
            continue
        if not full:
            if tensor and not has_default and type(value) is _Node:
                continue  # a tensor the op cannot go without: an edge of the picture
            if _is_edge(value) and (not has_default or getattr(value, "name", None) in state):
                continue  # a tensor the op cannot go without, or a weight: drawn already
        found.append((name, _argument_value_text(value, form)))
    return found


@functools.lru_cache(maxsize=1024)
def _schema_of(op: torch._ops.OpOverload) -> tuple[tuple[str, bool, bool, Any, bool], ...] | None:
    """An op's arguments as (name, keyword-only, has a default, the default, is a tensor), read
    once per op: every read of ``_schema.arguments`` builds its argument objects anew (40% of
    the time a picture's tooltip spent on its arguments)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    return tuple(
        (
            a.name,
            a.kwarg_only,
            a.has_default_value(),
            a.default_value if a.has_default_value() else None,
            isinstance(a.type, torch.TensorType),
        )
        for a in schema.arguments
    )


def arguments_text(node: Any, form: str = "short", state: Container[str] = ()) -> str:
    """:func:`op_arguments` written out: ``dim0=1, dim1=2``, ``8.0``; '' when there are none."""
    found = op_arguments(node, form, state)
    if not found:  # most ops of a picture: every argument is an edge
        return ""
    return ", ".join(f"{name}={text}" if name is not None else text for name, text in found)


def node_call_text(node: Any, form: str = "short", state: Container[str] = ()) -> str:
    """What an op node runs, in one line: its op (``form`` as :func:`op_text`) and the arguments
    a picture's edges do not show (:func:`op_arguments`' short form): ``aten.transpose(dim0=1,
    dim1=2)``, ``aten.div.Tensor(other=8.0)``; just ``aten.mul.Tensor`` when there are none.
    ``state``: the parameters and buffers among its inputs, left out."""
    if getattr(node, "op", None) != "call_function":
        return op_text(node, form)
    arguments = arguments_text(node, "short", state)
    name = op_text(node, form)
    return f"{name}({arguments})" if arguments else name


def describe_value(value: Any) -> str:
    """What a value is, for an error message: ``f32[2, 4]``, ``tuple (f32[2], 3)``...

    Example:
        >>> import torch
        >>> describe_value((torch.zeros(2, dtype=torch.int64), 3))
        'tuple (i64[2], 3)'
    """
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return f"a nested tensor of {value.size(0)} parts ({dtype_text(value.dtype)})"
        text = tensor_text(value.shape, value.dtype)
        if value.layout is not torch.strided:
            text += f" ({str(value.layout).removeprefix('torch.')})"
        return text
    if isinstance(value, (tuple, list, dict)) or pytree.is_namedtuple_instance(value):
        leaves, spec = pytree.tree_flatten(value)
        texts = [describe_value(v) if isinstance(v, torch.Tensor) else repr(v) for v in leaves]
        return f"{type(value).__name__} {format_structure(spec, texts)}"
    text = repr(value)
    return text if len(text) <= 60 else f"{type(value).__name__} {text[:57]}..."


# -- call names ----------------------------------------------------------------------------

CALL_SUFFIX = re.compile(r"@(\d+)$")


def split_call_name(name: str) -> tuple[str, int | None]:
    """``"blocks.0@1"`` -> ``("blocks.0", 1)``; ``"blocks.0"`` -> ``("blocks.0", None)``."""
    if "@" not in name:  # most names: no regular expression to run
        return name, None
    match = CALL_SUFFIX.search(name)
    if match is None:
        return name, None
    return name[: match.start()], int(match.group(1))


def inside(name: str, outer: str, *, strictly: bool = False) -> bool:
    """Whether module (or call) ``name`` is ``outer`` or inside it, by module path: the one
    reading of "is A inside B" (``""``, the root, holds everything; ``"blk@1"`` is in ``"blk"``).
    ``strictly``: inside and not ``outer`` itself. One call (``"blk@1"``) holds only itself and
    the paths under it (a replacement installed there: ``"blk@1.w"``), not the module ``blk``,
    its other calls or its state.

    Example:
        >>> inside("layers.1.attn", "layers.1"), inside("layers.10", "layers.1")
        (True, False)
        >>> inside("blk@1", "blk"), inside("blk", "blk", strictly=True), inside("a", "")
        (True, False, True)
        >>> inside("blk.w", "blk@1"), inside("blk@2", "blk@1"), inside("blk@1.w", "blk@1")
        (False, False, True)
    """
    if split_call_name(outer)[1] is not None:
        return (name == outer and not strictly) or name.startswith(outer + ".")
    fqn = split_call_name(name)[0]
    if fqn == outer:
        return not strictly
    return not outer or fqn.startswith(outer + ".")


def ambiguous_name_message(name: str, owner: str) -> str:
    """Why a module named like a repeated call (``blk@1``) is refused, and what to do."""
    return (
        f"{owner} has a module named {name!r}: graphsurgeon (and torch.export) name the k-th "
        f"repeated call of a module 'fqn@k', so {name!r} could be the second call of "
        f"{split_call_name(name)[0]!r}. Register the module under another name "
        f"(e.g. {name.replace('@', '_')!r}) and export again."
    )


# -- how a module is called --------------------------------------------------------------------


def module_call_text(
    in_spec: pytree.TreeSpec,
    out_spec: pytree.TreeSpec,
    inputs: list[str],
    outputs: list[str],
    parameters: list[str],
    *,
    wrap: int | None = None,
) -> str:
    """How a program calls a module, which is what a replacement's ``forward`` must accept and
    return: ``(x: f32[1, 16, 64], scale=2.5) → f32[1, 16, 64]``.

    ``in_spec`` / ``out_spec`` are the call signature's structures, ``inputs`` / ``outputs`` the
    text of each of their leaves, ``parameters`` the names of the positional arguments (the
    module's forward's, or ``arg0``...). Past ``wrap`` characters, one argument a line.

    Example:
        >>> import torch.utils._pytree as pytree
        >>> spec = pytree.tree_structure(((0,), {"scale": 0}))
        >>> module_call_text(spec, pytree.tree_structure(0), ["f32[2]", "2.5"], ["f32[2]"], ["x"])
        '(x: f32[2], scale=2.5) → f32[2]'
    """
    parts = []
    for key, child, offset in split_arguments(in_spec):
        text = format_structure(child, inputs[offset : offset + child.num_leaves])
        if isinstance(key, int):
            label = parameters[key] if key < len(parameters) else f"arg{key}"
            parts.append(f"{label}: {text}")
        else:
            parts.append(f"{key}={text}")
    result = format_structure(out_spec, outputs)
    text = f"({', '.join(parts)}) → {result}"
    if wrap is not None and len(text) > wrap:
        text = "(\n  " + ",\n  ".join(parts) + f"\n) → {result}"
    return text


def signature_leaf_text(argument: Any, node: Any, names: Mapping[str, str] | None = None) -> str:
    """One leaf of a call signature: a constant as its value (``2.5``, ``None``), a graph value
    as what its ``node`` computes (``f32[batch, 16]``), ``?`` when export dropped it."""
    if is_constant(argument):
        return shorten(repr(getattr(argument, "value", None)), 24)
    if node is None:
        return "?"
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return tensor_text(value.shape, value.dtype, names)
    return node_value_text(node, names) or (type(value).__name__ if value is not None else "?")


# -- where a node comes from, and how a module's forward names its arguments -------------------

# A frame of a stack trace; the code line is missing for code without a file (<stdin>, eval).
_FRAME = re.compile(
    r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)'
    r'(?:\n(?!\s*File ")(?P<code>[^\n]*))?'
)
_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCH_PATH = re.compile(r"[\\/]site-packages[\\/]torch[\\/]")
# Packages that only pass a call on (Hugging Face's `kernels`, which transformers installs, wraps
# functions such as apply_rotary_pos_emb in a module whose forward is `return func(*args,
# **kwargs)`): their frames would hide the model's own line, as torch's would.
_PASS_THROUGH_PATH = re.compile(r"[\\/]site-packages[\\/]kernels[\\/]")


def file_line_text(path: str, line: int | str) -> str:
    """Where a line of code is, as every view writes it: ``model.py:42`` (the file name, never
    its path); for code typed in a notebook cell, ``In [7]:42`` (the cell as IPython numbers
    it, read from a running IPython when there is one; else the cell file's name)."""
    name = os.path.basename(path.replace(chr(92), "/"))
    if "ipykernel_" in path or name.startswith("<ipython-input-"):
        number = _cell_number(path)
        if number is not None:
            return f"In [{number}]:{line}"
    return f"{name}:{line}"


def _cell_number(path: str) -> int | None:
    """The execution count of the notebook cell whose code IPython compiled as file ``path``
    (IPython is read only when the user runs it: never imported here)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = names.get(path) if isinstance(names, dict) else None
    return number if isinstance(number, int) else None


def source_text(node: Any) -> str:
    """The user's source lines behind a node (from its ``stack_trace``): the innermost frame
    outside torch with its code, then up to three callers; file names only, never paths."""
    trace = node.meta.get("stack_trace")
    return _source_of_trace(trace) if isinstance(trace, str) and trace else ""


@functools.lru_cache(maxsize=4096)  # the nodes of one source line share their stack trace
def _source_of_trace(trace: str) -> str:
    frames = []
    for match in _FRAME.finditer(trace):
        path = match.group("path")
        if path.startswith(_TORCH_DIR) or _TORCH_PATH.search(path):
            continue  # torch's own frames (nn.Linear.forward...) say nothing about the model
        if _PASS_THROUGH_PATH.search(path):
            continue
        where = file_line_text(path, match.group("line"))
        frames.append((where, match.group("function"), (match.group("code") or "").strip()))
    if not frames:
        return ""
    where, function, code = frames[-1]
    text = f"{where} in {function}" + (f"\n  {shorten(code, 80)}" if code else "")
    callers = [f for f, _, _ in frames[-4:-1]]
    if callers:
        text += "\ncalled from " + ", ".join(reversed(callers))
    return text


def parameter_names(module: Any, count: int | None = None) -> list[str]:
    """The names of ``module.forward``'s positional parameters (``["x", "mask"]``). With
    ``count``, exactly ``count`` names: a ``*args`` parameter gives ``args[0]``, ``args[1]``...,
    and ``arg{i}`` fills in where the forward names nothing (or cannot be read)."""
    names: list[str] = []
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):  # a builtin forward, or no module at all
        parameters = []
    for parameter in parameters:
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
        elif parameter.kind == parameter.VAR_POSITIONAL and count is not None:
            names += [f"{parameter.name}[{i}]" for i in range(count - len(names))]
    if count is None:
        return names
    return (names + [f"arg{i}" for i in range(len(names), count)])[:count]


# -- module paths as torch's strict tracer writes them ----------------------------------------


@functools.lru_cache(maxsize=4096)
def traced_path_fqn(path: str) -> str:
    r"""The fqn of a module path as torch's strict tracer records it, or ``path`` itself when
    it is not written that way.

    Strict export records the Python expression that reached the module, with its
    ``L['self'].`` removed and each ``._modules['name']`` shortened to ``.name`` where ``name``
    holds no quote or ``]`` (written as ``repr`` writes it, without the quotes)::

        blk, layers.0, d.x y                   ->  blk, layers.0, d.x y
        d._modules['a"b'], d._modules['q]r']   ->  d.a"b, d.q]r
        d.c\nd (a newline, as repr writes it)  ->  d.c<a newline>d
        getattr(L['self'], 'blk@1').lin        ->  blk@1.lin
        getattr(L['self'].layers, '1')         ->  layers.1
        L['self'].layers[0]                    ->  layers.0
    """
    names = _source_names(path)
    return ".".join(names) if names is not None else path


_ROOT_SOURCE = "L['self']"
_CONTAINERS = ("._modules", "._parameters", "._buffers")


def _source_names(expression: str) -> list[str] | None:
    """The module names along ``expression`` (see :func:`traced_path_fqn`), or None when it is
    not such an expression. A module name never holds a dot, so every dot outside a quoted
    name separates two steps; the quoted forms are tried first, and each split is kept only
    if the rest reads too."""
    if expression in ("", _ROOT_SOURCE):
        return []
    if expression.startswith("getattr(") and expression.endswith(")"):
        inner = expression[len("getattr(") : -1]
        at = inner.rfind(", ")
        while at > 0:
            member = _literal(inner[at + 2 :])
            if isinstance(member, str):
                base = _source_names(inner[:at])
                if base is not None:
                    return [*base, member]
            at = inner.rfind(", ", 0, at)
    if expression.endswith("]"):
        at = expression.rfind("[")
        while at > 0:
            key = _literal(expression[at + 1 : -1])
            if isinstance(key, (str, int)) and not isinstance(key, bool):
                base = expression[:at]
                for container in _CONTAINERS:
                    base = base.removesuffix(container)
                names = _source_names(base)
                if names is not None:
                    return [*names, str(key)]
            at = expression.rfind("[", 0, at)
    base, dot, member = expression.rpartition(".")
    if not member or any(c in member for c in "'\"]"):
        return None
    if not member.isidentifier():
        # a shortened ._modules['c\\nd']: the name as repr writes it, without its quotes
        member = _literal(f"'{member}'")
        if not isinstance(member, str):
            return None
    names = _source_names(base) if dot else []
    return None if names is None else [*names, member]


def _literal(text: str):
    """``text`` read as a Python literal, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an invalid escape is no literal of ours either
            return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
