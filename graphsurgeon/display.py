"""How graphsurgeon's objects show themselves in a notebook: small, self-contained HTML.

Every result object has a ``_repr_mimebundle_`` that returns ``text/html`` built here and a
short ``text/plain`` (its ``repr``). The HTML carries its own scoped style (classes prefixed
``gs-``, colours that read on light and dark themes), folds long lists in ``<details>``, and
loads nothing from anywhere. Every name and value that comes from a program (module names,
node names, reasons) is escaped: a module named ``<img src=x onerror=alert(1)>`` shows as that
text and runs nothing; the module tree shows a name's control characters visibly (``a␀b``) and
shortens a long one (:func:`graphsurgeon.picture.shown`). Nothing here imports IPython: a
notebook calls these methods itself.

Example:
    >>> from graphsurgeon.display import escape, table
    >>> escape("<b>")
    '&lt;b&gt;'
    >>> table(["a"], [["<x>"]])
    '<table class="gs-table"><thead><tr><th>a</th></tr></thead><tbody><tr><td>&lt;x&gt;</td></tr></tbody></table>'
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from .picture import TOOLTIP_NAME_LIMIT, id_text, shown

__all__ = ["badge", "bundle", "details", "escape", "table"]

STYLE = """<style>
.gs-out{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:12px;line-height:1.45;color:var(--jp-ui-font-color1,#1f2937);max-width:100%;overflow-x:auto}
.gs-out .gs-title{font-weight:600;margin:2px 0 4px}
.gs-out .gs-muted{color:var(--jp-ui-font-color2,#6b7280)}
.gs-out code,.gs-out .gs-mono{font-family:var(--jp-code-font-family,ui-monospace,monospace);font-size:11px}
.gs-out table.gs-table{border-collapse:collapse;margin:2px 0 6px;font-size:12px}
.gs-out table.gs-table th{text-align:left;font-weight:600;border-bottom:1px solid rgba(127,127,127,.45);padding:2px 10px 2px 0}
.gs-out table.gs-table td{padding:1px 10px 1px 0;vertical-align:top;border-bottom:1px solid rgba(127,127,127,.12);text-align:left}
.gs-out table.gs-table td.gs-num{text-align:right;font-variant-numeric:tabular-nums}
.gs-out .gs-badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;white-space:nowrap}
.gs-out .gs-ok{background:rgba(22,163,74,.16);color:#15803d}
.gs-out .gs-bad{background:rgba(220,38,38,.16);color:#b91c1c}
.gs-out .gs-warn{background:rgba(217,119,6,.18);color:#b45309}
.gs-out .gs-info{background:rgba(37,99,235,.14);color:#1d4ed8}
.gs-out details>summary{cursor:pointer;margin:2px 0}
.gs-out .gs-indent{display:inline-block}
</style>"""

_KINDS = ("ok", "bad", "warn", "info")


def escape(value: Any) -> str:
    """``value`` as HTML text: every ``<``, ``>``, ``&`` and quote escaped."""
    return html.escape(str(value), quote=True)


def badge(text: str, kind: str = "info") -> str:
    """A small coloured label: ``kind`` is ``"ok"``, ``"bad"``, ``"warn"`` or ``"info"``."""
    kind = kind if kind in _KINDS else "info"
    return f'<span class="gs-badge gs-{kind}">{escape(text)}</span>'


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric: Iterable[int] = (),
    raw: Iterable[int] = (),
) -> str:
    """An HTML table. Cells are escaped, except in the columns listed in ``raw`` (already
    HTML, made by these helpers); columns in ``numeric`` are right-aligned."""
    numeric, raw = set(numeric), set(raw)
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if i in raw else escape(cell)
            css = ' class="gs-num"' if i in numeric else ""
            cells.append(f"<td{css}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table class="gs-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def details(summary: str, body: str, *, open_: bool = False) -> str:
    """A fold: ``summary`` (HTML) always shown, ``body`` (HTML) on a click."""
    opened = " open" if open_ else ""
    return f"<details{opened}><summary>{summary}</summary>{body}</details>"


def names(values: Iterable[str], *, limit: int = 400) -> str:
    """A list of names as escaped monospace text, cut after ``limit`` of them."""
    values = list(values)
    shown = ", ".join(escape(v) for v in values[:limit])
    more = f" … and {len(values) - limit:,} more" if len(values) > limit else ""
    return f'<span class="gs-mono">{shown}{more}</span>'


def number(value: float | None) -> str:
    """``1.19e-07``, ``0.504``: a tolerance-sized number in few characters; '' for None."""
    if value is None:
        return ""
    return f"{value:.3g}"


def bundle(body: str, plain: str, include=None, exclude=None) -> dict[str, str]:
    """The mime bundle of a result: ``body`` (HTML) in a scoped container, and ``plain``."""
    data = {
        "text/plain": plain,
        "text/html": f'<div class="gs-out">{STYLE}{body}</div>',
    }
    if include:
        data = {k: v for k, v in data.items() if k in include}
    if exclude:
        data = {k: v for k, v in data.items() if k not in exclude}
    return data


_TREE_STYLE = """<style>
.gs-out .gs-tree summary,.gs-out .gs-tree .gs-leaf{display:grid;grid-template-columns:minmax(180px,2fr) minmax(90px,1fr) 44px 56px 64px minmax(120px,3fr);gap:8px;align-items:baseline;padding:1px 0;border-bottom:1px solid rgba(127,127,127,.12)}
.gs-out .gs-tree summary{list-style:none;cursor:pointer}
.gs-out .gs-tree summary::-webkit-details-marker{display:none}
.gs-out .gs-tree .gs-name::before{content:"\\25B8  ";color:var(--jp-ui-font-color2,#6b7280)}
.gs-out .gs-tree details[open]>summary .gs-name::before{content:"\\25BE  "}
.gs-out .gs-tree .gs-leaf .gs-name::before{content:"   "}
.gs-out .gs-tree .gs-head{font-weight:600;border-bottom:1px solid rgba(127,127,127,.45)}
.gs-out .gs-tree .gs-num{text-align:right;font-variant-numeric:tabular-nums}
</style>"""


def _count(value: int | None) -> str:
    """``137.2K``: a parameter count in few characters ('' for none)."""
    if not value:
        return ""
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def module_tree_html(
    tree: Any,
    parameters: dict[str, int] | None = None,
    open_depth: int = 1,
    selectable: bool = False,
) -> str:
    """A module tree as foldable rows: each module with its type, calls, nodes, parameters
    and whether it can be swapped (or why not). Modules down to ``open_depth`` start open,
    and so do containers (nn.ModuleList) there, so the first modules that compute show.
    ``parameters``: fqn -> parameter elements in that module and its submodules."""
    parameters = parameters or {}
    infos = dict(tree.items())
    swappable = sum(1 for i in infos.values() if i.swappable)

    def container(info: Any) -> bool:  # never called itself: nn.ModuleList, nn.ModuleDict
        return info.calls == 0 and bool(info.children)

    def cells(fqn: str, info: Any, depth: int) -> str:
        name = shown(fqn.rsplit(".", 1)[-1]) if fqn else "(root)"
        reason = f'<span class="gs-muted">{escape(info.reason or "")}</span>'
        if info.swappable:
            verdict = badge("swappable", "ok")
        elif selectable and fqn:  # narrow: the reason is the badge's tooltip
            verdict = badge(
                "container" if container(info) else "no", "info" if container(info) else "bad"
            )
            verdict = verdict.replace("<span ", f'<span title="{escape(info.reason or "")}" ', 1)
        elif not fqn:
            verdict = "" if selectable else reason
        elif container(info):
            verdict = f"{badge('container', 'info')} {reason}"
        else:
            verdict = f"{badge('no', 'bad')} {reason}"
        if selectable:  # many rows in a widget's state: the fqn is the data, no tooltips
            # the fqn as ids carry it: an attribute keeps no NUL, and the parser rewrites "\r"
            data = f' data-gs-module="{escape(id_text(fqn))}"' if fqn else ""
            head = f'<span class="gs-name" style="padding-left:{14 * depth}px"{data}>'
            kind = f"<span>{escape(info.type_name)}</span>"
        else:
            qualified = escape(getattr(info, "qualified_type", "") or "")
            head = (
                f'<span class="gs-name" style="padding-left:{14 * depth}px" '
                f'title="{escape(shown(fqn, TOOLTIP_NAME_LIMIT) if fqn else "(root)")}">'
            )
            kind = f'<span title="{qualified}">{escape(info.type_name)}</span>'
        return (
            f"{head}<code>{escape(name)}</code></span>{kind}"
            f'<span class="gs-num">{info.calls}</span>'
            f'<span class="gs-num">{info.num_nodes:,}</span>'
            f'<span class="gs-num">{_count(parameters.get(fqn))}</span><span>{verdict}</span>'
        )

    def block(fqn: str, depth: int) -> str:
        info = infos[fqn]
        children = [c for c in info.children if c in infos]
        if not children:
            return f'<div class="gs-leaf">{cells(fqn, info, depth)}</div>'
        inner = "".join(block(child, depth + 1) for child in children)
        opened = depth < open_depth or (container(info) and depth <= open_depth)
        head = f"<summary>{cells(fqn, info, depth)}</summary>"
        return f"<details{' open' if opened else ''}>{head}{inner}</details>"

    header = (
        '<div class="gs-leaf gs-head"><span>module</span><span>type</span>'
        '<span class="gs-num">calls</span><span class="gs-num">nodes</span>'
        '<span class="gs-num">params</span><span>swappable</span></div>'
    )
    title = (
        f'<div class="gs-title">module tree <span class="gs-muted">{len(infos):,} modules, '
        f"{swappable:,} swappable; click a row to fold it</span></div>"
    )
    body = block("", 0) if "" in infos else ""
    return f'{_TREE_STYLE}{title}<div class="gs-tree">{header}{body}</div>'
