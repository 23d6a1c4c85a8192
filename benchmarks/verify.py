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

Usage: python benchmarks/verify.py [--mb 100] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, os, re, resource, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import graphsurgeon as gs

torch.set_num_threads(1)
how, megabytes = sys.argv[1], float(sys.argv[2])
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


runs = {
    "gs.verify": with_verify,
    "torch.testing.assert_close": with_torch(assert_close),
    "torch.allclose": with_torch(lambda a, b: torch.allclose(b, a, rtol=1e-5, atol=1e-5)),
}
ok, extra, seconds = measured(runs[how], 2, rows)
print(json.dumps({"ok": ok, "extra": extra, "seconds": seconds, "output": rows * cols * 4}))
"""

CASES = ("gs.verify", "torch.testing.assert_close", "torch.allclose")


def measure(how: str, megabytes: float) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how, str(megabytes)],
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


if __name__ == "__main__":
    main()
