"""gs.find against torch.fx's SubgraphMatcher, side by side on the same program and pattern.

The program is the 80-layer Llama-3-70B-shaped decoder of ``graphsurgeon.examples``
(``LlamaLike``, hidden 8192, 64/8 heads, on the meta device: no weights), exported once with
gs.export before anything is timed. The pattern is its rotary embedding of one layer, q and k
(``GroupedQueryAttention._rotate`` twice: 12 ops), which occurs once per layer; gs.find traces
it on small example tensors (batch 2, 4/2 heads, 5 tokens, head size 16: none is the
program's).

Reported (1 thread; medians, runs interleaved):
- gs.find, first call in the process: traces the pattern (torch's symbolic shapes warm up
  on their first use) and searches;
- gs.find of a new pattern function (traced again, warm) and of the same one (its trace is
  cached, so the search alone);
- the anchor: ``torch.fx.passes.utils.matcher_utils.SubgraphMatcher`` on the program's graph
  with the very pattern graph gs.find traced (literals compared, overlapping matches
  removed); the ratio is gs.find's time over the anchor's.

Usage: python benchmarks/find.py [--layers 80] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def rope(q, k, cos, sin):
    """The rotary embedding of one layer of LlamaLike, as its attention computes it."""
    from graphsurgeon.examples import GroupedQueryAttention

    return GroupedQueryAttention._rotate(q, cos, sin), GroupedQueryAttention._rotate(k, cos, sin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--quick", action="store_true", help="8 layers, 3 rounds")
    options = parser.parse_args()
    if options.quick:
        options.layers, options.rounds = 8, 3

    import warnings

    import torch
    from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

    import graphsurgeon as gs
    from graphsurgeon.examples import LlamaLike
    from graphsurgeon.patterns.find import find

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with torch.device("meta"):
        model = LlamaLike(n_layers=options.layers)
        tokens = torch.zeros(1, 16, dtype=torch.long)
    start = time.perf_counter()
    ep = gs.export(model, (tokens,))
    export_s = time.perf_counter() - start
    nodes = len(ep.graph.nodes)
    print(
        f"torch {torch.__version__}, 1 thread; LlamaLike {options.layers} layers on meta, "
        f"{nodes:,} nodes, exported in {export_s:.1f} s (not timed below)",
        file=sys.stderr,
        flush=True,
    )
    example = (
        torch.randn(2, 4, 5, 16),
        torch.randn(2, 2, 5, 16),
        torch.randn(5, 16),
        torch.randn(5, 16),
    )

    start = time.perf_counter()
    found = find(ep, rope, example)
    cold = time.perf_counter() - start
    if len(found) != options.layers or found.calls != tuple(
        f"layers.{i}.self_attn" for i in range(options.layers)
    ):
        raise SystemExit(f"gs.find did not find one match per layer:\n{found}")
    pattern_graph = found.pattern_program.graph

    def new_pattern():  # another function object each time: traced again
        return lambda q, k, cos, sin: rope(q, k, cos, sin)

    def anchor() -> int:
        matcher = SubgraphMatcher(
            pattern_graph,
            match_output=False,
            match_placeholder=False,
            remove_overlapping_matches=True,
            ignore_literals=False,
        )
        return len(matcher.match(ep.graph))

    cases = {
        "gs.find, cached trace (search)": lambda: len(find(ep, rope, example)),
        "gs.find, new pattern (trace + search)": lambda: len(find(ep, new_pattern(), example)),
        "SubgraphMatcher (anchor)": anchor,
    }
    counts = {name: case() for name, case in cases.items()}  # also warms each up
    times: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    for round_ in range(options.rounds):
        shift = round_ % len(order)
        for name in order[shift:] + order[:shift]:
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    reference = medians["SubgraphMatcher (anchor)"]

    print()
    print(
        f"find the rotary embedding (12 ops) in LlamaLike, {options.layers} layers "
        f"({nodes:,} nodes), median of {options.rounds}:"
    )
    print()
    print("| run | matches | time | vs SubgraphMatcher |")
    print("|---|---:|---:|---:|")
    print(
        f"| gs.find, first call in the process | {len(found)} | {cold * 1e3:.0f} ms | "
        f"{cold / reference:.3f}x |"
    )
    for name, seconds in medians.items():
        print(f"| {name} | {counts[name]} | {seconds * 1e3:.0f} ms | {seconds / reference:.3f}x |")
    print()
    verdict = "within" if cold <= 1.0 else "OVER"
    print(f"target: gs.find <= 1 s on the first call: {cold:.2f} s, {verdict} the target")


if __name__ == "__main__":
    main()
