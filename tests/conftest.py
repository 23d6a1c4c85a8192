"""Fixtures shared by every test module (the helpers they use are in ``tests/helpers``)."""

from __future__ import annotations

import pytest
import torch

import graphsurgeon as gs


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_background_builds(monkeypatch):
    """A widget builds its program in the background once its clicks pause, and the swap set
    up in its picker as soon as it is; the widgets of tests outlive them, so that work (and
    the collector's passes it brings) would land in later tests, at times no test chooses.
    Off here; on where a test asks for it, and in the browser tests' kernels."""
    from graphsurgeon.widget import _widget

    monkeypatch.setattr(_widget, "WARM_UP_DELAY", None)
    monkeypatch.setattr(_widget, "PREPARE_DELAY", None)


@pytest.fixture(autouse=True, scope="session")
def _check_kept_parts():
    """Every part of a swapped program's code taken from the cache is also written afresh and
    compared (a wrong reuse would run another program's code), and every rewrite's footprint
    (the nodes it may disturb, worked out before it builds) is checked against what it
    disturbed in the graph it made: in every test."""
    from graphsurgeon.rewrite import _builder, _parts

    _parts.CHECK_KEPT_PARTS = True
    _builder.CHECK_FOOTPRINT = True
    yield
    _parts.CHECK_KEPT_PARTS = False
    _builder.CHECK_FOOTPRINT = False


@pytest.fixture(scope="session")
def tiny_gpt():
    """A 2-layer TinyGPT in eval mode, its example tokens and its program, exported once.
    Nothing in graphsurgeon changes them; tests must not either."""
    from graphsurgeon.examples import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(2).eval()
    tokens = model.example_input()
    return model, tokens, gs.export(model, (tokens,))
