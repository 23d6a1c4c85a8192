"""gs.swap against torch.export._swap._swap_modules, side by side on the same programs.

The model is the GPT-like decoder of ``graphsurgeon.examples`` (hidden 64, 1x16 tokens) at 8,
32, 96 and 384 layers (16,526 nodes), exported once with every layer and every attention module preserved. Both
engines swap the same request on the same ExportedProgram: one layer, then every layer, each
replaced by a deep copy of itself (torch's engine needs the original attribute layout).

Reported:
- swap time: the first call on a fresh program (gs builds and caches its partition index then)
  and the median of the following calls; ratio = torch / gs (higher is better for gs);
- microseconds per graph node;
- growth: a one-layer swap at each size as a ratio to the same swap at the smallest size run
  (an edit should cost what it changes, not what the program holds);
- the forward at batch 1 under no_grad, as a ratio to the eager model carrying the same
  replacements (runs interleaved in a rotating order, median): to ``eager_reference`` (deep
  copies of the model and of the replacements, as ``gs.verify`` runs it), and to the model
  with the very parameters and replacement objects the swapped program runs ("same
  modules"). Two deep copies of one model can differ by a few percent from each other (where
  their memory lies), more than what the swapped program adds; the second ratio runs the
  same memory;
- what a swapped call costs over eager's loop over its layers, in µs per call: every layer
  swapped for an ``nn.Identity`` (so nothing else runs), the swapped program against the
  model carrying those very modules;
- with every layer swapped, where the forward's extra time goes, against the same modules:
  the time spent inside the layers' calls (forward hooks on the very replacement objects,
  which both run) and outside them (the program's own statements, or eager's loop, with
  the embeddings and the head), per layer. The time a statement between two layers takes
  there is several times what it takes in a loop of its own (the layer evicted it from the
  caches);
- the input check a swapped program runs first (shapes, constants, structure, as
  ``ep.module()`` checks them): its own time per call and its share of the gs forward. It is
  included in the forward ratio above;
- the one-layer swap with the parts of its code that the edit did not reach taken whole from
  the program's cache (as gs.swap does), against the same swap writing every part (as before
  that reuse): alternated in one process, medians, as a ratio.

Usage: python benchmarks/swap.py [--quick] [--layers 8 32 96 384] [--repeat 5]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
import warnings

import torch
import torch.export._swap

import graphsurgeon as gs
from graphsurgeon.checks.verify import eager_reference
from graphsurgeon.examples import TinyGPT


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def forward_ratio(modules: dict, tokens: torch.Tensor, rounds: int) -> dict:
    """Median forward time of each module, interleaved so drift hits all alike, the order
    rotated every round so that none always runs first (or right after the same one): in a
    fixed order the 384-layer ratio read 1.06x, rotated 0.99-1.00x in repeated runs."""
    times = {name: [] for name in modules}
    names = list(modules)
    with torch.no_grad():
        for module in modules.values():
            for _ in range(5):
                module(tokens)
        for round_ in range(rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                start = time.perf_counter()
                modules[name](tokens)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def same_modules(model: torch.nn.Module, request: dict) -> torch.nn.Module:
    """The model holding the very objects a program swapped by ``request`` runs: the model's
    parameters (the program holds them, not copies) and the replacements, at ``layers.N``."""
    same = copy.deepcopy(model, {id(p): p for p in model.parameters()})
    for name, replacement in request.items():
        same.layers[int(name.split(".")[1])] = replacement
    return same


def call_overhead(model: torch.nn.Module, ep, tokens: torch.Tensor, rounds: int) -> float:
    """µs per swapped call that the swapped program spends over eager's loop: every layer
    swapped for an ``nn.Identity``, against the model carrying those very modules."""
    layers = len(model.layers)
    request = {f"layers.{i}": torch.nn.Identity() for i in range(layers)}
    gm = gs.swap(ep, request)
    same = same_modules(model, request)
    forward = forward_ratio({"eager": same, "gs": gm}, tokens, 10 * rounds)
    return (forward["gs"] - forward["eager"]) / layers * 1e6


def inside_and_outside(
    same: torch.nn.Module, gm: torch.fx.GraphModule, layers: list, tokens: torch.Tensor, rounds: int
) -> dict:
    """Median time inside the ``layers``' calls and outside them, per forward, for the model
    carrying them (``same``) and the swapped program calling them (``gm``), interleaved."""
    clock = time.perf_counter
    inside, began = [0.0], [0.0]
    hooks = []
    for layer in layers:
        hooks.append(layer.register_forward_pre_hook(lambda *_: began.__setitem__(0, clock())))
        hooks.append(
            layer.register_forward_hook(
                lambda *_: inside.__setitem__(0, inside[0] + clock() - began[0])
            )
        )
    modules = {"same": same, "gs": gm}
    spent: dict[str, dict[str, list]] = {name: {"in": [], "out": []} for name in modules}
    try:
        with torch.no_grad():
            for round_ in range(rounds):
                for name in ("same", "gs") if round_ % 2 else ("gs", "same"):
                    inside[0] = 0.0
                    start = clock()
                    modules[name](tokens)
                    total = clock() - start
                    spent[name]["in"].append(inside[0])
                    spent[name]["out"].append(total - inside[0])
    finally:
        for hook in hooks:
            hook.remove()
    return {
        name: {part: statistics.median(values) for part, values in parts.items()}
        for name, parts in spent.items()
    }


def guard_time(gm: torch.fx.GraphModule, tokens: torch.Tensor, calls: int = 2000) -> float:
    """Median time of the swapped program's input check alone, per call (batches of 100)."""
    (node,) = [n for n in gm.graph.nodes if n.name == "check_inputs"]
    check, (guard_node, *_) = node.target, node.args
    guard = getattr(gm, guard_node.target)
    batches = []
    for _ in range(calls // 100):
        start = time.perf_counter()
        for _ in range(100):
            check(guard, tokens)
        batches.append((time.perf_counter() - start) / 100)
    return statistics.median(batches)


def kept_parts_ratio(ep, request: dict, rounds: int) -> tuple[float, float]:
    """Median one-layer swap time with kept parts (gs.swap as it is) and with every part of
    the code written (the rewrite works out no footprint, so no part is known to be left
    alone and nothing is taken whole), alternated in one process so drift hits both alike."""
    from graphsurgeon.rewrite import _builder

    with_kept = _builder._Builder._footprint

    def without_kept(builder):
        return None

    times: dict[str, list[float]] = {"kept": [], "written": []}
    try:
        for round_ in range(rounds):
            order = (("kept", with_kept), ("written", without_kept))
            for name, footprint in order if round_ % 2 else order[::-1]:
                _builder._Builder._footprint = footprint
                gc.collect()
                times[name].append(timed(gs.swap, ep, request)[0])
    finally:
        _builder._Builder._footprint = with_kept
    return statistics.median(times["kept"]), statistics.median(times["written"])


def run(layers: int, repeat: int, rounds: int) -> list[dict]:
    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(layers)] + [f"layers.{i}.attn" for i in range(layers)]
    ep = gs.export(model, (tokens,), preserve=preserve)
    nodes = len(ep.graph.nodes)
    rows = []
    for label, count in (("1 layer", 1), ("all layers", layers)):
        request = {f"layers.{i}": copy.deepcopy(model.layers[i]) for i in range(count)}
        fresh = copy.copy(ep)  # a new program object: gs has no cache for it yet
        gs_first, gm = timed(gs.swap, fresh, request)
        torch_first, torch_gm = timed(torch.export._swap._swap_modules, ep, request)
        gs_times, torch_times = [], []
        for _ in range(repeat):
            gs_times.append(timed(gs.swap, fresh, request)[0])
            torch_times.append(timed(torch.export._swap._swap_modules, ep, request)[0])
        gs_median, torch_median = statistics.median(gs_times), statistics.median(torch_times)
        reference = eager_reference(model, request)
        if not gs.verify(reference, gm, (tokens,)):
            raise SystemExit(f"{layers} layers, {label}: the swapped program does not match")
        same = same_modules(model, request)
        forward = forward_ratio(
            {"eager": reference, "same": same, "gs": gm, "torch": torch_gm}, tokens, rounds
        )
        guard = guard_time(gm, tokens)
        kept = written = None
        overhead = split = None
        if count == 1:
            kept, written = kept_parts_ratio(fresh, request, max(6, 3 * repeat))
        else:
            overhead = call_overhead(model, fresh, tokens, rounds)
            split = inside_and_outside(same, gm, list(request.values()), tokens, 2 * rounds)
        rows.append(
            {
                "layers": layers,
                "nodes": nodes,
                "swap": label,
                "gs_first_ms": gs_first * 1e3,
                "gs_ms": gs_median * 1e3,
                "torch_ms": torch_median * 1e3,
                "torch_first_ms": torch_first * 1e3,
                "speedup": torch_median / gs_median,
                "speedup_first": torch_first / gs_first,
                "gs_us_per_node": gs_median * 1e6 / nodes,
                "eager_fwd_ms": forward["eager"] * 1e3,
                "gs_fwd_ratio": forward["gs"] / forward["eager"],
                "torch_fwd_ratio": forward["torch"] / forward["eager"],
                "gs_same_ratio": forward["gs"] / forward["same"],
                "call_overhead_us": overhead,
                "split": split,
                "guard_us": guard * 1e6,
                "guard_share": guard / forward["gs"],
                "kept_ms": kept * 1e3 if kept else None,
                "written_ms": written * 1e3 if written else None,
            }
        )
        print(
            f"  {layers:>3} layers, {label:<10}: gs {gs_median * 1e3:7.1f} ms "
            f"(first {gs_first * 1e3:6.1f}), torch {torch_median * 1e3:7.1f} ms, "
            f"{torch_median / gs_median:5.1f}x; forward gs {forward['gs'] / forward['eager']:.3f}x "
            f"({forward['gs'] / forward['same']:.3f}x of the same modules), "
            f"torch {forward['torch'] / forward['eager']:.3f}x of eager; input check "
            f"{guard * 1e6:.1f} µs ({guard / forward['gs']:.2%} of the gs forward)",
            file=sys.stderr,
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 32, 96, 384])
    parser.add_argument("--repeat", type=int, default=5, help="timed swaps after the first")
    parser.add_argument("--rounds", type=int, default=80, help="interleaved forward rounds")
    parser.add_argument("--quick", action="store_true", help="8 and 32 layers, fewer rounds")
    options = parser.parse_args()
    if options.quick:
        options.layers, options.repeat, options.rounds = [8, 32], 3, 15
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # torch's engine warns about its own get_attr use
    gc.collect()
    print(
        f"torch {torch.__version__}, 1 thread; GPT-like decoder, hidden 64, 1x16 tokens",
        file=sys.stderr,
    )
    rows = []
    for layers in options.layers:
        rows.extend(run(layers, options.repeat, options.rounds))
    print()
    print(
        "| layers | nodes | swapped | gs.swap | first call | _swap_modules | speedup | µs/node "
        "| forward vs eager: gs | gs vs same modules | torch | input check |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['layers']} | {r['nodes']:,} | {r['swap']} | {r['gs_ms']:.1f} ms | "
            f"{r['gs_first_ms']:.1f} ms | {r['torch_ms']:.0f} ms | {r['speedup']:.1f}x | "
            f"{r['gs_us_per_node']:.1f} | {r['gs_fwd_ratio']:.3f}x | {r['gs_same_ratio']:.3f}x | "
            f"{r['torch_fwd_ratio']:.3f}x | "
            f"{r['guard_us']:.1f} µs ({r['guard_share']:.2%}) |"
        )
    one = [r for r in rows if r["swap"] == "1 layer"]
    if len(one) > 1:
        print()
        print("| one-layer swap | " + " | ".join(f"{r['layers']} layers" for r in one) + " |")
        print("|---|" + "---:|" * len(one))
        base = one[0]["gs_ms"]
        growth = " | ".join(f"{r['gs_ms'] / base:.2f}x" for r in one)
        print(f"| gs.swap vs {one[0]['layers']} layers | {growth} |")
    every = [r for r in rows if r["call_overhead_us"] is not None]
    if every:
        print()
        print(
            "| every layer swapped for nn.Identity | "
            + " | ".join(f"{r['layers']} layers" for r in every)
            + " |"
        )
        print("|---|" + "---:|" * len(every))
        costs = " | ".join(f"{r['call_overhead_us']:.2f} µs" for r in every)
        print(f"| a swapped call over eager's loop | {costs} |")
        print()
        print(
            "| every layer swapped, against the same modules | inside the layers: gs / eager "
            "| outside, per layer: eager | gs | gs - eager |"
        )
        print("|---|---:|---:|---:|---:|")
        for r in every:
            same_, gs_ = r["split"]["same"], r["split"]["gs"]
            layers = r["layers"]
            print(
                f"| {layers} layers | {gs_['in'] / same_['in']:.4f}x "
                f"| {same_['out'] / layers * 1e6:.2f} µs | {gs_['out'] / layers * 1e6:.2f} µs "
                f"| {(gs_['out'] - same_['out']) / layers * 1e6:.2f} µs |"
            )
    print()
    print("| one-layer swap, one process | kept parts taken whole | every part written | ratio |")
    print("|---|---:|---:|---:|")
    for r in one:
        print(
            f"| {r['layers']} layers | {r['kept_ms']:.1f} ms | {r['written_ms']:.1f} ms | "
            f"{r['kept_ms'] / r['written_ms']:.2f}x |"
        )


if __name__ == "__main__":
    main()
