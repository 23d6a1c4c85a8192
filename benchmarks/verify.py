"""Peak memory of gs.verify on a large output, against torch's own comparisons of the same tensors.

The model returns one float32 tensor of about 100 MB, made in one allocation from a small
input (``x.expand(rows, cols) + offset``); the candidate is the same model with an offset of
1e-7, so every value differs a little and all of them are compared. Measured, each in a fresh
subprocess so the peaks never mix:

- ``gs.verify(reference, candidate, (x,))``: both runs and the comparison;
- the anchors, ``torch.testing.assert_close(b, a)`` and ``torch.allclose(b, a)``, on the same
  two tensors, made inside the measurement (so the two outputs count on both sides).

The figure is the increase of the peak resident set size (Linux ``VmHWM``, reset just before
the measured call through ``/proc/self/clear_refs``; ``ru_maxrss`` where that is refused) over
the resident size before the call, as a ratio to the output's size: the two outputs
themselves are 2.0 of it; the rest is what comparing them costs. A small warm-up call runs
first in each process, so one-time costs (lazy imports, first-call setup) are not counted.

Then the gradient check beside the forward check, ``gs.verify(..., backward=True)`` against
``gs.verify(...)``, each in a fresh subprocess, time and peak memory as above, on the same
large output and on a Llama built from a small config (Hugging Face's, 4 layers, hidden 256,
2 x 128 tokens) against its program with a fused RMSNorm (a hand-written backward) swapped in
at every norm (its times the best of five calls). The ratio is the backward check's cost over
the forward check's: the bound is about 3x. Those two runs are separate processes, whose
speed drifts apart by up to 30% on a shared host; so the Llama is also timed in one process,
in rotation (medians of 21): the forward check, the backward check, and torch's own eager
forward (no_grad) and forward+backward, the floor of a check that runs both sides.

Usage: python benchmarks/verify.py [--mb 100] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"  # the Llama's fused norms

CHILD = r"""
import json, os, re, resource, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import graphsurgeon as gs

torch.set_num_threads(1)
how, megabytes, quick = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "quick"
cols = 4096
rows = max(1, int(megabytes * 2**20 / 4 / cols))


class Big(torch.nn.Module):
    def __init__(self, offset, rows):
        super().__init__()
        self.offset, self.rows = offset, rows

    def forward(self, x):
        return x.expand(self.rows, cols) + self.offset  # one allocation of the output's size


def status(key):
    with open("/proc/self/status") as f:
        return int(re.search(key + r":\s+(\d+)", f.read()).group(1)) * 1024


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak (VmHWM) starts again from the current size
        return True
    except OSError:
        return False


def peak(reset):
    if reset:
        return status("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measured(run, small, large):
    run(small)  # warm-up: lazy imports and first-call setup are not what is measured
    reset = reset_peak()
    before = status("VmRSS")
    start = time.perf_counter()
    result = run(large)
    seconds = time.perf_counter() - start
    return result, peak(reset) - before, seconds


def with_verify(rows_):
    x = torch.randn(1, cols, generator=torch.Generator().manual_seed(0))
    return bool(gs.verify(Big(0.0, rows_), Big(1e-7, rows_), (x,)))


def with_torch(compare):
    def run(rows_):
        x = torch.randn(1, cols, generator=torch.Generator().manual_seed(0))
        a, b = x.expand(rows_, cols) + 0.0, x.expand(rows_, cols) + 1e-7
        return compare(a, b)

    return run


def assert_close(a, b):
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    return True


def with_backward(backward):
    def run(rows_):
        x = torch.randn(1, cols, generator=torch.Generator().manual_seed(0))
        return bool(gs.verify(Big(0.0, rows_), Big(1e-7, rows_), (x,), backward=backward))

    return run


def llama():
    # the Llama and its program with a fused RMSNorm at every norm: (model, program, ids, kwargs)
    import transformers

    sys.path.insert(0, sys.argv[4])
    from helpers.grad_models import fused_norms

    config = transformers.LlamaConfig(
        hidden_size=128 if quick else 256,
        intermediate_size=344 if quick else 688,
        num_hidden_layers=2 if quick else 4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=1000,
        max_position_embeddings=256,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 1000, (2, 32 if quick else 128))
    kwargs = {"use_cache": False}
    program = gs.swap(gs.export(model, (ids,), kwargs), fused_norms(model))
    return model, program, ids, kwargs


def llama_check(made, backward):
    model, program, ids, kwargs = made

    def run(_):
        report = gs.verify(model, program, (ids,), kwargs, rtol=1e-4, atol=1e-4, backward=backward)
        return bool(report)

    return run


def llama_times(rounds):
    # The Llama's checks and torch's own passes timed in one process, in rotation, so the
    # host's drift between processes does not enter the ratios: medians of `rounds`.
    import statistics

    made = llama()
    model, _, ids, kwargs = made
    forward_check, backward_check = llama_check(made, False), llama_check(made, True)
    parameters = list(model.parameters())

    def eager_forward(_):
        with torch.no_grad():
            model(ids, **kwargs)

    def eager_forward_backward(_):
        logits = model(ids, **kwargs).logits
        torch.autograd.grad(logits, parameters, torch.randn_like(logits))

    timed = {
        "forward check": forward_check,
        "backward check": backward_check,
        "eager forward": eager_forward,
        "eager forward+backward": eager_forward_backward,
    }
    times = {name: [] for name in timed}
    for run in timed.values():
        run(None)  # warm-up
    for round_ in range(rounds):
        names = list(timed)
        for name in names[round_ % 4 :] + names[: round_ % 4]:
            start = time.perf_counter()
            timed[name](None)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


runs = {
    "gs.verify": with_verify,
    "torch.testing.assert_close": with_torch(assert_close),
    "torch.allclose": with_torch(lambda a, b: torch.allclose(b, a, rtol=1e-5, atol=1e-5)),
    "large output, forward": with_backward(False),
    "large output, backward": with_backward(True),
}
if how == "llama, times":
    print(json.dumps(llama_times(9 if quick else 21)))
    sys.exit(0)
if how.startswith("llama"):
    runs[how] = llama_check(llama(), how.endswith("backward"))
ok, extra, seconds = measured(runs[how], 2, rows)
if how.startswith("llama"):  # a check of a few tens of ms: its time is the best of five
    for _ in range(4):
        start = time.perf_counter()
        runs[how](rows)
        seconds = min(seconds, time.perf_counter() - start)
print(json.dumps({"ok": ok, "extra": extra, "seconds": seconds, "output": rows * cols * 4}))
"""

CASES = ("gs.verify", "torch.testing.assert_close", "torch.allclose")
# the gradient check beside the forward check, per model
BACKWARD_CASES = ("large output", "llama")


def measure(how: str, megabytes: float, quick: bool = False) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how, str(megabytes), "quick" if quick else "", str(TESTS)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{how} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=100.0, help="the output's size in MiB")
    parser.add_argument("--quick", action="store_true", help="a 20 MiB output")
    options = parser.parse_args()
    megabytes = 20.0 if options.quick else options.mb
    rows = {how: measure(how, megabytes) for how in CASES}
    size = rows["gs.verify"]["output"]
    print(f"\none float32 output of {size / 2**20:.0f} MiB, compared with rtol=atol=1e-5\n")
    print("| comparison | verdict | peak RSS increase | / output size | time |")
    print("|---|---|---:|---:|---:|")
    for how in CASES:
        r = rows[how]
        print(
            f"| {how} | {'match' if r['ok'] else 'MISMATCH'} | {r['extra'] / 2**20:,.0f} MiB | "
            f"{r['extra'] / r['output']:.2f}x | {r['seconds']:.2f} s |"
        )
    anchor = rows["torch.testing.assert_close"]["extra"]
    print(f"\ngs.verify / assert_close peak increase: {rows['gs.verify']['extra'] / anchor:.2f}")

    print("\nthe gradient check beside the forward check (gs.verify(..., backward=True))\n")
    print(
        "| model | forward: time | backward: time | ratio | forward: peak | backward: peak "
        "| ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model in BACKWARD_CASES:
        forward = measure(f"{model}, forward", megabytes, options.quick)
        backward = measure(f"{model}, backward", megabytes, options.quick)
        if not (forward["ok"] and backward["ok"]):
            raise SystemExit(f"{model}: a check that must match did not: {forward} {backward}")
        print(
            f"| {model} | {forward['seconds']:.3f} s | {backward['seconds']:.3f} s "
            f"| {backward['seconds'] / forward['seconds']:.2f}x "
            f"| {forward['extra'] / 2**20:,.0f} MiB | {backward['extra'] / 2**20:,.0f} MiB "
            f"| {_ratio(backward['extra'], forward['extra'])} |"
        )

    times = measure("llama, times", megabytes, options.quick)
    check = times["backward check"] / times["forward check"]
    own = times["eager forward+backward"] / times["eager forward"]
    print(
        "\nthe Llama's checks timed in one process, in rotation (medians): the backward check "
        f"{times['backward check'] * 1e3:.1f} ms is {check:.2f}x the forward check "
        f"{times['forward check'] * 1e3:.1f} ms; torch's own forward+backward "
        f"{times['eager forward+backward'] * 1e3:.1f} ms is {own:.2f}x its forward "
        f"{times['eager forward'] * 1e3:.1f} ms (a check runs both sides: its floor); the "
        f"backward check is {times['backward check'] / (2 * times['eager forward+backward']):.2f}x "
        "two eager forward+backward passes"
    )


def _ratio(backward: float, forward: float) -> str:
    """The backward check's peak over the forward check's; none below 1 MiB, which the resident
    size cannot tell from the memory the warm-up left mapped."""
    if forward < 2**20:
        return "n/a (forward < 1 MiB)"
    return f"{backward / forward:.2f}x"


if __name__ == "__main__":
    main()
