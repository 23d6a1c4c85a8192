"""gs.compare alone against gs.compare followed by cmp.locate(), side by side on the same program.

The model is the GPT-like decoder of ``graphsurgeon.examples`` (hidden 64, 1x16 tokens) at 96
layers, exported once with every layer and every attention module preserved. One layer's
attention (``layers.48.attn``) is swapped for a copy of :class:`FusedAttention` that forgets
the causal mask, so compare finds one diverging call and locate has a line to find in it.

Measured, interleaved round by round so that drift hits all alike (medians):

- ``compare(..., locate=False)``: the anchor, compare alone;
- ``compare(..., locate=False)`` then ``cmp.locate()``: what a user pays for the line (locate
  exports the replacement on the call's inputs and runs it and the original call node by node);
- ``compare(...)`` as called by default, which locates a call this small on its own;
- ``compare(..., backward=True, locate=False)``: the same program, forward and backward (each
  swapped call's gradients too, and the program's): the issue's bound is ~3x compare alone.
  With the causal mask forgotten, every gradient upstream of the call differs, and verify's
  per-axis pattern of each differing gradient adds to it; so the faithful swap (a right
  FusedAttention) is timed too, forward alone and with ``backward=True``;
- the backward pass located: ``layers.48.ln2`` swapped for a LayerNorm with a hand-written
  backward whose weight gradient is twice what it should be, ``compare(..., backward=True,
  locate=False)`` then ``cmp.locate()`` (which names the planted line of the backward).

Each run starts from a program whose runnable original is already built (a warm-up compare
builds it); the first locate in the process (torch.export's own imports) is a warm-up too.
The ratio to compare alone is the figure to read (target: compare + locate within 3x).

Usage: python benchmarks/locate.py [--layers 96] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings


def buggy_attention(original):
    """A FusedAttention whose forward forgets ``is_causal=True``."""
    import torch
    from torch import nn

    from graphsurgeon.examples import FusedAttention

    class NoCausalMask(FusedAttention):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, tokens, hidden = x.shape
            q, k, v = (
                self.qkv(x)
                .view(batch, tokens, 3, self.heads, hidden // self.heads)
                .permute(2, 0, 3, 1, 4)
            )
            out = nn.functional.scaled_dot_product_attention(q, k, v)  # the planted bug
            return self.o(out.transpose(1, 2).reshape(batch, tokens, hidden))

    return NoCausalMask(original)


def doubled_weight_gradient(original):
    """A LayerNorm whose backward, written by hand, doubles the weight's gradient."""
    import torch
    from torch import nn

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, eps):
            mean = x.mean(-1, keepdim=True)
            rstd = torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + eps)
            normed = (x - mean) * rstd
            ctx.save_for_backward(normed, weight, rstd)
            return normed * weight + bias

        @staticmethod
        def backward(ctx, grad):
            normed, weight, rstd = ctx.saved_tensors
            flat = grad.reshape(-1, grad.shape[-1])
            grad_weight = (flat * normed.reshape(flat.shape)).sum(0) * 2  # the planted bug
            grad_normed = grad * weight
            mean = grad_normed.mean(-1, keepdim=True)
            mean_normed = (grad_normed * normed).mean(-1, keepdim=True)
            grad_x = (grad_normed - mean - normed * mean_normed) * rstd
            return grad_x, grad_weight, flat.sum(0), None

    class HandLayerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(original.weight.detach().clone())
            self.bias = nn.Parameter(original.bias.detach().clone())

        def forward(self, x):
            return Function.apply(x, self.weight, self.bias, original.eps)

    return HandLayerNorm()


def run(layers: int, rounds: int) -> dict:
    import torch

    import graphsurgeon as gs
    from graphsurgeon.examples import FusedAttention, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(n_layers=layers).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(layers)] + [f"layers.{i}.attn" for i in range(layers)]
    preserve.append(f"layers.{layers // 2}.ln2")
    ep = gs.export(model, (tokens,), preserve=preserve)
    name = f"layers.{layers // 2}.attn"
    swapped = gs.swap(ep, {name: buggy_attention(model.layers[layers // 2].attn)})
    faithful = gs.swap(ep, {name: FusedAttention(model.layers[layers // 2].attn)})
    norm = f"layers.{layers // 2}.ln2"
    norm_swapped = gs.swap(ep, {norm: doubled_weight_gradient(model.layers[layers // 2].ln2)})

    def alone():
        return gs.compare(ep, swapped, (tokens,), locate=False)

    def then_locate():
        comparison = gs.compare(ep, swapped, (tokens,), locate=False)
        return comparison, comparison.locate()

    def by_default():
        return gs.compare(ep, swapped, (tokens,))

    def backward_alone():
        return gs.compare(ep, swapped, (tokens,), locate=False, backward=True)

    def backward_then_locate():
        comparison = gs.compare(ep, norm_swapped, (tokens,), locate=False, backward=True)
        return comparison, comparison.locate()

    def faithful_forward():
        return gs.compare(ep, faithful, (tokens,), locate=False)

    def faithful_backward():
        return gs.compare(ep, faithful, (tokens,), locate=False, backward=True)

    runs = {
        "compare alone": alone,
        "compare, then locate()": then_locate,
        "compare (default)": by_default,
        "compare, backward=True": backward_alone,
        "compare, backward=True, then locate() in the backward": backward_then_locate,
        "faithful swap: compare alone": faithful_forward,
        "faithful swap: compare, backward=True": faithful_backward,
    }
    _, found = then_locate()  # warm-up: the runnable original, torch.export's imports
    if not found or found.call != name:
        raise SystemExit(f"locate did not find the planted bug in {name}: {found}")
    cmp, found_backward = backward_then_locate()
    if cmp.first_divergence_pass != "backward" or "the planted bug" not in found_backward.line:
        raise SystemExit(
            f"locate did not find the planted backward bug in {norm}: {found_backward}"
        )
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, function in runs.items():
            start = time.perf_counter()
            function()
            times[label].append(time.perf_counter() - start)
    return {
        "layers": layers,
        "nodes": len(ep.graph.nodes),
        "call": name,
        "found": str(found),
        "found backward": str(found_backward),
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
    anchor = result["medians"]["compare alone"]
    print(
        f"\n{result['layers']} layers ({result['nodes']:,} nodes), {result['call']} swapped for a copy without the causal mask"
    )
    print(f"located: {result['found']}")
    print(f"located in the backward: {result['found backward']}\n")
    print("| run | time | vs compare alone |")
    print("|---|---:|---:|")
    for label, seconds in result["medians"].items():
        print(f"| {label} | {seconds * 1e3:.0f} ms | {seconds / anchor:.2f}x |")
    medians = result["medians"]
    print(
        "\nbackward / forward: "
        f"{medians['compare, backward=True'] / anchor:.2f}x with the planted bug, "
        f"{medians['faithful swap: compare, backward=True'] / medians['faithful swap: compare alone']:.2f}x"
        " on the faithful swap"
    )


if __name__ == "__main__":
    main()
