"""gs.export against plain torch.export on an 80-layer Llama-3-70B-shaped model on the meta device.

Each export runs in a fresh subprocess so its peak memory (max RSS) is its own. gs.export
preserves every module's call signature (preserve="all"); plain torch.export preserves none.
The model's weights are never allocated: every tensor lives on the meta device.

Usage: python benchmarks/export.py [--layers 80] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import graphsurgeon as gs
from graphsurgeon.examples import LlamaLike
layers, how = int(sys.argv[1]), sys.argv[2]
with torch.device("meta"):
    model = LlamaLike(n_layers=layers)
    tokens = torch.zeros(1, 16, dtype=torch.long)
start = time.perf_counter()
if how == "torch":
    ep = torch.export.export(model, (tokens,))
else:
    ep = gs.export(model, (tokens,))
seconds = time.perf_counter() - start
tree_s = 0.0
preserved = sum(1 for e in ep.module_call_graph if e.signature is not None)
if how == "gs":
    start = time.perf_counter()
    tree = gs.module_tree(ep)
    tree_s = time.perf_counter() - start
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "nodes": len(ep.graph.nodes), "peak_mb": peak_mb,
                  "preserved": preserved, "tree_s": tree_s}))
"""


def measure(layers: int, how: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(layers), how], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{how} export failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--quick", action="store_true", help="8 layers")
    options = parser.parse_args()
    layers = 8 if options.quick else options.layers
    rows = {how: measure(layers, how) for how in ("torch", "gs")}
    print(f"\nLlama-3-70B-shaped decoder, {layers} layers, meta device, 1x16 tokens\n")
    print("| export | nodes | modules preserved | time | peak RSS |")
    print("|---|---:|---:|---:|---:|")
    for how, label in (("torch", "torch.export.export"), ("gs", 'gs.export (preserve="all")')):
        r = rows[how]
        print(
            f"| {label} | {r['nodes']:,} | {r['preserved']} | {r['seconds']:.1f} s | "
            f"{r['peak_mb']:.0f} MB |"
        )
    print(f"\ngs.module_tree on it: {rows['gs']['tree_s'] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
