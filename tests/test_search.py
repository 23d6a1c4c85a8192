"""search(program, text): the one reading of what a person types to find modules and ops."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.models import Chain
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import graphsurgeon as gs
from graphsurgeon.patterns.search import Match, initials, search


@pytest.fixture(scope="module")
def conv():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    return model, x, gs.export(model, (x,))


def pairs(matches):
    return [(m.name, m.kind) for m in matches]


def test_by_name_type_op_initials_and_regex(tiny_gpt):
    _, _, ep = tiny_gpt
    by_name = search(ep, "layers.1.mlp")
    assert by_name[0] == Match("layers.1.mlp", "module", "MLP"), "the exact name first"
    assert {m.name for m in by_name if m.kind == "module"} >= {"layers.1.mlp.up"}
    layer_norms = search(ep, "layernorm")  # a type, in any case
    assert layer_norms and all(m.what == "LayerNorm" for m in layer_norms if m.kind == "module")
    gelus = search(ep, "aten.gelu")  # an op
    assert [m.what for m in gelus] == ["aten.gelu", "aten.gelu"]
    assert all(m.kind == "node" for m in gelus)
    assert pairs(search(ep, r"layers\.\d+\.mlp$")) == [
        ("layers.0.mlp", "module"),
        ("layers.1.mlp", "module"),
    ]


def test_initials_of_types_and_ops(conv):
    _, _, ep = conv
    assert pairs(search(ep, "bn")) == [("1", "module"), ("batch_norm", "node")]
    assert initials("scaled_dot_product_attention") == "sdpa" and initials("BatchNorm2d") == "bn"
    assert initials("relu") == "" and initials("Linear") == ""


def test_modules_first_then_ops_in_graph_order_and_a_blank_text_finds_nothing(tiny_gpt):
    _, _, ep = tiny_gpt
    found = search(ep, "attn")
    kinds = [m.kind for m in found]
    assert kinds == sorted(kinds, key=lambda kind: kind != "module"), "modules, then nodes"
    order = {node.name: i for i, node in enumerate(ep.graph.nodes)}
    nodes = [order[m.name] for m in found if m.kind == "node"]
    assert nodes == sorted(nodes)
    assert search(ep, "") == [] and search(ep, "   ") == []
    assert search(ep, "nothing-like-this") == []


def test_a_text_that_is_no_valid_regex_is_read_as_text(tiny_gpt):
    _, _, ep = tiny_gpt
    assert search(ep, "layers.0.mlp(") == [], "no regex, and no name has the parenthesis"
    assert search(ep, "[") == []


def test_a_swapped_or_fused_module_is_found_once_in_every_form_of_a_program():
    model = Chain().eval()
    x = torch.randn(2, 4)
    surgery = gs.Surgery.from_model(model, (x,))
    assert pairs(search(surgery, r"act$")) == [("act", "module")], "precondition"
    surgery.swap("act", nn.GELU())
    assert pairs(search(surgery, r"act$")) == [("act", "module")], "not again as its call"
    assert pairs(search(surgery.module, r"act$")) == [("act", "module")], "a swap result too"
    assert [m.name for m in search(surgery, "act")].count("act") == 1
    surgery.undo()
    surgery.fuse("act")
    assert pairs(search(surgery, r"act$")) == [("act", "module")]


@pytest.fixture(scope="module")
def swapped_chain():
    model = Chain().eval()
    surgery = gs.Surgery.from_model(model, (torch.randn(2, 4),))
    surgery.swap("act", nn.GELU())
    return surgery


_TEXTS = ["lin", "linear", "linear_1", "act", "attn", "layers.1", "l", "a", "ln", r"\d$", "mlp.up"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_TEXTS), st.integers(0, 40), st.booleans())
def test_a_limit_keeps_the_first_matches_of_the_full_list(
    tiny_gpt, swapped_chain, text, limit, gpt
):
    # the widget keeps the first MATCHES; a limit stops the reading there, and must keep
    # exactly those: an exact name first, the modules in tree order, the ops in graph order
    program = tiny_gpt[2] if gpt else swapped_chain
    everything = search(program, text)
    assert search(program, text, limit=limit) == everything[:limit]
    assert search(program, text, limit=None) == everything


def test_an_exact_name_comes_first_under_any_limit(tiny_gpt):
    # the node "linear" is found after every Linear module; named exactly, it leads anyway
    _, _, ep = tiny_gpt
    found = search(ep, "linear")
    assert found[0] == Match("linear", "node", "aten.linear"), "precondition: exact first"
    assert found[1].kind == "module" and found[1].what == "Linear", "precondition: modules"
    assert search(ep, "linear", limit=1) == [found[0]]
    assert search(ep, "layers.1.attn", limit=1) == [Match("layers.1.attn", "module", "Attention")]


def test_the_ops_are_the_programs_as_it_is_now():
    model = Chain().eval()
    surgery = gs.Surgery.from_model(model, (torch.randn(2, 4),))
    assert [m.name for m in search(surgery, "aten.relu")] == ["relu"]
    surgery.swap("act", nn.GELU())
    assert search(surgery, "aten.relu") == [], "the swap removed it"
    assert search(surgery.program, "aten.relu") != [], "the original program still has it"


def test_what_is_no_program_is_refused_as_everywhere(conv):
    model, _, _ = conv
    with pytest.raises(gs.errors.NotAProgramError, match=r"search: .*export it first"):
        search(model, "bn")


def test_a_match_is_a_frozen_record():
    match = Match("layers.0", "module", "Block")
    with pytest.raises(dataclasses.FrozenInstanceError):
        match.name = "other"  # type: ignore[misc]
    assert match == Match("layers.0", "module", "Block") and hash(match)


_WORDS = ["layers", "attn", "İnner", "ẞlock", "LayerNorm", "aten.gelu", "sdpa", "0", "1", "Σ"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3),
            st.sampled_from(["", "ln", "sdpa", "bn"]),
        ),
        max_size=12,
    ),
    st.sampled_from(["att", "ATTN", "i̇nner", "ln", "layers.1", "^lay", "Σ", "ss", "norm$", "sdpa"]),
)
def test_the_joined_texts_find_what_a_row_by_row_reading_finds(rows, text):
    # the one text all rows are joined into (a str.find over it) against each row read alone;
    # among the words, some whose lower case is longer than they are ("İ") or differs ("ẞ")
    from graphsurgeon.patterns.search import _Matcher, _Texts

    table = [(f"row{i}", "what", tuple(words), initial) for i, (words, initial) in enumerate(rows)]
    matches = _Matcher(text)
    expected = [
        (name, what)
        for name, what, fields, initial in table
        if matches(fields, initial == matches.lowered)
    ]
    assert list(_Texts(table).matching(matches)) == expected
