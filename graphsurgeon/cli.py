"""The ``graphsurgeon`` command: ``demo``, ``modules``, ``render`` and ``report``.

Exit codes: 0 success, 1 the command ran and found a problem (a mismatch), 2 bad usage, an
unreadable program file or an output that cannot be written; errors are one line on standard
error, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

from .errors import GraphSurgeonError

__all__ = ["main"]


def _load_program(path_text: str):
    import torch

    path = Path(path_text)
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as error:  # a name too long, a loop of links: the path cannot be looked at
        raise SystemExit(_fail(f"{path}: cannot read ({error.strerror or error})")) from None
    if not exists:
        raise SystemExit(_fail(f"{path}: no such file"))
    if is_dir:
        raise SystemExit(_fail(f"{path}: is a directory, expected a .pt2 file"))
    if path.suffix != ".pt2":
        raise SystemExit(
            _fail(
                f"{path}: expected a .pt2 file saved with torch.export.save, got {path.suffix or 'no suffix'!r}"
            )
        )
    # torch logs the whole traceback of a file it cannot read before raising; the one-line
    # error below says it all, so its logger stays quiet while loading.
    logger = logging.getLogger("torch.export")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        return torch.export.load(str(path))
    except Exception as error:
        first = (str(error).strip().splitlines() or [""])[0]
        raise SystemExit(
            _fail(f"{path}: not a readable torch.export program ({type(error).__name__}: {first})")
        ) from None
    finally:
        logger.setLevel(level)


def _fail(message: str) -> int:
    print(f"graphsurgeon: error: {message}", file=sys.stderr)
    return 2


class _OutputFailed(Exception):
    """Standard output cannot be written (a full disk, a closed file): reported by main."""

    def __init__(self, error: OSError):
        super().__init__(error)
        self.error = error


def _out(text: str = "", end: str = "\n") -> None:
    """print() for a command's output: a write that fails is reported once, by main."""
    try:
        sys.stdout.write(text + end)
        sys.stdout.flush()  # a full disk shows at the flush: here, not at interpreter exit
    except BrokenPipeError:
        raise  # the reader went away (| head): main ends quietly
    except OSError as error:
        raise _OutputFailed(error) from None


def _silence_stdout() -> None:
    # What could not be written stays in the buffer, and the interpreter would try (and fail,
    # loudly) to flush it at exit: point the real standard output at the null device.
    if sys.stdout is not sys.__stdout__:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def _cmd_modules(options) -> int:
    import graphsurgeon as gs

    ep = _load_program(options.program)
    _out(gs.module_tree(ep).table())
    return 0


# Output formats of ``render``, by file suffix: DOT text, or a layout by graphviz's dot.
_RENDER_FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}


def _parse_collapse(text: str):
    """``auto`` | ``none`` | a depth | comma-separated module names."""
    if text == "auto":
        return "auto"
    if text == "none":
        return None
    if re.fullmatch(r"[0-9]+", text):  # str.isdigit() also takes '²', which int() refuses
        return int(text)
    return {name.strip() for name in text.split(",") if name.strip()}


def _cmd_render(options) -> int:
    from graphsurgeon import render

    output = options.output
    format_ = "dot"
    if output is not None and output != "-":
        suffix = Path(output).suffix.lower()
        format_ = _RENDER_FORMATS.get(suffix)
        if format_ is None:
            known = ", ".join(sorted(_RENDER_FORMATS))
            return _fail(
                f"{output}: unknown output format {suffix or '(no suffix)'!r}; use {known}"
            )
    ep = _load_program(options.program)
    highlight = [n.strip() for value in options.highlight for n in value.split(",") if n.strip()]
    try:
        view = render.graph_view(
            ep,
            highlight=highlight,
            collapse=_parse_collapse(options.collapse),
            max_nodes=options.max_nodes,
            show_parameters=options.show_parameters,
        )
        data = view.dot.encode() if format_ == "dot" else render._layout(view.dot, format_)
    except GraphSurgeonError as error:
        return _fail(str(error))
    if output is None or output == "-":
        _out(data.decode(), end="")
        return 0
    try:
        Path(output).write_bytes(data)
    except OSError as error:
        return _fail(f"{output}: cannot write ({error.strerror or error})")
    collapsed = f", {len(view.collapsed)} modules collapsed" if view.collapsed else ""
    print(
        f"{output}: {view.drawn_nodes} nodes drawn of {view.graph_nodes} in the program{collapsed}",
        file=sys.stderr,
    )
    return 0


_SWAP_FORM = "NAME=MODULE:ATTR, as in --swap layers.1.attn=my_kernels:FusedAttention"

_SWAP_HELP = """\
Each --swap NAME=MODULE:ATTR replaces the module NAME of the program (a name that
`graphsurgeon modules` lists; NAME@K for its call K alone) by the attribute ATTR of the
Python module MODULE, imported as `python -m` would: from the current directory first, then
sys.path (PYTHONPATH). ATTR may be dotted (Outer.attr). What it is decides what is swapped in:

  an nn.Module instance      used as it is;
  a class or a function      called with no arguments, or, when it takes one, with the
                             program's original module NAME, rebuilt from the program: a plain
                             nn.Module holding copies of its parameters and buffers under their
                             names (original.q.weight), that runs as the program ran it. Its
                             submodules are not of the model's classes (no in_features).

The swapped program is then checked against the original program on the example inputs the
.pt2 keeps (torch.export.save stores them; without them, inputs are made from the input
shapes): verify (the outputs) and compare (each replacement against the nodes it replaced).
Without --swap the report shows the program alone: module tree, picture, export notes.

Exit status: 0 written and every check matches, 1 written and a check found a mismatch (or a
replacement failed to run), 2 bad usage, an unreadable program, a --swap that cannot be
loaded or swapped, or a report that cannot be written.
"""


def _parse_swap(spec: str) -> tuple[str, str, str]:
    """A ``--swap`` value as (name, Python module, attribute); exit 2 when it is not one.

    >>> _parse_swap("layers.1.attn=my_kernels:FusedAttention")
    ('layers.1.attn', 'my_kernels', 'FusedAttention')
    >>> _parse_swap("blocks.a=b=kernels:Outer.make")  # a ModuleDict key may hold "="
    ('blocks.a=b', 'kernels', 'Outer.make')
    """
    # at the last "=": MODULE:ATTR has none, a module name may (ModuleDict keys are any text)
    name, equals, target = spec.rpartition("=")
    name, target = name.strip(), target.strip()
    if not equals or not name:
        raise SystemExit(_fail(f"--swap {spec}: expected {_SWAP_FORM}"))
    module_name, colon, attribute = target.partition(":")
    module_name, attribute = module_name.strip(), attribute.strip()
    if not colon or not module_name or not attribute:
        given = f"{target!r} is not MODULE:ATTR" if target else "nothing after '='"
        raise SystemExit(_fail(f"--swap {spec}: {given}; expected {_SWAP_FORM}"))
    return name, module_name, attribute


def _import_from_here(spec: str, module_name: str):
    """Import ``module_name`` with the current directory first on sys.path, as ``python -m``
    does (a console script's sys.path starts with its own folder instead)."""
    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise SystemExit(
                _fail(
                    f"--swap {spec}: no Python module {module_name!r} in the current directory "
                    "or on sys.path; run from the folder that holds it, or add that folder to "
                    "PYTHONPATH"
                )
            ) from None
        raise SystemExit(
            _fail(f"--swap {spec}: importing {module_name!r} failed: {_first_line(error)}")
        ) from None
    except Exception as error:  # its own code raised (a SyntaxError, an ImportError, ...)
        raise SystemExit(
            _fail(f"--swap {spec}: importing {module_name!r} failed: {_first_line(error)}")
        ) from None
    finally:
        sys.path[:] = saved


def _first_line(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _required_arguments(factory) -> int | None:
    """How many arguments ``factory`` needs (None: it needs keyword-only ones)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no readable signature (a builtin): call it bare
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.default is inspect.Parameter.empty]
    if any(p.kind == inspect.Parameter.KEYWORD_ONLY for p in required):
        return None
    return sum(1 for p in required if p.kind in positional)


def _replacement(spec: str, program, rebuilt: dict):
    """(the name, the module ``--swap spec`` names, made as _SWAP_HELP says, and
    ``MODULE:ATTR``)."""
    import torch

    from graphsurgeon.errors import did_you_mean

    name, module_name, attribute = _parse_swap(spec)
    value = _import_from_here(spec, module_name)
    where = module_name
    for part in attribute.split("."):
        if not hasattr(value, part):
            choices = [n for n in dir(value) if not n.startswith("_")]
            raise SystemExit(
                _fail(
                    f"--swap {spec}: {where} has no attribute {part!r}.{did_you_mean(part, choices)}"
                )
            )
        value, where = getattr(value, part), f"{where}.{part}"
    source = f"{module_name}:{attribute}"
    if isinstance(value, torch.nn.Module):
        return name, value, source
    if not callable(value):
        raise SystemExit(
            _fail(
                f"--swap {spec}: {source} is {_a(value)}; expected an nn.Module, or a class or "
                "function that returns one"
            )
        )
    needed = _required_arguments(value)
    if needed is None or needed > 1:
        raise SystemExit(
            _fail(
                f"--swap {spec}: {source} needs {'keyword' if needed is None else needed} "
                "arguments; --swap calls it with none, or with the original module: give it "
                "defaults, or write a function of no arguments that builds the replacement"
            )
        )
    call = f"{source}()" if needed == 0 else f"{source}(original)"
    try:
        made = value() if needed == 0 else value(_original_module(spec, program, name, rebuilt))
    except SystemExit:
        raise
    except Exception as error:
        raise SystemExit(_fail(f"--swap {spec}: {call} raised {_first_line(error)}")) from None
    if not isinstance(made, torch.nn.Module):
        raise SystemExit(_fail(f"--swap {spec}: {call} returned {_a(made)}; expected an nn.Module"))
    return name, made, source


def _a(value) -> str:
    from graphsurgeon.errors import a_type

    return a_type(value)


def _original_module(spec: str, program, name: str, rebuilt: dict):
    """The program's module ``name`` rebuilt as a plain nn.Module (the hierarchy is rebuilt
    once for all the --swap options that need it)."""
    from graphsurgeon._hierarchy import rebuild_hierarchy
    from graphsurgeon.errors import did_you_mean

    fqn = name.partition("@")[0]
    if "hierarchy" not in rebuilt:
        try:
            rebuilt["hierarchy"] = rebuild_hierarchy(program, {})[0]
        except GraphSurgeonError as error:
            raise SystemExit(
                _fail(f"--swap {spec}: the original module cannot be rebuilt to pass it: {error}")
            ) from None
    hierarchy = rebuilt["hierarchy"]
    try:
        return hierarchy.get_submodule(fqn) if fqn else hierarchy
    except AttributeError:
        names = [n for n, _ in hierarchy.named_modules() if n]
        raise SystemExit(
            _fail(f"--swap {spec}: the program has no module {fqn!r}.{did_you_mean(fqn, names)}")
        ) from None


def _tolerance(text: str) -> float:
    """A tolerance option: a finite number >= 0 (argparse's own type error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; use e.g. 1e-5") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: use a finite number >= 0, e.g. 1e-5")
    return value


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e6 else f"{max(1, round(count / 1e3))} KB"


def _cmd_report(options) -> int:
    import graphsurgeon as gs
    from graphsurgeon.report import build_report

    names = [_parse_swap(spec)[0] for spec in options.swap]  # the forms, before the slow load
    for spec, name in zip(options.swap, names):
        if names.count(name) > 1:
            return _fail(f"--swap {spec}: {name!r} is swapped twice; give one --swap per module")
    program = _load_program(options.program)
    surgery = gs.Surgery(program)
    sources: dict[str, str] = {}
    rebuilt: dict = {}
    for spec in options.swap:
        name, replacement, sources[name] = _replacement(spec, program, rebuilt)
        try:
            surgery.swap(name, replacement)
        except GraphSurgeonError as error:
            # on the command line, the command line's way to list the modules
            listing = f"`graphsurgeon modules {options.program}`"
            return _fail(f"--swap {spec}: {str(error).replace('gs.module_tree(ep)', listing)}")
    title = (
        options.title or f"{gs.module_tree(program).root.type_name} ({Path(options.program).name})"
    )
    report = build_report(
        surgery, title=title, sources=sources, rtol=options.rtol, atol=options.atol
    )
    to_stdout = options.output == "-"
    if to_stdout:
        _out(report.html, end="")
    else:
        try:
            report.save(options.output)
        except OSError as error:
            return _fail(f"{options.output}: cannot write ({error.strerror or error})")
    shown = ["the module tree"]
    if not report.picture:  # else the summary below says why there is none
        shown.append("the before/after picture" if surgery.replacements else "the picture")
    if report.verify is not None:
        shown.append("verify and compare")
    shown.append("export notes")
    lines = [
        f"{'report' if to_stdout else options.output}: {_size(len(report.html.encode()))}, "
        f"{', '.join(shown)}",
        *report.summary(),
    ]
    for line in lines:
        if to_stdout:
            print(line, file=sys.stderr)
        else:
            _out(line)
    return 0 if report.ok else 1


# The demo swaps layers.1.attn (so 2 at least) and builds the model on the spot (a bound keeps
# a typo such as --layers 40000 from filling the memory).
_DEMO_LAYERS = (2, 64)
# Under out/, which a checkout of graphsurgeon ignores (the screenshots of the tests go there).
_DEMO_REPORT = os.path.join("out", "demo-report.html")


def _cmd_demo(options) -> int:
    import torch

    import graphsurgeon as gs
    from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT

    if not _DEMO_LAYERS[0] <= options.layers <= _DEMO_LAYERS[1]:
        return _fail(
            f"--layers {options.layers}: the demo swaps the attention of layers.1, so it needs "
            f"{_DEMO_LAYERS[0]} to {_DEMO_LAYERS[1]} layers (the default is 4)"
        )
    if options.rounds < 1:
        return _fail(f"--rounds {options.rounds}: the forward is timed over at least 1 round")
    torch.manual_seed(0)
    model = TinyGPT(n_layers=options.layers).eval()
    tokens = model.example_input()
    _out(f"model: TinyGPT, {options.layers} layers, hidden 64; input tokens {list(tokens.shape)}")

    start = time.perf_counter()
    ep = gs.export(model, (tokens,))
    export_s = time.perf_counter() - start
    tree = gs.module_tree(ep)
    _out(
        f"exported: {len(ep.graph.nodes)} graph nodes, {len(tree) - 1} modules in {export_s:.2f} s\n"
    )
    _out(tree.table())

    replacements = {"layers.1.attn": FusedAttention(model.layers[1].attn)}
    _out(
        "\nswap: layers.1.attn (Attention, written out) -> FusedAttention (scaled_dot_product_attention)"
    )
    start = time.perf_counter()
    swapped = gs.swap(ep, replacements)
    swap_s = time.perf_counter() - start
    info = gs.swap_info(swapped)
    for call, node in info.call_nodes.items():
        removed = len(info.partitions[call].nodes)
        _out(f"  {call}: {removed} graph nodes -> one call ({node}) in {swap_s * 1e3:.1f} ms")

    reference = gs.eager_reference(model, replacements)
    report = gs.verify(reference, swapped, (tokens,))
    _out("\nswapped program vs eager model with the same replacement:")
    _out("  " + str(report).replace("\n", "\n  "))
    against_original = gs.verify(model, swapped, (tokens,), rtol=1e-4, atol=1e-5)
    _out("swapped program vs the original model (is the fused attention equivalent?):")
    _out("  " + str(against_original).replace("\n", "\n  "))

    approx = {"layers.3.mlp": GeluTanhMLP(model.layers[3].mlp)} if options.layers > 3 else {}
    ok = bool(report) and bool(against_original)
    if approx:
        _out("\nswap: layers.3.mlp -> GeluTanhMLP (tanh approximation of GELU: close, not equal)")
        drifted = gs.swap(ep, {**replacements, **approx})
        drift = gs.verify(model, drifted, (tokens,))
        _out("  " + str(drift).replace("\n", "\n  "))
        _out("  (a mismatch is expected here: verify reports it instead of raising)")

    with torch.no_grad():
        # interleaved runs, medians: drift on a busy machine hits both alike
        runs: dict[str, list[float]] = {"eager": [], "swapped": []}
        for _ in range(5):
            reference(tokens), swapped(tokens)
        for _ in range(options.rounds):
            for name, module in (("eager", reference), ("swapped", swapped)):
                start = time.perf_counter()
                module(tokens)
                runs[name].append(time.perf_counter() - start)
        timings = {name: statistics.median(values) for name, values in runs.items()}
    _out(
        f"\ntimings: export {export_s:.2f} s, swap {swap_s * 1e3:.1f} ms, forward "
        f"{timings['swapped'] * 1e3:.2f} ms (eager reference {timings['eager'] * 1e3:.2f} ms, "
        f"ratio {timings['swapped'] / timings['eager']:.2f}x)"
    )

    surgery = gs.Surgery(ep, model=model, args=(tokens,))
    for name, replacement in {**replacements, **approx}.items():
        surgery.swap(name, replacement)
    description = (
        f"TinyGPT, {options.layers} layers, hidden 64, exported by the graphsurgeon demo. "
        "layers.1.attn is swapped for FusedAttention (scaled_dot_product_attention, the same "
        "computation)"
        + (
            "; layers.3.mlp for GeluTanhMLP (the tanh approximation of GELU: close, not equal, "
            "so verify reports a mismatch and compare shows that it starts there)."
            if approx
            else "."
        )
    )
    written = _write_demo_report(surgery, options.report, options.layers, description)
    if written is None:
        return 2
    _out(
        f"\nreport: {options.report} ({written}): the module tree, the before/after picture, "
        "verify and compare, export notes; one HTML file, open it in a browser"
    )
    _out("tutorials: `make lab` (in a checkout of graphsurgeon) opens the notebooks in JupyterLab")
    return 0 if ok else 1


def _write_demo_report(surgery, path_text: str, layers: int, description: str) -> str | None:
    """Write the demo's report; its size as text, or None (the error said) if it cannot."""
    from graphsurgeon.report import build_report

    # the tolerances of the demo's check against the original model (fused attention rounds
    # differently, within 1e-4)
    report = build_report(
        surgery,
        title=f"graphsurgeon demo: TinyGPT, {layers} layers",
        description=description,
        rtol=1e-4,
        atol=1e-5,
    )
    path = Path(path_text)
    try:
        if not path.parent.exists():  # out/ the first time (a file there: the write says so)
            path.parent.mkdir(parents=True)
        report.save(path)
    except OSError as error:
        _fail(
            f"{path}: cannot write the report ({error.strerror or error}); choose another file with --report"
        )
        return None
    return _size(len(report.html.encode()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="graphsurgeon",
        description="Swap modules of torch.export programs for eager code, and check the result.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="export a built-in transformer, swap a layer, verify, write a report"
    )
    demo.add_argument("--layers", type=int, default=4, help="decoder layers, 2 to 64 (default 4)")
    demo.add_argument(
        "--rounds", type=int, default=100, help="timed forward runs of each model (default 100)"
    )
    demo.add_argument(
        "-o",
        "--report",
        default=_DEMO_REPORT,
        metavar="FILE",
        help=f"the HTML report written at the end (default {_DEMO_REPORT})",
    )
    demo.set_defaults(run=_cmd_demo)

    modules = commands.add_parser("modules", help="the module tree of a .pt2 program as a table")
    modules.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    modules.set_defaults(run=_cmd_modules)

    render = commands.add_parser(
        "render",
        help="draw a .pt2 program with its module partitions (SVG, PNG, PDF or DOT)",
        description="Draw a program saved with torch.export.save, one cluster per module.",
    )
    render.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    render.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="out.svg, out.png, out.pdf or out.dot (default: DOT text on standard output)",
    )
    render.add_argument(
        "--collapse",
        default="auto",
        metavar="WHAT",
        help="modules drawn as one box: auto (default: at most --max-nodes nodes), none, a "
        "depth (1: every top-level module), or comma-separated module names",
    )
    render.add_argument(
        "--highlight",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module to make stand out (repeat, or separate names with commas)",
    )
    render.add_argument(
        "--max-nodes", type=int, default=300, help="the node budget of --collapse auto (300)"
    )
    render.add_argument(
        "--show-parameters", action="store_true", help="draw parameters as nodes of their own"
    )
    render.set_defaults(run=_cmd_render)

    report = commands.add_parser(
        "report",
        help="one self-contained HTML page of a .pt2 program, with swaps checked",
        description="Write one HTML file (it loads nothing from any network) of a program\n"
        "saved with torch.export.save: the module tree, the picture (before/after with --swap,\n"
        "zoomable), verify and compare of the swaps, and the export notes.",
        epilog=_SWAP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    report.add_argument(
        "--swap",
        action="append",
        default=[],
        metavar="NAME=MODULE:ATTR",
        help="replace module NAME by MODULE.ATTR: an nn.Module, or a class or function called "
        "with no arguments or with the original module (repeat for more; see below)",
    )
    report.add_argument(
        "-o",
        "--output",
        default="report.html",
        metavar="FILE",
        help="the HTML file to write (default: report.html; - for standard output)",
    )
    report.add_argument("--title", help="the page's title (default: the model type and file)")
    report.add_argument(
        "--rtol", type=_tolerance, default=1e-5, help="relative tolerance of the checks (1e-5)"
    )
    report.add_argument(
        "--atol", type=_tolerance, default=1e-5, help="absolute tolerance of the checks (1e-5)"
    )
    report.set_defaults(run=_cmd_report)

    options = parser.parse_args(argv)
    try:
        return options.run(options)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except _OutputFailed as failed:
        _silence_stdout()
        reason = failed.error.strerror or str(failed.error)
        return _fail(f"cannot write to standard output ({reason}); redirect it to a file with room")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
