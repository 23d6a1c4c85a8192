"""What the SurgeryWidget's page shows: pure functions of a session, to HTML.

Each panel (the module tree, the selection's details, the replacement's preview, the history,
verify, compare, culprits, the stepper, the search results, the picture's caption and legend)
is a function of a :class:`~graphsurgeon.widget.SurgerySession` that returns HTML, every name
and value escaped, written with :mod:`graphsurgeon.display`'s tables and badges so the widget
looks as the displays do. :func:`page` gathers what changed into the values of the widget's
traits. Nothing here changes the session.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.widget import SurgerySession
    >>> from graphsurgeon.widget._panels import page, preview
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> session = SurgerySession(gs.Surgery.from_model(model, (torch.randn(2, 4),)))
    >>> session.select("1")
    >>> "Swapping <code>1</code> removes 1 fx nodes" in preview(session)
    True
    >>> sorted(page(session, {"selection", "history"}))
    ['can_redo', 'can_undo', 'details', 'history', 'selected', 'selected_node']
"""

from __future__ import annotations

import re
from typing import Any

from .. import _meta
from .. import display as d
from ..checks.compare import Comparison
from ..render import legend_html
from ..rewrite import swap_info
from ..step import summary_table
from ._session import SurgerySession
from ._view import packed

__all__ = [
    "candidates",
    "caption",
    "compare",
    "culprits",
    "details",
    "history",
    "page",
    "page_text",
    "preview",
    "region",
    "search",
    "stepper",
    "tree",
    "verify",
    "warning",
]

# How many characters of a name the panels show (the middle of a longer one gives way to "…").
_NAME_LIMIT = 120
# How long a line of a message to the page may be, and how many lines it may have: an error's
# message and details, and the busy line, echo names and ids, which may be of any length.
_LINE_LIMIT = 1_000
_LINES = 200
# A name, an id or a value's repr in a message: a run of characters without a space longer
# than the panels show a name.
_LONG_RUN = re.compile(rf"\S{{{_NAME_LIMIT + 1},}}")
# What a message puts around a name (quotes, brackets, a full stop): kept around the cut name.
_OPENING, _CLOSING, _PUNCTUATION = "'\"([{<", "'\")]}>", ".,;:!?"
# How many calls of a module the details list.
_CALLS_LISTED = 20
# How many search matches the results list shows (all are marked in the picture).
_MATCHES_LISTED = 200


def _name(name: str) -> str:
    """A module or call name as the panels show it: HTML text, control characters visible,
    a long name shortened (the ids and ``data-gs-*`` attributes carry it whole)."""
    return d.escape(d.shown(name, _NAME_LIMIT))


# A match's row in the side panel shows this many characters of its name, its last ones: the
# matches of a search share their start ("decoder.block.0.layer.1.EncDecAttention..."), and a
# row cut at its end would show them all alike.
_ROW_NAME_LIMIT = 32


def _tail(name: str, limit: int = _ROW_NAME_LIMIT) -> str:
    """A name as a list row shows it: whole when short, else its last dotted parts that fit
    after an ellipsis (the full name is the row's tooltip).

    Example:
        >>> _tail("decoder.block.0.layer.1.EncDecAttention.q")
        '…0.layer.1.EncDecAttention.q'
        >>> _tail("linear_3")
        'linear_3'
    """
    shown = d.shown(name, _NAME_LIMIT)
    if len(shown) <= limit:
        return d.escape(shown)
    parts = shown.split(".")
    kept = parts[-1][-(limit - 1) :]
    for part in reversed(parts[:-1]):
        if len(kept) + len(part) + 2 > limit:
            break
        kept = f"{part}.{kept}"
    return d.escape("…" + kept)


def page_text(text: str) -> str:
    """A message for the page (an error's message or details, the busy line) with every name
    and id in it cut as the panels cut a name, its full length noted: a 5 MB id the page sent
    comes back as ``'node:xxxx…xxxx' (5,000,005 characters)``, and the words around it still
    say what is wrong. A line past ``_LINE_LIMIT`` characters (a long name with spaces) loses
    its middle, and a text of more than ``_LINES`` lines the lines in its middle."""
    lines = text.split("\n")
    if len(lines) > _LINES:
        half = _LINES // 2
        lines = [*lines[:half], f"… {len(lines) - 2 * half:,} lines …", *lines[-half:]]
    kept = []
    for line in lines:
        if len(line) > _NAME_LIMIT:
            line = _LONG_RUN.sub(_shortened_run, line)
        if len(line) > _LINE_LIMIT:
            line = f"{d.shown(line, _LINE_LIMIT)} ({len(line):,} characters)"
        kept.append(line)
    return "\n".join(kept)


def _shortened_run(match: re.Match) -> str:
    """A long name in a message, cut in the middle (quotes and punctuation around it kept),
    followed by its full length."""
    run = match.group()
    core = run.lstrip(_OPENING)
    opening = run[: len(run) - len(core)]
    body = core.rstrip(_PUNCTUATION)
    punctuation = core[len(body) :]
    name = body.rstrip(_CLOSING)
    closing = body[len(name) :]
    if len(name) <= _NAME_LIMIT:  # long only with its quotes and punctuation
        return run
    shown = d.shown(name, _NAME_LIMIT)
    return f"{opening}{shown}{closing} ({len(name):,} characters){punctuation}"


def _muted(text: str) -> str:
    return f'<span class="gs-muted">{text}</span>'


def _pre(text: str) -> str:
    return f'<span class="gs-pre">{d.escape(text)}</span>'


def _fields(rows: list[list[str]]) -> str:
    """(field, HTML value) rows as a table without a header."""
    return d.table([], rows, raw=(1,))


def _state(node: Any) -> set[str]:
    """The parameters and buffers among a node's inputs (the short forms leave them out)."""
    return {n.name for n in node.all_input_nodes if n.op in ("get_attr", "placeholder")}


def call_line(node: Any, form: str = "short") -> str:
    """What a node runs, with the arguments its edges do not show: ``aten.transpose(dim0=1,
    dim1=2)`` (``form="short"``), or every argument of the op's schema, defaults included
    (``"full"``); inputs and the output as their kind."""
    if node.op in ("placeholder", "output"):
        return node.op
    if form == "short":
        return _meta.node_call_text(node, "short", _state(node))
    arguments = _meta.arguments_text(node, "full")
    name = _meta.op_text(node, "full")
    return f"{name}({arguments})" if arguments and node.op == "call_function" else name


# -- the picture -----------------------------------------------------------------------------


def caption(session: SurgerySession) -> str:
    """What the picture shows against what the program has, in a line whose totals do not
    change with the view: ``57 nodes drawn · the program: 349 fx nodes, 24 module calls,
    1 swapped``."""
    view = session.scene.view
    surgery = session.surgery
    total = _program_nodes(session)
    text = (
        f"{view.drawn_nodes:,} nodes drawn · the program: {total:,} fx nodes, "
        f"{len(session.partitions):,} module calls"
    )
    if surgery.replacements:
        text += f", {len(surgery.replacements)} swapped"
    if surgery.fused:
        text += f", {len(surgery.fused)} fused"
    return text


def _program_nodes(session: SurgerySession) -> int:
    """The fx nodes of the current program, each fused call counted as the nodes it runs."""
    surgery = session.surgery
    if not (surgery.replacements or surgery.fused):
        return len(surgery.program.graph.nodes)
    module = surgery.module
    info = swap_info(module)
    fused = info.partitions if info is not None else {}
    return len(module.graph.nodes) + sum(
        len(fused[c].nodes) - 1 for c in surgery.fused if c in fused
    )


def legend(session: SurgerySession) -> str:
    """The overlay's legend (its colours and what they mean), '' without an overlay."""
    return legend_html(session.scene.picture)


# -- the module tree and the selection ----------------------------------------------------------


def tree(session: SurgerySession) -> str:
    """The module tree: each row's name selects the module (``data-gs-module``); with an
    overlay, each module's value, as the picture aggregates a box's.

    Made again only when what it shows changed: the tree is the original program's, so an
    edit without an overlay leaves it as it was (at 384 layers its 4,600 rows cost ~60 ms,
    paid by every swap, undo and redo before it was kept)."""
    values = session.overlay_values()
    made_from = (session.tree, values)
    kept = session.kept_pages.get("tree")
    if kept is not None and all(a is b for a, b in zip(kept[0], made_from)):
        return kept[1]
    parameters = {fqn: info.num_parameters for fqn, info in session.tree.items()}
    text = d.module_tree_html(
        session.tree, parameters, open_depth=1, selectable=True, overlay=values
    )
    # what it was made from is held with it: an id could be reused once they are dropped
    session.kept_pages["tree"] = (made_from, text)
    return text


def packed_tree(session: SurgerySession, text: str) -> tuple[str, bytes]:
    """The tree's HTML as the page gets it: ``(key, deflated)`` (:func:`._view.packed`; 1.9 MB
    to 62 KB at 384 layers), made again only for another text. The key is what tells the page
    that a new tree came: a change of bytes alone raises no change event there."""
    kept = session.kept_pages.get("tree packed")
    if kept is not None and kept[0] is text:
        return kept[1]
    made = packed(text)
    session.kept_pages["tree packed"] = (text, made)
    return made


def module_types(session: SurgerySession) -> list[str]:
    """The module types of the tree, for its type filter (sorted)."""
    return sorted({info.type_name for fqn, info in session.tree.items() if fqn})


def details(session: SurgerySession) -> str:
    """The selection: a node (its op and arguments, value, module, where it is drawn) or a
    module (type, calls, nodes, parameters, swappable or why not, how it is called, its
    source line)."""
    if session.selected_node is not None:
        return _node_details(session, session.selected_node)
    name = session.selected
    if name is None:
        return _muted("Click a module or a node in the picture or the tree.")
    info = session.module_info(name)
    rows = [["module", f"<code>{_name(name)}</code>"]]
    if info is not None:
        rows.append(["type", d.escape(info.qualified_type or info.type_name)])
        listed = ", ".join(_name(c) for c in info.call_names[:_CALLS_LISTED])
        more = len(info.call_names) - _CALLS_LISTED
        listed += f", … {more:,} more" if more > 0 else ""
        rows.append(["calls", listed or "none (a container)"])
        rows.append(["nodes", f"{info.num_nodes:,}"])
        rows.append(["parameters", f"{info.num_parameters:,}"])
        rows.append(["swap", _swappable(info)])
    surgery = session.surgery
    replacement = surgery.replacements.get(name)
    if replacement is not None:
        rows.append(["swapped for", d.escape(type(replacement).__name__)])
    elif name in surgery.fused:
        rows.append(["fused", "yes: its nodes run as one call"])
    calls = session.calls_of(name)
    if calls:
        # the module's own argument names, as export recorded them
        text = session.call_text(calls[0])
        if text:
            rows.append(["called as", _pre(text)])
        source = session.source_of(calls[0])
        if source:
            rows.append(["source", _pre(source)])
    return _fields(rows)


def _node_details(session: SurgerySession, node: str) -> str:
    fx_node = session.node(node)
    rows = [["node", f"<code>{d.escape(node)}</code>"]]
    if fx_node is not None:
        rows.append(["op", _pre(call_line(fx_node, "short"))])
        if fx_node.op == "call_function":
            rows.append(["arguments", _pre(_meta.arguments_text(fx_node, "full") or "none")])
        value = _meta.node_value_text(fx_node)
        if value:
            rows.append(["value", _pre(value)])
    in_drawn = session.in_drawn_program(node)
    removed = session.removed_by(node) if not in_drawn else None
    inner_call = session.inner_call(node) if not in_drawn else None
    if inner_call is not None:
        module = f"inside the swapped call <code>{_name(inner_call)}</code>"
        drawn = (
            "in the replacement's picture"
            if fx_node is not None
            else "inside the replacement: run to it (or stop at it) to draw it"
        )
    else:
        chain = session.chain_of_node(node)
        module = " › ".join(_name(c) for c in chain) or "(top level)"
        element = session.scene.node_element(node)
        if element is None:
            drawn = "not drawn (glue)"
        elif element.kind == "box":
            drawn = f"in the collapsed box {element.label.splitlines()[0]}"
        else:
            drawn = element.tooltip
    rows.append(["module", module])
    if removed is not None:
        rows.append(
            [
                "swapped",
                f"{d.badge('removed', 'warn')} by the swap of <code>{_name(removed)}</code>: "
                "the before/after views draw it",
            ]
        )
    rows.append(["drawn", _pre(drawn)])
    if fx_node is not None and fx_node.op == "call_function":
        source = _meta.source_text(fx_node)
        if source:
            rows.append(["source", _pre(source)])
    return _fields(rows)


def _swappable(info: Any) -> str:
    if info.swappable:
        return d.badge("swappable", "ok")
    return f"{d.badge('not swappable', 'bad')} {d.escape(info.reason or '')}"


# -- search ----------------------------------------------------------------------------------


def search(session: SurgerySession) -> str:
    """The search's matches: which is selected, and one row per match (a click selects it:
    ``data-gs-match`` is its index)."""
    if not session.search_text:
        return ""
    matches = session.matches
    head = (
        f"<div><b>{len(matches):,}</b> match{'es' if len(matches) != 1 else ''} for "
        f"<code>{_name(session.search_text)}</code> · {session.match_index + 1} of "
        f"{len(matches):,} {_muted('Enter / F3: next, Shift: previous, Esc: close')}</div>"
    )
    rows = []
    for i, match in enumerate(matches[:_MATCHES_LISTED]):
        mark = ' class="gs-match-current"' if i == session.match_index else ""
        what = f"{match.kind} {match.what}"
        title = d.escape(f"{d.shown(match.name, _NAME_LIMIT)} ({what})")
        rows.append(
            f'<div data-gs-match="{i}"{mark} title="{title}"><code>{_tail(match.name)}</code> '
            f"{_muted(d.escape(what))}</div>"
        )
    more = len(matches) - _MATCHES_LISTED
    tail = _muted(f"… {more:,} more, marked in the picture") if more > 0 else ""
    return f'{head}<div class="gs-matches">{"".join(rows)}{tail}</div>'


# -- replacing -------------------------------------------------------------------------------


def candidates(session: SurgerySession) -> list[dict[str, Any]]:
    """The picker's options, as the page reads them: those that fit the selected call first
    (``fits``: true, false, or null when not known), with why one does not (``why``)."""
    return [
        {"key": c.key, "label": c.label, "fits": c.fits, "why": c.why} for c in session.candidates()
    ]


def preview(session: SurgerySession) -> str:
    """What swapping the selection (or the region) removes, how the replacement will be
    called, and the replacement chosen."""
    if session.region:
        return _region_preview(session)
    name = session.selected
    if name is None:
        return _muted("Select a module to swap.")
    calls = session.calls_of(name)
    if not calls:
        return _muted(f"{_name(name)} has no calls of its own: pick one of its submodules.")
    removed = sum(session.partitions[c].num_nodes for c in calls)
    lines = [
        f"Swapping <code>{_name(name)}</code> removes {removed:,} fx nodes "
        f"({len(calls)} call{'s' if len(calls) != 1 else ''})"
    ]
    info = session.module_info(name)
    if info is not None:
        lines[0] += f" and {info.num_parameters:,} parameter elements"
        if not info.swappable:
            lines.append(_swappable(info))
    text = session.call_text(calls[0], session.replacement_module)
    if text:
        lines.append(f"The replacement is called as {_pre(text)}")
    if session.replacement_label:
        lines.append(f"Replacement: <b>{_name(session.replacement_label)}</b>")
        misfit = session.picker.misfit()
        if misfit is not None:
            lines.append(f"{d.badge('does not fit the call', 'bad')} {d.escape(misfit)}")
    return "<br>".join(lines)


def _region_preview(session: SurgerySession) -> str:
    plan = session.region_plan
    count = len(session.region)
    lines = [f"The region of {count:,} op{'s' if count != 1 else ''}"]
    if plan is None:
        lines.append(f"{d.badge('not one call', 'bad')} {d.escape(session.region_problem)}")
    else:
        lines[0] += f" becomes the call <code>{_name(plan.region.name)}</code>"
        lines.append(f"The replacement is called as {_pre(plan.call_text)}")
    if session.replacement_label:
        lines.append(f"Replacement: <b>{_name(session.replacement_label)}</b>")
    return "<br>".join(lines)


def region(session: SurgerySession) -> str:
    """The region being chosen (a shift-click adds a node, a shift-drag rectangle every op in
    it): its nodes, the call it would be, and what Find similar found (matches, near-misses
    with what differs)."""
    if not session.region:
        return _muted(
            "Shift-click ops in the picture, or shift-drag a rectangle over them, to choose a "
            "region."
        )
    parts = [_region_preview(session)]
    shown = ", ".join(f"<code>{d.escape(n)}</code>" for n in session.region[:24])
    more = len(session.region) - 24
    parts.append(_muted("nodes: ") + shown + (_muted(f", … {more:,} more") if more > 0 else ""))
    found = session.similar
    if found is not None:
        count = len(found.matches)
        rows = [
            f'<div data-gs-node="{d.escape(m.nodes[0])}">{d.badge("match", "ok")} '
            f"<code>{_name(m.call or '(top level)')}</code> {_muted(d.escape(m.nodes[0]))}</div>"
            for m in found.matches
            if m.nodes
        ]
        rows += [
            f'<div data-gs-node="{d.escape(n.nodes[0])}">{d.badge("near-miss", "warn")} '
            f"<code>{_name(n.call or '(top level)')}</code> {_muted(d.escape(n.reason))}</div>"
            for n in found.near_misses
            if n.nodes
        ]
        head = (
            f"<b>{count}</b> place{'s' if count != 1 else ''} compute the same, "
            f"{len(found.near_misses)} near-miss{'es' if len(found.near_misses) != 1 else ''}"
        )
        # what find says of its search, and the places left out that swaps removed
        notes = "".join(f"<div>{_muted(d.escape(note))}</div>" for note in found.notes)
        parts.append(f'<div>{head}</div>{notes}<div class="gs-similar">{"".join(rows)}</div>')
    return "<br>".join(parts)


def history(session: SurgerySession) -> str:
    """Every step of the Surgery, the undone ones marked (the table the Surgery's own display
    shows: :func:`graphsurgeon.display.history_table`)."""
    surgery = session.surgery
    return d.history_table(surgery.steps, surgery.position) or _muted("No swaps yet.")


# -- checks ----------------------------------------------------------------------------------


def verify(session: SurgerySession) -> str:
    """The last verify report of the Surgery's state: its two verdicts, each with its badge
    (faithful to the eager model with the same replacements; equal to the original)."""
    report = session.report
    if report is None:
        return _muted("Not verified in this state.")
    return report._repr_html_() + (
        '<div class="gs-muted">Faithful: the program against the eager model with the same '
        "replacements (the swap itself). Equal to the original: against the model as it was "
        "(does it still compute the same?). Compare checks each replacement on its own.</div>"
    )


def compare(session: SurgerySession) -> str:
    """Each swapped call against what it replaced, in the table the Comparison's own display
    shows (:func:`graphsurgeon.display.comparison_table`): a row's call name selects the call
    (``data-gs-call``), the first divergence is marked (``data-gs-first``); and the line of
    the replacement where it first differs is named (:meth:`Comparison.locate`)."""
    comparison: Comparison | None = session.comparison
    if comparison is None:
        return _muted("Not compared in this state.")
    first = comparison.first_divergence
    if comparison.ok:
        head = d.badge("every swapped call matches", "ok")
    elif first:
        head = d.badge(f"first divergence: {d.shown(first, _NAME_LIMIT)}", "bad")
    else:
        head = d.badge("outputs differ", "bad")
    table = d.comparison_table(comparison)  # the Comparison's own display shows it too
    return (
        f"<div>{head} {_muted('click a row to select the call')}</div>{_located(comparison)}"
        f'<div class="gs-wide">{table}</div>'
    )


def _located(comparison: Comparison) -> str:
    """Where the first diverging call starts to differ: ``my_kernels.py:42 `y = ...`: first
    differs here, inputs agree``, or why that cannot be said."""
    if not comparison.first_divergence:
        return ""
    location = comparison.location if comparison.location is not None else None
    if location is None:
        return ""
    if not location:
        return f'<div class="gs-located">{_muted("where: " + d.escape(location.reason))}</div>'
    where = (
        f"<code>{d.escape(location.source)}</code> <code>{d.escape(location.line)}</code>"
        if location.source
        else f"<code>{d.escape(location.op)}</code>"
    )
    return (
        f'<div class="gs-located">{d.badge(location.verdict, "bad")} '
        f"<code>{_name(location.call)}</code>: {where} "
        f"{_muted(d.escape(location.op) if location.source else '')}</div>"
    )


def culprits(session: SurgerySession) -> str:
    """What "Find culprits" found: the swaps to blame (each selects its call), and the
    program runs it took."""
    found = session.bisection
    if found is None:
        return ""
    runs = f"{found.runs} program run{'s' if found.runs != 1 else ''}"
    if not found.culprits:
        verdict = "no culprits: the program matches the original" if found.matches else ""
        return f"<div>{d.badge('no culprits', 'ok')} {d.escape(verdict)} {_muted(runs)}</div>"
    names = ", ".join(
        f'<code data-gs-call="{d.escape(d.id_text(c))}">{_name(c)}</code>' for c in found.culprits
    )
    count = len(found.culprits)
    head = d.badge(f"{count} culprit{'s' if count != 1 else ''}", "bad")
    together = [" + ".join(group) for group in found.groups if len(group) > 1]
    note = _muted(" mismatch only together: " + d.escape("; ".join(together))) if together else ""
    return (
        f'<div class="gs-culprits">{head} {names} {_muted(f"among {len(found.swaps)} swaps, {runs}")}'
        f"{note}</div>"
    )


# -- stepping --------------------------------------------------------------------------------


def stepper(session: SurgerySession) -> str:
    """Where the stepper is (the next node, its op and arguments, its module; inside a
    swapped call, the original node it stands for and that node's value), what the last move
    ran and why it stopped, the values around the next node, and the breakpoints."""
    running = session.stepper
    parts = []
    if running is None:
        parts.append(_muted("Press Step (or F10 / F11) to run the program node by node."))
    else:
        if running.done:
            parts.append(f"{d.badge('finished', 'ok')} all {running.total:,} nodes ran")
        else:
            node = running.current
            where = " › ".join(d.shown(c, _NAME_LIMIT) for c in running.stack) or "the top level"
            if running.frames:
                inside = f"inside {d.shown(running.frames[0], _NAME_LIMIT)} · "
            else:
                inside = ""
            parts.append(
                f"next: <code>{d.escape(node.name)}</code> <code>{d.escape(call_line(node))}</code> "
                + _muted(
                    f"{d.escape(inside)}in {d.escape(where)} · node {running.position + 1:,} of "
                    f"{running.total:,}"
                )
            )
            if node.op == "call_function":
                parts.append(_muted("all arguments: " + d.escape(call_line(node, "full"))))
            parts.extend(_counterpart(session, node.name))
        result = session.last_step
        if result is not None:
            reasons = {"breakpoint": "stopped at a breakpoint", "end": "reached the end"}
            line = f"ran {len(result.ran):,} node{'s' if len(result.ran) != 1 else ''}"
            if result.reason in reasons:
                line += f"; {reasons[result.reason]}"
            if result.breakpoints:
                line += ": " + ", ".join(str(b) for b in result.breakpoints)
            parts.append(d.escape(line))
            if result.note:
                parts.append(_muted(d.escape(result.note)))
        summaries = session.summaries()
        if summaries:
            parts.append(summary_table(summaries))
    breakpoints = [
        f"{'before' if kind == 'node' else 'entering'} {d.shown(name, _NAME_LIMIT)}"
        for kind, name in session.breakpoints
    ]
    if session.break_on_nan:
        breakpoints.append("a NaN or an Inf")
    if breakpoints:
        parts.append("breakpoints: " + d.escape("; ".join(breakpoints)))
    return "<br>".join(parts)


def _counterpart(session: SurgerySession, node: str) -> list[str]:
    """Inside a swapped call: the original node the next node stands for, and its value."""
    running = session.stepper
    if session.inside is None or not running.frames:
        return []
    original = session.counterpart(node)
    if original is None:
        return [_muted("the original call has no node of this op at this place")]
    line = f"stands for the original's <code>{d.escape(original)}</code>"
    summary = session.counterpart_summary(original)
    if summary is None:
        return [line]
    return [
        line + " " + _muted("(the original program, run on the same inputs):"),
        summary_table([summary]),
    ]


def inside_caption(session: SurgerySession) -> str:
    """The title of the swapped call's picture the stepper is inside."""
    inside = session.inside
    running = session.stepper
    if inside is None or running is None or not running.frames:
        return ""
    call = running.frames[0]
    replacement = session.surgery.replacements.get(call)
    kind = type(replacement).__name__ if replacement is not None else "replacement"
    return (
        f"inside {d.shown(call, _NAME_LIMIT)}: {kind}, exported on the inputs the call "
        f"received ({inside.view.drawn_nodes:,} nodes)"
    )


def warning(session: SurgerySession) -> str:
    """A large layout waiting for a confirmation: what it shows and how many nodes."""
    pending = session.pending
    if pending is None:
        return ""
    return (
        f"{d.badge('large picture', 'warn')} {d.escape(pending.what)} draws "
        f"<b>{pending.drawn:,}</b> nodes: graphviz may take several seconds to lay it out."
    )


# -- the page --------------------------------------------------------------------------------


def page(session: SurgerySession, parts: set[str]) -> dict[str, Any]:
    """What the page shows of the ``parts`` that changed (:data:`~._session.PARTS`): the
    widget's trait name -> its value."""
    values: dict[str, Any] = {}
    if "picture" in parts:
        svg_key, svg_packed = session.scene.packed
        clicks_key, clicks_packed = session.selection.packed_click_marks()
        values.update(
            svg=session.scene.svg,
            # one key for the picture and what a click on it marks: the page keeps them together
            svg_key=svg_key + clicks_key,
            svg_packed=svg_packed,
            clicks_packed=clicks_packed,
            view=session.view,
            caption=caption(session),
            legend=legend(session),
            can_diff=session.can_diff,
            overlay=session.overlay,
            clicks=session.selection.click_marks(),
        )
    if "marks" in parts:
        values["marks"] = session.marks
    if "selection" in parts:
        values.update(
            selected=session.selected,
            selected_node=session.selected_node,
            details=details(session),
        )
    if "tree" in parts:
        surgery = session.surgery
        text = tree(session)
        tree_key, tree_packed = packed_tree(session, text)
        values.update(
            tree=text,
            tree_key=tree_key,
            tree_packed=tree_packed,
            module_types=module_types(session),
            swapped=sorted(set(surgery.replacements) | set(surgery.fused)),
        )
    if "choice" in parts:
        # the picker (choice_key), the preview and the Swap button (can_swap) come from the
        # same state, together: they cannot disagree
        values.update(
            candidates=candidates(session),
            choice=session.replacement_label,
            choice_key=session.replacement_key,
            can_swap=session.can_swap,
            can_swap_region=session.can_swap_region,
            preview=preview(session),
        )
    if "history" in parts:
        values.update(
            history=history(session),
            can_undo=session.surgery.can_undo,
            can_redo=session.surgery.can_redo,
        )
    if "checks" in parts:
        values.update(
            verify_html=verify(session),
            compare_html=compare(session),
            culprits_html=culprits(session),
            gradients=session.gradients,
        )
    if "stepper" in parts or "inside" in parts:
        running = session.stepper
        values.update(
            stepper_html=stepper(session),
            stepping=running is not None and not running.done,
            break_on_nan=session.break_on_nan,
        )
    if "current" in parts:
        values.update(current=session.current, scroll_current=session.scroll_current)
    if "scroll" in parts:
        values["scroll"] = session.scroll
    if "search" in parts:
        values.update(
            search_html=search(session),
            search_text=session.search_text,
            has_matches=bool(session.matches),
        )
    if "warning" in parts:
        values.update(warning=warning(session), pending=session.pending is not None)
    if "region" in parts:
        values.update(
            region_html=region(session),
            has_region=bool(session.region),
            can_swap_region=session.can_swap_region,
            can_use_region=session.region_plan is not None,
        )
    if "inside" in parts:
        inside = session.inside
        values.update(
            inside_svg=inside.svg if inside is not None else "",
            inside_caption=inside_caption(session),
            inside_current=session.inside_current,
        )
    return values


# -- the saved notebook ----------------------------------------------------------------------

# In JupyterLab and Notebook 7 a widget output whose model is gone (a saved notebook, the kernel
# not running) shows only "Loading widget..." or "Error displaying widget: model not found": this
# hides that line when the static copy follows it. A live widget's output holds the widget.
_STATIC_STYLE = (
    "<style>.jp-OutputArea-child:has(+ .jp-OutputArea-child .gs-static) > "
    ".jp-OutputArea-output:not(:has(.gs-widget)){display:none}"
    ".gs-static .gs-static-view{overflow:auto;max-height:80vh;border:1px solid "
    "rgba(127,127,127,.25);border-radius:4px}.gs-static svg{display:block;max-width:100%;"
    "height:auto}</style>"
)


def static(session: SurgerySession, model_id: str) -> str:
    """The widget's picture as static HTML (what a saved notebook shows when the kernel is
    gone): its caption, the overlay's legend and the SVG, ids and tooltips kept."""
    title = f"SurgeryWidget of {session.scene.picture.name}"
    note = "a static copy of the picture: run the cell for the live widget"
    return (
        f'{d.STYLE}{_STATIC_STYLE}<div class="gs-out gs-static" '
        f'data-gs-model="{d.escape(model_id)}"><div class="gs-title">{d.escape(title)} '
        f"{_muted(d.escape(note))}</div><div>{_muted(d.escape(caption(session)))}</div>"
        f'{legend(session)}<div class="gs-static-view">{session.scene.svg}</div></div>'
    )
