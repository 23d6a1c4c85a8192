"""A scene's vertices in stretches: what lets a picture that opens one layer of many read
that layer, not the program.

The vertices of a call mostly follow each other in graph order, and the call index shares one
chain tuple among the vertices of a chain. :func:`segments` cuts the vertices into runs of one
chain; :func:`spans` names the calls whose vertices are one stretch of segments (a layer);
:func:`crossing` gives, for a segment, the inputs that come from outside each call around it
(what can be an edge of that call's box). The writer places a boxed call's stretch at once and
reads only its crossing inputs (:class:`graphsurgeon.render._writer._Writer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["crossing", "segments", "spans"]

Segment = tuple[tuple[str, ...], int, int]


def segments(chains: Sequence[tuple[str, ...]]) -> list[Segment]:
    """``(chain, start, stop)`` of each run of neighbours in ``chains`` (each vertex's chain,
    in vertex order) that share one chain tuple.

    Example:
        >>> a, b = ("l0",), ("l0", "l0.attn")
        >>> segments([a, a, b, a])
        [(('l0',), 0, 2), (('l0', 'l0.attn'), 2, 3), (('l0',), 3, 4)]
    """
    found = []
    start = 0
    for i in range(1, len(chains) + 1):
        if i == len(chains) or chains[i] is not chains[start]:
            found.append((chains[start], start, i))
            start = i
    return found


def spans(found: Sequence[Segment]) -> dict[str, tuple[int, int]]:
    """``call -> (first, stop)``: the calls whose segments are one stretch of ``found``.

    Example:
        >>> a, b = ("l0",), ("l1",)
        >>> spans([(a, 0, 2), (b, 2, 3), (a, 3, 4)])
        {'l1': (1, 2)}
    """
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    count: dict[str, int] = {}
    for i, (chain, _, _) in enumerate(found):
        for name in chain:
            first.setdefault(name, i)
            last[name] = i
            count[name] = count.get(name, 0) + 1
    return {
        name: (i, last[name] + 1) for name, i in first.items() if count[name] == last[name] + 1 - i
    }


def crossing(
    vertices: Sequence[Any], segment: Segment, chain_of: Mapping[str, tuple[str, ...]]
) -> list[list[tuple[str, str, str]]]:
    """For each depth ``d`` of ``segment``'s chain, ``(vertex, source, index path)`` of the
    inputs of its vertices whose source is not inside ``chain[d]`` (``chain_of``: each
    vertex's chain by name), in vertex order: the inputs that can be an edge when that call
    is drawn as a box (the others are inside the same box)."""
    chain, start, stop = segment
    found: list[list[tuple[str, str, str]]] = [[] for _ in chain]
    for vertex in vertices[start:stop]:
        for source, path in vertex.inputs:
            other = chain_of.get(source, ())
            common = 0  # how many outer calls the source shares with the vertex
            while common < min(len(chain), len(other)) and other[common] == chain[common]:
                common += 1
            for outside in found[common:]:
                outside.append((vertex.name, source, path))
    return found
