"""Fixtures shared by every test module (the helpers they use are in ``tests/helpers``)."""

from __future__ import annotations

import pytest
import torch

import graphsurgeon as gs


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_gpt():
    """A 2-layer TinyGPT in eval mode, its example tokens and its program, exported once.
    Nothing in graphsurgeon changes them; tests must not either."""
    from graphsurgeon.examples import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(2).eval()
    tokens = model.example_input()
    return model, tokens, gs.export(model, (tokens,))
