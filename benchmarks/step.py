"""gs.Stepper against torch.fx.Interpreter.run, side by side on the same program.

The model is the GPT-like decoder of ``graphsurgeon.examples`` (hidden 64, 1x16 tokens),
exported with every layer and every attention module preserved. The stepped program is the
original's unlifted graph (``gs.Stepper(ep, tokens)`` steps ``gs.swap(ep, {})``), and the
anchor runs ``torch.fx.Interpreter(gm).run(tokens)`` on that very GraphModule.

Reported at 96 and 384 layers by default (each size its own program, the anchor measured in
the same process; runs interleaved in a rotating order, medians, under no_grad, 1 thread):
- the generated code ``gm(tokens)``, for scale;
- ``Interpreter.run`` (the anchor, ratio 1.00), and the same keeping every value, as the
  stepper's ``keep="all"`` does (``garbage_collect_values=False``);
- ``reset(); continue_()`` to the end: the default (``keep="recent"``: the values later nodes
  need and the last nodes' values), ``keep="all"`` (every value, the default before),
  memory-light mode (``keep="needed"``, every value summarized as it goes), and with a NaN/Inf
  breakpoint (a condition checked on every node's value);
- ``step()`` node by node to the end; the per-step overhead is (that time - anchor) / nodes.

Memory (96 layers by default): the peak of the tensor bytes the stepper holds in ``env``,
``keep="all"`` vs the default vs memory-light: the default and memory-light are stepped node
by node and measured after every step; ``keep="all"`` never drops a value, so its peak is what
it holds at the end. Tensors are
counted once per storage, and parameters and buffers are left out (the module holds them
either way). tracemalloc does not see tensor memory, torch has no CPU allocator statistics,
and the process RSS is dominated by export and by malloc's caching of small blocks, so the
bytes held are the measure that isolates what the mode changes.

Usage: python benchmarks/step.py [--quick] [--layers 96,384] [--memory-layers 96] [--rounds 9]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

import graphsurgeon as gs
from graphsurgeon.checks._exec import runnable_original
from graphsurgeon.examples import TinyGPT
from graphsurgeon.step import Stepper


def program(layers: int) -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(layers)] + [f"layers.{i}.attn" for i in range(layers)]
    return gs.export(model, (tokens,), preserve=preserve), tokens


def run_all_steps(stepper: Stepper) -> None:
    stepper.reset()
    while not stepper.done:
        stepper.step()


def timing(layers: int, rounds: int) -> dict:
    ep, tokens = program(layers)
    gm = runnable_original(ep)
    nodes = len(gm.graph.nodes)
    interpreter = torch.fx.Interpreter(gm)
    keeping = torch.fx.Interpreter(gm, garbage_collect_values=False)

    def run_keeping_values() -> None:
        keeping.run(tokens)
        keeping.env = {}  # what reset() does: drop the values of the last run

    default = Stepper(ep, tokens)
    full = Stepper(ep, tokens)
    full.keep = "all"
    light = Stepper(ep, tokens)
    light.memory_light = True
    watched = Stepper(ep, tokens)
    watched.breakpoints.nan_or_inf()

    def continue_to_end(stepper: Stepper) -> None:
        stepper.reset()
        while stepper.continue_().reason != "end":  # TinyGPT's -inf mask stops the watched one
            pass

    cases = {
        "generated code gm(x)": lambda: gm(tokens),
        "Interpreter.run (anchor)": lambda: interpreter.run(tokens),
        "Interpreter.run, values kept": run_keeping_values,
        "continue_(), default (keep='recent')": lambda: continue_to_end(default),
        "continue_(), keep='all'": lambda: continue_to_end(full),
        "continue_(), memory-light": lambda: continue_to_end(light),
        "continue_(), NaN/Inf breakpoint": lambda: continue_to_end(watched),
        "step() x every node": lambda: run_all_steps(default),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():
        expected = gm(tokens)
        continue_to_end(default)
        if not torch.equal(default.output, expected):
            raise SystemExit("the stepper's output differs from the program's")
        for case in cases.values():  # warm up
            case()
        order = list(cases)
        for round_ in range(rounds):
            # a different order each round, so no case always follows the same neighbour
            shift = round_ % len(order)
            for name in order[shift:] + order[:shift]:
                start = time.perf_counter()
                cases[name]()
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    anchor = medians["Interpreter.run (anchor)"]
    return {
        "layers": layers,
        "nodes": nodes,
        "medians": medians,
        "anchor": anchor,
        "step_overhead_us": (medians["step() x every node"] - anchor) * 1e6 / nodes,
        "continue_overhead_us": (
            (medians["continue_(), default (keep='recent')"] - anchor) * 1e6 / nodes
        ),
    }


def _state_storages(gm: torch.fx.GraphModule) -> set[int]:
    tensors = list(gm.parameters()) + list(gm.buffers())
    return {t.untyped_storage().data_ptr() for t in tensors}


def held_bytes(stepper: Stepper, exclude: set[int]) -> int:
    seen: dict[int, int] = {}
    for value in stepper.env.values():
        for leaf in torch.utils._pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                pointer = storage.data_ptr()
                if pointer not in exclude:
                    seen[pointer] = storage.nbytes()
    return sum(seen.values())


def memory(layers: int) -> dict:
    ep, tokens = program(layers)
    runnable_original(ep)  # built once per program and cached; not part of a Stepper's own cost
    start = time.perf_counter()
    full = Stepper(ep, tokens)
    build = time.perf_counter() - start
    full.keep = "all"
    light = Stepper(ep, tokens)
    light.memory_light = True
    default = Stepper(ep, tokens)
    exclude = _state_storages(full.graph_module)
    peaks = {}
    with torch.no_grad():
        # keep="all" never drops a value, so what it holds only grows: its peak is at the end.
        full.continue_()
        if len(full.env) != full.total:
            raise SystemExit("keep='all' dropped a value")
        peaks["full"] = held_bytes(full, exclude)
        for name, stepper in (("light", light), ("default", default)):
            peak = 0
            while not stepper.done:
                stepper.step()
                peak = max(peak, held_bytes(stepper, exclude))
            peaks[name] = peak
            if not torch.equal(stepper.output, full.output):
                raise SystemExit(f"{name} mode computed something else")
    return {
        "layers": layers,
        "nodes": full.total,
        "build_ms": build * 1e3,
        "full_bytes": peaks["full"],
        "light_bytes": peaks["light"],
        "default_bytes": peaks["default"],
        "light_values": len(light.env),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers", default="96,384", help="decoder layers for the timing, comma-separated"
    )
    parser.add_argument("--memory-layers", type=int, default=96, help="layers for the memory run")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds")
    parser.add_argument("--quick", action="store_true", help="32 layers, fewer rounds")
    options = parser.parse_args()
    if options.quick:
        options.rounds, options.memory_layers, options.layers = 5, 32, "32"
    torch.set_num_threads(1)
    gc.collect()
    print(
        f"torch {torch.__version__}, 1 thread; GPT-like decoder, hidden 64, 1x16 tokens",
        file=sys.stderr,
        flush=True,
    )
    timings = []
    for layers in [int(n) for n in options.layers.split(",")]:
        timings.append(timing(layers, options.rounds))
        t = timings[-1]
        print(f"  timing done ({layers} layers, {t['nodes']:,} nodes)", file=sys.stderr, flush=True)
    m = memory(options.memory_layers)
    for t in timings:
        print()
        print(
            f"Run to the end, {t['layers']} layers ({t['nodes']:,} nodes), "
            f"median of {options.rounds}:"
        )
        print()
        print("| run | time | vs Interpreter.run | µs per node |")
        print("|---|---:|---:|---:|")
        for name, seconds in t["medians"].items():
            print(
                f"| {name} | {seconds * 1e3:.1f} ms | {seconds / t['anchor']:.3f}x | "
                f"{seconds * 1e6 / t['nodes']:.1f} |"
            )
        print()
        print(
            f"Per-step overhead over Interpreter.run: step() {t['step_overhead_us']:+.1f} µs per "
            f"node; continue_() {t['continue_overhead_us']:+.1f} µs per node."
        )
    print()
    print(f"Memory held by the stepper, {m['layers']} layers ({m['nodes']:,} nodes):")
    print()
    print("| mode | peak tensor bytes held in env | vs full |")
    print("|---|---:|---:|")
    print(f"| keep='all' | {m['full_bytes'] / 2**20:.2f} MiB | 1.00x |")
    print(
        f"| default (keep='recent') | {m['default_bytes'] / 2**20:.3f} MiB | "
        f"{m['default_bytes'] / m['full_bytes']:.3f}x |"
    )
    print(
        f"| memory-light | {m['light_bytes'] / 2**20:.3f} MiB | "
        f"{m['light_bytes'] / m['full_bytes']:.3f}x |"
    )
    print()
    print(
        f"Building a Stepper over {m['nodes']:,} nodes (layout, last uses): {m['build_ms']:.0f} ms."
    )


if __name__ == "__main__":
    main()
