"""s.bisect(): program runs and time to find the wrong swaps among many, against the bound.

The model is the GPT-like decoder of ``graphsurgeon.examples`` (hidden 64, 1x16 tokens) at 96
layers, exported once. For each case, ``n`` layers spread over the decoder have their attention
swapped, each for :class:`FusedAttention` (faithful) or, for ``k`` of them, for a copy that
forgets the causal mask; ``s.bisect(rtol=1e-4, atol=1e-4)`` must name exactly those ``k``.

Reported per case: the runs bisect made (the original's included) against the bound
``2 k ceil(log2 n) + 2`` and against testing each swap alone (``n + 1`` runs), the programs it
built, and its time against the anchor measured beside it: one test, that is one program with
every swap built by ``gs.swap`` and run once (bisect's time is about its runs times that).
Beside it, ``s.bisect(backward=True)`` on the same swaps (each run forward and backward, from
the same seeded upstream gradients): the same culprits, its runs and its time over the
forward bisection's.

(This script is not named ``bisect.py``: run as a script, its folder comes first on
``sys.path``, and a ``bisect.py`` there would hide the standard library's ``bisect`` module
from every benchmark, ``random`` and so ``torch`` included.)

Usage: python benchmarks/bisection.py [--layers 96]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings

# (swaps, the positions among them that are wrong)
CASES = ((10, (3, 7)), (10, (6,)), (16, (2, 9, 13)), (5, ()), (32, (5, 20)))


def run(layers: int) -> list[dict]:
    import torch

    import graphsurgeon as gs
    from graphsurgeon.examples import FusedAttention, TinyGPT

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from locate import buggy_attention

    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    results = []
    for count, wrong in CASES:
        chosen = [round(i * (layers - 1) / max(count - 1, 1)) for i in range(count)]
        surgery = gs.Surgery(ep, args=(tokens,))
        swaps = {}
        for position, layer in enumerate(chosen):
            attention = model.layers[layer].attn
            replacement = (
                buggy_attention(attention) if position in wrong else FusedAttention(attention)
            )
            swaps[f"layers.{layer}.attn"] = replacement
            surgery.swap(f"layers.{layer}.attn", replacement)
        expected = tuple(f"layers.{chosen[p]}.attn" for p in wrong)

        start = time.perf_counter()
        with torch.no_grad():
            gs.swap(ep, swaps)(tokens)
        one_test = time.perf_counter() - start

        start = time.perf_counter()
        found = surgery.bisect(rtol=1e-4, atol=1e-4)
        seconds = time.perf_counter() - start
        if found.culprits != expected:
            raise SystemExit(f"bisect named {found.culprits}, the wrong swaps are {expected}")
        start = time.perf_counter()
        with_grads = surgery.bisect(rtol=1e-4, atol=1e-4, backward=True)
        backward_seconds = time.perf_counter() - start
        if with_grads.culprits != expected:
            raise SystemExit(
                f"bisect(backward=True) named {with_grads.culprits}, the wrong swaps are {expected}"
            )
        bound = 2 * len(wrong) * math.ceil(math.log2(count)) + 2
        results.append(
            {
                "n": count,
                "k": len(wrong),
                "runs": found.runs,
                "bound": bound,
                "builds": found.builds,
                "seconds": seconds,
                "one_test": one_test,
                "backward_runs": with_grads.runs,
                "backward_seconds": backward_seconds,
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=96)
    options = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    print(
        f"torch {torch.__version__}, 1 thread; GPT-like decoder, {options.layers} layers, "
        "hidden 64, 1x16 tokens",
        file=sys.stderr,
    )
    results = run(options.layers)
    print(
        "\n| swaps n | wrong k | runs | bound 2k⌈log2 n⌉+2 | each alone (n+1) | built "
        "| bisect | one test (anchor) | vs anchor | backward=True: runs | time | vs forward |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['n']} | {r['k']} | {r['runs']} | {r['bound']} | {r['n'] + 1} | {r['builds']} "
            f"| {r['seconds']:.2f} s | {r['one_test'] * 1e3:.0f} ms "
            f"| {r['seconds'] / r['one_test']:.1f}x | {r['backward_runs']} "
            f"| {r['backward_seconds']:.2f} s | {r['backward_seconds'] / r['seconds']:.1f}x |"
        )


if __name__ == "__main__":
    main()
