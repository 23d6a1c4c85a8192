r"""How graphsurgeon's objects show themselves in a notebook: small, self-contained HTML.

Every result object has a ``_repr_mimebundle_`` that returns ``text/html`` built here and a
short ``text/plain`` (its ``repr``). The HTML carries its own scoped style (classes prefixed
``gs-``, colours that read on light and dark themes), folds long lists in ``<details>``, and
loads nothing from anywhere. Every name and value that comes from a program (module names,
node names, reasons) is escaped: a module named ``<img src=x onerror=alert(1)>`` shows as that
text and runs nothing; the module tree shows a name's control characters visibly (``a␀b``) and
shortens a long one (:func:`shown`). Nothing here imports IPython: a notebook calls these
methods itself.

Names are user text: a module may be called ``"a\x00b"``, ``"line\nbreak"`` or 10,000 characters
long. Two rules, decided here and used by the pictures, the panels and the widget:

* in ids (and DOT names), :func:`id_text` keeps an ordinary name as it is and writes ``%`` and the
  characters an id cannot carry (NUL and other control characters, newlines, tabs, lone
  surrogates) as ``%XX`` (UTF-8 bytes, as in a URL): ``module:a%00b``. :func:`name_of_id_text`
  reverses it;
* in labels, tooltips and panels, :func:`shown` makes those characters visible (``␀``, ``␊``)
  and shortens a long name in the middle with an ellipsis.

Example:
    >>> from graphsurgeon.display import escape, table
    >>> escape("<b>")
    '&lt;b&gt;'
    >>> table(["a"], [["<x>"]])
    '<table class="gs-table"><thead><tr><th>a</th></tr></thead><tbody><tr><td>&lt;x&gt;</td></tr></tbody></table>'
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._meta import count_text, number_text, tolerance_text
from .errors import RenderError

__all__ = [
    "badge",
    "bundle",
    "comparison_table",
    "details",
    "escape",
    "history_table",
    "id_text",
    "inline_svg",
    "label_text",
    "legend_html",
    "name_of_id_text",
    "picture_html",
    "picture_script",
    "shown",
    "svg_size",
    "table",
]

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
    cards: bool = False,
) -> str:
    """An HTML table. Cells are escaped, except in the columns listed in ``raw`` (already
    HTML, made by these helpers); columns in ``numeric`` are right-aligned.

    ``cards``: the table may be shown as one card per row where it is narrow (the widget's
    panel column: its stylesheet does it); each cell then carries its column's name
    (``data-label``), which a card shows before the value, since no header row is shown.
    """
    numeric, raw = set(numeric), set(raw)
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    labels = [f' data-label="{escape(h)}"' if cards and h else "" for h in headers]
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if i in raw else escape(cell)
            css = ' class="gs-num"' if i in numeric else ""
            label = labels[i] if i < len(labels) else ""
            cells.append(f"<td{css}{label}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    kind = "gs-table gs-cards" if cards else "gs-table"
    return (
        f'<table class="{kind}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def details(summary: str, body: str, *, open_: bool = False) -> str:
    """A fold: ``summary`` (HTML) always shown, ``body`` (HTML) on a click."""
    opened = " open" if open_ else ""
    return f"<details{opened}><summary>{summary}</summary>{body}</details>"


def names(values: Iterable[str], *, limit: int = 400) -> str:
    """A list of names as escaped monospace text, cut after ``limit`` of them."""
    values = list(values)
    text = ", ".join(escape(v) for v in values[:limit])
    more = f" … and {len(values) - limit:,} more" if len(values) > limit else ""
    return f'<span class="gs-mono">{text}{more}</span>'


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


# -- the tables of a Surgery's history and of a comparison --------------------------------------

#: How many characters of a name the history and comparison tables show (the middle of a
#: longer one gives way to "…"; ``data-gs-call`` carries it whole).
TABLE_NAME_LIMIT = 120


def _table_name(name: str) -> str:
    return f"<code>{escape(shown(name, TABLE_NAME_LIMIT))}</code>"


def history_table(steps: Sequence[Any], position: int) -> str:
    """A Surgery's history as a table: each step's number (or ``undone``, past ``position``),
    what it did, the module and the replacement's type; '' when there are no steps. The one
    writer of it: the Surgery's own display and the widget's history panel show this.

    Example:
        >>> from types import SimpleNamespace as Step
        >>> steps = [Step(action="swap", name="act", replacement_type="GELU")]
        >>> "step 1" in history_table(steps, position=1), "undone" in history_table(steps, 0)
        (True, True)
    """
    rows = []
    for number, step in enumerate(steps, start=1):
        mark = badge("undone", "warn") if number > position else badge(f"step {number}", "ok")
        rows.append(
            [mark, escape(step.action), _table_name(step.name), escape(step.replacement_type)]
        )
    if not rows:
        return ""
    return table(["", "action", "module", "replacement"], rows, raw=range(4), cards=True)


def comparison_table(comparison: Any) -> str:
    """A :class:`~graphsurgeon.Comparison` as a table: one row per swapped call, the diverging
    ones first (in graph order: the first is where it starts), then the program's outputs.
    Each call's name carries it as ids do (``data-gs-call``; the first divergence is marked
    ``data-gs-first``), so a page can select it. Where no values were compared (on the meta
    device) the row says so instead of printing NaN. With ``backward=True`` a column says how
    each call's backward went (``ok``, ``differs: <worst gradient> <its max abs>``), and a call
    that diverges in its backward only says so. The one writer of it: the Comparison's own
    display and the widget's compare panel show this."""
    first = comparison.first_divergence
    backward = getattr(comparison, "backward", False)
    rows = comparison.rows  # one per call, in graph order, then the outputs'
    calls = list(comparison.calls)
    order = [i for i, c in enumerate(calls) if not c.ok] + [i for i, c in enumerate(calls) if c.ok]
    cells = []
    for i in order:
        call, row = calls[i], rows[i]
        marked = " data-gs-first" if call.call_name == first else ""
        name = (
            f'<code data-gs-call="{escape(id_text(call.call_name))}"{marked}>'
            f"{escape(shown(call.call_name, TABLE_NAME_LIMIT))}</code>"
        )
        verdict = badge("ok", "ok") if call.ok else badge("DIVERGES", "bad")
        if backward and not call.ok and call.forward_ok:
            verdict = badge("DIVERGES in backward", "bad")
        measured = _measured_cells(row)
        drift = number_text(row["input_drift"]) if row["values_compared"] else ""
        replacement, problem = escape(call.replacement), escape(call.problem)
        if problem:  # a width of its own: squeezed beside the other columns, it runs a word a line
            problem = f'<div style="min-width:20em">{problem}</div>'
        passes = [_backward_cell(row)] if backward else []
        cells.append(
            [verdict, name, replacement, str(row["leaves"]), *measured, drift, *passes, problem]
        )
    outputs = rows[-1]
    verdict = badge("match", "ok") if outputs["ok"] else badge("DRIFT", "bad")
    if backward and outputs["backward_ok"] is None and outputs["forward_ok"]:
        verdict = badge("NOT CHECKED", "warn")  # the program's backward could not run
    measured = _measured_cells(outputs)
    passes = [_backward_cell(outputs)] if backward else []
    cells.append([verdict, "(outputs)", "", str(outputs["leaves"]), *measured, "", *passes, ""])
    headers = ["", "call", "replacement", "leaves", "max abs", "max rel", "of tolerance"]
    headers += ["input drift", *(["backward"] if backward else []), "what differs"]
    return table(headers, cells, numeric=(3, 4, 5, 6, 7), raw=range(len(headers)), cards=True)


def _backward_cell(row: Mapping[str, Any]) -> str:
    """How a call's (or the program's) backward went, from its row of a comparison."""
    if row["backward_ok"] is False:
        return badge(row["backward"], "bad")
    text = escape(row["backward"])
    if row["backward_ok"] is None:
        return f'<span class="gs-muted">{text}</span>'
    return text


def _measured_cells(row: Mapping[str, Any]) -> list[str]:
    """The max abs, max rel and tolerance cells of a comparison's row (``Comparison.rows``)."""
    if not row["values_compared"]:
        return ['<span class="gs-muted">no values compared</span>', "", ""]
    return [
        number_text(row["max_abs"]),
        number_text(row["max_rel"]),
        tolerance_text(row["tolerance_ratio"]),
    ]


_TREE_STYLE = """<style>
.gs-out .gs-tree summary,.gs-out .gs-tree .gs-leaf{display:grid;grid-template-columns:minmax(180px,2fr) minmax(90px,1fr) 44px 56px 64px minmax(120px,3fr);gap:8px;align-items:baseline;padding:1px 0;border-bottom:1px solid rgba(127,127,127,.12)}
.gs-out .gs-tree summary{list-style:none;cursor:pointer}
.gs-out .gs-tree summary::-webkit-details-marker{display:none}
.gs-out .gs-tree .gs-name{padding-left:min(calc(var(--gs-depth,0)*14px),calc(100% - 5em))}
.gs-out .gs-tree .gs-name::before{content:"\\25B8  ";color:var(--jp-ui-font-color2,#6b7280)}
.gs-out .gs-tree details[open]>summary .gs-name::before{content:"\\25BE  "}
.gs-out .gs-tree .gs-leaf .gs-name::before{content:"   "}
.gs-out .gs-tree .gs-head{font-weight:600;border-bottom:1px solid rgba(127,127,127,.45)}
.gs-out .gs-tree .gs-num{text-align:right;font-variant-numeric:tabular-nums}
.gs-out .gs-tree.gs-valued summary,.gs-out .gs-tree.gs-valued .gs-leaf{grid-template-columns:minmax(180px,2fr) minmax(90px,1fr) 44px 56px 64px 76px minmax(120px,3fr)}
</style>"""


def module_tree_html(
    tree: Any,
    parameters: dict[str, int] | None = None,
    open_depth: int = 1,
    selectable: bool = False,
    overlay: Any = None,
) -> str:
    """A module tree as foldable rows: each module with its type, calls, nodes, parameters
    and whether it can be swapped (or why not). Modules down to ``open_depth`` start open,
    and so do containers (nn.ModuleList) there, so the first modules that compute show.
    ``parameters``: fqn -> parameter elements in that module and its submodules.
    ``overlay``: an overlay's values (:class:`graphsurgeon.checks.overlay.OverlayValues`): each module
    then shows its value, its calls' taken together as the picture takes a box's (the worst
    error, the sum of the times), a container its submodules', the root the whole program's;
    an error beyond the tolerance is marked."""
    parameters = parameters or {}
    infos = dict(tree.items())
    swappable = sum(1 for i in infos.values() if i.swappable)
    valued = _module_values(infos, overlay) if overlay is not None else None

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
            head = f'<span class="gs-name" style="--gs-depth:{depth}"{data}>'
            kind = f"<span>{escape(info.type_name)}</span>"
        else:
            qualified = escape(getattr(info, "qualified_type", "") or "")
            head = (
                f'<span class="gs-name" style="--gs-depth:{depth}" '
                f'title="{escape(shown(fqn, TOOLTIP_NAME_LIMIT) if fqn else "(root)")}">'
            )
            kind = f'<span title="{qualified}">{escape(info.type_name)}</span>'
        value = ""
        if valued is not None:
            number = valued.get(fqn)
            text = overlay.number(number) if number is not None else ""
            beyond = overlay.threshold is not None and number is not None
            beyond = beyond and number >= overlay.threshold
            shown_value = badge(text, "bad") if beyond else escape(text)
            value = f'<span class="gs-num" data-gs-value="{text}">{shown_value}</span>'
        return (
            f"{head}<code>{escape(name)}</code></span>{kind}"
            f'<span class="gs-num">{info.calls}</span>'
            f'<span class="gs-num">{info.num_nodes:,}</span>'
            f'<span class="gs-num">{count_text(parameters.get(fqn))}</span>{value}<span>{verdict}</span>'
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

    value_head = ""
    if valued is not None:
        value_head = f'<span class="gs-num" title="{escape(overlay.description)}">'
        value_head += f"{escape(overlay.kind)}</span>"
    header = (
        '<div class="gs-leaf gs-head"><span>module</span><span>type</span>'
        '<span class="gs-num">calls</span><span class="gs-num">nodes</span>'
        f'<span class="gs-num">params</span>{value_head}<span>swappable</span></div>'
    )
    title = (
        f'<div class="gs-title">module tree <span class="gs-muted">{len(infos):,} modules, '
        f"{swappable:,} swappable; click a row to fold it</span></div>"
    )
    body = block("", 0) if "" in infos else ""
    classes = "gs-tree gs-valued" if valued is not None else "gs-tree"
    return f'{_TREE_STYLE}{title}<div class="{classes}">{header}{body}</div>'


def _module_values(infos: dict[str, Any], overlay: Any) -> dict[str, float]:
    """Each module's overlay value: its calls' (``blk``, ``blk@1``) combined as the overlay
    combines a box's members; a module without calls of its own (a container) its
    submodules'; the root the whole program's nodes'."""
    of_module: dict[str, list[float]] = {}
    for call, value in overlay.calls.items():
        fqn, _, k = call.rpartition("@")
        of_module.setdefault(fqn if fqn and k.isdigit() else call, []).append(value)
    found: dict[str, float] = {}

    def visit(fqn: str) -> float | None:
        children = [visit(c) for c in infos[fqn].children if c in infos]
        own = of_module.get(fqn)
        if fqn == "":
            value = overlay.combine(list(overlay.nodes.values()))
        elif own:
            value = overlay.combine(own)
        else:
            value = overlay.combine([v for v in children if v is not None])
        if value is not None:
            found[fqn] = value
        return value

    if "" in infos:
        visit("")
    return found


# -- names in ids and in text ----------------------------------------------------------------

# What an id cannot carry as it is: NUL (dot reads C strings), the other C0 and C1 control
# characters (not XML; tab, newline and carriage return are rewritten by XML and HTML parsers in
# attribute values), lone surrogates and U+FFFE/U+FFFF (not encodable, not XML); and "%", the
# escape character itself, so that the escaping is reversible.
_NOT_IN_IDS = re.compile("[\x00-\x1f\x7f-\x9f%\ud800-\udfff\ufffe\uffff]")
# What a name shows visibly in text: the same, except "%".
_NOT_IN_NAMES = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
# What any label or tooltip text cannot carry: the same, except the newline (a line break).
_NOT_IN_LABELS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_ESCAPED = re.compile("(?:%[0-9A-F]{2})+")
#: How many characters of a name a label shows, and a tooltip (the middle gives way to "…").
LABEL_NAME_LIMIT, TOOLTIP_NAME_LIMIT = 60, 400


def _percent(match: re.Match) -> str:
    return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8", "surrogatepass"))


def id_text(name: str) -> str:
    r"""``name`` as it is written in element ids and DOT names: itself when it is an ordinary
    name, else with ``%`` and each character an id cannot carry as ``%XX`` (its UTF-8 bytes).
    Deterministic, and reversed by :func:`name_of_id_text`.

    Example:
        >>> id_text("layers.0.attn"), id_text("a\x00b"), id_text("line\nbreak"), id_text("50%")
        ('layers.0.attn', 'a%00b', 'line%0Abreak', '50%25')
        >>> name_of_id_text("a%00b")
        'a\x00b'
    """
    if ("%" not in name and name.isprintable()) or _NOT_IN_IDS.search(name) is None:
        return name
    return _NOT_IN_IDS.sub(_percent, name)


def name_of_id_text(text: str) -> str:
    r"""The name that :func:`id_text` wrote as ``text`` (``"a%00b"`` -> ``"a\x00b"``)."""
    if "%" not in text:
        return text

    def decode(match: re.Match) -> str:
        try:
            return bytes.fromhex(match.group().replace("%", "")).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:  # not written by id_text: left as it is
            return match.group()

    return _ESCAPED.sub(decode, text)


def _visible_character(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ␀, ␉, ␊, ␍, ␛ ...
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown(name: str, limit: int = LABEL_NAME_LIMIT) -> str:
    r"""``name`` as labels and panels show it: control characters and newlines visible (``␀``,
    ``␊``, ``␉``; others as ``\x85``), and past ``limit`` characters shortened in the middle
    with an ellipsis, so a 10,000-character name does not make a 10,000-pixel-wide box.

    Example:
        >>> shown("a\x00b\nc"), shown("x" * 100, 11)
        ('a␀b␊c', 'xxxxx…xxxxx')
    """
    if not name.isprintable() and _NOT_IN_NAMES.search(name) is not None:
        name = _NOT_IN_NAMES.sub(_visible_character, name)
    if len(name) > limit:
        head = (limit - 1) // 2 + (limit - 1) % 2
        name = name[:head] + "…" + name[len(name) - (limit - 1 - head) :]
    return name


def label_text(text: str) -> str:
    r"""``text`` with each character a label or tooltip cannot carry shown as :func:`shown`
    shows it (``␀``, ````); newlines are kept (line breaks). A name reaches a label already
    :func:`shown`: this is the last guard for any other text (a type's name, a dict key)."""
    if _NOT_IN_LABELS.search(text) is None:
        return text
    return _NOT_IN_LABELS.sub(_visible_character, text)


# -- pictures ----------------------------------------------------------------------------------

_PICTURE_STYLE = """<style>
.gs-drawing .gs-toolbar{display:flex;gap:6px;align-items:baseline;flex-wrap:wrap;margin:2px 0 4px}
.gs-drawing .gs-toolbar button{font:inherit;font-size:11px;padding:0 7px;border:1px solid rgba(127,127,127,.5);border-radius:4px;background:transparent;color:inherit;cursor:pointer}
.gs-drawing .gs-viewport{overflow:auto;max-width:100%}
.gs-drawing .gs-viewport svg{display:block;max-width:100%;height:auto}
.gs-drawing.gs-zoomed .gs-viewport{max-height:85vh;cursor:grab}
.gs-drawing.gs-dragging .gs-viewport{cursor:grabbing;user-select:none}
.gs-drawing .gs-legend{display:flex;gap:8px;align-items:center;flex-wrap:wrap;font-size:11px;margin:0 0 4px}
.gs-drawing .gs-stop{display:inline-flex;gap:3px;align-items:center}
.gs-drawing .gs-swatch{display:inline-block;width:14px;height:10px;border:1px solid rgba(127,127,127,.5);border-radius:2px}
</style>"""


def legend_html(title: str, stops: Iterable[tuple[str, str]], note: str | None = None) -> str:
    """An overlay's legend: ``title``, a swatch per ``(text, colour)`` stop (coolest first)
    and a ``note`` on what the values are."""
    swatches = "".join(
        f'<span class="gs-stop"><span class="gs-swatch" style="background:{escape(colour)}">'
        f"</span>{escape(text)}</span>"
        for text, colour in stops
    )
    note_html = f' <span class="gs-muted">{escape(note)}</span>' if note else ""
    return (
        f'<div class="gs-legend"><span class="gs-title">{escape(title)}</span> '
        f"{swatches}{note_html}</div>"
    )


@functools.cache
def picture_script() -> str:
    """The small script (vendored, no network) that zooms and pans an inline picture."""
    return (Path(__file__).parent / "static" / "drawing.js").read_text()


def svg_size(svg: str) -> tuple[float, float]:
    """The picture's size in CSS pixels, from the ``width="513pt" height="605pt"`` of dot."""
    match = re.search(r'<svg[^>]*\swidth="([\d.]+)pt"[^>]*\sheight="([\d.]+)pt"', svg)
    if match is None:
        raise RenderError("graphviz's SVG has no size in points; cannot fit it to the page")
    return float(match.group(1)) * 4 / 3, float(match.group(2)) * 4 / 3


def inline_svg(svg: str) -> str:
    r"""dot's SVG made fit to sit inside HTML: no XML prolog, doctype or comments, no line
    break between two elements, and its size in pixels (CSS scales it down to the output's
    width; its viewBox keeps the proportions).

    dot writes each element on a line of its own, and a page parses each line break between
    two elements as a text node: at 384 layers, 6,600 of a picture's 13,700 nodes. They draw
    nothing (SVG collapses white space), but every picture shown inserts, styles and lays them
    out: without them, opening a layer at 384 layers in JupyterLab costs the page about a
    third less (insertion 6 against 10 ms, style 30 against 50, layout 13 against 21). Line
    breaks inside an element's text are not touched.

    Example:
        >>> inline_svg('<svg width="2pt" height="1pt">\n<g>\n<text>a</text>\n</g>\n</svg>\n')
        '<svg width="3" height="1"><g><text>a</text></g></svg>\n'
    """
    start = svg.find("<svg")
    svg = re.sub(r"<!--.*?-->\s*", "", svg[start:], flags=re.S).replace(">\n<", "><")
    width, height = svg_size(svg)

    def pixels(match: re.Match) -> str:
        return f'<svg width="{round(width)}" height="{round(height)}"'

    return re.sub(r'<svg\s+width="[\d.]+pt"\s+height="[\d.]+pt"', pixels, svg, count=1)


def picture_html(
    title: str,
    caption: str,
    svg: str,
    collapsed: int = 0,
    *,
    min_scale: float = 0.0,
    legend: str = "",
) -> str:
    """A laid-out picture (dot's SVG) as inline HTML that fits the output's width and zooms
    (Ctrl+wheel, the +/- buttons) and pans (drag): its tooltips and element ids stay.
    ``collapsed``: how many modules the picture draws as boxes (said after the caption).
    ``min_scale``: the picture is never fitted smaller than this (its text stays readable): a
    wider one scrolls inside its frame. ``legend``: HTML shown under the toolbar (an overlay's
    colours), made by the caller."""
    if collapsed:
        caption += f"; {collapsed:,} modules collapsed (boxes)"
    tools = (
        '<button data-gs="out" title="zoom out">−</button>'
        '<button data-gs="in" title="zoom in">+</button>'
        '<button data-gs="fit" title="fit to the width">fit</button>'
    )
    picture = inline_svg(svg)
    smallest = ""
    if min_scale > 0:
        width = svg_size(svg)[0]
        smallest = f' data-gs-min-scale="{min_scale:g}"'
        picture = picture.replace(
            "<svg ", f'<svg style="min-width:{round(width * min_scale)}px" ', 1
        )
    return (
        f'<div class="gs-drawing"{smallest}>{_PICTURE_STYLE}'
        f'<div class="gs-toolbar"><span class="gs-title">{escape(title)}</span>'
        f'<span class="gs-muted">{escape(caption)} · Ctrl+wheel zooms, drag pans'
        f"</span>{tools}</div>{legend}"
        f'<div class="gs-viewport">{picture}</div>'
        f"<script>{picture_script()}</script></div>"
    )
