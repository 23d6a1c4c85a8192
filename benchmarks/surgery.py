"""A long Surgery session: the memory it keeps, and what undo/redo cost, side by side.

The model is the GPT-like decoder of ``graphsurgeon.examples`` (hidden 64, 1x16 tokens) at 96
layers, exported once with every layer and every attention module preserved (as the swap and
step benchmarks do). A session makes 50 swap steps, one per layer: ``layers.i.attn`` by a
``FusedAttention`` of it (the replacements are made before anything is measured: they are the
user's objects either way).

Reported:
- memory: the growth of the Python heap (tracemalloc) from the session's start to its middle
  and to its last step, and per step over the second half (0 when bounded), for a Surgery that keeps every state built (``keep_built = None``: what
  a Surgery did before states were dropped, the anchor) and for the default
  (``Surgery.keep_built`` states kept, the others built again when needed). The decoder has no
  buffers and the program's parameters are shared by every state, so the heap is the memory a
  state costs: the graph, its code and its metadata;
- time: one ``Surgery.swap`` step (every state kept, and the default), and undo/redo to a state that was dropped (the move plus
  ``s.module``, which builds it again) or is still kept, each as a ratio to one ``gs.swap`` of
  the same request in the same run (the anchor, 1.00). Medians, 1 thread, no tracemalloc.

Usage: python benchmarks/surgery.py [--quick] [--layers 96] [--steps 50]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc

import torch

import graphsurgeon as gs
from graphsurgeon.examples import FusedAttention, TinyGPT


def program(layers: int):
    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(layers)] + [f"layers.{i}.attn" for i in range(layers)]
    return model, tokens, gs.export(model, (tokens,), preserve=preserve)


def replacements(model: TinyGPT, steps: int) -> list[tuple[str, FusedAttention]]:
    return [(f"layers.{i}.attn", FusedAttention(model.layers[i].attn)) for i in range(steps)]


def memory(ep, swaps, keep_built: int | None) -> dict:
    """Heap growth after each step of the session, with tracemalloc on (which slows the
    session: not timed)."""
    surgery = gs.Surgery(ep)
    surgery.keep_built = keep_built
    surgery.module  # noqa: B018 - the original state built, as a session starts
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    growth = []
    for name, replacement in swaps:
        surgery.swap(name, replacement)
        gc.collect()
        growth.append(tracemalloc.get_traced_memory()[0] - start)
    tracemalloc.stop()
    del surgery
    gc.collect()
    half = len(growth) // 2
    return {
        "half": growth[half - 1],
        "end": growth[-1],
        "slope": (growth[-1] - growth[half - 1]) / (len(growth) - half),
    }


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def session(ep, swaps, keep_built: int | None) -> tuple[gs.Surgery, float]:
    """A Surgery after every swap step, and the median time of a step."""
    surgery = gs.Surgery(ep)
    surgery.keep_built = keep_built
    surgery.module  # noqa: B018
    steps = [timed(surgery.swap, name, replacement)[0] for name, replacement in swaps]
    return surgery, statistics.median(steps)


def timing(ep, tokens, swaps) -> dict:
    before = session(ep, swaps, None)[1]
    gc.collect()
    surgery, step = session(ep, swaps, gs.Surgery.keep_built)
    anchor = [timed(gs.swap, ep, surgery.replacements)[0] for _ in range(5)]
    expected = surgery.module(tokens)

    def move(verb: str) -> tuple[float, bool]:
        start = time.perf_counter()
        getattr(surgery, verb)()
        was_kept = surgery._position in surgery._built  # before s.module builds it
        surgery.module  # noqa: B018 - what the widget or the next cell reads at once
        return time.perf_counter() - start, was_kept

    moves = {"dropped": [], "kept": []}
    back = min(10, len(swaps) - 1)
    for verb in ["undo"] * back + ["redo"] * back:
        seconds, was_kept = move(verb)
        moves["kept" if was_kept else "dropped"].append(seconds)
    if not torch.equal(surgery.module(tokens), expected):
        raise SystemExit("the state built again computes something else")
    return {
        "swap_step": step,
        "swap_step_before": before,
        "anchor": statistics.median(anchor),
        "dropped": statistics.median(moves["dropped"]) if moves["dropped"] else float("nan"),
        "kept": statistics.median(moves["kept"]) if moves["kept"] else float("nan"),
        "moves": {k: len(v) for k, v in moves.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="24 layers, 12 steps")
    options = parser.parse_args()
    if options.quick:
        options.layers, options.steps = 24, 12
    steps = min(options.steps, options.layers)
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, 1 thread; GPT-like decoder, hidden 64, 1x16 tokens",
        file=sys.stderr,
        flush=True,
    )
    model, tokens, ep = program(options.layers)
    nodes = len(ep.graph.nodes)
    swaps = replacements(model, steps)
    kept = gs.Surgery.keep_built
    rows = {}
    for label, keep in (("every state kept (before)", None), (f"{kept} states kept", kept)):
        rows[label] = memory(ep, swaps, keep)
        print(f"  memory: {label} done", file=sys.stderr, flush=True)
    t = timing(ep, tokens, swaps)
    print()
    print(f"A session of {steps} swap steps on {options.layers} layers ({nodes:,} nodes):")
    print()
    half = steps // 2
    print(
        f"| Surgery | heap growth after {half} steps | after {steps} | per step, steps "
        f"{half + 1}-{steps} | after {steps} vs every state kept |"
    )
    print("|---|---:|---:|---:|---:|")
    anchor = rows["every state kept (before)"]["end"]
    for label, r in rows.items():
        print(
            f"| {label} | {r['half'] / 2**20:.1f} MiB | {r['end'] / 2**20:.1f} MiB | "
            f"{r['slope'] / 2**20:+.2f} MiB | {r['end'] / anchor:.2f}x |"
        )
    print()
    print("| operation | time | vs one gs.swap |")
    print("|---|---:|---:|")
    print(f"| gs.swap of the same request (anchor) | {t['anchor'] * 1e3:.0f} ms | 1.00x |")
    print(
        f"| Surgery.swap, one step, every state kept (before) | "
        f"{t['swap_step_before'] * 1e3:.0f} ms | {t['swap_step_before'] / t['anchor']:.2f}x |"
    )
    print(
        f"| Surgery.swap, one step, {kept} states kept | {t['swap_step'] * 1e3:.0f} ms | "
        f"{t['swap_step'] / t['anchor']:.2f}x |"
    )
    print(
        f"| undo/redo to a dropped state + s.module ({t['moves']['dropped']} moves) | "
        f"{t['dropped'] * 1e3:.0f} ms | {t['dropped'] / t['anchor']:.2f}x |"
    )
    print(
        f"| undo/redo to a kept state + s.module ({t['moves']['kept']} moves) | "
        f"{t['kept'] * 1e6:.0f} µs | {t['kept'] / t['anchor']:.1e}x |"
    )


if __name__ == "__main__":
    main()
