"""Rendering benchmark: graphsurgeon's to_dot / to_svg side by side with torch.fx's FxGraphDrawer.

Programs: the GPT-like decoder of graphsurgeon.examples at 8, 32 and 96 layers (every layer and
every attention preserved), and an 80-layer Llama-3-70B-shaped decoder built on the meta device
(no weights are allocated). For each program it times:

* the default view (``collapse="auto"``): ``to_dot`` alone, and DOT + ``dot -Tsvg``;
* the fully expanded view (``collapse=None``): the same (a stack of many open layers is laid
  out a layer at a time: target 2 s for the 80-layer decoder);
* FxGraphDrawer on the same program (``ep.graph_module``): DOT building (pydot) + ``dot -Tsvg``.

Run: ``python benchmarks/render.py`` (``--quick`` for 8 and 32 layers only; ``--large`` adds a
384-layer decoder, 16,526 fx nodes, without FxGraphDrawer: its layout alone would take
minutes). FxGraphDrawer needs the ``pydot`` package; without it that column is left out. Set
OMP_NUM_THREADS=1 for stable figures; absolute times drift run to run, ratios measured side by
side in one run do not.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

import graphsurgeon as gs
import graphsurgeon.render as render
from graphsurgeon import _derived
from graphsurgeon.examples import LlamaLike, TinyGPT
from graphsurgeon.render import _scene, graphviz

#: The layers of the large decoder (``--large``): 16,526 fx nodes.
LARGE_LAYERS = 384
# FxGraphDrawer is not run on larger programs: its layout alone would outlast the timeout.
BASELINE_MAX_NODES = 10_000


def export_llama(layers: int = 80) -> torch.export.ExportedProgram:
    """The Llama-shaped decoder exported on the meta device (no weights allocated)."""
    with torch.device("meta"):
        model = LlamaLike(n_layers=layers).eval()
        tokens = torch.zeros(1, 16, dtype=torch.long)
    preserve = [f"layers.{i}" for i in range(layers)]
    preserve += [f"layers.{i}.self_attn" for i in range(layers)]
    return gs.export(model, (tokens,), preserve=preserve)


def export_gpt(layers: int) -> torch.export.ExportedProgram:
    model = TinyGPT(layers).eval()
    preserve = [f"layers.{i}" for i in range(layers)] + [f"layers.{i}.attn" for i in range(layers)]
    return gs.export(model, (model.example_input(),), preserve=preserve)


# -- timing --------------------------------------------------------------------------------


def median_time(function: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# What a picture derives from a program and keeps in its record: dropped for a cold run.
COLD_KEYS = (_scene.ANALYSIS_KEY, "render state", "render lookups")


def cold(function: Callable[[], object]) -> Callable[[], object]:
    """Run ``function`` with graphsurgeon's caches emptied: every run analyses and lays out anew."""

    def run() -> object:
        for record in list(_derived._RECORDS.values()):  # every program's picture analysis
            for key in COLD_KEYS:
                record.values.pop(key, None)
        graphviz._LAYOUTS.clear()
        return function()

    return run


def fx_graph_drawer(ep: torch.export.ExportedProgram, timeout: float) -> float | None:
    """FxGraphDrawer's SVG of ``ep``: its DOT text (built with pydot), then ``dot -Tsvg`` as
    pydot's ``create_svg`` runs it. Seconds; ``math.inf`` past ``timeout``; None without pydot."""
    try:
        import pydot  # noqa: F401  (FxGraphDrawer imports it lazily and fails late without it)
        from torch.fx.passes.graph_drawer import FxGraphDrawer
    except ImportError:
        return None
    gc.collect()
    start = time.perf_counter()
    text = FxGraphDrawer(ep.graph_module, "program").get_dot_graph().to_string()
    try:
        subprocess.run(
            ["dot", "-Tsvg"], input=text.encode(), capture_output=True, check=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return math.inf
    return time.perf_counter() - start


def measure(name: str, ep, repeat: int, baseline: bool, timeout: float) -> dict:
    nodes = len(ep.graph.nodes)
    row: dict = {"program": name, "nodes": nodes}
    row["default_drawn"] = render.graph_view(ep).drawn_nodes
    row["default_dot"] = median_time(cold(lambda: render.to_dot(ep)), repeat)
    row["default_svg"] = median_time(cold(lambda: render.to_svg(ep)), repeat)
    row["full_drawn"] = render.graph_view(ep, collapse=None).drawn_nodes
    row["full_dot"] = median_time(cold(lambda: render.to_dot(ep, collapse=None)), repeat)
    row["full_svg"] = median_time(cold(lambda: render.to_svg(ep, collapse=None)), 1)
    if baseline:
        row["fx_svg"] = fx_graph_drawer(ep, timeout)
    return row


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "timed out"
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def per_thousand(row: dict, key: str) -> float:
    """Milliseconds per 1,000 fx nodes of the program."""
    return row[key] * 1e3 / (row["nodes"] / 1000)


def table(rows: list[dict]) -> str:
    header = [
        "program",
        "fx nodes",
        "default view: drawn",
        "to_dot",
        "SVG",
        "expanded: drawn",
        "to_dot",
        "SVG",
        "FxGraphDrawer: SVG",
        "to_dot per 1k nodes (default / expanded)",
        "expanded SVG / FxGraphDrawer",
        "default SVG / FxGraphDrawer",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        fx = row.get("fx_svg")
        full = row.get("full_svg")
        cells = [
            row["program"],
            f"{row['nodes']:,}",
            str(row["default_drawn"]),
            seconds(row["default_dot"]),
            seconds(row["default_svg"]),
            f"{row['full_drawn']:,}",
            seconds(row["full_dot"]),
            seconds(full),
            seconds(fx),
            f"{per_thousand(row, 'default_dot'):.0f} / {per_thousand(row, 'full_dot'):.0f} ms",
            f"{full / fx:.2f}x" if fx and full and math.isfinite(fx) else "-",
            f"{row['default_svg'] / fx:.3f}x" if fx and math.isfinite(fx) else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the 8- and 32-layer decoders")
    parser.add_argument("--repeat", type=int, default=5, help="runs per fast measurement (median)")
    parser.add_argument(
        "--large", action="store_true", help="also the 384-layer decoder (FxGraphDrawer skipped)"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip FxGraphDrawer (the slowest column)"
    )
    parser.add_argument(
        "--timeout", type=float, default=120, help="give up on FxGraphDrawer's layout after this"
    )
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, graphviz dot, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; medians of {options.repeat} "
        f"(expanded SVG and FxGraphDrawer: one run each; FxGraphDrawer's layout is given "
        f"{options.timeout:.0f} s)\n",
        flush=True,
    )
    programs: list[tuple[str, Callable[[], torch.export.ExportedProgram]]] = [
        ("GPT-like, 8 layers", lambda: export_gpt(8)),
        ("GPT-like, 32 layers", lambda: export_gpt(32)),
    ]
    if not options.quick:
        programs += [
            ("GPT-like, 96 layers", lambda: export_gpt(96)),
            ("Llama-3-70B shape, 80 layers (meta)", export_llama),
        ]
    if options.large:
        programs.append(("GPT-like, 384 layers", lambda: export_gpt(LARGE_LAYERS)))
    rows = []
    for name, make in programs:
        start = time.perf_counter()
        ep = make()
        print(
            f"{name}: exported {len(ep.graph.nodes):,} nodes in "
            f"{time.perf_counter() - start:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        baseline = not options.no_baseline and len(ep.graph.nodes) < BASELINE_MAX_NODES
        rows.append(measure(name, ep, options.repeat, baseline, options.timeout))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        del ep
        gc.collect()
    print(table(rows))
    slowest = max(r["default_svg"] for r in rows)
    per_k = max(max(per_thousand(r, "default_dot"), per_thousand(r, "full_dot")) for r in rows)
    largest = max(r["default_drawn"] for r in rows)
    expanded = max(r["full_svg"] for r in rows)
    print(
        f"\ndefault view SVG: at most {seconds(slowest)} (target 1 s); to_dot: at most "
        f"{per_k:.0f} ms per 1,000 nodes (target 50); largest default view: {largest} nodes "
        f"(budget {render.AUTO_MAX_NODES}); expanded SVG: at most {seconds(expanded)} "
        "(target 2 s)"
    )
    slower = [r["program"] for r in rows if r.get("fx_svg") and r["full_svg"] > r["fx_svg"]]
    if slower:
        print(f"expanded view slower than FxGraphDrawer on: {', '.join(slower)}")
    missed = slowest > 1.0 or per_k > 50 or largest > render.AUTO_MAX_NODES or slower
    missed = missed or expanded > 2.0
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
