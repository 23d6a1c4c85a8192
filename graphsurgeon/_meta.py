"""The metadata contract of the programs graphsurgeon makes, and how call signatures are read.

Decided here once, read by every stage:

* the keys a swapped or fused program carries (``gm.meta`` and ``node.meta``);
* which arguments of a preserved call signature are graph values and which are constants;
* how a pytree structure is walked (leaf paths) and printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
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


def tensor_text(shape: Any, dtype: torch.dtype) -> str:
    """``f32[1, 16, 64]``."""
    return f"{dtype_text(dtype)}[{', '.join(str(d) for d in shape)}]"


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
    match = CALL_SUFFIX.search(name)
    if match is None:
        return name, None
    return name[: match.start()], int(match.group(1))


def ambiguous_name_message(name: str, owner: str) -> str:
    """Why a module named like a repeated call (``blk@1``) is refused, and what to do."""
    return (
        f"{owner} has a module named {name!r}: graphsurgeon (and torch.export) name the k-th "
        f"repeated call of a module 'fqn@k', so {name!r} could be the second call of "
        f"{split_call_name(name)[0]!r}. Register the module under another name "
        f"(e.g. {name.replace('@', '_')!r}) and export again."
    )
