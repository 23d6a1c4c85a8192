"""A tall picture as the page shows it: its nodes and edges in horizontal tiles that the
browser styles, lays out and paints only when they come near the view.

A 384-layer program draws about 5,500 SVG elements, and every picture the page showed (a layer
opened, a swap, undo) had the browser style, lay out and paint all of them, though the view
shows about fifteen layers. Here the picture is one box of the same size holding one ``<svg>``
per tile, over the picture's own ``<svg>`` (its background and its clusters, drawn under all
else, as dot draws them). A tile's svg has the picture's coordinates, its viewBox the tile's
strip, and sits in a block with ``content-visibility: auto``, which the browser skips (style,
layout and paint) while it is off screen. The elements, their ids and classes, and their order
within a tile are dot's: what the page marks, clicks and looks up is the same, and the picture
looks the same at its natural size (each tile's box holds all that its elements draw, and
starts on a whole pixel: pixel by pixel, only the antialiasing of a line's edge differs here
and there). What a page can no longer assume: that the picture's elements are siblings in one
``<svg>``, or that its first ``<svg>`` is as tall as the picture.

In JupyterLab at 384 layers, a layer opened or closed costs the page's main thread 65 ms
(medians of 13) against 89 in one svg: layout 5 against 13 ms, style 22 against 30; in a bare
page, the frame after a new 384-layer picture comes as soon as a 96-layer one's (24 ms).

What cannot be split safely stays whole: a picture that is not dot's plain SVG (one group
under one transform), one that fits a few screens, and any element that spans more than a few
tiles (an edge from the top of a stack to its bottom) or that carries a transform of its own.
"""

from __future__ import annotations

import math
import re

__all__ = ["TILE_HEIGHT", "tiled"]

#: The height of a tile in the picture's own units (dot's points): about 800 px on screen at
#: the picture's natural size, a screen or so of a tall picture.
TILE_HEIGHT = 600.0
#: A picture of fewer tiles than this is shipped whole (small pictures gain nothing).
MIN_TILES = 3
#: An element spanning more tiles than this is drawn with the picture's own svg, not tiled.
SPAN = 3.0
# What an element draws beyond the coordinates it is written with: text above its baseline,
# the widest stroke the page's marks give (4 px), rounded up.
_MARGIN = 14.0

_HEAD = re.compile(
    r'<svg width="(?P<width>[\d.]+)" height="(?P<height>[\d.]+)"\s+'
    r'viewBox="(?P<box>[-\d. ]+)"(?P<rest>[^>]*)>'
    r'<g id="graph0" class="graph" transform="scale\((?P<sx>[-\d.]+) (?P<sy>[-\d.]+)\) '
    r'rotate\(0\) translate\((?P<tx>[-\d.]+) (?P<ty>[-\d.]+)\)">'
)
# an element drawn at the top level of the picture: dot writes each as one group
_ITEM = re.compile(r'<g id="[^"]*" class="(node|edge|cluster)[^"]*">')
_PAIRS = re.compile(r'(?:points|d)="([^"]*)"')
_Y = re.compile(r",(-?[\d.]+)")
_TEXT_Y = re.compile(r'<(?:text|ellipse)[^>]*? c?y="(-?[\d.]+)"(?:[^>]*? ry="([\d.]+)")?')


def tiled(svg: str, tile_height: float = TILE_HEIGHT) -> str:
    """``svg`` (dot's, as :func:`graphsurgeon.display.inline_svg` makes it) as tiles, or
    unchanged when it is small or not dot's plain SVG (see the module docstring).

    Example:
        >>> tiled('<svg width="1" height="1"><g/></svg>')  # not tall: as it was
        '<svg width="1" height="1"><g/></svg>'
    """
    head = _HEAD.match(svg)
    if head is None:
        return svg
    x0, y0, box_width, box_height = (float(v) for v in head["box"].split())
    sx, sy, ty = float(head["sx"]), float(head["sy"]), float(head["ty"])
    if box_height < MIN_TILES * tile_height or x0 or y0 or sx <= 0 or sy <= 0:
        return svg
    end = svg.rfind("</g>")
    if end < head.end() or svg[end:].rstrip() != "</g></svg>":
        return svg
    body = svg[head.end() : end]
    items = list(_ITEM.finditer(body))
    if not items:
        return svg
    base = [body[: items[0].start()]]  # the picture's title and background
    count = int(box_height // tile_height) + 1
    tiles: list[list[str]] = [[] for _ in range(count)]
    extents = [[box_height, 0.0] for _ in range(count)]
    for i, found in enumerate(items):
        item = body[found.start() : items[i + 1].start() if i + 1 < len(items) else len(body)]
        extent = _extent(item) if found[1] != "cluster" and "transform=" not in item else None
        if extent is None:  # clusters are drawn first, under all else, as dot draws them
            base.append(item)
            continue
        top, bottom = (sy * (y + ty) for y in extent)
        if bottom - top > SPAN * tile_height:
            base.append(item)
            continue
        k = min(count - 1, max(0, int(top // tile_height)))
        tiles[k].append(item)
        seen = extents[k]
        seen[0], seen[1] = min(seen[0], top), max(seen[1], bottom)
    if sum(1 for members in tiles if members) < MIN_TILES:
        return svg
    # where the picture's own svg draws its viewBox: one scale both ways, centred ("meet");
    # each tile's viewBox is set so that its svg, stretched over the tile's box, draws the
    # same point at the same place (the box's width and height, in pixels, are rounded)
    width, height = float(head["width"]), float(head["height"])
    scale = min(width / box_width, height / box_height)
    left = (width - box_width * scale) / 2
    below = (height - box_height * scale) / 2
    transform = _transform(head)
    # the tiles first, the picture's own svg last (drawn under them: widget.css), so that the
    # picture's first svg holds nodes, as a picture drawn whole does
    parts = [
        f'<div class="gs-tiled" data-gs-width="{head["width"]}" style="width:{head["width"]}px;'
        f'aspect-ratio:{head["width"]} / {head["height"]}">'
    ]
    for members, (top, bottom) in zip(tiles, extents):
        if not members:
            continue
        # on whole pixels at the picture's natural size: its text is drawn as the whole
        # picture's is, to the pixel
        upper = max(0, math.floor(below + top * scale))
        lower = min(height, math.ceil(below + bottom * scale))
        top, bottom = (upper - below) / scale, (lower - below) / scale
        parts.append(
            f'<div class="gs-tile" style="top:{100 * upper / height:.6f}%;'
            f'height:{100 * (lower - upper) / height:.6f}%">'
            f'<svg viewBox="{-left / scale:.4f} {top:.4f} {width / scale:.4f} {bottom - top:.4f}" '
            f'preserveAspectRatio="none"{head["rest"]}><g class="graph" transform="{transform}">'
            f"{''.join(members)}</g></svg></div>"
        )
    parts += [
        head[0][: head[0].index("<g id=")],  # the picture's own <svg>, as dot wrote it
        f'<g id="graph0" class="graph" transform="{transform}">',
        *base,
        "</g></svg></div>",
    ]
    return "".join(parts)


def _transform(head: re.Match) -> str:
    return f"scale({head['sx']} {head['sy']}) rotate(0) translate({head['tx']} {head['ty']})"


def _extent(item: str) -> tuple[float, float] | None:
    """The lowest and highest y an element is written with (dot's coordinates), widened by
    what it draws beyond them; None when it has none."""
    ys = [float(y) for values in _PAIRS.findall(item) for y in _Y.findall(values)]
    for y, radius in _TEXT_Y.findall(item):
        ys.append(float(y))
        if radius:
            ys.extend((float(y) - float(radius), float(y) + float(radius)))
    if not ys:
        return None
    return min(ys) - _MARGIN, max(ys) + _MARGIN
