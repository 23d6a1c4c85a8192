"""gs.export against plain torch.export on an 80-layer Llama-3-70B-shaped model on the meta device,
and on tiny Hugging Face models (``--hf``).

Each export of the big model runs in a fresh subprocess so its peak memory (max RSS) is its own.
gs.export preserves every module's call signature (preserve="all"); plain torch.export
preserves none. The model's weights are never allocated: every tensor lives on the meta device.

``--hf``: tiny 2-layer Gemma3, Llama, T5, BERT and ViT from transformers, in one process, runs
interleaved (medians, 1 thread): plain ``torch.export.export``, the same asked to preserve
every module's signature (what preserving costs in torch itself: a tracepoint pair per module
call), and ``gs.export`` (it preserves every module, drops what torch cannot keep and exports
again: Gemma3's rotary embedding takes a string, one retry).

Usage: python benchmarks/export.py [--layers 80] [--quick] [--hf [--rounds 5]]
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


def hf_models():
    """Tiny 2-layer Hugging Face models: name, model, args, kwargs."""
    import torch
    import transformers as hf

    torch.manual_seed(0)
    ids = torch.randint(0, 128, (1, 8))
    text = {"vocab_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}
    sizes = {**text, "hidden_size": 32, "intermediate_size": 64, "max_position_embeddings": 64}
    gemma = hf.Gemma3TextConfig(**sizes, num_key_value_heads=1, head_dim=16, sliding_window=8)
    yield "Gemma3", hf.Gemma3ForCausalLM(gemma), (ids,), {"use_cache": False}
    llama = hf.LlamaConfig(**sizes, num_key_value_heads=1)
    yield "Llama", hf.LlamaForCausalLM(llama), (ids,), {"use_cache": False}
    t5 = hf.T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    decoder_ids = torch.randint(1, 128, (1, 6))
    kwargs = {"decoder_input_ids": decoder_ids, "use_cache": False}
    yield "T5", hf.T5ForConditionalGeneration(t5), (ids,), kwargs
    yield "BERT", hf.BertModel(hf.BertConfig(**sizes)), (ids,), {}
    vit = hf.ViTConfig(**{k: v for k, v in sizes.items() if k not in ("vocab_size", "max_position_embeddings")}, image_size=32, patch_size=8)  # fmt: skip
    yield "ViT", hf.ViTModel(vit), (torch.randn(1, 3, 32, 32),), {}


def hf_times(model, args: tuple, kwargs: dict, rounds: int) -> tuple[dict[str, float], int]:
    """Medians of the three exports of one model, interleaved; and gs.export's attempts."""
    import statistics
    import time

    import torch

    import graphsurgeon as gs
    from graphsurgeon.export import export_notes

    every = tuple(n for n, _ in model.named_modules() if n)
    ep = gs.export(model, args, kwargs)  # warm up, and what torch can preserve of it
    kept = tuple(n for n in every if n not in export_notes(ep).dropped)
    runs = {
        "torch": lambda: torch.export.export(model, args, kwargs=kwargs),
        "preserving": lambda: torch.export.export(
            model, args, kwargs=kwargs, preserve_module_call_signature=kept
        ),
        "gs": lambda: gs.export(model, args, kwargs),
    }
    times: dict[str, list[float]] = {how: [] for how in runs}
    for round_ in range(rounds):
        for how in list(runs)[round_ % 3 :] + list(runs)[: round_ % 3]:
            start = time.perf_counter()
            runs[how]()
            times[how].append(time.perf_counter() - start)
    return {how: statistics.median(values) for how, values in times.items()}, export_notes(
        ep
    ).attempts


def hf_main(rounds: int) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print("\n| model | torch.export | torch.export, every signature preserved | gs.export | "
          "gs / torch | gs / torch preserving | gs attempts |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, model, args, kwargs in hf_models():
        t, attempts = hf_times(model.eval(), args, kwargs, rounds)
        print(
            f"| {name} | {t['torch']:.2f} s | {t['preserving']:.2f} s | {t['gs']:.2f} s | "
            f"{t['gs'] / t['torch']:.2f}x | {t['gs'] / t['preserving']:.2f}x | {attempts} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--quick", action="store_true", help="8 layers")
    parser.add_argument("--hf", action="store_true", help="tiny Hugging Face models instead")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds for --hf")
    options = parser.parse_args()
    if options.hf:
        hf_main(options.rounds)
        return
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
