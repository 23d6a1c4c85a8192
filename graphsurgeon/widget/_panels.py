"""What the SurgeryWidget's page shows: pure functions from a session's state to each panel.

Each panel (the module tree, the selection's details, the replacement's preview, the history,
verify, compare, the stepper, the picture's caption) is a function of a
:class:`~graphsurgeon.widget.SurgerySession` that returns HTML, every name and value escaped,
written with :mod:`graphsurgeon.display`'s tables and badges so the widget looks as the
displays do. :func:`page` gathers what changed into the values of the widget's traits. Nothing
here changes the session.

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

from typing import Any

from .. import _meta
from .. import display as d
from ..compare import Comparison
from ..step import summary_table
from ._session import SurgerySession

__all__ = [
    "candidates",
    "caption",
    "compare",
    "details",
    "history",
    "page",
    "preview",
    "stepper",
    "tree",
    "verify",
]

# How many characters of a name the panels show (the middle of a longer one gives way to "…").
_NAME_LIMIT = 120
# How many calls of a module the details list.
_CALLS_LISTED = 20


def _name(name: str) -> str:
    """A module or call name as the panels show it: HTML text, control characters visible,
    a long name shortened (the ids and ``data-gs-*`` attributes carry it whole)."""
    return d.escape(d.shown(name, _NAME_LIMIT))


def _muted(text: str) -> str:
    return f'<span class="gs-muted">{text}</span>'


def _pre(text: str) -> str:
    return f'<span class="gs-pre">{d.escape(text)}</span>'


def _fields(rows: list[list[str]]) -> str:
    """(field, HTML value) rows as a table without a header."""
    return d.table([], rows, raw=(1,))


# -- the picture -----------------------------------------------------------------------------


def caption(session: SurgerySession) -> str:
    """What the picture shows, in a line: the picture's own caption, and how many modules
    are collapsed (``57 of 349 fx nodes drawn, 1 swapped, 12 modules collapsed``)."""
    view = session.scene.view
    text = view.caption()
    if view.collapsed:
        text += f", {len(view.collapsed):,} modules collapsed"
    return text


# -- the module tree and the selection ----------------------------------------------------------


def tree(session: SurgerySession) -> str:
    """The module tree: each row's name selects the module (``data-gs-module``)."""
    parameters = {fqn: info.num_parameters for fqn, info in session.tree.items()}
    return d.module_tree_html(session.tree, parameters, open_depth=1, selectable=True)


def details(session: SurgerySession) -> str:
    """The selection: a node (where it is drawn, its module) or a module (type, calls,
    nodes, parameters, swappable or why not, how it is called, its source line)."""
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
    element = session.scene.node_element(node)
    if element is None:
        drawn = "not drawn (glue)"
    elif element.kind == "box":
        drawn = f"in the collapsed box {element.label.splitlines()[0]}"
    else:
        drawn = element.tooltip
    chain = session.chain_of_node(node)
    rows = [
        ["node", f"<code>{d.escape(node)}</code>"],
        ["module", " › ".join(_name(c) for c in chain) or "(top level)"],
        ["drawn", _pre(drawn)],
    ]
    return _fields(rows)


def _swappable(info: Any) -> str:
    if info.swappable:
        return d.badge("swappable", "ok")
    return f"{d.badge('not swappable', 'bad')} {d.escape(info.reason or '')}"


# -- replacing -------------------------------------------------------------------------------


def candidates(session: SurgerySession) -> list[dict[str, str]]:
    """The picker's options, as the page reads them."""
    return [{"key": c.key, "label": c.label} for c in session.candidates()]


def preview(session: SurgerySession) -> str:
    """What swapping the selection removes, how the replacement will be called, and the
    replacement chosen."""
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
        lines.append(f"Replacement: <b>{d.escape(session.replacement_label)}</b>")
    return "<br>".join(lines)


def history(session: SurgerySession) -> str:
    """Every step of the Surgery, the undone ones marked."""
    surgery = session.surgery
    rows = []
    for i, step in enumerate(surgery.steps, start=1):
        undone = i > surgery.position
        mark = d.badge("undone", "warn") if undone else d.badge(f"step {i}", "ok")
        name = f"<code>{_name(step.name)}</code>"
        rows.append([mark, d.escape(step.action), name, d.escape(step.replacement_type)])
    if not rows:
        return _muted("No swaps yet.")
    return d.table(["", "action", "module", "replacement"], rows, raw=range(4))


# -- checks ----------------------------------------------------------------------------------


def verify(session: SurgerySession) -> str:
    """The last verify report of the Surgery's state, with what it checked."""
    report = session.report
    if report is None:
        return _muted("Not verified in this state.")
    return report._repr_html_() + (
        '<div class="gs-muted">The program against the eager model with the same '
        "replacements: the swap itself is faithful. Compare checks each replacement "
        "against the module it replaced.</div>"
    )


def compare(session: SurgerySession) -> str:
    """Each swapped call against what it replaced; a row's call name selects the call
    (``data-gs-call``), the first divergence is marked (``data-gs-first``)."""
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
    rows = []
    for call in comparison.calls:
        first_mark = " data-gs-first" if call.call_name == first else ""
        name = (
            f'<code data-gs-call="{d.escape(d.id_text(call.call_name))}"{first_mark}>'
            f"{_name(call.call_name)}</code>"
        )
        measured = call.values_compared
        rows.append(
            [
                d.badge("ok", "ok") if call.ok else d.badge("differs", "bad"),
                name,
                d.escape(call.replacement),
                *_errors(measured, call.max_abs, call.max_rel),
                d.number(call.input_drift) if measured else "",
                d.escape(call.problem),
            ]
        )
    outputs = comparison.outputs
    max_rel = max((leaf.max_rel for leaf in outputs.leaves), default=0.0)
    rows.append(
        [
            d.badge("ok", "ok") if outputs.ok else d.badge("differs", "bad"),
            "(outputs)",
            "",
            *_errors(outputs.values_compared, outputs.max_abs, max_rel),
            "",
            "",
        ]
    )
    headers = ["", "call", "replacement", "max abs", "max rel", "input drift", "what differs"]
    table = d.table(headers, rows, numeric=(3, 4, 5), raw=range(7))
    return f"<div>{head} {_muted('click a row to select the call')}</div>{table}"


def _errors(values_compared: bool, max_abs: float, max_rel: float) -> list[str]:
    """The max abs and max rel cells of a compare row; on meta, where no values were compared,
    say so instead of printing nan."""
    if not values_compared:
        return [_muted("no values compared"), ""]
    return [d.number(max_abs), d.number(max_rel)]


# -- stepping --------------------------------------------------------------------------------


def stepper(session: SurgerySession) -> str:
    """Where the stepper is (the next node, its op and module), what the last move ran and
    why it stopped, the values around the next node, and the breakpoints."""
    running = session.stepper
    parts = []
    if running is None:
        parts.append(_muted("Press step to start running the program node by node."))
    else:
        if running.done:
            parts.append(f"{d.badge('finished', 'ok')} all {running.total:,} nodes ran")
        else:
            node = running.current
            where = " › ".join(d.shown(c, _NAME_LIMIT) for c in running.stack) or "(top level)"
            parts.append(
                f"next: <code>{d.escape(node.name)}</code> "
                + _muted(
                    f"{d.escape(_op_of(node))} in {d.escape(where)} · "
                    f"node {running.position + 1:,} of {running.total:,}"
                )
            )
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


def _op_of(node: Any) -> str:
    """What a node runs, as the stepper and the picture's tooltips write it."""
    if node.op in ("placeholder", "output"):
        return node.op
    weights = {n.name for n in node.all_input_nodes if n.op in ("get_attr", "placeholder")}
    return _meta.node_call_text(node, "full", weights)


# -- the page --------------------------------------------------------------------------------


def page(session: SurgerySession, parts: set[str]) -> dict[str, Any]:
    """What the page shows of the ``parts`` that changed (:data:`~._session.PARTS`): the
    widget's trait name -> its value."""
    values: dict[str, Any] = {}
    if "picture" in parts:
        values.update(
            svg=session.scene.svg,
            view=session.view,
            caption=caption(session),
            can_diff=session.can_diff,
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
        values.update(
            tree=tree(session),
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
            preview=preview(session),
        )
    if "history" in parts:
        values.update(
            history=history(session),
            can_undo=session.surgery.can_undo,
            can_redo=session.surgery.can_redo,
        )
    if "checks" in parts:
        values.update(verify_html=verify(session), compare_html=compare(session))
    if "stepper" in parts:
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
    return values
