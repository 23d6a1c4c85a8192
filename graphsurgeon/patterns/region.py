"""Regions: a set of a program's nodes, chosen by hand (in the widget's picture, by name), made
one call as a module call is: fused, swapped for a replacement, or looked for elsewhere.

A region is what :meth:`graphsurgeon.Surgery.replace` makes of each match of a pattern, with
the nodes given instead of found: its inputs are the values its nodes read from outside it
(the program's parameters, buffers and constants they read stay state: a fused region reads
the program's, a replacement holds its own), its results the values of its nodes read after
it. It can be made a call only if it is convex (no node outside it both reads its results and
feeds it), and if it covers each module call it reaches into entirely (or holds a whole call of
the module it sits in, never a part of another's).

Example:
    >>> import torch, graphsurgeon as gs
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         h = self.a(x)
    ...         return self.b(h * torch.sigmoid(h))
    >>> s = gs.Surgery.from_model(Net(), (torch.randn(2, 4),))
    >>> s.region_signature(["sigmoid", "mul"]).call_text
    '(linear: f32[2, 4]) → f32[2, 4]'
    >>> s.swap_region(["sigmoid", "mul"], torch.nn.SiLU()).replacements
    {'region:(top)': SiLU()}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.export.exported_program import ModuleCallSignature
from torch.export.graph_signature import TensorArgument
from torch.fx import Node

from .. import _meta
from ..errors import SurgeryError, UnknownNodeError, a_type, unknown_name
from ..partition import ProgramIndex
from ..rewrite import Region
from ..rewrite._plan import region_partition

__all__ = ["RegionPlan", "region_of"]


@dataclass(frozen=True)
class RegionPlan:
    """A region ready to be made a call, and what its call looks like.

    Attributes:
        region: the :class:`~graphsurgeon.rewrite.Region` (its name, the module call it sits
            in, its nodes in graph order, its call signature).
        inputs: the program values it reads from outside, in the order its call takes them.
        outputs: its nodes whose values are read after it, in the order its call returns them
            (one value is returned as it is, several as a tuple).
        call_text: what a replacement must accept and return:
            ``(linear: f32[2, 4]) → f32[2, 4]``.
    """

    region: Region
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    call_text: str

    @property
    def nodes(self) -> tuple[str, ...]:
        """The names of the region's nodes, in graph order."""
        return self.region.nodes


def region_of(
    index: ProgramIndex,
    nodes: Iterable[str],
    name: str | None = None,
    taken: Iterable[str] = (),
) -> RegionPlan:
    """The region of ``nodes`` (node names of the program ``index`` reads), named ``name``
    (default ``"region:<the call it sits in>"``, numbered ``#1``, ``#2``... past the names in
    ``taken``). Raises :class:`~graphsurgeon.errors.SurgeryError` saying which node is in the way
    when the nodes cannot be one call, :class:`~graphsurgeon.errors.UnknownNodeError` for a name
    the program does not have."""
    chosen = _chosen_nodes(index, nodes)
    members = set(chosen)
    calls = index.calls
    # the checks torch.export records on a value go with the op that made it, in its call
    for node in list(chosen):
        for user in node.users:
            if (
                user not in members
                and user.op == "call_function"
                and _meta.is_check(user.target)
                and calls.call_of(user.name) == calls.call_of(node.name)
            ):
                members.add(user)
    ordered = sorted(members, key=index.order.__getitem__)
    around = _common_calls(index, ordered)
    call = around[-1] if around else ""
    _check_whole_calls(index, ordered, members, len(around))
    breaker = index.convexity_breaker(ordered, members)
    if breaker is not None:
        raise SurgeryError(
            f"the region cannot be one call: `{breaker.name}`, outside it, reads its values and "
            "feeds it (it is not convex). Add that node to the region, or take fewer nodes."
        )
    inputs = _inputs(index, ordered, members)
    outputs = _outputs(ordered, members)
    if not outputs:
        raise SurgeryError(
            "the region's values are read nowhere after it (it computes nothing the program "
            "uses): choose nodes whose results are read"
        )
    base = f"region:{call or '(top)'}" if name is None else name
    if name is not None:
        _check_region_name(index, name)
    taken = set(taken)
    if name is not None and name in taken:
        raise SurgeryError(
            f"a region named {name!r} exists already in this Surgery: give this one another "
            "name, or undo the step that made the first one"
        )
    label, count = base, 0
    while label in taken or (name is None and label in index.calls_of):
        count += 1
        label = f"{base}#{count}"
    example = tuple(n.meta["val"] for n in inputs)
    results = tuple(n.meta["val"] for n in outputs)
    in_spec = pytree.tree_flatten((example, {}))[1]
    out_spec = pytree.tree_flatten(results if len(results) > 1 else results[0])[1]
    signature = ModuleCallSignature(
        inputs=[TensorArgument(name=n.name) for n in inputs],
        outputs=[TensorArgument(name=n.name) for n in outputs],
        in_spec=in_spec,
        out_spec=out_spec,
    )
    region = Region(
        label,
        call,
        tuple(n.name for n in ordered),
        signature,
        "region",
        tuple(n.name for n in inputs),
    )
    call_text = region_partition(index, region).call_text
    return RegionPlan(
        region, tuple(n.name for n in inputs), tuple(n.name for n in outputs), call_text
    )


def _check_region_name(index: ProgramIndex, name: object) -> None:
    """Refuse a region name that could mean something else: a region lives in a namespace of
    its own, so that every name a Surgery takes means one thing (``s.swap("a", ...)`` is module
    ``a``, never a region someone called ``"a"``; ``"sh@1"`` is the second call of ``sh``)."""
    if not isinstance(name, str) or not name:
        raise SurgeryError(f"a region's name is a non-empty string, got {a_type(name)}")
    fqn, k = _meta.split_call_name(name)
    if fqn in index.fqn_set:
        what = f"call {k} of module {fqn!r}" if k is not None else f"module {fqn!r}"
        raise SurgeryError(
            f"a region cannot be named {name!r}: that is the name of {what} of the program, "
            f"and s.swap({name!r}, ...) must mean that {'call' if k is not None else 'module'}. "
            f"Name the region apart from modules, e.g. name={'region:' + name!r}, or leave name= "
            "out for 'region:<the call it sits in>'."
        )
    if k is not None:
        raise SurgeryError(
            f"a region cannot be named {name!r}: a name ending in '@{k}' names the call {k} of "
            f"a module (here {fqn!r}, which the program does not have). Choose a name without "
            f"'@', e.g. {name.replace('@', '#')!r}."
        )


def example_inputs(index: ProgramIndex, plan: RegionPlan) -> tuple[torch.Tensor, ...]:
    """Random tensors shaped as the region's inputs were at export (a symbolic size at the
    size it was traced with): what :meth:`Surgery.find_similar` traces the region on."""
    generator = torch.Generator().manual_seed(0)
    made = []
    for name in plan.inputs:
        value = index.by_name[name].meta["val"]
        shape = [_hint(size) for size in value.shape]
        if value.dtype.is_floating_point or value.dtype.is_complex:
            made.append(torch.randn(shape, generator=generator).to(value.dtype))
        elif value.dtype == torch.bool:
            made.append(torch.randint(0, 2, shape, generator=generator).bool())
        else:
            made.append(torch.randint(0, 8, shape, generator=generator).to(value.dtype))
    return tuple(made)


def _hint(size) -> int:
    if isinstance(size, torch.SymInt):
        return size.node.hint if size.node.hint is not None else 2
    return int(size)


def _chosen_nodes(index: ProgramIndex, nodes: Iterable[str]) -> list[Node]:
    if isinstance(nodes, (str, Mapping)) or not isinstance(nodes, Iterable):
        raise SurgeryError(
            f"a region is a list of node names such as ['sigmoid', 'mul'], got {a_type(nodes)}"
        )
    chosen: list[Node] = []
    for name in nodes:
        node = index.by_name.get(name) if isinstance(name, str) else None
        if node is None:
            raise UnknownNodeError(unknown_name(name, index.by_name, kind="node"))
        if node.op in ("placeholder", "get_attr", "output"):
            what = {"placeholder": "an input, parameter or buffer", "output": "the output"}
            raise SurgeryError(
                f"node {name!r} is {what.get(node.op, 'a parameter or buffer')} of the program, "
                "not an op: a region holds ops (the values it reads become its inputs)"
            )
        if node not in chosen:
            chosen.append(node)
    if not chosen:
        raise SurgeryError("a region needs at least one node")
    return chosen


def _common_calls(index: ProgramIndex, nodes: list[Node]) -> tuple[str, ...]:
    """The module calls around every node, outermost first."""
    chains = [index.calls.chain(n.name) for n in nodes]
    common = chains[0]
    for chain in chains[1:]:
        length = 0
        for a, b in zip(common, chain):
            if a != b:
                break
            length += 1
        common = common[:length]
    return common


def _check_whole_calls(
    index: ProgramIndex, nodes: list[Node], members: set[Node], depth: int
) -> None:
    """Every module call the region reaches into (below the ``depth`` calls around all of
    it), it covers entirely: a part of a call would leave its other nodes without their module."""
    seen: set[str] = set()
    for node in nodes:
        for sub in index.calls.chain(node.name)[depth:]:
            if sub in seen:
                continue
            seen.add(sub)
            own = [n for n in index.call_nodes.get(sub, ()) if _meta.computes(n)]
            left = [n for n in own if n not in members]
            if left:
                raise SurgeryError(
                    f"the region takes {len(own) - len(left)} of the {len(own)} ops of module "
                    f"call {sub!r} (not `{left[0].name}`): a region holds whole module calls "
                    f"or none. Add the rest of {sub!r}, or swap {sub!r} itself."
                )


def _inputs(index: ProgramIndex, nodes: list[Node], members: set[Node]) -> list[Node]:
    inputs: list[Node] = []
    for node in nodes:
        for value in node.all_input_nodes:
            if value in members or value in inputs:
                continue
            if value.op == "get_attr" or value.name in index.lifted:
                continue  # the program's state: read by a fused region, held by a replacement
            if not isinstance(value.meta.get("val"), torch.Tensor):
                raise SurgeryError(
                    f"the region reads `{value.name}` ({_meta.node_value_text(value)}), which "
                    "is not a tensor, from outside it: add the node that computes it to the "
                    "region"
                )
            inputs.append(value)
    return inputs


def _outputs(nodes: list[Node], members: set[Node]) -> list[Node]:
    outputs = []
    for node in nodes:
        if any(user not in members for user in node.users):
            if not isinstance(node.meta.get("val"), torch.Tensor):
                raise SurgeryError(
                    f"`{node.name}` ({_meta.node_value_text(node)}) is read after the region "
                    "and is not a tensor: add the nodes that read it to the region"
                )
            outputs.append(node)
    return outputs
