"""A program and the swaps made to it, as one self-contained HTML file to keep or send.

``write_report(program, path)`` writes what a notebook would show of a program, on one page
that opens in any browser without a network: the swaps and what they replaced, ``verify``
(the swapped program against the original) and ``compare`` (each replacement against the nodes
it replaced), the picture (before/after when something is swapped; zoom and pan with the same
vendored script as in a notebook), the module tree, and the export notes. ``program`` is an
ExportedProgram, a GraphModule made by :func:`graphsurgeon.swap`, or a
:class:`~graphsurgeon.Surgery`. It is what ``graphsurgeon report`` and ``graphsurgeon demo``
write.

The page loads nothing: styles and the zoom script are inline, and its Content-Security-Policy
lets no request out and runs no script but that one (by its hash), so even a name that got
past the escaping could run nothing. Every name from the program is escaped text. The page is
the same for the same program and inputs, except for the times of export, if known.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.report import build_report
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),)).swap("1", torch.nn.GELU())
    >>> report = build_report(s, title="Sequential <demo>")
    >>> report
    <Report 'Sequential <demo>': 1 swap; verify MISMATCH; compare first divergence '1'>
    >>> "<title>Sequential &lt;demo&gt; · graphsurgeon report</title>" in report.html
    True
    >>> bool(report), any(f'{a}="http' in report.html for a in ("src", "href"))
    (False, False)
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from . import display as d
from ._hierarchy import describe_dynamic
from ._program import as_inputs, as_program
from .checks.compare import Comparison, compare
from .checks.overlay import overlay_values
from .checks.verify import VerifyReport, verify
from .drawing import draw
from .errors import GraphSurgeonError, MissingDependencyError, RenderError, a_type
from .export import export_notes
from .partition import module_tree
from .swap import swap_info

__all__ = ["Report", "build_report", "write_report"]

_PAGE_STYLE = """<style>
body{margin:0;background:#fff}
.gs-page{max-width:1240px;margin:0 auto;padding:16px 24px 40px}
.gs-page h1{font-size:20px;margin:4px 0 2px}
.gs-page h2{font-size:15px;margin:0 0 6px;padding-top:4px}
.gs-page section{margin:18px 0;padding-top:10px;border-top:1px solid rgba(127,127,127,.25)}
.gs-page nav a{margin-right:12px;color:#1d4ed8;text-decoration:none}
.gs-page .gs-facts td:first-child{color:#6b7280}
.gs-page .gs-check{margin:8px 0 14px}
.gs-page footer{margin-top:28px;color:#6b7280}
</style>"""


@dataclass(frozen=True)
class Report:
    """A report built by :func:`build_report`: the page, and the checks it shows.

    Attributes:
        title: the page's title (plain text).
        html: the whole page, one self-contained HTML document.
        swaps: the swapped calls, in graph order (fused calls are not swaps).
        verify: the swapped program against the original, or None when not run.
        comparison: each swapped call against the nodes it replaced, or None when not run.
        skipped: why verify and compare did not run ('' when they did, or nothing is swapped).
        problem: the error of a check that could not run ('' when none).
        picture: what is missing from the picture ('' when it is there).
    """

    title: str
    html: str
    swaps: tuple[str, ...]
    verify: VerifyReport | None
    comparison: Comparison | None
    skipped: str = ""
    problem: str = ""
    picture: str = ""

    @property
    def ok(self) -> bool:
        """False when a check found a mismatch or could not run; True otherwise."""
        return not self.problem and (self.verify is None or bool(self.verify))

    def __bool__(self) -> bool:
        return self.ok

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (UTF-8) and return the path."""
        path = Path(path)
        path.write_text(self.html, encoding="utf-8")
        return path

    def summary(self) -> list[str]:
        """The report in a few lines of text, as ``graphsurgeon report`` prints them."""
        lines = []
        if self.verify is not None:
            lines.append(str(self.verify).splitlines()[0])
        if self.comparison is not None:
            lines.append(str(self.comparison).splitlines()[0])
        if self.problem:
            lines.append(f"checks: could not run: {self.problem}")
        elif self.skipped:
            lines.append(f"verify and compare skipped: {self.skipped}")
        if self.picture:
            lines.append(f"no picture: {self.picture}")
        return lines

    def __repr__(self) -> str:
        count = len(self.swaps)
        parts = [f"{count} swap{'s' if count != 1 else ''}"]
        if self.verify is not None:
            parts.append("verify " + ("match" if self.verify else "MISMATCH"))
        if self.comparison is not None:
            first = self.comparison.first_divergence
            parts.append(f"compare first divergence {first!r}" if first else "compare ok")
        if self.problem:
            parts.append("a check could not run")
        elif self.skipped:
            parts.append("checks skipped")
        return f"<Report {self.title!r}: {'; '.join(parts)}>"


def write_report(program: Any, path: str | Path, **options: Any) -> Report:
    """Build the report of ``program`` (see :func:`build_report`, which takes the same
    ``options``) and write it to ``path``. Returns the :class:`Report`; an unwritable path
    raises the OSError."""
    report = build_report(program, **options)
    report.save(path)
    return report


def build_report(
    program: Any,
    *,
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    title: str | None = None,
    description: str = "",
    sources: Mapping[str, str] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    overlay: str | None = None,
) -> Report:
    """The report of ``program`` as a :class:`Report`, its page in ``.html``.

    Args:
        program: an ExportedProgram (the page shows it alone), a GraphModule made by
            :func:`graphsurgeon.swap`, or a Surgery (its current swaps and fused calls).
        args: the positional inputs verify and compare run on. Without them: a Surgery's own
            inputs, else the example inputs the program keeps (``torch.export.save`` stores
            them), else inputs made from the program's input shapes and dtypes (seeded normal
            floats, zero integers), when they are all static tensors; else the checks are
            skipped and the page says why.
        kwargs: the keyword inputs that go with ``args``.
        title: the page's title (default: the program's model type).
        description: a paragraph under the title (plain text).
        sources: call name -> where its replacement came from (``"kernels:FusedAttention"``),
            shown next to the replacement's type.
        rtol: the relative tolerance of verify and compare.
        atol: the absolute tolerance of verify and compare.
        overlay: also paint the swapped program's picture with ``"error"`` (its values
            against the original's), ``"own error"`` (each swapped call on the original's
            inputs), ``"grad error"`` / ``"own grad error"`` (the same for the gradients) or
            ``"latency"`` (time per node, of the program alone too); see
            :func:`graphsurgeon.checks.overlay.overlay_values`. It needs the inputs.

    The swapped program is verified against the original: the eager model when a Surgery
    knows it, else the original program. A check that cannot run (a replacement that raises)
    is shown on the page and in ``problem``, not raised.
    """
    ep, module, model, own_inputs = _unpack(program)
    info = swap_info(module) if module is not None else None
    swaps = info.swapped if info is not None else ()
    title = title or _model_name(ep)
    inputs, inputs_note = _choose_inputs(ep, args, kwargs, own_inputs)

    checks = verified = comparison = None
    skipped = problem = ""
    if swaps:
        if inputs is None:
            skipped = inputs_note
        else:
            verified, comparison, problem = _run_checks(ep, module, model, inputs, rtol, atol)
        checks = _checks_html(model, verified, comparison, skipped, problem, inputs_note)

    picture_html, missing = _picture_html(ep, module)
    overlay_html = None
    if overlay is not None:
        overlay_html = _overlay_html(ep, module, overlay, inputs, inputs_note, rtol, atol)
    sections = [
        ("program", "the program", _facts_html(ep, inputs, inputs_note)),
    ]
    if info is not None and info.calls:
        sections.append(("swaps", "swaps", _swaps_html(info, sources or {})))
    if checks is not None:
        sections.append(("checks", "verify and compare", checks))
    picture_title = "before / after" if info is not None and info.calls else "picture"
    sections.append(("picture", picture_title, picture_html))
    if overlay_html is not None:
        sections.append(("overlay", f"{overlay} overlay", overlay_html))
    sections.append(("tree", "module tree", _html_of(module_tree(ep))))
    sections.append(("notes", "export notes", _notes_html(ep)))

    page = _page(title, description, sections, verified, comparison, skipped, problem, swaps)
    return Report(
        title=title,
        html=page,
        swaps=swaps,
        verify=verified,
        comparison=comparison,
        skipped=skipped,
        problem=problem,
        picture=missing,
    )


# -- what the report is of ----------------------------------------------------------------


def _unpack(program: Any):
    """(the original ExportedProgram, the swapped GraphModule or None, the eager model or
    None, the inputs the object carries or None), as every entry point reads a program."""
    source = as_program(program, verb="report")
    own = None if source.args is None else (source.args, dict(source.kwargs or {}))
    return source.ep, source.module, getattr(source.surgery, "model", None), own


def _model_name(ep: ExportedProgram) -> str:
    tree = module_tree(ep)
    return tree.root.type_name or "program"


def _user_inputs(ep: ExportedProgram) -> list[tuple[str, Any]]:
    """(name, the example value torch recorded) of each user input placeholder, in order."""
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    return [
        (spec.arg.name if hasattr(spec.arg, "name") else str(spec.arg), node.meta.get("val"))
        for node, spec in zip(placeholders, ep.graph_signature.input_specs)
        if spec.kind.name == "USER_INPUT"
    ]


def _choose_inputs(ep, args, kwargs, own):
    """((args, kwargs), where they come from) or (None, why there are none)."""
    if args is not None:
        return as_inputs(args, kwargs, verb="report"), "the inputs given"
    if own is not None:
        return own, "the Surgery's example inputs"
    stored = ep.example_inputs
    if stored is not None:
        return (tuple(stored[0]), dict(stored[1])), "the example inputs stored in the program"
    made, why = _inputs_from_specs(ep)
    if made is None:
        return None, why
    return made, (
        "inputs made from the program's input shapes and dtypes (it stores no example "
        "inputs): normal floats (seed 0), zero integers, False bools"
    )


def _inputs_from_specs(ep: ExportedProgram):
    generator = torch.Generator().manual_seed(0)
    values = []
    for name, value in _user_inputs(ep):
        if not isinstance(value, torch.Tensor):
            return None, (
                f"the program stores no example inputs, and its input {name!r} is not a tensor "
                "to make one from; save the program with its example inputs "
                "(torch.export.export keeps them)"
            )
        if not all(isinstance(size, int) for size in value.shape):
            return None, (
                f"the program stores no example inputs, and its input {name!r} has dynamic "
                f"sizes ({describe_dynamic(ep)}); save the program with its example inputs "
                "(torch.export.export keeps them)"
            )
        shape = tuple(value.shape)
        if value.dtype.is_floating_point:
            made = torch.randn(shape, generator=generator).to(value.dtype)
        else:
            made = torch.zeros(shape, dtype=value.dtype)
        values.append(made)
    try:
        args, kwargs = pytree.tree_unflatten(values, ep.call_spec.in_spec)
    except (TypeError, ValueError, RuntimeError) as error:
        return None, f"the program stores no example inputs, and none could be made ({error})"
    return (tuple(args), dict(kwargs)), ""


def _run_checks(ep, module, model, inputs, rtol, atol):
    args, kwargs = inputs
    reference = model if model is not None else ep
    verified = comparison = None
    try:
        verified = verify(reference, module, args, kwargs, rtol=rtol, atol=atol)
        comparison = compare(ep, module, args, kwargs, rtol=rtol, atol=atol)
    except GraphSurgeonError as error:
        return verified, comparison, str(error)
    return verified, comparison, ""


# -- the sections -------------------------------------------------------------------------


def _html_of(result: Any) -> str:
    """A result object's notebook HTML (without the container each output has)."""
    html = getattr(result, "_repr_html_", None)
    if html is not None:
        return html()
    return result._repr_mimebundle_()["text/html"]


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    return a_type(value)


def _facts_html(ep: ExportedProgram, inputs, inputs_note: str) -> str:
    tree = module_tree(ep)
    swappable = sum(1 for _, info in tree.items() if info.swappable)
    parameters = sum(int(t.numel()) for t in ep.state_dict.values())
    computation = sum(
        1 for n in ep.graph.nodes if n.op in ("call_function", "call_module", "call_method")
    )
    rows = [
        ["model", tree.root.type_name],
        ["graph", f"{len(ep.graph.nodes):,} fx nodes ({computation:,} computation)"],
        ["modules", f"{len(tree):,} with the root, {swappable:,} of them swappable"],
        ["parameters and buffers", f"{parameters:,} elements"],
    ]
    names = [name for name, _ in _user_inputs(ep)]
    if inputs is not None:
        leaves = pytree.tree_leaves(inputs)
        shown = zip(names, leaves) if len(names) == len(leaves) else enumerate(leaves)
        described = ", ".join(f"{n}: {_describe_value(v)}" for n, v in shown)
        rows.append(["inputs", f"{described} ({inputs_note})"])
    else:
        rows.append(["inputs", ", ".join(names) or "none"])
    dynamic = describe_dynamic(ep)
    rows.append(["dynamic sizes", dynamic or "none (every size is static)"])
    return f'<div class="gs-facts">{d.table(["", ""], rows)}</div>'


def _swaps_html(info, sources: Mapping[str, str]) -> str:
    rows = []
    for call, module in info.calls.items():
        part = info.partitions.get(call)
        fused = call in info.fused
        if fused:
            replacement = "its own nodes (fused)"
        else:
            source = sources.get(call)
            replacement = type(module).__name__ + (f" ({source})" if source else "")
        parameters = 0 if fused else sum(p.numel() for p in module.parameters())
        rows.append(
            [
                d.badge("fused" if fused else "swapped", "info"),
                d.escape(call),
                d.escape(part.type_name if part else ""),
                f"{len(part.nodes):,}" if part else "",
                d.escape(replacement),
                f"{parameters:,}" if not fused else "",
            ]
        )
    headers = ["", "call", "original", "nodes replaced", "replacement", "its parameters"]
    diff = info.diff
    summary = (
        f'<div class="gs-muted">computation nodes against the original: {len(diff.removed):,} '
        f"removed, {len(diff.added):,} added, {len(diff.kept):,} kept</div>"
    )
    return d.table(headers, rows, numeric=(3, 5), raw=range(6)) + summary


def _checks_html(model, verified, comparison, skipped, problem, inputs_note) -> str:
    against = "the original eager model" if model is not None else "the original program"
    if skipped:
        return (
            f"<div>{d.badge('skipped', 'warn')} verify and compare did not run: "
            f"{d.escape(skipped)}</div>"
        )
    parts = [
        f'<div class="gs-muted">on {d.escape(inputs_note)}; the swapped program against '
        f"{against} (verify), and each replacement against the nodes it replaced, on the "
        "inputs it received (compare)</div>"
    ]
    if verified is not None:
        parts.append(f'<div class="gs-check">{_html_of(verified)}</div>')
    if comparison is not None:
        parts.append(f'<div class="gs-check">{_html_of(comparison)}</div>')
    if problem:
        which = "verify" if verified is None else "compare"
        parts.append(f"<div>{d.badge(f'{which} could not run', 'bad')} {d.escape(problem)}</div>")
    return "".join(parts)


def _picture_html(ep: ExportedProgram, module) -> tuple[str, str]:
    """The picture's HTML, and what is missing ('' when nothing)."""
    try:
        if module is None:
            drawing = draw(ep)
        else:
            drawing = draw(module, diff="split")
    except MissingDependencyError as missing:
        return f"<div>{d.badge('no picture', 'warn')} {d.escape(missing)}</div>", str(missing)
    note = ""
    if module is not None:
        note = (
            '<div class="gs-muted">the original (before/) and the swapped program (after/), '
            "aligned; what a swap removed is greyed, each replacement is one box</div>"
        )
    return note + drawing._repr_html_(), ""


OVERLAYS = ("error", "own error", "grad error", "own grad error", "latency")


def _overlay_html(ep, module, kind, inputs, inputs_note, rtol, atol) -> str:
    """The picture painted with an overlay, or why there is none."""
    if kind not in OVERLAYS:
        raise RenderError(
            f"overlay={kind!r}: expected one of {', '.join(map(repr, OVERLAYS))}, or None"
        )
    if module is None and kind != "latency":
        return f"<div>{d.badge('no overlay', 'warn')} {kind} needs swaps to compare</div>"
    if inputs is None:
        return f"<div>{d.badge('no overlay', 'warn')} {d.escape(inputs_note)}</div>"
    args, kwargs = inputs
    target = module if module is not None else ep
    try:
        values = overlay_values(target, args, kwargs, kind, rtol=rtol, atol=atol)
        drawing = draw(target, overlay=values)
    except MissingDependencyError as missing:
        return f"<div>{d.badge('no picture', 'warn')} {d.escape(missing)}</div>"
    except Exception as error:  # a replacement that raises: said on the page, as checks are
        return f"<div>{d.badge('overlay could not run', 'bad')} {d.escape(error)}</div>"
    return drawing._repr_html_()


def _notes_html(ep: ExportedProgram) -> str:
    notes = export_notes(ep)
    if notes is not None:
        body = _html_of(notes)
    else:
        body = (
            '<div class="gs-muted">No notes from gs.export: the program was exported by another '
            "tool (a program gs.export made carries its notes, also in a .pt2). What the program "
            "itself records follows.</div>"
        )
    preserved = [entry.fqn for entry in ep.module_call_graph if entry.fqn]
    tree = module_tree(ep)
    rows = [
        [fqn, info.type_name, info.reason]
        for fqn, info in tree.items()
        if fqn and not info.swappable and info.calls
    ]
    body += (
        f'<div class="gs-title">{len(preserved):,} module call signatures preserved in the '
        "program</div>"
    )
    if rows:
        body += d.table(["module not swappable", "type", "why"], rows)
    else:
        body += '<div class="gs-muted">every module that was called can be swapped</div>'
    return body


# -- the page -----------------------------------------------------------------------------


def _script_hash() -> str:
    digest = hashlib.sha256(d.picture_script().encode()).digest()
    return "sha256-" + base64.b64encode(digest).decode()


def _policy() -> str:
    """Nothing may be fetched, sent or framed; the one script that may run is the zoom."""
    return (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src '{_script_hash()}'; form-action 'none'; base-uri 'none'"
    )


def _verdict_badges(verified, comparison, skipped, problem, swaps) -> str:
    if not swaps:
        return d.badge("nothing swapped", "info")
    badges = [d.badge(f"{len(swaps)} swap{'s' if len(swaps) != 1 else ''}", "info")]
    if verified is not None:
        badges.append(
            d.badge("verify: match", "ok") if verified else d.badge("verify: MISMATCH", "bad")
        )
    if comparison is not None:
        first = comparison.first_divergence
        badges.append(
            d.badge(f"first divergence: {first}", "bad")
            if first
            else d.badge("no call diverges", "ok")
        )
    if problem:
        badges.append(d.badge("a check could not run", "bad"))
    elif skipped:
        badges.append(d.badge("checks skipped", "warn"))
    return " ".join(badges)


def _page(title, description, sections, verified, comparison, skipped, problem, swaps) -> str:
    from . import __version__

    nav = "".join(f'<a href="#{key}">{d.escape(name)}</a>' for key, name, _ in sections)
    body = "".join(
        f'<section id="{key}"><h2>{d.escape(name)}</h2>{html}</section>'
        for key, name, html in sections
    )
    about = f"<p>{d.escape(description)}</p>" if description else ""
    badges = _verdict_badges(verified, comparison, skipped, problem, swaps)
    footer = (
        f"<footer>graphsurgeon {d.escape(__version__)}, torch {d.escape(torch.__version__)}. "
        "This file loads nothing from any network.</footer>"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_policy()}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{d.escape(title)} · graphsurgeon report</title>\n"
        f"{_PAGE_STYLE}\n</head>\n<body>\n"
        f'<div class="gs-out gs-page">{d.STYLE}'
        f"<h1>{d.escape(title)}</h1><div>{badges}</div>{about}<nav>{nav}</nav>"
        f"{body}{footer}</div>\n</body></html>\n"
    )
