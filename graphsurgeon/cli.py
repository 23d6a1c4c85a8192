"""The ``graphsurgeon`` command: ``demo``, ``modules`` and ``render``.

Exit codes: 0 success, 1 the command ran and found a problem (a mismatch), 2 bad usage, an
unreadable program file or an output that cannot be written; errors are one line on standard
error, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
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


# The demo swaps layers.1.attn (so 2 at least) and builds the model on the spot (a bound keeps
# a typo such as --layers 40000 from filling the memory).
_DEMO_LAYERS = (2, 64)


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
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="graphsurgeon",
        description="Swap modules of torch.export programs for eager code, and check the result.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="export a built-in transformer, swap a layer, verify")
    demo.add_argument("--layers", type=int, default=4, help="decoder layers, 2 to 64 (default 4)")
    demo.add_argument(
        "--rounds", type=int, default=100, help="timed forward runs of each model (default 100)"
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
