"""Pictures of programs: a program drawn with its module partitions, before and after a swap.

:func:`to_dot` gives the DOT text (no binary needed), :func:`to_svg` the SVG laid out by
graphviz's ``dot``, :func:`graph_view` the text and what it shows (a :class:`GraphView`). They,
and :func:`graphsurgeon.draw`, take the same keyword arguments: the fields of
:class:`DrawOptions`, with one set of defaults. What a picture shows, and the ids it gives each
element: :mod:`graphsurgeon.render._assemble`. What a layer is, the rule a stack of layers is
drawn by, is :func:`layer_calls`'s.

The stages, one module each: ``_scene`` (the graph's analysis, the scene and the collapse
plan), ``_writer`` (scene -> a semantic :class:`~graphsurgeon.render.picture.Picture`),
``picture`` (the records, their lookups, and the one writer of DOT), ``_assemble`` (the names a
caller gives, the stages put together), ``graphviz`` (the one ``dot`` runner, pure, cached by
text) and ``_stack`` (a picture with a stack of open layers, laid out a layer at a time).

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.render import graph_view
    >>> from torch.nn import Linear, ReLU, Sequential
    >>> model = Sequential(Sequential(Linear(4, 4), ReLU()), Linear(4, 2))
    >>> ep = gs.export(model, (torch.randn(2, 4),))
    >>> view = graph_view(ep)  # "0" holds two nodes: a cluster; "1" one node: drawn as it
    >>> view.drawn_nodes, view.clusters, view.collapsed
    (5, ('0',), ())
    >>> graph_view(ep, collapse=1).collapsed
    ('0', '1')
"""

from ..errors import RenderError
from ._assemble import (
    AUTO_MAX_NODES,
    DrawOptions,
    GraphView,
    analyze,
    graph_view,
    legend_html,
    overlay_of,
    to_dot,
    to_svg,
)
from ._scene import OPS_PREFIX
from ._stack import layer_calls

__all__ = [
    "AUTO_MAX_NODES",
    "OPS_PREFIX",
    "DrawOptions",
    "GraphView",
    "RenderError",
    "analyze",
    "graph_view",
    "layer_calls",
    "legend_html",
    "overlay_of",
    "to_dot",
    "to_svg",
]
