"""The ``graphsurgeon`` command: ``demo`` and ``modules`` (more subcommands to come).

Exit codes: 0 success, 1 the command ran and found a problem (a mismatch), 2 bad usage or an
unreadable program file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _load_program(path_text: str):
    import torch

    path = Path(path_text)
    if not path.exists():
        raise SystemExit(_fail(f"{path}: no such file"))
    if path.is_dir():
        raise SystemExit(_fail(f"{path}: is a directory, expected a .pt2 file"))
    if path.suffix != ".pt2":
        raise SystemExit(
            _fail(f"{path}: expected a .pt2 file saved with torch.export.save, got {path.suffix or 'no suffix'!r}")
        )
    try:
        return torch.export.load(str(path))
    except Exception as error:
        raise SystemExit(
            _fail(f"{path}: not a readable torch.export program ({type(error).__name__}: {error})")
        ) from None


def _fail(message: str) -> int:
    print(f"graphsurgeon: error: {message}", file=sys.stderr)
    return 2


def _cmd_modules(options) -> int:
    import graphsurgeon as gs

    ep = _load_program(options.program)
    print(gs.module_tree(ep).table())
    return 0


def _cmd_demo(options) -> int:
    import torch

    import graphsurgeon as gs
    from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(n_layers=options.layers).eval()
    tokens = model.example_input()
    print(f"model: TinyGPT, {options.layers} layers, hidden 64; input tokens {list(tokens.shape)}")

    start = time.perf_counter()
    ep = gs.export(model, (tokens,))
    export_s = time.perf_counter() - start
    tree = gs.module_tree(ep)
    print(f"exported: {len(ep.graph.nodes)} graph nodes, {len(tree) - 1} modules in {export_s:.2f} s\n")
    print(tree.table())

    replacements = {"layers.1.attn": FusedAttention(model.layers[1].attn)}
    print("\nswap: layers.1.attn (Attention, written out) -> FusedAttention (scaled_dot_product_attention)")
    start = time.perf_counter()
    swapped = gs.swap(ep, replacements)
    swap_s = time.perf_counter() - start
    info = gs.swap_info(swapped)
    for call, node in info.call_nodes.items():
        removed = len(info.partitions[call].nodes)
        print(f"  {call}: {removed} graph nodes -> one call ({node}) in {swap_s * 1e3:.1f} ms")

    reference = gs.eager_reference(model, replacements)
    report = gs.verify(reference, swapped, (tokens,))
    print("\nswapped program vs eager model with the same replacement:")
    print("  " + str(report).replace("\n", "\n  "))
    against_original = gs.verify(model, swapped, (tokens,), rtol=1e-4, atol=1e-5)
    print("swapped program vs the original model (is the fused attention equivalent?):")
    print("  " + str(against_original).replace("\n", "\n  "))

    approx = {"layers.3.mlp": GeluTanhMLP(model.layers[3].mlp)} if options.layers > 3 else {}
    ok = bool(report) and bool(against_original)
    if approx:
        print("\nswap: layers.3.mlp -> GeluTanhMLP (tanh approximation of GELU: close, not equal)")
        drifted = gs.swap(ep, {**replacements, **approx})
        drift = gs.verify(model, drifted, (tokens,))
        print("  " + str(drift).replace("\n", "\n  "))
        print("  (a mismatch is expected here: verify reports it instead of raising)")

    with torch.no_grad():
        timings = {}
        for name, module in (("eager", reference), ("swapped", swapped)):
            for _ in range(5):
                module(tokens)
            start = time.perf_counter()
            for _ in range(50):
                module(tokens)
            timings[name] = (time.perf_counter() - start) / 50
    print(
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
    demo.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    demo.set_defaults(run=_cmd_demo)

    modules = commands.add_parser("modules", help="the module tree of a .pt2 program as a table")
    modules.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    modules.set_defaults(run=_cmd_modules)

    options = parser.parse_args(argv)
    try:
        return options.run(options)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
