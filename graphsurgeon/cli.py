"""The ``graphsurgeon`` command: ``demo``, ``modules``, ``render`` and ``report``.

Exit codes: 0 success, 1 the command ran and found a problem (a mismatch), 2 bad usage, an
unreadable program file, one that needs ``--trust-file`` (a .pt2 is code: see ``_TRUST_NOTE``)
or an output that cannot be written; errors are one line on standard error, without a
traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

from ._load import CannotLoad, import_from_here, load_program
from ._load import first_line as _first_line
from .errors import GraphSurgeonError

__all__ = ["main"]


# -- what the options say -------------------------------------------------------------------

# A .pt2 is code: see graphsurgeon._load, which reads it weights-only unless told to trust it.
_TRUST_NOTE = """\
A .pt2 file is code: torch.export.load unpickles what it holds, and a pickle can run any
Python. graphsurgeon loads it weights-only (tensors and plain values) and refuses a file that
needs more (pickled Python objects, compiled AOTInductor code) with exit status 2, unless
given --trust-file: only for a file you trust as you would a program.
"""

_TRUST_HELP = (
    "load the .pt2 as torch.export.load does, running any pickled Python or compiled code it "
    "holds: only for a file you trust as you would a program"
)

_IMPORT_HELP = (
    "import the Python module MODULE first (from the current directory, then sys.path), for a "
    "program whose specs name a type it registers with torch's pytree (repeat for more)"
)


def _load_program(path_text: str, *, trust: bool = False, imports: list[str] = ()):
    """The ExportedProgram in the file ``path_text`` (:func:`graphsurgeon._load.load_program`);
    exit 2 with its one line when it cannot be read, or, unless ``trust``, when reading it could
    run code from it."""
    try:
        return load_program(path_text, trust=trust, imports=imports)
    except CannotLoad as refusal:
        raise SystemExit(_fail(str(refusal))) from None


def _import_from_here(option: str, module_name: str):
    """Import ``module_name`` as ``python -m`` would (:func:`graphsurgeon._load.import_from_here`);
    exit 2 with one line that starts with ``option`` when it cannot be."""
    try:
        return import_from_here(option, module_name)
    except CannotLoad as refusal:
        raise SystemExit(_fail(str(refusal))) from None


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

    ep = _load_program(options.program, trust=options.trust_file, imports=options.imports)
    _out(gs.module_tree(ep).table())
    return 0


def _check_output(output: str, suffixes, program: str) -> None:
    """Exit 2 with one line unless a command that reads ``program`` may write ``output``: not
    the program file itself (by any path to it: a link, another spelling), and named with one
    of ``suffixes`` (checked without regard to case)."""
    try:
        same = Path(output).exists() and os.path.samefile(output, program)
    except (OSError, ValueError):  # the program is missing or unreadable: its load says so
        same = False
    if same:
        alias = "" if os.path.abspath(output) == os.path.abspath(program) else ", by another path"
        raise SystemExit(
            _fail(
                f"{output}: is the program file {program} itself{alias}; writing it would "
                "overwrite the program: choose another output file"
            )
        )
    suffix = Path(output).suffix.lower()
    if suffix not in suffixes:
        known = ", ".join(sorted(suffixes))
        raise SystemExit(
            _fail(
                f"{output}: unknown output format {suffix or '(no suffix)'!r}; use {known} "
                "(or - for standard output)"
            )
        )


# Output formats of ``render``, by file suffix: DOT text, or a layout by graphviz's dot.
_RENDER_FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}

# What ``report -o`` writes: one HTML file.
_REPORT_SUFFIXES = (".html",)


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
    to_stdout = output is None or output == "-"
    if not to_stdout:
        _check_output(output, _RENDER_FORMATS, options.program)
    format_ = "dot" if to_stdout else _RENDER_FORMATS[Path(output).suffix.lower()]
    ep = _load_program(options.program, trust=options.trust_file, imports=options.imports)
    highlight = [n.strip() for value in options.highlight for n in value.split(",") if n.strip()]
    try:
        view = render.graph_view(
            ep,
            highlight=highlight,
            collapse=_parse_collapse(options.collapse),
            max_nodes=options.max_nodes,
            show_parameters=options.show_parameters,
        )
        data = view.dot.encode() if format_ == "dot" else view.laid_out(format_)
    except GraphSurgeonError as error:
        return _fail(str(error))
    if to_stdout:
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
                             names (original.q.weight), that runs as the program ran it. It and
                             its submodules are not of the model's classes: a program keeps no
                             other attribute (no n_heads, config, in_features, methods). For
                             those, write a function that builds the real module and loads
                             the program's weights into it:
                               def build(original):
                                   real = T5Attention(config)
                                   real.load_state_dict(original.state_dict())
                                   return MyAttention(real)

The swapped program is then checked against the original program on the example inputs the
.pt2 keeps (torch.export.save stores them; without them, inputs are made from the input
shapes): verify (the outputs) and compare (each replacement against the nodes it replaced).
Without --swap the report shows the program alone: module tree, picture, export notes.

Exit status: 0 written and every check matches, 1 written and a check found a mismatch (or a
replacement failed to run), 2 bad usage, an unreadable program (or one that needs
--trust-file, below), a --swap that cannot be loaded or swapped, or a report that cannot be
written (or would overwrite the program, or is not .html).
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


def _replacement(spec: str, surgery, listing: str):
    """(the name, the module ``--swap spec`` names, made as _SWAP_HELP says, and
    ``MODULE:ATTR``)."""
    import torch

    from graphsurgeon.errors import did_you_mean

    name, module_name, attribute = _parse_swap(spec)
    value = _import_from_here(f"--swap {spec}", module_name)
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
        made = value() if needed == 0 else value(_original_module(spec, surgery, name, listing))
    except SystemExit:
        raise
    except AttributeError as error:
        rebuilt_as = getattr(type(error.obj), "_rebuilt_as", None)
        if rebuilt_as is None or not error.name or error.name.startswith("__"):
            # not an attribute a rebuilt module lacks (see _Rebuilt): said as it is
            raise SystemExit(_fail(f"--swap {spec}: {call} raised {_first_line(error)}")) from None
        missing = _missing_attribute(rebuilt_as, error.name, reader=call)
        raise SystemExit(_fail(f"--swap {spec}: {missing}")) from None
    except Exception as error:
        raise SystemExit(_fail(f"--swap {spec}: {call} raised {_first_line(error)}")) from None
    if not isinstance(made, torch.nn.Module):
        raise SystemExit(_fail(f"--swap {spec}: {call} returned {_a(made)}; expected an nn.Module"))
    return name, made, source


def _a(value) -> str:
    from graphsurgeon.errors import a_type

    return a_type(value)


@dataclasses.dataclass(frozen=True)
class _RebuiltAs:
    """What a module of an original that --swap passes is, for the message of an attribute it
    lacks."""

    fqn: str  # its name in the program
    type_name: str  # its type as the program recorded it ('' when it did not)
    path: str  # how the replacement's code reaches it: "original", "original.q"
    swapped_type: str  # the recorded type of the swapped module, the one to build for real
    swap: tuple[str, str, str]  # the --swap's (name, module, attribute)


class _Rebuilt:
    """Mixed into the class of each module of an original that --swap passes: an attribute
    that the module rebuilt from the program does not have (the real module's ``n_heads``,
    ``config``, a method) raises an AttributeError that names it and says how to pass it,
    when the replacement is built and when it runs."""

    _rebuilt_as: _RebuiltAs

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") and name.endswith("__"):
                raise  # a protocol asked (copy, pickle): "no" is its answer, not an error
            message = _missing_attribute(type(self)._rebuilt_as, name)
            raise AttributeError(message, name=name, obj=self) from None


def _missing_attribute(rebuilt_as: _RebuiltAs, name: str, reader: str = "") -> str:
    """The one line for an attribute ``name`` that a rebuilt original does not have, and how
    to give the replacement the real module instead, with the program's weights."""
    swap_name, module_name, attribute = rebuilt_as.swap
    reader = reader or f"the replacement made by {module_name}:{attribute}"
    real = rebuilt_as.swapped_type.rpartition(".")[2] or "TheModule"
    recorded = f" ({rebuilt_as.type_name})" if rebuilt_as.type_name else ""
    return (
        f"{reader} reads {rebuilt_as.path}.{name}, which {rebuilt_as.fqn}{recorded} rebuilt from "
        "the program does not have: a .pt2 keeps a module's parameters, buffers and submodules, "
        "not its other attributes; build the real module in a function of yours and load the "
        f"program's weights into it, def build(original): real = {real}(config); "
        f"real.load_state_dict(original.state_dict()); return {attribute}(real), as --swap "
        f"{swap_name}={module_name}:build"
    )


def _explain_missing_attributes(original, fqn: str, program, swap: tuple[str, str, str]):
    """Give each module of ``original`` (the program's module ``fqn``, rebuilt for ``swap``) a
    class of its own that says what it lacks (see _Rebuilt); ``original`` is a copy of the
    command's own (:meth:`graphsurgeon.Surgery.original`), nothing else holds it."""
    import graphsurgeon as gs

    tree = gs.module_tree(program)

    def recorded(name: str) -> str:
        return tree[name].qualified_type if name in tree else ""

    for sub, module in original.named_modules():
        kind = type(module)
        full = f"{fqn}.{sub}" if sub else fqn
        path = f"original.{sub}" if sub else "original"
        rebuilt_as = _RebuiltAs(full, recorded(full), path, recorded(fqn), swap)
        namespace = {"_rebuilt_as": rebuilt_as, "__module__": kind.__module__}
        module.__class__ = type(kind.__name__, (_Rebuilt, kind), namespace)


def _original_module(spec: str, surgery, name: str, listing: str):
    """The program's module ``name`` as the Surgery has it (:meth:`graphsurgeon.Surgery.original`:
    rebuilt from the program once, a copy of its own for each --swap), whose missing attributes
    say so."""
    from graphsurgeon.errors import UnknownNameError

    try:
        original = surgery.original(name)
    except UnknownNameError as error:
        # on the command line, the command line's way to list the modules
        raise SystemExit(
            _fail(f"--swap {spec}: {str(error).replace('gs.module_tree(ep)', listing)}")
        ) from None
    except GraphSurgeonError as error:
        raise SystemExit(
            _fail(f"--swap {spec}: the original module cannot be rebuilt to pass it: {error}")
        ) from None
    fqn = name.partition("@")[0]
    _explain_missing_attributes(original, fqn, surgery.program, _parse_swap(spec))
    return original


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
    if options.output != "-":
        _check_output(options.output, _REPORT_SUFFIXES, options.program)
    program = _load_program(options.program, trust=options.trust_file, imports=options.imports)
    surgery = gs.Surgery(program)
    sources: dict[str, str] = {}
    # on the command line, the command line's way to list the modules
    listing = f"`graphsurgeon modules {options.program}`"
    for spec in options.swap:
        name, replacement, sources[name] = _replacement(spec, surgery, listing)
        try:
            surgery.swap(name, replacement)
        except GraphSurgeonError as error:
            return _fail(f"--swap {spec}: {str(error).replace('gs.module_tree(ep)', listing)}")
    title = (
        options.title or f"{gs.module_tree(program).root.type_name} ({Path(options.program).name})"
    )
    report = build_report(
        surgery,
        title=title,
        sources=sources,
        rtol=options.rtol,
        atol=options.atol,
        overlay=options.overlay.replace("-", " ") if options.overlay else None,
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
    from graphsurgeon.checks.verify import eager_reference
    from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT
    from graphsurgeon.swap import swap_info

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
    info = swap_info(swapped)
    for call, node in info.call_nodes.items():
        removed = len(info.partitions[call].nodes)
        _out(f"  {call}: {removed} graph nodes -> one call ({node}) in {swap_s * 1e3:.1f} ms")

    reference = eager_reference(model, replacements)
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


def _add_reading_options(command: argparse.ArgumentParser) -> None:
    """The options of every command that reads a program: what it may import and run."""
    command.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=_IMPORT_HELP,
    )
    command.add_argument("--trust-file", action="store_true", help=_TRUST_HELP)


def main(argv: list[str] | None = None) -> int:
    """Run the ``graphsurgeon`` command on ``argv`` (default: the command line); returns the
    exit code (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="graphsurgeon",
        description="Swap modules of torch.export programs for eager code, and check the result.",
        epilog=_TRUST_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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

    modules = commands.add_parser(
        "modules",
        help="the module tree of a .pt2 program as a table",
        description="Print the module tree of a program saved with torch.export.save: calls, "
        "nodes, swappable or why not.",
        epilog=_TRUST_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modules.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    _add_reading_options(modules)
    modules.set_defaults(run=_cmd_modules)

    render = commands.add_parser(
        "render",
        help="draw a .pt2 program with its module partitions (SVG, PNG, PDF or DOT)",
        description="Draw a program saved with torch.export.save, one cluster per module.",
        epilog=_TRUST_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    _add_reading_options(render)
    render.set_defaults(run=_cmd_render)

    report = commands.add_parser(
        "report",
        help="one self-contained HTML page of a .pt2 program, with swaps checked",
        description="Write one HTML file (it loads nothing from any network) of a program\n"
        "saved with torch.export.save: the module tree, the picture (before/after with --swap,\n"
        "zoomable), verify and compare of the swaps, and the export notes.",
        epilog=f"{_SWAP_HELP}\n{_TRUST_NOTE}",
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
        help="the HTML file to write, never the program itself (default: report.html; - for "
        "standard output)",
    )
    report.add_argument("--title", help="the page's title (default: the model type and file)")
    report.add_argument(
        "--rtol", type=_tolerance, default=1e-5, help="relative tolerance of the checks (1e-5)"
    )
    report.add_argument(
        "--atol", type=_tolerance, default=1e-5, help="absolute tolerance of the checks (1e-5)"
    )
    report.add_argument(
        "--overlay",
        choices=("error", "own-error", "grad-error", "own-grad-error", "latency"),
        help="also paint the picture: error (the swapped program against the original), "
        "own-error (each swapped call on the original's inputs), grad-error and "
        "own-grad-error (the same for the gradients) or latency (time per node)",
    )
    _add_reading_options(report)
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
