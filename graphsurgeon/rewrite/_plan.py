"""The plan of a rewrite: which calls each request names, whether each can be replaced, and
whether its replacement can take the call (checked before anything is built)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

from .. import _meta
from ..errors import (
    ConflictError,
    NotPreservedError,
    NotSwappableError,
    ReplacementError,
    SwapError,
    a_type,
)
from ..partition import (
    OutsideRead,
    Partition,
    ProgramIndex,
)
from .info import Region

__all__ = ["FUSE", "FunctionModule", "as_module", "check_module"]


class _Fuse:
    """Stands for "fuse this call" where a replacement module would stand in a request."""

    def __repr__(self) -> str:
        return "FUSE"


#: In a request ``{name: FUSE}``: cut the call's own nodes into a GraphModule of their own.
FUSE = _Fuse()


@dataclass
class _Request:
    call_name: str
    fqn: str
    replacement: torch.nn.Module | _Fuse
    install_path: str
    partition: Partition
    nodes: list[Node]
    # filled while building
    emitted: bool = False
    outputs: dict[str, Any] = field(default_factory=dict)
    call_node: Node | None = None
    module: torch.nn.Module | None = None  # what runs the call (the cut, for a fused call)
    region: Region | None = None  # for nodes that are no module's (a match of gs.find)
    # the module's state the program reads outside its calls: read from the replacement
    attributes_read: tuple[OutsideRead, ...] = ()

    @property
    def fused(self) -> bool:
        return self.replacement is FUSE


def _type_name(module: Any) -> str:
    return type(module).__name__


def _plan(
    index: ProgramIndex,
    modules: Mapping[str, Any],
    verb: str = "swap",
    regions: Mapping[str, Region] | None = None,
) -> list[_Request]:
    if not isinstance(modules, Mapping):
        raise SwapError(
            f"{verb}: expected a mapping {{module name: replacement}}, got {type(modules).__name__}"
        )
    parts = index.partitions()
    regions = regions or {}
    requests: list[_Request] = []
    for name, replacement in modules.items():
        if not isinstance(name, str):
            raise SwapError(f"{verb}: module names are strings such as 'blocks.0', got {name!r}")
        if replacement is not FUSE:
            check_module(name, replacement)
        if name in regions:
            request = _region_request(index, regions[name], replacement)
            if not request.fused:
                _check_call(index, request)
            requests.append(request)
            continue
        resolved = index.resolve(name)
        fqn = resolved.fqn
        if fqn == "":
            raise SwapError(
                f"{verb}: the root module cannot be {verb}ped; call the replacement model directly"
                if verb == "swap"
                else "fuse: the root module is the whole program; name a submodule"
            )
        if not resolved.calls:
            raise NotSwappableError(
                f"cannot {verb} {fqn!r}: {index.why_no_calls(fqn)}. Its submodules may be "
                f"{verb}pable: gs.module_tree(ep) lists them."
                if verb == "swap"
                else f"cannot fuse {fqn!r}: {index.why_no_calls(fqn)}."
            )
        # one call is installed under its own name ("blk@1", also "blk@0" as given)
        chosen, install = resolved.calls, (name if resolved.one_call else fqn)
        for cname in chosen:
            part = parts[cname]
            if not part.preserved:
                raise NotPreservedError(
                    f"cannot {verb} {cname!r}: its call signature was {part.reason}."
                )
            if not part.swappable:
                raise NotSwappableError(f"cannot {verb} {cname!r}: {part.reason}.")
            request = _Request(
                call_name=cname,
                fqn=fqn,
                replacement=replacement,
                install_path=install,
                partition=part,
                nodes=index.call_nodes.get(cname, []),
            )
            if not request.fused:
                _check_call(index, request)
                if not resolved.one_call:
                    request.attributes_read = _attributes_read(index, request)
            requests.append(request)
    _check_conflicts(requests)
    # an empty partition is never swappable (refused above), so every request has nodes[0]
    requests.sort(key=lambda r: index.order[r.nodes[0]])
    return requests


def region_partition(index: ProgramIndex, region: Region) -> Partition:
    """A region as the partition of a call: what the rewrite, compare's cut and the views read."""
    signature = region.signature
    texts = [
        _meta.signature_leaf_text(a, None if _meta.is_constant(a) else index.by_name.get(a.name))
        for a in signature.inputs
    ]
    outputs = [
        _meta.signature_leaf_text(a, None if _meta.is_constant(a) else index.by_name.get(a.name))
        for a in signature.outputs
    ]
    call_text = _meta.module_call_text(
        signature.in_spec, signature.out_spec, texts, outputs, list(region.parameters)
    )
    return Partition(
        call_name=region.name,
        fqn=region.name,
        call_index=0,
        type_name=region.type_name,
        qualified_type=f"pattern {region.type_name}",
        nodes=region.nodes,
        input_names=_meta.graph_names(signature.inputs),
        output_names=_meta.graph_names(signature.outputs),
        signature=signature,
        swappable=True,
        reason=None,
        call_text=call_text,
    )


def _region_request(index: ProgramIndex, region: Region, replacement: Any) -> _Request:
    missing = [n for n in region.nodes if n not in index.by_name]
    if missing:
        raise SwapError(
            f"{region.name!r}: the program has no node {missing[0]!r} of this region any more "
            "(was it found in another program?); find the pattern again in this one"
        )
    nodes = sorted((index.by_name[n] for n in region.nodes), key=index.order.__getitem__)
    return _Request(
        call_name=region.name,
        fqn=region.name,
        replacement=replacement,
        install_path="_replaced." + "".join(c if c.isalnum() else "_" for c in region.name),
        partition=region_partition(index, region),
        nodes=nodes,
        region=region,
    )


class FunctionModule(torch.nn.Module):
    """A plain function as a replacement: a module whose forward calls it. Made by
    :func:`as_module` as a class named after the function (``my_gelu``), so the history, the
    pictures and the tables name the function, and with the function's signature, so the
    check of the call reads the function's parameters."""

    def __init__(self, function: Any):
        super().__init__()
        self.function = function

        @functools.wraps(function)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        self.forward = forward  # the function's signature, not (*args, **kwargs)

    def extra_repr(self) -> str:
        return getattr(self.function, "__qualname__", "")


def as_module(name: str, replacement: Any) -> torch.nn.Module:
    """``replacement`` as a module: itself, or for a plain function a :class:`FunctionModule`
    calling it (``s.replace`` and ``s.swap_region`` take either). Anything else is refused as
    :func:`check_module` refuses it."""
    if (
        not isinstance(replacement, torch.nn.Module)
        and callable(replacement)
        and (inspect.isfunction(replacement) or inspect.isbuiltin(replacement))
    ):
        label = getattr(replacement, "__name__", "function")
        kind = type(label, (FunctionModule,), {"__module__": FunctionModule.__module__})
        return kind(replacement)
    check_module(name, replacement)
    return replacement


def check_module(name: str, replacement: Any) -> None:
    """A replacement must be a working nn.Module."""
    if not isinstance(replacement, torch.nn.Module):
        raise ReplacementError(
            f"the replacement for {name!r} is {a_type(replacement)}, not a torch.nn.Module. "
            "Wrap a function in an nn.Module whose forward calls it."
        )
    if "_modules" not in vars(replacement) or "_parameters" not in vars(replacement):
        raise ReplacementError(
            f"the replacement for {name!r} ({_type_name(replacement)}) is not initialized as a "
            "module: its __init__ does not call super().__init__() (it must, before setting "
            "any attribute)."
        )


def call_misfit(forward: Any, in_spec: Any) -> str | None:
    """Why ``forward`` cannot take the arguments of a call whose inputs have the pytree spec
    ``in_spec`` (a preserved call's ``signature.in_spec``: ``(args, kwargs)``), in Python's
    words ("too many positional arguments"); None when it can, or when Python cannot read its
    signature (the call will tell at run time). The one check of a replacement's signature
    against a call: a swap refuses by it, the widget's picker ranks by it.

    Example:
        >>> import torch
        >>> spec = torch.utils._pytree.tree_flatten(((1, 2), {}))[1]
        >>> call_misfit(lambda x: x, spec)
        'too many positional arguments'
        >>> call_misfit(lambda x, mask=None: x, spec) is None
        True
    """
    try:
        parameters = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    args_spec, kwargs_spec = in_spec.children()
    try:
        parameters.bind(*range(args_spec.num_children), **dict.fromkeys(kwargs_spec.context))
    except TypeError as problem:
        return str(problem)
    return None


def _check_call(index: ProgramIndex, request: _Request) -> None:
    """The replacement's forward must take the arguments the program calls the module with."""
    module = request.replacement
    problem = call_misfit(module.forward, request.partition.signature.in_spec)
    if problem is not None:
        parameters = inspect.signature(module.forward)
        raise ReplacementError(
            f"the replacement for {request.call_name!r} ({_type_name(module)}) cannot take the "
            f"arguments the program calls it with: the program calls "
            f"{request.call_name}{request.partition.call_text or index.call_text(request.call_name)}"
            f", but its forward is "
            f"forward{parameters} ({problem}). Make forward accept those arguments (add the "
            "missing parameters, or **kwargs for the keywords it ignores)."
        ) from None


def _attributes_read(index: ProgramIndex, request: _Request) -> tuple[OutsideRead, ...]:
    """The module's state that the program reads outside its calls (a parent's
    ``self.child.scale``): in eager, once the module is swapped, those reads take the
    replacement's attribute of the same name, so the replacement must hold one of the same
    shape and dtype (the program's later ops were traced for it). Refused, naming the
    attribute, when it does not."""
    reads = index.outside_reads(request.fqn)
    replacement = request.replacement
    for read in reads:
        held: Any = replacement
        for part in read.attribute.split("."):
            held = getattr(held, part, None)
        value = read.value
        expected = _meta.value_text(value)
        if isinstance(held, torch.Tensor) and (
            not isinstance(value, torch.Tensor)
            or (tuple(held.shape) == tuple(value.shape) and held.dtype == value.dtype)
        ):
            continue
        has = (
            "has none"
            if held is None
            else f"has {_meta.value_text(held)}"
            if isinstance(held, torch.Tensor)
            else f"has {a_type(held)} there"
        )
        raise ReplacementError(
            f"cannot swap {request.fqn!r}: the program reads its {read.kind} "
            f"{read.attribute!r} ({expected}) outside its call ({read.where}, node "
            f"{read.reader!r}: the code reads it directly, not through the module's call). In "
            f"eager, with {request.fqn!r} swapped, that read takes the replacement's "
            f"{read.attribute!r}, and the replacement ({_type_name(replacement)}) {has}. Give "
            f"it a {read.kind} {read.attribute!r} of {expected}, or swap the module that reads it."
        )
    return reads


def _check_conflicts(requests: list[_Request]) -> None:
    owner: dict[Node, _Request] = {}
    for request in requests:
        for node in request.nodes:
            other = owner.get(node)
            if other is None:
                owner[node] = request
                continue
            a, b = sorted((other, request), key=lambda r: len(r.fqn))
            if a.call_name == b.call_name:
                raise ConflictError(f"call {a.call_name!r} is requested twice; request it once.")
            if _meta.inside(b.fqn, a.fqn, strictly=True):
                raise ConflictError(
                    f"both {a.call_name!r} and its submodule {b.call_name!r} are requested. "
                    f"Swap only {a.call_name!r}, and put the replacement for {b.call_name!r} "
                    f"inside the replacement for {a.call_name!r}."
                )
            raise ConflictError(
                f"{a.call_name!r} and {b.call_name!r} share nodes (e.g. {node.name!r}); "
                "request only one of them."
            )
