"""The demo command: the main job of `make demo`, on a small model."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def test_demo_exports_swaps_verifies_and_reports():
    done = subprocess.run(
        [sys.executable, "-m", "graphsurgeon", "demo", "--layers", "4", "--rounds", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "layers.1.attn: 20 graph nodes -> one call" in out
    assert "swapped program vs eager model with the same replacement:\n  verify: match" in out
    assert "verify: MISMATCH" in out, "the approximate MLP's drift is reported"
    timings = re.search(
        r"forward ([\d.]+) ms \(eager reference ([\d.]+) ms, ratio ([\d.]+)x\)", out
    )
    assert timings, "the forward timings are printed"
    swapped, eager, ratio = map(float, timings.groups())
    assert swapped > 0 and eager > 0 and ratio == pytest.approx(swapped / eager, rel=0.1)
    assert "Attention" in out and "swappable" in out, "the module table is printed"
