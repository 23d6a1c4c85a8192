"""The one door: every entry point reads programs and inputs alike (graphsurgeon._program).

The same wrong object (the eager model where a program goes) gets one error class from every
verb, and so do the same wrong inputs (a list where the tuple of positional inputs goes), with
a message that names the verb.
"""

from __future__ import annotations

import pytest
import torch
from helpers.models import Chain
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks.bisect import bisect
from graphsurgeon.checks.overlay import overlay_values
from graphsurgeon.errors import InputStructureError, NotAProgramError
from graphsurgeon.render import graph_view
from graphsurgeon.report import build_report


@pytest.fixture(scope="module")
def made():
    torch.manual_seed(0)
    model = Chain()
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,))
    surgery = gs.Surgery(ep, args=(x,)).swap("act", nn.GELU())
    return model, x, ep, surgery


def relu(x):
    return torch.relu(x)


# verb named in the message -> the call, given (model, x, ep, surgery)
WITH_THE_MODEL = {
    "compare": lambda m, x, ep, s: gs.compare(m, s.module, (x,)),
    "compare ": lambda m, x, ep, s: gs.compare(ep, m, (x,)),  # the swapped side
    "bisect": lambda m, x, ep, s: bisect(m, (x,)),
    "overlay": lambda m, x, ep, s: overlay_values(m, (x,), kind="error"),
    "report": lambda m, x, ep, s: build_report(m, args=(x,)),
    "find": lambda m, x, ep, s: gs.find(m, relu, (x,)),
    "Surgery": lambda m, x, ep, s: gs.Surgery(m, args=(x,)),
    "Stepper": lambda m, x, ep, s: gs.Stepper(m, x),
    "forget": lambda m, x, ep, s: gs.forget(m),
    "swap": lambda m, x, ep, s: gs.swap(m, {"act": nn.GELU()}),
    "fuse": lambda m, x, ep, s: gs.fuse(m, ["act"]),
    "partition": lambda m, x, ep, s: gs.partition(m),
    "module_tree": lambda m, x, ep, s: gs.module_tree(m),
    "to_dot": lambda m, x, ep, s: gs.to_dot(m),
    "to_svg": lambda m, x, ep, s: gs.to_svg(m),
    "draw": lambda m, x, ep, s: gs.draw(m),
    "graph_view": lambda m, x, ep, s: graph_view(m),
}

WITH_A_LIST = {
    "verify": lambda m, x, ep, s: gs.verify(m, s.module, [x]),
    "compare": lambda m, x, ep, s: gs.compare(ep, s.module, [x]),
    "bisect": lambda m, x, ep, s: bisect(s, [x]),
    "bisect ": lambda m, x, ep, s: s.bisect([x]),
    "overlay": lambda m, x, ep, s: overlay_values(s, [x], kind="error"),
    "report": lambda m, x, ep, s: build_report(s, args=[x]),
    "find": lambda m, x, ep, s: gs.find(ep, relu, [x]),
    "replace": lambda m, x, ep, s: gs.Surgery(ep).replace(relu, nn.GELU(), [x]),
    "export": lambda m, x, ep, s: gs.export(m, [x]),
    "Surgery": lambda m, x, ep, s: gs.Surgery(ep, args=[x]),
    "Surgery.from_model": lambda m, x, ep, s: gs.Surgery.from_model(m, [x]),
    "verify ": lambda m, x, ep, s: s.verify([x]),
    "compare  ": lambda m, x, ep, s: s.compare([x]),
    "export ": lambda m, x, ep, s: s.export([x]),
    "to_dot": lambda m, x, ep, s: gs.to_dot(s, overlay="error", args=[x]),
    "to_svg": lambda m, x, ep, s: gs.to_svg(s, overlay="error", args=[x]),
    "draw": lambda m, x, ep, s: gs.draw(s, overlay="error", args=[x]),
    "graph_view": lambda m, x, ep, s: graph_view(s, overlay="error", args=[x]),
}

CASES = [
    pytest.param(NotAProgramError, verb, call, id=f"{verb.strip()}-the model")
    for verb, call in WITH_THE_MODEL.items()
] + [
    pytest.param(InputStructureError, verb, call, id=f"{verb.strip()}-a list")
    for verb, call in WITH_A_LIST.items()
]


@pytest.mark.parametrize(("error", "verb", "call"), CASES)
def test_every_entry_point_refuses_the_model_and_a_list_alike(made, error, verb, call):
    """The eager model where a program goes: NotAProgramError; ``[x]`` where ``(x,)`` goes:
    InputStructureError; from every verb, naming it first."""
    with pytest.raises(error) as caught:
        call(*made)
    assert type(caught.value) is error, type(caught.value)
    message = str(caught.value)
    what = "a model: export it first" if error is NotAProgramError else "got a list; pass tuple("
    assert what in message, message
    verb = verb.strip()
    assert message.startswith(f"{verb}: "), message


def test_one_value_is_the_one_input_and_a_surgery_lends_its_own(made):
    model, x, ep, surgery = made
    assert gs.verify(model, model, x)  # a lone tensor is (x,), as gs.export reads it
    assert gs.Surgery(ep, args=x).args == (x,)
    stepper = gs.Stepper(surgery)  # no inputs given: the Surgery's
    assert stepper.continue_().reason == "end"
    assert torch.equal(stepper.output, surgery.module(x))
