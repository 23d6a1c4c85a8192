"""The overlays against their anchors, side by side on the same program.

The model is the GPT-like decoder of ``graphsurgeon.examples`` (hidden 64, 1x16 tokens) at 96
layers, exported once with every module preserved. One layer's attention (``layers.48.attn``)
is swapped for a copy of :class:`FusedAttention` that forgets the causal mask, so the error
overlay has a wrong call to mark and a long stretch of drift after it.

Measured, interleaved round by round so that drift hits all alike (medians):

- ``gs.compare(ep, gm, args, locate=False)``: the anchor of the error overlays (target: the
  error overlay within 3x of it);
- ``overlay_values(gm, args, kind="error")`` and ``kind="own error"``;
- ``gm(tokens)``: a plain forward, the anchor of the latency overlay;
- the latency overlay's profiled run alone (the timed copy of the program, built once, called
  once: target within 2x of a forward), and the whole ``kind="latency"`` call (a warm-up run
  and three timed runs, the copy already built).

Each run starts from a program whose runnable original (and timed copy) is already built: a
warm-up round builds them.

Usage: python benchmarks/overlay.py [--layers 96] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings


def run(layers: int, rounds: int) -> dict:
    import torch

    import graphsurgeon as gs
    from graphsurgeon.checks._exec import bind_inputs
    from graphsurgeon.checks.overlay import _timed, overlay_values
    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.swap import swap_info

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from locate import buggy_attention

    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    name = f"layers.{layers // 2}.attn"
    swapped = gs.swap(ep, {name: buggy_attention(model.layers[layers // 2].attn)})
    timed, _ = _timed(swapped)
    values = bind_inputs(swapped, (tokens,), {})

    def forward():
        with torch.no_grad():
            return swapped(tokens)

    def profiled_run():
        with torch.no_grad():
            return timed(*values)

    runs = {
        "gs.compare (anchor)": lambda: gs.compare(ep, swapped, (tokens,), locate=False),
        "error overlay": lambda: overlay_values(swapped, (tokens,), kind="error"),
        "own error overlay": lambda: overlay_values(swapped, (tokens,), kind="own error"),
        "forward (anchor)": forward,
        "profiled run": profiled_run,
        "latency overlay (4 runs)": lambda: overlay_values(swapped, (tokens,), kind="latency"),
    }
    for function in runs.values():  # warm-up: runnable original, timed copy, first calls
        function()
    error = overlay_values(swapped, (tokens,), kind="error")
    call_node = swap_info(swapped).call_nodes[name]
    order = [n.name for n in swapped.graph.nodes]
    before = [n for n in order[: order.index(call_node)] if n in error.nodes]
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, function in runs.items():
            start = time.perf_counter()
            function()
            times[label].append(time.perf_counter() - start)
    return {
        "layers": layers,
        "nodes": len(swapped.graph.nodes),
        "call": name,
        "marked": error.nodes[call_node],
        "before": max((error.nodes[n] for n in before), default=0.0),
        "before_count": len(before),
        "medians": {label: statistics.median(values) for label, values in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds")
    options = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    print(
        f"torch {torch.__version__}, 1 thread; GPT-like decoder, hidden 64, 1x16 tokens",
        file=sys.stderr,
    )
    result = run(options.layers, options.rounds)
    medians = result["medians"]
    print(
        f"\n{result['layers']} layers ({result['nodes']:,} fx nodes), {result['call']} swapped "
        "for a copy without the causal mask"
    )
    print(
        f"error overlay: {result['call']} at {result['marked']:.3g}x tolerance; the "
        f"{result['before_count']:,} nodes before it at most {result['before']:.3g}\n"
    )
    anchors = {
        "gs.compare (anchor)": "gs.compare (anchor)",
        "error overlay": "gs.compare (anchor)",
        "own error overlay": "gs.compare (anchor)",
        "forward (anchor)": "forward (anchor)",
        "profiled run": "forward (anchor)",
        "latency overlay (4 runs)": "forward (anchor)",
    }
    print("| run | time | vs anchor |")
    print("|---|---:|---:|")
    for label, seconds in medians.items():
        anchor = anchors[label]
        ratio = seconds / medians[anchor]
        print(f"| {label} | {seconds * 1e3:.1f} ms | {ratio:.2f}x {anchor.split(' (')[0]} |")


if __name__ == "__main__":
    main()
