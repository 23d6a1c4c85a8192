"""The demo command: the main job of `make demo`, on a small model."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def test_demo_exports_swaps_verifies_and_reports(tmp_path):
    report = tmp_path / "demo" / "report.html"  # a folder of its own: the demo makes it
    command = [sys.executable, "-m", "graphsurgeon", "demo", "--layers", "4", "--rounds", "3"]
    done = subprocess.run(
        [*command, "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,  # nothing is written where the tests run
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

    # it ends by writing the report, and says where it is and where the tutorials are
    assert f"report: {report} (" in out and "open it in a browser" in out
    assert out.rstrip().endswith(
        "`make lab` (in a checkout of graphsurgeon) opens the notebooks in JupyterLab"
    )
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") and "graphsurgeon demo: TinyGPT, 4 layers" in html
    for section in ("swaps", "checks", "picture", "tree", "notes"):
        assert f'<section id="{section}">' in html
    assert "FusedAttention" in html and "first divergence: layers.3.mlp" in html
    assert "torch.export attempt" in html, "the export notes of this very export"
    assert not list(tmp_path.glob("out")), "--report chose the file"
