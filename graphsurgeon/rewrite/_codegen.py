"""Code generation for swapped programs: the same graph, with cheaper calls to aten ops.

A node's target stays the aten ``OpOverload`` that torch.export recorded (rendering, stepping
and re-export all read it). Only the generated Python calls the op through torch's own Python
binding (``torch._C._nn.linear`` for ``aten.linear.default``) instead of through the
``OpOverload`` object. The binding resolves to the same overload for the same argument types,
but skips the generic boxed call path, which costs about a microsecond per op: on a GPT-like
decoder the aten graph runs ~1.25x the eager model through ``OpOverload`` and ~1.0x through
the bindings. Ops without a binding keep the ``OpOverload`` call.

Given a :class:`~._parts.PartCache` (the one of the program a swap or fuse was made from), the
forward is written in parts, each compiled once and reused by the next program made from the
same ExportedProgram (see :mod:`._parts`): an edit compiles only what it changed.
"""

from __future__ import annotations

import torch
from torch.fx.graph import CodeGen
from torch.fx.node import _get_qualified_name

from ._parts import PartCache, Unsupported, write_in_parts

__all__ = ["FastCodeGen", "fast_function"]

_NAMESPACES = (
    torch._C._VariableFunctions,
    torch._C._nn,
    torch._C._linalg,
    torch._C._special,
    torch._C._fft,
)
# Bindings written by hand in torch (not generated from the schema), or with another meaning.
_KEEP = frozenset(
    {
        "sym_size",
        "sym_numel",
        "sym_stride",
        "sym_storage_offset",
        "_assert_scalar",
        "range",
        "nonzero",
        "numel",
        "as_tensor",
        "tensor",
        "asarray",
        "from_numpy",
        "frombuffer",
        "sparse_coo_tensor",
        "sparse_compressed_tensor",
        "sparse_csr_tensor",
    }
)
# Tensor methods whose binding takes exactly the schema's arguments. Other methods (``to``,
# ``type``, ``new_*`` ...) have hand-written Python signatures and keep the OpOverload call.
_METHODS = frozenset({"view", "expand", "contiguous", "repeat", "unfold"})
_CACHE: dict[torch._ops.OpOverload, object | None] = {}


def fast_function(op: object) -> object | None:
    """The Python binding that runs ``op`` (an aten OpOverload) for its own argument types, or None."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    if op in _CACHE:
        return _CACHE[op]
    found = None
    namespace, _, name = op._schema.name.partition("::")
    if (
        namespace == "aten"
        and name not in _KEEP
        and not name.startswith("__")  # operator dunders: the Python binding is a method
        and not op._schema.is_mutable
    ):
        for module in _NAMESPACES:
            candidate = getattr(module, name, None)
            if candidate is not None:
                found = candidate
                break
        else:
            if name in _METHODS:
                found = getattr(torch.Tensor, name)
    if found is not None and not _nameable(found):
        found = None  # the generated code could not refer to it (e.g. Tensor.__and__)
    _CACHE[op] = found
    return found


def _nameable(function: object) -> bool:
    """Whether fx's code generation can name ``function`` in generated code."""
    try:
        _get_qualified_name(function)
    except Exception:
        return False
    return True


class FastCodeGen(CodeGen):
    """A CodeGen that emits Python-binding calls for aten ops (see the module docstring), in
    cached parts when it is given a :class:`PartCache` (``parts``)."""

    def __init__(self, parts: PartCache | None = None):
        super().__init__()
        self.parts = parts
        # node -> the program node it copies, for the first compile only (see write_in_parts):
        # a later edit of the graph is written from the nodes as they are then
        self.origins: dict | None = None
        # the program nodes that first compile's edit disturbed (see write_in_parts)
        self.disturbed: frozenset | None = None

    def _gen_python_code(self, nodes, root_module, namespace, **kwargs):
        plain = root_module == "self" and not any(
            kwargs.get(k)
            for k in (
                "verbose",
                "include_stride",
                "include_device",
                "colored",
                "expanded_def",
                "record_func",
                "additional_meta",
            )
        )
        if self.parts is not None and plain:
            try:
                return write_in_parts(
                    nodes, self.parts, fast_function, self.origins, self.disturbed
                )
            except Unsupported:
                pass  # fx writes it whole, below
        replaced = []
        for node in nodes:
            if node.op != "call_function":
                continue
            fast = fast_function(node.target)
            if fast is not None:
                replaced.append((node, node.target))
                # Plain attribute writes: the node keeps its identity and lookup-table entry.
                object.__setattr__(node, "target", fast)
        try:
            return super()._gen_python_code(nodes, root_module, namespace, **kwargs)
        finally:
            for node, target in replaced:
                object.__setattr__(node, "target", target)
