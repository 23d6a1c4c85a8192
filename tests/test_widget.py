"""SurgeryWidget, driven without a browser: every control, through the same route as the page.

The page's events are injected as the comm delivers them (``_handle_msg``), so a click here
goes through exactly the code a click in JupyterLab goes through; what the page would show is
read back from the traits. Every swap is checked against the eager reference.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import re
import shutil
import time
import xml.etree.ElementTree as ET
import zlib
from html import escape as html_escape
from html import unescape as html_unescape
from pathlib import Path

import pytest
import torch
import transformers
from helpers.grad_models import NormStack, fused_norms
from helpers.imports import MODULES, circles_but_surgery_widget, imports_of
from helpers.models import Chain, Shared, hf_decoder
from helpers.view_models import (
    Doubler,
    GatedOut,
    GeluTwice,
    Later,
    MakesNaN,
    MaskedAlike,
    MaskedInner,
    Named,
    NeedsArgs,
    NeverCalled,
    OddlyNamed,
    OffByOne,
    OneArgument,
    PassesMaskOnlyWhenExported,
    SiluBlocks,
    Tempered,
)
from ipywidgets.widgets.tests.utils import setup_test_comm, teardown_test_comm
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks.verify import eager_reference
from graphsurgeon.display import comparison_table, history_table, id_text
from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT
from graphsurgeon.partition import call_index
from graphsurgeon.render import graph_view, layer_calls
from graphsurgeon.widget import ACTIONS, SurgerySession
from graphsurgeon.widget._panels import page as panel_values
from graphsurgeon.widget._panels import tree as tree_panel
from graphsurgeon.widget._session import PARTS
from graphsurgeon.widget._widget import OLD_NAMES

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="needs graphviz's dot")


@pytest.fixture(autouse=True)
def comm():
    """A dummy comm that records what the kernel sends the page."""
    setup_test_comm()
    yield
    teardown_test_comm()


def page_event(widget, **content):
    """What the page's model.send({...}) delivers to the kernel."""
    widget._handle_msg(
        {"content": {"data": {"method": "custom", "content": content}}, "buffers": []}
    )


def page_sets(widget, **state):
    """A trait set in the page (model.set + save_changes)."""
    widget._handle_msg({"content": {"data": {"method": "update", "state": state}}, "buffers": []})


def sent(widget, trait):
    """The values of ``trait`` the kernel sent the page, in order (bytes: the binary buffer
    sent beside the message's JSON)."""
    values = []
    for _args, kwargs in widget.comm.messages:
        data = kwargs.get("data") or {}
        if data.get("method") != "update":
            continue
        if trait in data.get("state", {}):
            values.append(data["state"][trait])
        elif [trait] in data.get("buffer_paths", []):
            values.append(bytes(kwargs["buffers"][data["buffer_paths"].index([trait])]))
    return values


def svg_ids(svg: str) -> set[str]:
    """The element ids of the SVG, parsed as XML (dot escapes '>' in ids)."""
    root = ET.fromstring(svg)
    return {e.get("id") for e in root.iter() if e.get("id")}


@pytest.fixture
def gpt(tiny_gpt):
    model, tokens, ep = tiny_gpt
    surgery = gs.Surgery(ep, model=model, args=(tokens,))
    namespace = {
        "fast": FusedAttention(model.layers[1].attn),
        "tanh_mlp": GeluTanhMLP(model.layers[0].mlp),
        "Doubler": Doubler,
        "NeedsArgs": NeedsArgs,
        "not_a_module": 3,
        "torch": torch,
        "nn": nn,
        "model": model,
    }
    return gs.SurgeryWidget(surgery, namespace=namespace), model, tokens


# -- construction ----------------------------------------------------------------------------


def test_built_from_a_program_a_surgery_or_s_widget(tiny_gpt):
    _model, tokens, ep = tiny_gpt
    from_program = gs.SurgeryWidget(ep, args=(tokens,))
    assert from_program.surgery.program is ep and from_program.surgery.args == (tokens,)
    surgery = gs.Surgery.from_model(Chain(), (torch.randn(2, 4),))
    assert surgery.widget().surgery is surgery
    assert "<svg" in from_program.svg and from_program.tree.count("data-gs-module") > 5
    assert from_program.selected is None and from_program.error == {}


def test_a_model_instead_of_a_program_is_refused_with_what_to_do():
    # refused as every entry point refuses a model (one door: graphsurgeon._program)
    with pytest.raises(gs.errors.NotAProgramError, match=r"a model: export it first"):
        gs.SurgeryWidget(Chain())


def test_the_notebook_shows_the_widget_and_a_static_copy_for_other_front_ends(gpt):
    widget, _, _ = gpt
    bundle = widget._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "<svg" in data["text/html"], "front ends without widgets see the picture"


# -- selection -------------------------------------------------------------------------------


def test_a_click_on_a_cluster_or_box_selects_its_call_and_marks_its_neighbours(gpt):
    widget, _, _ = gpt
    widget.expand("layers.1")
    ids = svg_ids(widget.svg)
    assert "module:layers.1.attn" in ids, "precondition: the attention is a box"
    page_event(widget, event="click", id="module:layers.1.attn")
    assert widget.selected == "layers.1.attn" and widget.error == {}
    marks = widget.marks
    assert marks["selected"] == ["module:layers.1.attn"]
    assert marks["producers"] and marks["consumers"] and marks["edges"]
    assert set(marks["producers"] + marks["consumers"]) <= ids
    assert "layers.1.attn" in widget.details and "swappable" in widget.details
    page_event(widget, event="click", id="cluster:layers.1")
    assert widget.selected == "layers.1" and widget.marks["selected"] == ["cluster:layers.1"]


def test_a_click_on_a_node_selects_the_node_and_its_module(gpt):
    widget, _, _ = gpt
    widget.expand("layers.0.attn")
    page_event(widget, event="click", id="node:view")
    assert widget.selected_node == "view" and widget.selected == "layers.0.attn"
    assert widget.marks["selected"] == ["node:view"]
    # the q projection, a module of one op, is drawn as that op
    assert widget.marks["producers"] == ["node:linear"], "the q projection feeds it"
    assert "aten.view" in widget.details
    page_event(widget, event="click", id="node:linear")
    assert widget.selected == "layers.0.attn.q" and widget.selected_node is None  # its module
    page_event(widget, event="click", id="cluster:layers.0.attn")
    assert widget.selected == "layers.0.attn" and widget.selected_node is None


def shipped_click(widget, element_id):
    """What the page marks at once for a click on ``element_id``, read from what the page
    gets (``clicks_packed``, deflated JSON) as static/widget.js reads it; None when the element
    is not in it."""
    import zlib

    shipped = json.loads(zlib.decompress(widget.clicks_packed))
    assert shipped == widget.clicks, "the page gets the kernel's click marks"
    for row in shipped["clicks"]:
        if shipped["ids"][row[0]] == element_id:
            names = [[shipped["ids"][i] for i in part] for part in row[1:5]]
            module = shipped["modules"][row[5]] if row[5] >= 0 else ""
            return dict(zip(("selected", "producers", "consumers", "edges"), names), module=module)
    return None


def assert_the_page_marks_every_click_as_the_kernel_does(widget):
    """Every node, box and cluster of the picture shown: a click on it marks, in the page at
    once, what the kernel's answer to that click marks; one the kernel refuses is not shipped."""
    root = ET.fromstring(widget.svg)
    clickable = [  # what the page's click handler takes: g.node, g.cluster
        e.get("id")
        for e in root.iter()
        if {"node", "cluster"} & set((e.get("class") or "").split()) and e.get("id")
    ]
    assert clickable, "precondition: the picture has elements"
    shipped_count = 0
    for element_id in clickable:
        expected = shipped_click(widget, element_id)
        widget.select(None)
        page_event(widget, event="click", id=element_id)
        if widget.error:
            assert expected is None, (element_id, widget.error)
            continue
        shipped_count += 1
        marks = widget.marks
        kernel = {k: marks[k] for k in ("selected", "producers", "consumers", "edges", "module")}
        assert expected == kernel, element_id
    assert shipped_count == len(widget.clicks["clicks"]), "only what the picture shows"


def test_the_page_marks_a_click_at_once_as_the_kernel_marks_it(gpt):
    widget, _, _ = gpt
    assert_the_page_marks_every_click_as_the_kernel_does(widget)  # the default view
    widget.expand_all(force=True)
    assert any(i.startswith("node:") for i in svg_ids(widget.svg)), "precondition: ops drawn"
    assert_the_page_marks_every_click_as_the_kernel_does(widget)
    assert sent(widget, "clicks_packed"), "shipped with the picture"


def test_the_page_marks_a_click_as_the_kernel_does_around_a_swap_and_a_fused_region(gpt):
    widget, model, _ = gpt
    widget.swap(GeluTanhMLP(model.layers[1].mlp), name="layers.1.mlp")
    widget.region(["matmul", "div"]).fuse_region()
    assert widget.error == {} and widget.surgery.fused, "precondition: a fused region"
    assert "node:swapped_layers_1_mlp" in svg_ids(widget.svg), "precondition: the swapped call"
    assert_the_page_marks_every_click_as_the_kernel_does(widget)
    widget.expand_all(force=True)  # the fused region's ops, drawn
    for view in ("program", "merged", "split"):
        widget.show(view)
        assert_the_page_marks_every_click_as_the_kernel_does(widget)


def test_what_the_page_marks_for_clicks_is_small():
    from graphsurgeon.examples import TinyGPT

    model = TinyGPT(32).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(32)] + [f"layers.{i}.attn" for i in range(32)]
    widget = gs.SurgeryWidget(gs.export(model, (tokens,), preserve=preserve), args=(tokens,))
    widget.expand_all(force=True)
    # ids once each, indexes after: a tenth of the picture's own text
    assert len(json.dumps(widget.clicks)) < len(widget.svg) / 10


def test_the_widget_compiles_its_program_in_the_background_so_a_first_swap_compiles_little(
    monkeypatch,
):
    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.rewrite._builder import compiled_parts
    from graphsurgeon.widget import _widget

    monkeypatch.setattr(_widget, "WARM_UP_DELAY", 0.0)
    torch.manual_seed(0)
    model = TinyGPT(8).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(8)] + [f"layers.{i}.attn" for i in range(8)]
    ep = gs.export(model, (tokens,), preserve=preserve)
    cache = compiled_parts(ep)
    assert not cache.code, "precondition: nothing of the program is compiled yet"
    widget = gs.SurgeryWidget(ep, args=(tokens,))
    widget._warming.join(30)
    warmed = len(cache.code)
    assert warmed > 4, "the program's parts were compiled while the widget waited"
    # and the program built is the Surgery's: the first step or check does not build it
    import graphsurgeon.surgery as surgery_module

    built = []
    rewrite = surgery_module.rewrite
    monkeypatch.setattr(
        surgery_module, "rewrite", lambda *a, **k: built.append(a) or rewrite(*a, **k)
    )
    program = widget.surgery.module
    assert built == [] and program is widget.surgery.module
    assert gs.verify(model, program, (tokens,))
    widget.step()
    assert built == [] and widget.surgery._warmed is None
    replacement = FusedAttention(model.layers[5].attn)
    widget.swap(replacement, "layers.5.attn")
    assert len(cache.code) - warmed <= 3  # the parts around layer 5, no more
    assert len(built) == 1, "precondition: the patched rewrite counts the builds"
    expected = eager_reference(model, {"layers.5.attn": replacement})
    assert gs.verify(expected, widget.surgery.module, (tokens,))
    # a Surgery whose program is built has its code compiled: nothing is started for it
    assert widget.surgery.build_in_background() is None
    # every action of the widget is one a warm-up pauses for
    from graphsurgeon.rewrite import _turns

    busy = []
    monkeypatch.setattr(widget._session, "sync", lambda: busy.append(_turns._busy))
    widget.select("layers.1")
    assert busy == [1] and _turns._busy == 0


def test_the_background_build_begins_once_the_clicks_pause(monkeypatch):
    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.widget import _widget

    monkeypatch.setattr(_widget, "WARM_UP_DELAY", 1.0)  # well above a click and a pause
    model = TinyGPT(2).eval()
    tokens = model.example_input()
    widget = gs.SurgeryWidget(gs.export(model, (tokens,)), args=(tokens,))
    first = widget._warming
    for name in ["layers.0", "layers.1", "layers.0.mlp", "layers.1.mlp", None, "layers.0"]:
        widget.select(name)  # a click every 0.15 s: each one puts the build off
        time.sleep(0.15)
    assert not widget._warming.begun and first.finished.is_set() and not first.begun
    widget._warming.join(30)
    assert widget._warming.begun, "it began once the clicks paused"
    assert widget.surgery.build_in_background() is None  # built, waiting to be taken


def collector_back(timeout: float = 10.0) -> None:
    """Wait until the widget has let the cyclic collector go again."""
    from graphsurgeon.widget import _collector

    deadline = time.monotonic() + timeout
    while _collector.releasing() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _collector.releasing()


def test_the_collector_waits_until_a_click_is_answered_then_runs_on_a_thread_of_its_own(
    gpt, monkeypatch
):
    # The young passes over what a swap made are owed; they run after the answer is sent,
    # not inside the click's time, and not in the next click either.
    import gc
    import threading

    widget, model, _tokens = gpt
    session = widget._session
    collector_back()
    assert gc.isenabled(), "precondition: the collector is on"
    seen = []
    publish = widget._publish

    def publishing(**also):
        seen.append(("publish", gc.isenabled()))
        return publish(**also)

    monkeypatch.setattr(widget, "_publish", publishing)
    swap = session.swap
    monkeypatch.setattr(
        session, "swap", lambda *a: seen.append(("swap", gc.isenabled())) or swap(*a)
    )
    passes = []

    def record(phase, info):
        if phase == "start":
            passes.append(threading.current_thread())

    gc.callbacks.append(record)
    try:
        widget.select("layers.1.attn")
        widget.choose("ns:fast")
        assert not gc.isenabled(), "held between two clicks that follow at once"
        page_event(widget, event="button", name="swap")
        assert ("swap", False) in seen and seen[-1] == ("publish", False)
        assert widget.swapped == ["layers.1.attn"], "precondition: the click swapped"
        assert not gc.isenabled() and not any(t is threading.main_thread() for t in passes)
        collector_back()
    finally:
        gc.callbacks.remove(record)
    assert gc.isenabled(), "on again once the answer is out"
    assert passes and all(t is not threading.main_thread() for t in passes), (
        "the owed passes ran on the collector's own thread"
    )
    expected = eager_reference(
        model, {"layers.1.attn": widget._session.surgery.replacements["layers.1.attn"]}
    )
    assert gs.verify(expected, widget.surgery.module, widget._session.inputs()[0])


def test_a_swap_chosen_in_the_picker_is_built_before_swap_is_pressed(gpt, monkeypatch):
    # Once a replacement is chosen for the selection, the swap is built in the background: Swap
    # then only draws it. The build holds the collector, and the Swap takes the hold over: the
    # passes the build brought due run after the Swap's answer, never inside it.
    import gc

    import graphsurgeon.surgery as surgery_module
    from graphsurgeon._derived import derived
    from graphsurgeon.render._scene import ANALYSIS_KEY
    from graphsurgeon.widget import _collector, _widget

    monkeypatch.setattr(_widget, "PREPARE_DELAY", 0.0)
    monkeypatch.setattr(_collector, "AHEAD_DELAY", 30.0)  # held until the Swap, however slow
    widget, model, tokens = gpt
    collector_back()
    widget.select("layers.1.attn")
    assert widget.surgery._ahead is None, "precondition: nothing chosen, nothing built ahead"
    widget.choose("ns:fast")
    ahead = widget.surgery._ahead
    assert ahead is not None and ahead.thread is not None
    ahead.thread.join(30)
    assert ahead.module is not None, "built while the user looks at the preview"
    assert ANALYSIS_KEY in derived(ahead.module), "and what its picture reads worked out"
    assert not gc.isenabled() and _collector.releasing(), "the build holds the collector"
    built = []
    rewrite = surgery_module.rewrite
    monkeypatch.setattr(
        surgery_module, "rewrite", lambda *a, **k: built.append(a) or rewrite(*a, **k)
    )
    page_event(widget, event="button", name="swap")
    assert widget.swapped == ["layers.1.attn"] and widget.error == {}
    assert built == [] and widget.surgery.module is ahead.module
    collector_back()  # the Swap's own hold, released as every click's is
    assert gc.isenabled()
    fast = widget._session.surgery.replacements["layers.1.attn"]
    expected = eager_reference(model, {"layers.1.attn": fast})
    assert gs.verify(expected, widget.surgery.module, (tokens,))
    # the choice still stands for the module just swapped: nothing more to build
    assert widget.surgery._ahead is None
    # a choice for another module, then a click elsewhere (the choice goes): dropped
    monkeypatch.setattr(_collector, "AHEAD_DELAY", 0.6)  # its own, for a build not taken
    widget.select("layers.0.attn")
    widget.choose("ns:fast")
    dropped = widget.surgery._ahead
    assert dropped is not None
    widget.select("layers.0")
    assert widget.surgery._ahead is None
    dropped.thread.join(30)  # one begun finishes on its own, and lets the collector go
    collector_back()


def test_actions_in_a_loop_keep_the_collector_off_no_longer_than_the_longest_hold(gpt, monkeypatch):
    # a cell that clicks in a loop never leaves the collector the pause it waits for: the owed
    # passes run at the start of an action once it has been off LONGEST_HOLD
    import gc
    import threading

    from graphsurgeon.widget import _collector

    monkeypatch.setattr(_collector, "LONGEST_HOLD", 0.3)
    widget, _model, _tokens = gpt
    collector_back()
    passes = []

    def record(phase, info):
        if phase == "start":
            passes.append((time.monotonic(), threading.current_thread()))

    gc.callbacks.append(record)
    try:
        start = time.monotonic()
        names = ["layers.0", "layers.1", "layers.0.mlp", "layers.1.mlp"]
        while time.monotonic() - start < 1.0:
            for name in names:
                widget.select(name)
                assert _collector.releasing() and not gc.isenabled(), "held between the clicks"
                for _ in range(1000):  # garbage only the collector frees: cycles
                    cycle = []
                    cycle.append(cycle)
    finally:
        gc.callbacks.remove(record)
        collector_back()
    during = [at for at, thread in passes if thread is threading.main_thread()]
    assert during, "the owed passes ran during the loop"
    gaps = [b - a for a, b in zip([start, *during], [*during, time.monotonic()])]
    assert max(gaps) < 0.3 + 0.5, gaps  # the longest hold, and a margin for a slow machine


def test_checks_and_overlays_run_with_the_collector_and_a_user_s_choice_is_kept(gpt, monkeypatch):
    import gc

    widget, model, _tokens = gpt
    session = widget._session
    widget.swap(FusedAttention(model.layers[1].attn), "layers.1.attn")  # compare needs a swap
    collector_back()
    seen = {}
    for name in ("verify", "compare", "find_culprits", "set_overlay"):
        method = getattr(session, name)

        def spy(*a, _name=name, _method=method):
            seen.setdefault(_name, []).append(gc.isenabled())
            return _method(*a)

        monkeypatch.setattr(session, name, spy)
    widget.verify()
    widget.compare()
    page_event(widget, event="button", name="verify")
    page_event(widget, event="button", name="bisect")  # an old name of find_culprits
    page_event(widget, event="overlay", value="error")
    widget.show_overlay(None)
    assert seen == {
        "verify": [True, True],
        "compare": [True],
        "find_culprits": [True],
        "set_overlay": [True, True],
    }
    assert widget.error == {}, "precondition: every check ran"
    # the collector turned off by the user stays off: a click does not turn it on
    gc.disable()
    try:
        widget.select("layers.0")
        collector_back()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_selecting_from_the_tree_or_the_trait_is_the_same_as_a_click(gpt):
    widget, _, _ = gpt
    page_event(widget, event="select", value="layers.0.mlp")
    assert widget.selected == "layers.0.mlp" and widget.marks["selected"]
    page_sets(widget, selected="layers.1")
    assert widget.selected == "layers.1" and widget.marks["selected"]
    widget.select(None)
    assert widget.selected is None and widget.marks["selected"] == []


def test_an_unknown_name_is_an_error_message_in_the_widget_and_raised_from_code(gpt):
    widget, _, _ = gpt
    page_event(widget, event="select", value="layers.7")
    # the one error every entry point raises for an unknown name (gs.swap, to_dot, the stepper)
    assert widget.error["type"] == "UnknownNameError" and "layers.7" in widget.error["message"]
    assert "Traceback" in widget.error["details"]
    with pytest.raises(gs.errors.UnknownNameError, match=r"Did you mean 'layers\.1\.attn'"):
        widget.select("layers.1.atn")
    widget.select("layers.1")
    assert widget.error == {}, "the next action that works clears the message"


def test_the_first_search_finds_the_program_s_texts_read_when_the_widget_opened(monkeypatch):
    from graphsurgeon import _derived
    from graphsurgeon.examples import TinyGPT
    from graphsurgeon.patterns import search as search_module

    model = TinyGPT(2).eval()
    tokens = model.example_input()
    ep = gs.export(model, (tokens,))
    assert "search: ops" not in _derived.derived(ep), "precondition: nothing read yet"
    widget = gs.SurgeryWidget(ep, args=(tokens,))
    assert {"search: ops", "search: modules"} <= set(_derived.derived(ep))
    read = []
    texts = search_module._Texts
    monkeypatch.setattr(search_module, "_Texts", lambda rows: read.append(1) or texts(rows))
    widget.search("layers.1.attn")
    assert read == [] and widget.selected == "layers.1.attn"
    widget.swap(FusedAttention(model.layers[1].attn))
    widget.search("linear")  # the program an edit made: its ops are read at its first search
    assert read == [1] and widget.matches


def test_search_opens_what_hides_the_match_selects_it_and_scrolls_to_it(gpt):
    widget, _, _ = gpt
    widget.collapse("layers.1")
    assert "cluster:layers.1.mlp" not in svg_ids(widget.svg), "precondition: hidden"
    scroll = widget.scroll
    page_event(widget, event="search", value="layers.1.mlp.down")
    assert widget.selected == "layers.1.mlp.down" and widget.scroll == scroll + 1
    assert "cluster:layers.1.mlp" in svg_ids(widget.svg)
    widget.search("linear_11")
    assert widget.selected_node == "linear_11"
    with pytest.raises(gs.errors.WidgetError, match="no module or node matches"):
        widget.search("nothing-like-this")


def test_a_search_that_opens_a_module_shows_its_matches_before_the_new_picture(gpt):
    """The matches are listed and marked in the picture shown, in a message of their own,
    while the picture that opens the first is laid out (at 384 layers most of the search)."""
    widget, _, _ = gpt
    widget.collapse("layers.1")
    widget.comm.messages.clear()
    page_event(widget, event="search", value="layers.1.mlp.down")
    updates = [
        kwargs["data"]["state"]
        for _args, kwargs in widget.comm.messages
        if (kwargs.get("data") or {}).get("method") == "update"
    ]
    early = next(i for i, state in enumerate(updates) if "search_html" in state)
    picture = next(i for i, state in enumerate(updates) if "svg_key" in state)
    assert early < picture, "the matches first, then the picture"
    first = updates[early]
    assert "layers.1.mlp.down" in first["search_html"] and first["busy"].startswith("opening")
    assert first["marks"]["matches"] == ["module:layers.1"], "the box that holds it, as shown"
    assert "cluster:layers.1.mlp" in svg_ids(widget.svg) and widget.busy == ""
    assert widget.marks["matches"] == ["node:linear_11"], "then as the new picture draws it"
    widget.comm.messages.clear()
    page_event(widget, event="search", value="layers.1.mlp.down")  # again: shown already
    assert not [b for b in sent(widget, "busy") if b.startswith("opening")], "no early message"
    assert widget.selected == "layers.1.mlp.down" and widget.error == {}


# -- the picture -----------------------------------------------------------------------------


def test_double_click_opens_a_box_and_collapses_a_cluster_again(gpt):
    widget, _, _ = gpt
    widget.expand("layers.1")
    assert "module:layers.1.mlp" in svg_ids(widget.svg)
    page_event(widget, event="toggle", id="module:layers.1.mlp")
    ids = svg_ids(widget.svg)
    assert "cluster:layers.1.mlp" in ids and "module:layers.1.mlp" not in ids
    page_event(widget, event="toggle", id="cluster:layers.1.mlp")
    assert "module:layers.1.mlp" in svg_ids(widget.svg)
    page_event(widget, event="button", name="expand_all")
    assert widget.session.opened_by_user == frozenset(widget.session.partitions)
    assert "cluster:layers.0.attn" in svg_ids(widget.svg)
    page_event(widget, event="button", name="auto")
    assert widget.error == {} and widget.session.opened_by_user is None


def test_a_run_of_boxes_opens_into_one_box_per_call():
    from graphsurgeon.examples import TinyGPT

    model = TinyGPT(48).eval()  # too many layers for a box each: runs of them
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(48)]
    widget = gs.SurgeryWidget(gs.export(model, (tokens,), preserve=preserve), args=(tokens,))
    run = [i for i in svg_ids(widget.svg) if i.startswith("modules:")]
    assert run, "precondition: the default view draws the layers as runs"
    page_event(widget, event="toggle", id=run[0])
    ids = svg_ids(widget.svg)
    first, last = run[0].removeprefix("modules:").split("..")
    assert f"module:{first}" in ids and f"module:{last}" in ids


def decoder_widget(layers: int) -> gs.SurgeryWidget:
    from graphsurgeon.examples import TinyGPT

    model = TinyGPT(layers).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(layers)]
    preserve += [f"layers.{i}.attn" for i in range(layers)]
    return gs.SurgeryWidget(gs.export(model, (tokens,), preserve=preserve), args=(tokens,))


def boxes_of(widget) -> set[str]:
    return {i for i in svg_ids(widget.svg) if i.startswith(("module:", "modules:"))}


def test_opening_one_layer_draws_as_many_boxes_however_deep_the_stack():
    # the other layers fold into runs around the open one: the picture, its text and its
    # layout cost the same at any depth of stack
    drawn = {}
    for layers in (48, 64):  # deep enough that the default view folds the stack
        widget = decoder_widget(layers)
        widget.expand("layers.5")
        ids = svg_ids(widget.svg)
        assert "cluster:layers.5" in ids
        assert {"modules:layers.0..layers.4", f"modules:layers.6..layers.{layers - 1}"} <= ids
        drawn[layers] = (len(boxes_of(widget)), widget.session.scene.view.drawn_nodes)
        # a search in the user's view opens the match's layer the same way
        widget.search(f"layers.{layers - 3}.attn")
        ids = svg_ids(widget.svg)
        assert widget.selected == f"layers.{layers - 3}.attn"
        assert (
            f"cluster:layers.{layers - 3}" in ids
            and f"modules:layers.6..layers.{layers - 4}" in ids
        )
    assert drawn[48] == drawn[64]


def test_opening_a_layer_of_a_stack_the_default_view_draws_layer_by_layer_folds_nothing():
    # 16 layers: the default view draws a box a layer; opening one keeps the others' boxes
    widget = decoder_widget(16)
    layers = {f"module:layers.{i}" for i in range(16)}
    assert layers <= svg_ids(widget.svg)
    widget.expand("layers.5")
    ids = svg_ids(widget.svg)
    assert "cluster:layers.5" in ids and layers - {"module:layers.5"} <= ids
    assert not any(i.startswith("modules:") for i in ids)
    widget.collapse("layers.5")
    assert layers <= svg_ids(widget.svg)


def test_a_run_the_user_opened_stays_a_box_a_layer_until_the_default_view():
    widget = decoder_widget(48)
    widget.expand("layers.5")
    page_event(widget, event="toggle", id="modules:layers.6..layers.47")
    assert {f"module:layers.{i}" for i in range(6, 48)} <= svg_ids(widget.svg)
    widget.expand("layers.2")  # the next open does not fold them back
    ids = svg_ids(widget.svg)
    assert {f"module:layers.{i}" for i in range(6, 48)} <= ids
    assert {"modules:layers.0..layers.1", "modules:layers.3..layers.4"} <= ids
    widget.collapse("layers.2")
    assert "modules:layers.0..layers.4" in svg_ids(widget.svg)
    widget.auto()
    widget.expand("layers.9")  # the default view forgot them: the runs fold again
    assert {"modules:layers.0..layers.8", "modules:layers.10..layers.47"} <= svg_ids(widget.svg)


def test_save_writes_the_picture_shown_and_the_page_gets_a_download(gpt, tmp_path):
    widget, _, _ = gpt
    svg = widget.save(tmp_path / "p.svg").read_text()
    dot = widget.save(tmp_path / "p.dot").read_text()
    assert svg == widget.svg and dot.startswith("digraph")
    sent = []
    widget.send = lambda content, buffers=None: sent.append(content)
    page_event(widget, event="save", format="dot")
    assert sent and sent[0]["event"] == "download" and sent[0]["name"].endswith(".dot")
    assert sent[0]["text"] == dot
    with pytest.raises(gs.errors.WidgetError, match="'svg' or 'dot'"):
        widget.save(tmp_path / "p.png")


# -- replacements ----------------------------------------------------------------------------


def test_the_picker_offers_modules_and_classes_of_the_namespace(gpt):
    widget, _, _ = gpt
    keys = [c["key"] for c in widget.candidates]
    assert keys[:2] == ["copy", "identity"]
    assert {"ns:fast", "ns:tanh_mlp", "ns:Doubler"} <= set(keys)
    assert "ns:not_a_module" not in keys and "ns:nn" not in keys


def test_the_preview_says_what_the_swap_removes_and_how_the_replacement_is_called(gpt):
    widget, _, _ = gpt
    widget.select("layers.1.attn")
    page_event(widget, event="choose", value="ns:fast")
    assert widget.choice == "fast"
    assert "removes 20 fx nodes" in widget.preview and "16,640 parameter" in widget.preview
    assert "(x: f32[1, 16, 64]) → f32[1, 16, 64]" in widget.preview


def test_swap_from_the_picker_is_checked_against_the_eager_reference(gpt):
    widget, model, tokens = gpt
    widget.select("layers.1.attn")
    page_event(widget, event="choose", value="ns:fast")
    page_event(widget, event="button", name="swap")
    assert widget.error == {}
    assert list(widget.surgery.replacements) == ["layers.1.attn"]
    assert widget.view == "merged" and widget.can_undo and not widget.can_redo
    assert "after" in widget.caption or "swapped" in widget.caption
    assert "FusedAttention" in widget.history
    reference = eager_reference(model, widget.surgery.replacements)
    torch.testing.assert_close(widget.surgery.module(tokens), reference(tokens))
    page_event(widget, event="button", name="verify")
    # two verdicts: faithful (the eager model with the same swaps) and equal to the original
    assert ">faithful<" in widget.verify_html and widget.error == {}


def test_copy_identity_classes_and_expressions(gpt):
    widget, model, _tokens = gpt
    widget.select("layers.0.mlp.act")
    widget.choose("copy").swap()
    replacement = widget.surgery.replacements["layers.0.mlp.act"]
    assert isinstance(replacement, nn.GELU) and replacement is not model.layers[0].mlp.act
    assert widget.verify().ok
    widget.choose("ns:Doubler").swap()
    assert isinstance(widget.surgery.replacements["layers.0.mlp.act"], Doubler)
    assert widget.verify().ok, "the swap is faithful to the eager model with Doubler"
    assert not widget.compare().ok, "but doubling is not GELU"
    page_event(widget, event="expression", value="nn.Tanh()")
    assert widget.choice == "nn.Tanh()"
    widget.swap()
    assert isinstance(widget.surgery.replacements["layers.0.mlp.act"], nn.Tanh)
    page_event(widget, event="choose", value="identity")
    widget.swap()
    assert isinstance(widget.surgery.replacements["layers.0.mlp.act"], nn.Identity)


def test_replacements_that_cannot_be_made_say_why(gpt):
    widget, _, _ = gpt
    widget.select("layers.0.mlp")
    page_event(widget, event="choose", value="ns:NeedsArgs")
    assert (
        "needs arguments" in widget.error["message"] and "NeedsArgs(...)" in widget.error["message"]
    )
    page_event(widget, event="expression", value="nn.Linear(")
    assert "failed: SyntaxError" in widget.error["message"]
    page_event(widget, event="expression", value="41 + 1")
    assert "not an nn.Module" in widget.error["message"]
    before = widget.svg
    widget.select("layers")
    page_event(widget, event="choose", value="identity")
    page_event(widget, event="button", name="swap")
    assert widget.error["type"] in ("NotSwappableError", "NotPreservedError", "SwapError")
    assert widget.surgery.replacements == {} and widget.svg == before, "nothing changed"


def test_a_replacement_belongs_to_the_selection_it_was_chosen_for(gpt):
    widget, model, tokens = gpt
    first, second = model.layers[0].mlp, model.layers[1].mlp
    assert not torch.equal(first.up.weight, second.up.weight), "precondition: blocks differ"
    page_event(widget, event="select", value="layers.0.mlp")
    page_event(widget, event="choose", value="ns:tanh_mlp")  # made from block 0's weights
    assert "Replacement: <b>tanh_mlp</b>" in widget.preview
    page_event(widget, event="button", name="swap")
    assert torch.equal(widget.surgery.replacements["layers.0.mlp"].up.weight, first.up.weight)
    page_event(widget, event="select", value="layers.1.mlp")
    page_event(widget, event="button", name="swap")
    assert list(widget.surgery.replacements) == ["layers.0.mlp"], "block 0's module not reused"
    assert "pick a replacement first" in widget.error["message"]
    # nothing is chosen for the new selection: picker, preview and Swap button say so
    assert (widget.choice, widget.choice_key, widget.can_swap) == ("", "", False)
    assert "Replacement:" not in widget.preview
    page_event(widget, event="choose", value="copy")
    page_event(widget, event="button", name="swap")
    assert widget.error == {}
    swapped = widget.surgery.replacements
    assert torch.equal(swapped["layers.1.mlp"].up.weight, second.up.weight)
    assert torch.equal(swapped["layers.0.mlp"].up.weight, first.up.weight)
    # the program computes what eager does with the replacements meant, built here
    reference = copy.deepcopy(model)
    reference.layers[0].mlp = GeluTanhMLP(first)
    torch.testing.assert_close(widget.surgery.module(tokens), reference(tokens))
    calls = {c.call_name: c.ok for c in widget.compare().calls}
    assert calls["layers.1.mlp"], "a copy of the original computes what the original does"
    page_event(widget, event="choose", value="")  # the picker's first line: nothing chosen
    assert (widget.choice_key, widget.can_swap) == ("", False)


def test_a_module_swapped_from_code_is_not_reused_for_another_module(gpt):
    widget, model, _tokens = gpt
    widget.select("layers.0.mlp").swap(copy.deepcopy(model.layers[0].mlp))
    with pytest.raises(gs.errors.WidgetError, match=r"chosen for 'layers\.0\.mlp', not for"):
        widget.swap(name="layers.1.mlp")
    page_event(widget, event="select", value="layers.1.mlp")
    page_event(widget, event="button", name="swap")
    assert list(widget.surgery.replacements) == ["layers.0.mlp"], "block 0's module not reused"
    assert "pick a replacement first" in widget.error["message"]
    widget.select("layers.0.mlp").swap(copy.deepcopy(model.layers[0].mlp))
    assert (widget.choice_key, widget.choice) == ("module", "MLP"), "the picker shows it"
    widget.expand("layers.0.attn")
    page_event(widget, event="select", value="layers.0.attn")
    page_event(widget, event="choose", value="identity")
    page_event(widget, event="click", id="node:view")  # a node of the selected module
    assert (widget.selected, widget.choice_key, widget.can_swap) == (
        "layers.0.attn",
        "identity",
        True,
    )
    widget.select(None)
    assert (widget.choice_key, widget.can_swap) == ("", False)
    with pytest.raises(gs.errors.WidgetError, match="select a module first"):
        widget.choose("identity")


def test_a_swap_or_fuse_made_from_code_selects_that_module_and_brings_it_into_view(gpt):
    widget, model, _tokens = gpt
    widget.select("layers.0.attn")
    scroll = widget.scroll
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    assert widget.selected == "layers.1.attn" and widget.scroll == scroll + 1
    assert widget.marks["selected"], "its call in the new picture is marked"
    assert (widget.choice_key, widget.choice) == ("module", "FusedAttention"), "the picker"
    assert "FusedAttention" in widget.details
    widget.fuse("layers.0.mlp")
    assert widget.selected == "layers.0.mlp" and widget.scroll == scroll + 2
    assert widget.marks["selected"]


def test_what_is_brought_into_view_is_a_swapped_modules_new_call_else_the_selection(gpt):
    # the before/after cluster of a swapped module also holds the nodes it replaced, often
    # wider than the view: the page brings the marks' focus into view, the new call's node
    widget, model, _tokens = gpt
    widget.select("layers.1.attn")
    assert widget.marks["focus"] == widget.marks["selected"][0], "nothing swapped: the cluster"
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    assert widget.view == "merged" and widget.selected == "layers.1.attn", "precondition"
    node = widget.session.viewer.call_node("layers.1.attn")
    focus = widget.marks["focus"]
    assert focus not in widget.marks["selected"] and focus in svg_ids(widget.svg)
    assert focus == widget.session.viewer.scene.node_element(node).id, "the new call's node"
    widget.show("program")
    assert widget.marks["focus"] in svg_ids(widget.svg), "drawn in the program's picture too"
    widget.show("merged")
    for other in ("layers.1", "layers.0.attn"):  # around it, or beside it: the selection's own
        widget.select(other)
        assert widget.marks["focus"] == widget.marks["selected"][0], other
    widget.select(node)  # a node: its own element
    assert widget.marks["focus"] == widget.marks["selected"][0]


def test_undo_and_redo_select_the_step_they_move_over_and_bring_it_into_view(gpt):
    widget, model, _tokens = gpt
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    widget.swap(copy.deepcopy(model.layers[0].mlp), name="layers.0.mlp")
    widget.select("layers.1.mlp")
    scroll = widget.scroll
    widget.undo()
    assert list(widget.surgery.replacements) == ["layers.1.attn"], "precondition"
    assert widget.selected == "layers.0.mlp" and widget.scroll == scroll + 1
    assert widget.marks["selected"]
    widget.undo()
    assert widget.selected == "layers.1.attn" and widget.scroll == scroll + 2
    widget.redo()
    assert widget.selected == "layers.1.attn" and widget.scroll == scroll + 3
    widget.redo()
    assert widget.selected == "layers.0.mlp" and widget.scroll == scroll + 4
    assert list(widget.surgery.replacements) == ["layers.1.attn", "layers.0.mlp"]


def test_a_refused_selection_snaps_back_and_the_next_swap_uses_the_real_one(gpt):
    widget, _model, _tokens = gpt
    page_sets(widget, selected="layers.0.mlp")
    page_event(widget, event="choose", value="copy")
    widget.comm.messages.clear()
    page_sets(widget, selected="layers.0.atn")  # a typo, as a page could send it
    assert "'layers.0.atn'" in widget.error["message"], "the error is shown"
    assert widget.selected == "layers.0.mlp", "the trait snaps back to the real selection"
    assert sent(widget, "selected")[-1:] == ["layers.0.mlp"], "and so does the page"
    assert widget.choice_key == "copy", "the selection did not change, nor its replacement"
    page_event(widget, event="button", name="swap")
    assert list(widget.surgery.replacements) == ["layers.0.mlp"] and widget.error == {}
    widget.selected = "layers.9"  # from code
    assert widget.selected == "layers.0.mlp" and "'layers.9'" in widget.error["message"]


@pytest.mark.parametrize(
    "name",
    ["a\x00b", "line\nbreak", "cr\rtab\t", "x" * 10_000],
    ids=["nul", "newline", "cr", "long"],
)
def test_any_module_name_draws_clicks_selects_and_swaps(name):
    x = torch.randn(1, 2)
    widget = gs.SurgeryWidget(gs.Surgery.from_model(OddlyNamed(name), (x,)))
    widget.expand_all()
    cluster = f"cluster:{id_text(name)}"
    assert cluster in svg_ids(widget.svg), "the SVG is XML and carries the id"
    assert int(re.search(r'width="(\d+)"', widget.svg)[1]) < 1_500, "a long name is shortened"
    page_event(widget, event="click", id=cluster)
    assert widget.selected == name and widget.error == {}
    assert widget.marks["selected"] == [cluster] and widget.marks["module"] == id_text(name)
    # the tree carries the name as ids do; what its row sends back selects the module
    assert f'data-gs-module="{html_escape(id_text(name))}.a"' in widget.tree
    page_event(widget, event="select", value=f"{id_text(name)}.a")
    assert widget.selected == f"{name}.a" and widget.error == {}
    page_event(widget, event="select", value=id_text(name))
    assert widget.selected == name
    panels = widget.tree + widget.details + widget.preview
    assert not re.search("[\x00\r\t]", panels), "control characters are shown visibly"
    assert len(widget.details) < 5_000
    page_event(widget, event="choose", value="copy")
    page_event(widget, event="button", name="swap")
    assert widget.error == {} and list(widget.surgery.replacements) == [name]
    assert widget.verify().ok
    json.dumps(state_as_sent(widget)[0])  # everything travels to the page


def test_swap_without_a_choice_or_a_selection_says_what_to_do(gpt):
    widget, _, _ = gpt
    page_event(widget, event="button", name="swap")
    assert "select a module first" in widget.error["message"]
    widget.select("layers.0")
    page_event(widget, event="button", name="swap")
    assert "pick a replacement first" in widget.error["message"]


# -- history ---------------------------------------------------------------------------------


def test_fuse_undo_redo_reset_and_the_before_after_views(gpt):
    widget, _, _tokens = gpt
    with pytest.raises(gs.errors.WidgetError, match="nothing is swapped"):
        widget.show("merged")
    widget.select("layers.0.mlp")
    page_event(widget, event="button", name="fuse")
    assert widget.surgery.fused == ("layers.0.mlp",) and widget.error == {}
    assert "module:layers.0.mlp" in svg_ids(widget.svg), "one fused box"
    assert not widget.can_diff, "a fused call computes what it did: no before/after"
    widget.swap(GeluTanhMLP(widget.surgery.model.layers[1].mlp), name="layers.1.mlp")
    assert list(widget.surgery.replacements) == ["layers.1.mlp"]
    for view in ("split", "merged", "program"):
        page_event(widget, event="view", value=view)
        assert widget.view == view and widget.error == {}
    page_event(widget, event="view", value="split")
    assert any(i.startswith("after/") for i in svg_ids(widget.svg))
    page_event(widget, event="button", name="undo")
    assert widget.surgery.replacements == {} and widget.can_redo
    page_event(widget, event="button", name="redo")
    assert list(widget.surgery.replacements) == ["layers.1.mlp"]
    page_event(widget, event="button", name="reset")
    assert widget.surgery.replacements == {} and widget.surgery.fused == ()
    assert widget.view == "program" and not widget.can_diff and widget.can_redo
    assert "undone" in widget.history
    page_event(widget, event="button", name="undo")
    assert "nothing to undo" in widget.error["message"]


# -- checks ----------------------------------------------------------------------------------


def test_compare_finds_the_wrong_call_and_a_click_on_its_row_selects_it(gpt):
    widget, model, _ = gpt
    page_event(widget, event="button", name="compare")
    assert "nothing is swapped" in widget.error["message"]
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    widget.swap(OffByOne(model.layers[0].mlp), name="layers.0.mlp")
    page_event(widget, event="button", name="compare")
    assert widget.error == {}
    assert "first divergence: layers.0.mlp" in widget.compare_html
    rows = re.findall(r'data-gs-call="([^"]+)"', widget.compare_html)
    assert rows == ["layers.0.mlp", "layers.1.attn"]
    page_event(widget, event="select", value=rows[0])
    assert widget.selected == "layers.0.mlp"
    page_event(widget, event="button", name="verify")
    # the Verify button's two verdicts: faithful to the eager model with the same swaps, and
    # still the original's numbers (the LayerNorm after the MLP takes the +1 back out)
    assert ">faithful<" in widget.verify_html, "faithful to the eager model with the same swaps"
    assert ">equal to the original<" in widget.verify_html


def test_the_compare_and_history_panels_are_the_tables_the_objects_show(gpt):
    widget, model, _ = gpt
    widget.swap(OffByOne(model.layers[0].mlp), name="layers.0.mlp")
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    widget.undo()
    comparison = widget.compare()
    table = comparison_table(comparison)
    assert table in widget.compare_html and table in comparison._repr_html_(), "one writer"
    history = history_table(widget.surgery.steps, widget.surgery.position)
    assert "undone" in history and history in widget.history
    assert history in widget.surgery._repr_mimebundle_()["text/html"], "one writer"


def test_checks_without_example_inputs_say_how_to_give_them(tiny_gpt):
    _, _, ep = tiny_gpt
    widget = gs.SurgeryWidget(ep)
    page_event(widget, event="button", name="verify")
    assert "args=(x,)" in widget.error["message"]
    page_event(widget, event="button", name="step")
    assert "args=(x,)" in widget.error["message"]


# -- stepping --------------------------------------------------------------------------------


def test_step_moves_the_current_node_through_the_picture(gpt):
    widget, _, _ = gpt
    assert widget.stepper is None and widget.current == ""
    seen = []
    for _ in range(4):
        page_event(widget, event="button", name="step")
        assert widget.error == {}
        seen.append(widget.current)
    assert len(set(seen)) == 4 and all(s in svg_ids(widget.svg) for s in seen)
    assert widget.stepper.current.name == seen[-1].split(":", 1)[1]
    assert "next:" in widget.stepper_html and "<table" in widget.stepper_html


def test_stepping_into_a_collapsed_module_opens_it(gpt):
    widget, _, _ = gpt
    widget.collapse("layers.0")
    assert "module:layers.0" in svg_ids(widget.svg), "precondition: layers.0 is a box"
    widget.select("layers.0.attn.q")
    page_event(widget, event="button", name="run_to")
    assert widget.stepper.stack[-1] == "layers.0.attn.q"
    assert widget.current.startswith("node:") and widget.current in svg_ids(widget.svg)


def test_step_over_into_out_continue_and_reset(gpt):
    widget, model, tokens = gpt
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    widget.select("layers.1.attn")
    page_event(widget, event="button", name="run_to")
    stepper = widget.stepper
    assert stepper.current.name.startswith("swapped_layers_1_attn")
    page_event(widget, event="button", name="step_into")
    assert stepper.frames == ("layers.1.attn",) and widget.current, "the call stays marked"
    page_event(widget, event="button", name="step_out")
    assert stepper.frames == ()
    page_event(widget, event="button", name="step_over")
    page_event(widget, event="button", name="continue")
    assert stepper.done and "finished" in widget.stepper_html and widget.current == ""
    torch.testing.assert_close(stepper.output, widget.surgery.module(tokens))
    page_event(widget, event="button", name="step")
    assert "finished" in widget.error["message"]
    page_event(widget, event="button", name="restart")
    assert not stepper.done and stepper.position == 0


def test_breakpoints_from_the_selection_and_on_nan(gpt):
    widget, _model, _ = gpt
    widget.select("layers.1.mlp")
    page_event(widget, event="button", name="break")
    assert "entering layers.1.mlp" in widget.stepper_html
    page_event(widget, event="button", name="continue")
    assert widget.stepper.stack[-1].startswith("layers.1.mlp")
    page_event(widget, event="button", name="break")  # again: removed
    page_event(widget, event="nan", value=True)
    assert widget.break_on_nan and "NaN" in widget.stepper_html

    widget.swap(MakesNaN(), name="layers.0.mlp.act")
    page_event(widget, event="button", name="continue")
    assert "breakpoint" in widget.stepper_html and not widget.stepper.done


def test_an_error_in_a_handler_shows_in_the_widget_instead_of_vanishing(gpt):
    widget, _, _ = gpt
    page_event(widget, event="no-such-event")
    assert "unknown event" in widget.error["message"]
    page_event(widget, event="button", name="no-such-button")
    assert "no button 'no-such-button'" in widget.error["message"]


def test_busy_is_shown_during_slow_work_and_cleared_after(gpt):
    widget, _, _ = gpt
    seen = []
    widget.observe(lambda change: seen.append(change["new"]), names=["busy"])
    widget.verify()
    assert any("verifying" in s for s in seen) and widget.busy == ""


# -- the session alone, and limits ------------------------------------------------------------


def test_the_session_runs_without_ipywidgets_or_a_comm():
    s = gs.Surgery.from_model(Shared(), (torch.randn(2, 4),))
    session = SurgerySession(s)
    session.take_changes()
    session.select("shared@1")
    assert session.selected == "shared@1" and {"selection", "marks"} <= session.changed
    session.use(nn.Identity())
    session.swap()
    assert list(s.replacements) == ["shared@1"]


def test_a_module_called_twice_selects_every_call_or_one(gpt):
    s = gs.Surgery.from_model(Shared(), (torch.randn(2, 4),))
    widget = gs.SurgeryWidget(s)
    widget.select("shared")
    assert len(widget.marks["selected"]) == 2
    widget.select("shared@1")
    assert len(widget.marks["selected"]) == 1


def test_the_state_of_the_default_view_of_a_large_program_stays_small():
    from graphsurgeon.examples import TinyGPT

    model = TinyGPT(32).eval()
    tokens = model.example_input()
    preserve = [f"layers.{i}" for i in range(32)] + [f"layers.{i}.attn" for i in range(32)]
    widget = gs.SurgeryWidget(gs.export(model, (tokens,), preserve=preserve), args=(tokens,))
    state, buffers = state_as_sent(widget)
    size = len(json.dumps(state)) + sum(len(b) for b in buffers)
    assert size < 1_000_000, f"{size:,} bytes of widget state"
    assert len(widget.svg) < 200_000


def state_as_sent(widget) -> tuple[dict, list]:
    """The widget's state as the comm sends it: JSON, and the binary buffers beside it."""
    from ipywidgets.widgets.widget import _remove_buffers

    state, _paths, buffers = _remove_buffers(widget.get_state())
    return state, [bytes(b) for b in buffers]


def test_the_page_gets_the_picture_deflated_under_a_key_of_its_text(gpt):
    """The SVG text, the click marks and the module tree stay in the kernel (``w.svg``,
    ``w.clicks``, ``w.tree``); the page gets them deflated, a tenth of their size, the picture
    and its clicks beside one key that names both: the same picture, the same key."""
    import zlib

    widget, _, _ = gpt
    state, buffers = state_as_sent(widget)
    packed = {"svg", "svg_packed", "clicks", "clicks_packed", "tree", "tree_packed"}
    assert not packed & set(state), "buffers only"
    texts = sorted(zlib.decompress(b).decode() for b in buffers)
    clicks = json.dumps(widget.clicks, separators=(",", ":"))
    assert texts == sorted([widget.svg, clicks, widget.tree])
    assert sum(map(len, buffers)) < sum(map(len, texts)) / 4
    first = widget.svg_key
    widget.collapse("layers.1")
    assert widget.svg_key != first and zlib.decompress(widget.svg_packed).decode() == widget.svg
    widget.expand("layers.1")
    assert widget.svg_key == first, "a picture shown again has the key it had"
    # a new tree comes under a new key: the page is told by the key (bytes raise no event)
    tree_key = widget.tree_key
    widget.show_overlay("latency")
    assert "data-gs-value" in widget.tree, "precondition: the tree shows the overlay's values"
    assert (
        widget.tree_key != tree_key and zlib.decompress(widget.tree_packed).decode() == widget.tree
    )


@pytest.fixture(scope="module")
def tall_picture():
    """The default picture of a 40-layer decoder: every layer a box, 2,230 points tall."""
    torch.manual_seed(0)
    model = TinyGPT(n_layers=40).eval()
    tokens = model.example_input()
    return gs.SurgeryWidget(gs.export(model, (tokens,)), args=(tokens,))


def _drawn(text: str) -> list[tuple[str, str]]:
    """The elements a picture draws, as ``(id, its markup)``: dot's groups at its top level."""
    return [
        (m[1], m[0])
        for m in re.finditer(r'<g id="([^"]*)" class="(?:node|edge|cluster)[^"]*">', text)
    ]


def test_a_tall_picture_reaches_the_page_in_tiles_holding_each_element_once(tall_picture):
    from graphsurgeon.widget._tiles import TILE_HEIGHT, tiled

    svg = tall_picture.svg
    box = [float(v) for v in re.search(r'viewBox="([^"]+)"', svg)[1].split()]
    assert box[3] > 3 * TILE_HEIGHT, "precondition: a picture of several tiles"
    sent = zlib.decompress(tall_picture.svg_packed).decode()
    assert sent == tiled(svg) and sent != svg
    page = ET.fromstring(sent)  # well-formed: one box
    assert (
        page.get("class") == "gs-tiled"
        and page.get("data-gs-width") == re.search(r'<svg width="([\d.]+)"', svg)[1]
    )
    *tiles, own = list(page)  # the tiles, then the picture's own svg (drawn under them)
    assert own.tag.endswith("svg") and own[0].get("id") == "graph0" and len(tiles) >= 3
    assert all(t.get("class") == "gs-tile" and "top:" in t.get("style") for t in tiles)
    # every element once, each tile's in dot's order; clusters drawn first, under the tiles
    ids = [i for i, _ in _drawn(sent)]
    assert sorted(ids) == sorted(i for i, _ in _drawn(svg)) and len(set(ids)) == len(ids)
    order = {i: k for k, (i, _) in enumerate(_drawn(svg))}
    strips = sent[: sent.rindex("<svg width=")].split('<div class="gs-tile"')[1:]
    assert len(strips) == len(tiles)
    for strip in strips:
        inside = [order[i] for i, _ in _drawn(strip)]
        assert inside == sorted(inside) and inside
    assert all('class="cluster' not in strip for strip in strips)
    # a tile's box holds what its elements draw: every y they are written with, in its strip
    for tile in tiles:
        view = [float(v) for v in tile[0].get("viewBox").split()]
        transform = re.search(r"translate\(([-\d.]+) ([-\d.]+)\)", sent)
        ty = float(transform[2])
        for group in tile[0][0]:
            text = ET.tostring(group, encoding="unicode")
            ys = [
                float(y)
                for y in re.findall(
                    r",(-?[\d.]+)", " ".join(re.findall(r'(?:points|d)="([^"]*)"', text))
                )
            ]
            assert ys and view[1] <= min(ys) + ty and max(ys) + ty <= view[1] + view[3]


def test_a_small_picture_or_one_not_drawn_by_dot_reaches_the_page_whole(gpt, tall_picture):
    from graphsurgeon.widget._tiles import tiled

    widget, _, _ = gpt
    assert zlib.decompress(widget.svg_packed).decode() == widget.svg == tiled(widget.svg)
    svg = tall_picture.svg
    assert tiled(svg) != svg, "precondition: tall, dot's own"
    assert tiled(svg.replace('class="graph"', 'class="other"', 1)) == svg.replace(
        'class="graph"', 'class="other"', 1
    )
    assert tiled(svg) == tiled(svg), "deterministic"


def test_names_that_are_markup_reach_the_page_escaped():
    widget = gs.SurgeryWidget(gs.export(Named(), (torch.randn(1, 2),)), args=(torch.randn(1, 2),))
    widget.select("blocks.<img src=x onerror=alert(1)>")
    for html in (widget.tree, widget.details, widget.preview, widget.svg):
        assert "<img" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in widget.details


def test_every_button_can_be_pressed_from_code(gpt, monkeypatch):
    """``w.click(name)`` presses each button of SurgeryWidget.BUTTONS, as the page does."""
    from graphsurgeon.widget import _session

    widget, _, _ = gpt
    widget.select("layers.1.attn")
    widget.choose("ns:fast")
    monkeypatch.setattr(_session, "LARGE_LAYOUT", 5)  # "open all" asks first
    order = [
        "swap", "verify", "compare", "find_culprits", "undo", "redo", "expand", "collapse",
        "expand_all", "confirm_layout", "expand_all", "cancel_layout", "auto", "next_match",
        "previous_match", "escape", "toggle_breakpoint", "step", "step_over", "run_to_selection",
        "step_into", "step_out", "continue_", "reset_stepper", "find_similar", "swap_region",
        "clear_region", "fuse_region", "fuse", "reset",
    ]  # fmt: skip
    assert sorted(set(order)) == sorted(widget.BUTTONS), "every button is pressed below"
    pressed: list[str] = []
    for button in order:
        pressed.append(button)
        if button == "fuse":
            widget.select("layers.0.mlp")
        if button == "next_match":
            widget.search("attn")
        if button == "find_similar":
            widget.region(["softmax"])
            widget.choose("identity")  # for the region
        if button == "fuse_region":
            widget.region(["matmul", "div"])
        widget.click(button)
        assert widget.error == {}, (button, widget.error)
        if button == "expand_all" and "confirm_layout" not in pressed:  # then it is laid out
            assert widget.pending and "nodes" in widget.warning, "a large picture asks first"
    assert widget.surgery.replacements == {} and widget.can_redo
    with pytest.raises(gs.errors.WidgetError, match="no button 'paste'"):
        widget.click("paste")


def test_a_surgery_changed_in_code_is_shown_at_the_next_action(gpt):
    widget, model, _ = gpt
    widget.surgery.swap("layers.0.mlp", GeluTanhMLP(model.layers[0].mlp))
    assert not widget.can_diff, "precondition: the widget has not seen it yet"
    widget.select("layers.0.mlp")
    assert widget.can_diff and "GeluTanhMLP" in widget.history
    widget.step()
    assert widget.stepper.graph_module is widget.surgery.module
    widget.surgery.undo()
    widget.refresh()
    assert not widget.can_diff and widget.stepper is None


def test_the_compare_panel_on_meta_says_no_values_were_compared():
    from graphsurgeon.examples import LlamaLike

    with torch.device("meta"):
        model = LlamaLike(n_layers=1, hidden=16, heads=2, kv_heads=1, inner=32, vocab=50).eval()
    tokens = torch.zeros(1, 4, dtype=torch.long, device="meta")
    w = gs.SurgeryWidget(gs.Surgery.from_model(model, (tokens,)), namespace={})
    w.select("layers.0.mlp")
    w.swap(copy.deepcopy(model.layers[0].mlp))
    w.compare()
    panel = w.compare_html
    assert "no values compared" in panel and "nan" not in panel


# -- real models (Hugging Face, built from small configs): what stepping opens ------------------


@pytest.fixture(scope="module")
def llama32():
    """A 32-layer Hugging Face Llama (hidden 32), exported once with every module preserved."""
    model = hf_decoder("Llama", 32)
    ids = torch.randint(0, 100, (1, 8))
    kwargs = {"use_cache": False}
    return model, ids, kwargs, gs.export(model, (ids,), kwargs)


@pytest.fixture(scope="module")
def gpt2():
    """A 2-layer Hugging Face GPT-2 with its default (SDPA) attention."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    kwargs = {"use_cache": False}
    return model, ids, kwargs, gs.export(model, (ids,), kwargs)


def widget_of(hf, namespace=None) -> gs.SurgeryWidget:
    model, ids, kwargs, ep = hf
    surgery = gs.Surgery(ep, model=model, args=(ids,), kwargs=kwargs)
    return gs.SurgeryWidget(surgery, namespace=namespace or {})


def test_run_to_a_layers_attention_draws_at_most_that_layer_more(llama32):
    widget = widget_of(llama32)
    session = widget.session
    layer = "model.layers.5"
    before, clusters = session.scene.view.drawn_nodes, session.scene.view.clusters
    assert not any(c.startswith(layer) for c in clusters), "precondition: layer 5 is a box"
    widget.select(layer + ".self_attn")
    assert widget.run_to_selection().reason == "target"
    drawn = session.scene.view.drawn_nodes
    assert 0 < drawn - before <= session.partitions[layer].num_nodes, (before, drawn)
    opened = set(session.scene.view.clusters) - set(clusters)
    assert layer in opened and all(c.startswith(layer) for c in opened), opened
    assert widget.current == f"node:{widget.stepper.current.name}"
    assert widget.current in svg_ids(widget.svg), "the stop is a drawn node, marked"
    layouts = len(sent(widget, "svg_key"))
    for _ in range(12):  # through the attention: nothing is laid out again
        widget.step()
        assert widget.current == f"node:{widget.stepper.current.name}"
        assert widget.current in svg_ids(widget.svg)
    assert len(sent(widget, "svg_key")) == layouts


def test_what_a_layer_is_is_the_renderers_not_a_name_ending_in_a_digit(llama32, tiny_gpt):
    calls = call_index(llama32[3]).calls
    layers = layer_calls(calls)
    assert layers == {f"model.layers.{i}" for i in range(32)}, "the decoder's stack, only"
    assert not layer_calls(call_index(tiny_gpt[2]).calls), "two blocks are no stack"


def test_stepping_through_a_layer_lays_it_out_once_as_the_run_enters_it(llama32):
    widget = widget_of(llama32)
    session = widget.session
    layer = "model.layers.5"
    inside = set(session.partitions[layer].nodes)
    widget.select(layer + ".input_layernorm").run_to_selection()
    assert widget.stepper.current.name in inside, "precondition: the run is at the layer's start"
    assert widget.current in svg_ids(widget.svg)
    layouts, calls = len(sent(widget, "svg_key")), set()
    while widget.stepper.current.name in inside:
        assert len(sent(widget, "svg_key")) == layouts, (
            "the layer was laid out whole as the run entered"
        )
        calls.add(session.chain_of_node(widget.stepper.current.name)[-1])
        assert widget.current == f"node:{widget.stepper.current.name}"
        assert widget.current in svg_ids(widget.svg), "each stop is a drawn node"
        widget.step()
    assert {layer + ".self_attn", layer + ".mlp"} <= calls, "through norm, attention and MLP"
    assert len(sent(widget, "svg_key")) == layouts + 1, "the next layer: one layout"


def test_stepping_keeps_the_users_view_and_closes_what_it_opened(llama32):
    widget = widget_of(llama32)
    session = widget.session
    widget.expand("model.layers.20")  # the user's
    widget.select("model.layers.5.self_attn").run_to_selection()
    clusters = set(session.scene.view.clusters)
    assert {"model.layers.5", "model.layers.20"} <= clusters
    widget.select("model.layers.6.mlp").run_to_selection()
    clusters = set(session.scene.view.clusters)
    assert "model.layers.5" not in clusters, "the layer the stepper left is closed again"
    assert {"model.layers.6", "model.layers.20"} <= clusters
    assert widget.current in svg_ids(widget.svg)
    widget.continue_()
    assert widget.stepper.done and session.revealed == frozenset()
    clusters = set(session.scene.view.clusters)
    assert "model.layers.6" not in clusters and "model.layers.20" in clusters


def test_every_stop_is_a_drawn_node_and_a_module_breakpoint_stops_at_its_first_op(gpt2):
    widget = widget_of(gpt2)
    session = widget.session
    call = "transformer.h.1.mlp"
    by_name = {n.name: n for n in gpt2[3].graph.nodes}
    ops = [n for n in session.partitions[call].nodes if gs._meta.computes(by_name[n])]
    widget.select(call).click("break")
    result = widget.continue_()
    assert result.reason == "breakpoint" and widget.stepper.current.name == ops[0]
    assert widget.current == f"node:{ops[0]}" and widget.current in svg_ids(widget.svg)
    widget.reset_stepper()
    widget.click("break")  # removed
    while not widget.stepper.done:
        widget.step()
        if not widget.stepper.done:
            assert widget.current == f"node:{widget.stepper.current.name}"
            assert widget.current in svg_ids(widget.svg), widget.current
    assert widget.current == "" and session.revealed == frozenset()


def test_open_all_and_open_to_a_depth_ask_before_a_large_layout(llama32, monkeypatch):
    from graphsurgeon.widget import LARGE_LAYOUT

    widget = widget_of(llama32)
    session = widget.session
    svg = widget.svg
    page_event(widget, event="button", name="expand_all")
    assert widget.pending and widget.svg == svg, "nothing is laid out before the answer"
    drawn = session.pending.drawn
    assert drawn > LARGE_LAYOUT and f"<b>{drawn:,}</b> nodes" in widget.warning
    page_event(widget, event="button", name="cancel_layout")
    assert not widget.pending and widget.warning == "" and widget.svg == svg
    page_event(widget, event="depth", value="2")  # the layers, as boxes
    ids = svg_ids(widget.svg)
    assert "cluster:model" in ids and "module:model.layers.3" in ids and not widget.pending
    page_event(widget, event="depth", value="3")  # each layer open: its attention, its MLP
    ids = svg_ids(widget.svg)
    assert "cluster:model.layers.3" in ids and "module:model.layers.3.self_attn" in ids
    page_event(widget, event="depth", value="4")  # everything
    assert widget.pending and widget.error == {}
    page_event(widget, event="button", name="confirm_layout")
    assert "cluster:model.layers.3.self_attn" in svg_ids(widget.svg) and not widget.pending
    page_event(widget, event="depth", value="auto")
    assert session.opened_by_user is None and widget.svg == svg
    with pytest.raises(gs.errors.WidgetError, match="depth: expected"):
        widget.expand_to_depth(0)


def test_open_all_lays_out_once_confirmed(gpt, monkeypatch):
    from graphsurgeon.widget import _session

    widget, _, _ = gpt
    monkeypatch.setattr(_session, "LARGE_LAYOUT", 10)
    widget.expand_all()
    assert widget.pending
    widget.confirm_layout()
    assert widget.session.opened_by_user == frozenset(widget.session.partitions)
    assert "cluster:layers.1.attn" in svg_ids(widget.svg)
    with pytest.raises(gs.errors.WidgetError, match="no layout waits"):
        widget.confirm_layout()
    widget.collapse("layers.1")
    widget.expand_all(force=True)
    assert not widget.pending and "cluster:layers.1.mlp" in svg_ids(widget.svg)


# -- search --------------------------------------------------------------------------------


def test_search_by_type_op_initials_and_regex_marks_and_lists_every_match(gpt2):
    widget = widget_of(gpt2)
    page_event(widget, event="search", value="LayerNorm")
    layer_norms = [m.name for m in widget.matches]
    assert layer_norms[:1] == ["transformer.h.0.ln_1"] and "transformer.ln_f" in layer_norms
    assert all(widget.session.module_info(n).type_name == "LayerNorm" for n in layer_norms)
    assert widget.selected == "transformer.h.0.ln_1" and widget.error == {}
    marked = widget.marks["matches"]
    assert marked and set(marked) <= svg_ids(widget.svg), "every match is marked"
    assert f"{len(layer_norms)}</b> matches" in widget.search_html
    assert widget.search_html.count("data-gs-match=") == len(layer_norms)
    page_event(widget, event="button", name="next_match")
    assert widget.selected == layer_norms[1] and widget.marks["selected"]
    page_event(widget, event="button", name="previous_match")
    page_event(widget, event="button", name="previous_match")  # before the first: the last
    assert widget.selected == layer_norms[-1]
    page_event(widget, event="match", value=2)
    assert widget.selected == layer_norms[2]
    widget.search("sdpa")  # initials
    assert {m.what for m in widget.matches} == {"aten.scaled_dot_product_attention"}
    assert widget.selected_node == widget.matches[0].name
    assert widget.current == "" and widget.selected_node in {
        i.removeprefix("node:") for i in svg_ids(widget.svg)
    }, "the match's module was opened"
    widget.search(r"h\.\d+\.mlp$")  # a regular expression
    assert [m.name for m in widget.matches] == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    page_event(widget, event="button", name="escape")  # closes the search
    assert widget.search_html == "" and widget.marks["matches"] == []
    assert widget.selected == "transformer.h.0.mlp"
    page_event(widget, event="button", name="escape")  # then clears the selection
    assert widget.selected is None
    with pytest.raises(gs.errors.WidgetError, match="no module or node matches"):
        widget.search("nothing-like-this")


def test_search_finds_ops_and_batch_norms_by_initials(gpt):
    widget, _, _ = gpt
    widget.search("aten.gelu")
    assert [m.what for m in widget.matches] == ["aten.gelu", "aten.gelu"]
    assert set(widget.marks["matches"]) <= svg_ids(widget.svg)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    conv = gs.SurgeryWidget(gs.Surgery.from_model(model, (torch.randn(1, 3, 8, 8),)))
    conv.search("bn")
    assert [(m.name, m.kind) for m in conv.matches][:1] == [("1", "module")]
    assert "BatchNorm2d" in conv.module_types, "the tree's type filter lists it"


# -- the layout, the keys, the caption --------------------------------------------------------


def test_shortcuts_resets_and_a_caption_that_does_not_change_with_the_view(gpt):
    widget, model, _ = gpt
    keys = {a.name: a.key for a in ACTIONS}
    assert (keys["step_over"], keys["step_into"], keys["step_out"]) == ("F10", "F11", "Shift+F11")
    assert keys["continue_"] == "F8" and keys["escape"] == "Escape"
    labels = {a.name: a.label for a in ACTIONS}
    assert labels["reset"] == "Reset surgery" and labels["reset_stepper"] == "Restart run"
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    totals = set()
    for view in ("program", "merged", "split"):
        widget.show(view)
        totals.add(widget.caption.split(" · ")[1])
    widget.expand_all()
    totals.add(widget.caption.split(" · ")[1])
    assert totals == {"the program: 77 fx nodes, 28 module calls, 1 swapped"}, totals
    css = (Path(gs.__file__).parent / "widget" / "static" / "widget.css").read_text()
    assert "text-overflow: ellipsis" in css, "tree cells never overprint their neighbours"


# -- small defects ---------------------------------------------------------------------------


def test_a_new_widget_sends_no_busy_line(tiny_gpt):
    """A busy line sent while the widget is made reached the page after its first picture,
    which stayed dimmed ("laying out the picture…") until the first click."""
    model, tokens, ep = tiny_gpt
    widget = gs.SurgeryWidget(gs.Surgery(ep, model=model, args=(tokens,)), namespace={})
    assert widget.busy == "" and set(sent(widget, "busy")) <= {""}
    seen = []
    widget.observe(lambda change: seen.append(change["new"]), names=["busy"])
    widget.expand_all()  # after it is made, slow work says so
    assert any("laying out" in text for text in seen) and widget.busy == ""


def test_open_on_an_open_module_keeps_its_one_node_modules_as_nodes(gpt):
    widget, _, _ = gpt
    tiny = widget.surgery.program
    # the precondition: a module of one op, collapsed by name, is a "1 node" box
    assert 'id="module:layers.0.attn.q"' in gs.to_dot(tiny, collapse={"layers.0.attn.q"})
    widget.expand("layers.0.attn")
    widget.expand("layers.0.attn")  # open again: nothing changes
    ids = svg_ids(widget.svg)
    assert "cluster:layers.0.attn" in ids and "module:layers.0.attn.q" not in ids
    assert "node:linear" in ids


def test_opening_a_module_keeps_the_own_ops_boxes_folded_until_opened(llama32):
    widget = widget_of(llama32)
    assert "ops:model" in svg_ids(widget.svg), "precondition: the mask building is one box"
    widget.expand("model.layers.0.self_attn")
    ids = svg_ids(widget.svg)
    assert "cluster:model.layers.0.self_attn" in ids and "ops:model" in ids
    page_event(widget, event="toggle", id="ops:model")  # a double-click opens it
    assert widget.error == {} and "ops:model" not in svg_ids(widget.svg)


def test_a_node_a_swap_removed_is_selected_and_says_what_removed_it(gpt):
    widget, model, _ = gpt
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    assert widget.view == "merged"
    removed = [n for n in widget.session.partitions["layers.1.attn"].nodes if n.startswith("view")]
    node = removed[0]
    assert node not in {n.name for n in widget.surgery.module.graph.nodes}, "precondition"
    page_event(widget, event="click", id=f"node:{node}")
    assert widget.error == {} and widget.selected_node == node
    assert "(top level)" not in widget.details and "layers.1 › layers.1.attn" in widget.details
    assert "removed" in widget.details and "swap of <code>layers.1.attn</code>" in widget.details
    widget.show("program")
    widget.select(node)  # from code, in a view that does not draw it
    assert widget.selected_node == node and widget.marks["selected"] == []


def test_the_notebook_shows_the_live_widget_then_a_static_copy_for_saved_notebooks(
    gpt, monkeypatch
):
    import IPython.display

    widget, _, _ = gpt
    shown, updates = [], []

    class Handle:  # what display(..., display_id=True) returns
        def update(self, obj, **options):
            updates.append(obj)

    def display(obj, **options):
        shown.append((obj, options))
        return Handle() if options.get("display_id") else None

    def picture(html):
        return svg_ids(html[html.index("<svg") : html.index("</svg>") + 6])

    monkeypatch.setattr(IPython.display, "display", display)
    widget._ipython_display_()
    (live, live_options), (static, static_options) = shown
    assert "application/vnd.jupyter.widget-view+json" in live and "text/html" not in live
    assert live_options["raw"] and static_options["raw"]
    html = static["text/html"]
    assert 'class="gs-out gs-static"' in html and f'data-gs-model="{widget.model_id}"' in html
    assert picture(html) == svg_ids(widget.svg)
    widget.expand_all()  # the static copy follows the picture shown, for the saved notebook
    assert updates and picture(updates[-1]["text/html"]) == svg_ids(widget.svg)
    css = (Path(gs.__file__).parent / "widget" / "static" / "widget.css").read_text()
    assert ":has(.gs-static)" in css, "a live widget hides its static copy"


def test_clicks_update_the_static_copy_once_a_moment_later_with_the_newest_picture(
    gpt, monkeypatch
):
    """A click's new picture reaches the page first; the static copy (as large as the picture,
    rendered by the notebook at once) follows when the clicks pause, with the last picture."""
    import threading

    import IPython.display

    from graphsurgeon.widget import _widget

    widget, _, _ = gpt
    updates = []

    def picture(html):
        return svg_ids(html[html.index("<svg") : html.index("</svg>") + 6])

    sent_all = threading.Event()

    class Handle:
        def update(self, obj, **options):
            updates.append(obj["text/html"])
            sent_all.set()

    monkeypatch.setattr(
        IPython.display,
        "display",
        lambda obj, **options: Handle() if options.get("display_id") else None,
    )
    monkeypatch.setattr(_widget, "STATIC_COPY_DELAY", 0.3)
    widget._ipython_display_()
    first = widget.svg
    page_event(widget, event="toggle", id="layers.0")  # two double-clicks
    page_event(widget, event="toggle", id="layers.1")
    assert widget.svg != first, "precondition: the clicks drew new pictures"
    assert updates == [], "the copy waits for the clicks to pause"
    assert sent_all.wait(5), "the copy follows within the delay"
    time.sleep(0.5)  # nothing more comes: one update for the two clicks
    assert len(updates) == 1 and picture(updates[0]) == svg_ids(widget.svg)
    widget.toggle("layers.0")  # from code (a cell): at once, as nbval stores it
    assert len(updates) == 2 and picture(updates[1]) == svg_ids(widget.svg)


# -- the picker ------------------------------------------------------------------------------


def test_the_picker_offers_what_can_be_built_and_builds_a_class_from_the_original(tiny_gpt):
    model, tokens, ep = tiny_gpt
    namespace = {
        "model": model,
        "block": model.layers[0],
        "fast": FusedAttention(model.layers[1].attn),
        "GeluTanhMLP": GeluTanhMLP,
        "Doubler": Doubler,
        "NeedsArgs": NeedsArgs,
        "TinyGPT": type(model),
    }
    widget = gs.SurgeryWidget(gs.Surgery(ep, model=model, args=(tokens,)), namespace=namespace)
    labels = {c["key"]: c["label"] for c in widget.candidates}
    assert "ns:model" not in labels and "ns:block" not in labels, "the model, or a part of it"
    assert "ns:NeedsArgs" not in labels, "a class that cannot be built"
    assert "ns:TinyGPT" not in labels, "the model's own class: a fresh one is no replacement"
    assert labels["ns:Doubler"] == "Doubler: class, built as Doubler()"
    assert labels["ns:GeluTanhMLP"] == "GeluTanhMLP: class, built as GeluTanhMLP(original)"
    assert "ns:fast" in labels
    widget.select("layers.0.mlp")
    page_event(widget, event="choose", value="ns:GeluTanhMLP")
    page_event(widget, event="button", name="swap")
    swapped = widget.surgery.replacements["layers.0.mlp"]
    assert isinstance(swapped, GeluTanhMLP) and widget.error == {}
    assert torch.equal(swapped.up.weight, model.layers[0].mlp.up.weight), "from the original"
    reference = eager_reference(model, widget.surgery.replacements)
    torch.testing.assert_close(widget.surgery.module(tokens), reference(tokens))

    namespace["Later"] = Later
    page_event(widget, event="candidates")  # the picker got the focus
    assert "ns:Later" in [c["key"] for c in widget.candidates]


def test_the_picker_ranks_what_fits_the_call_first_and_the_preview_says_why_one_does_not():
    #   x, mask ─▶ gate(hidden_states, attention_mask) ─▶ out(x): two calls of other shapes
    model, x, mask = GatedOut().eval(), torch.randn(2, 4), torch.ones(2, 4)
    namespace = {"OneArgument": OneArgument, "Masked": MaskedAlike, "one": OneArgument()}
    surgery = gs.Surgery.from_model(model, (x, mask))
    widget = gs.SurgeryWidget(surgery, namespace=namespace)
    assert all(c["fits"] is None for c in widget.candidates), "no call selected: not judged"

    widget.select("gate")
    fits = {c["key"]: c["fits"] for c in widget.candidates}
    assert fits == {
        "copy": True,
        "ns:Masked": True,
        "identity": False,
        "ns:OneArgument": False,
        "ns:one": False,
    }
    assert [c["key"] for c in widget.candidates][:2] == ["copy", "ns:Masked"], "fits first"
    why = {c["key"]: c["why"] for c in widget.candidates}
    assert (
        why["ns:one"]
        == why["ns:OneArgument"]
        == (
            "forward(x): too many positional arguments; the call passes 2 arguments: "
            "hidden_states, attention_mask"
        )
    )
    assert why["ns:Masked"] == ""

    page_event(widget, event="choose", value="ns:OneArgument")
    preview = html_unescape(widget.preview)
    assert "does not fit the call" in preview and why["ns:OneArgument"] in preview
    # the picker's verdict is the swap's: it refuses the same replacement for the same reason
    with pytest.raises(gs.errors.ReplacementError, match="too many positional arguments"):
        gs.swap(surgery.program, {"gate": OneArgument()})
    page_event(widget, event="choose", value="ns:Masked")
    assert "does not fit" not in html_unescape(widget.preview)
    page_event(widget, event="button", name="swap")
    assert widget.error == {} and list(widget.surgery.replacements) == ["gate"]

    widget.select("out")  # called with one argument: the other way round
    fits = {c["key"]: c["fits"] for c in widget.candidates}
    assert fits["ns:OneArgument"] and fits["identity"] and not fits["ns:Masked"]
    why = {c["key"]: c["why"] for c in widget.candidates}["ns:Masked"]
    assert why == (
        "forward(x, mask, *, scale=1.0): missing a required argument: 'mask'; the call passes "
        "1 argument: input"
    )


# -- the last mile: op arguments, stepping into a replacement, where it differs ---------------


def test_op_arguments_in_the_details_and_on_the_stepper_lines(gpt):
    widget, _, _ = gpt
    widget.expand("layers.0.attn")
    page_event(widget, event="click", id="node:transpose_3")
    assert "aten.transpose(dim0=-2, dim1=-1)" in widget.details  # short: what edges do not show
    assert "self=transpose_1, dim0=-2, dim1=-1" in widget.details  # full: every argument
    page_event(widget, event="button", name="run_to")
    assert widget.stepper.current.name == "transpose_3"
    text = html_unescape(widget.stepper_html)
    assert "aten.transpose(dim0=-2, dim1=-1)" in text
    assert "aten.transpose.int(self=transpose_1, dim0=-2, dim1=-1)" in text
    widget.step()
    assert "aten.matmul" in html_unescape(widget.stepper_html)


def test_running_to_a_module_that_already_ran_names_the_restart_button(gpt):
    widget, _, _ = gpt
    widget.select("layers.1.attn").run_to_selection()
    assert widget.error == {} and "layers.1.attn" in widget.stepper.stack, "precondition"
    page_event(widget, event="select", value="layers.0.attn")
    page_event(widget, event="button", name="run_to")
    message = widget.error["message"]
    assert widget.error["type"] == "WidgetError", widget.error
    assert "no call of 'layers.0.attn' starts" in message and "press Restart run" in message
    assert "reset()" not in message
    page_event(widget, event="button", name="continue")
    page_event(widget, event="button", name="step")  # the run is over
    assert "press Restart run to run it again" in widget.error["message"]
    page_event(widget, event="button", name="restart")
    page_event(widget, event="button", name="run_to")
    assert widget.error == {} and "layers.0.attn" in widget.stepper.stack


def test_stepping_into_a_swapped_call_draws_its_replacement_beside_the_original(gpt):
    widget, model, tokens = gpt
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    widget.show("program")
    widget.select("layers.1.attn").run_to_selection()
    assert widget.inside_svg == "" and widget.stepper.current.name == "swapped_layers_1_attn"
    page_event(widget, event="button", name="step_into")
    stepper = widget.stepper
    assert stepper.frames == ("layers.1.attn",) and widget.error == {}
    inside = svg_ids(widget.inside_svg)
    assert (
        widget.inside_current == f"node:{stepper.current.name}" and widget.inside_current in inside
    )
    assert "FusedAttention" in widget.inside_caption
    # beside it, the original call's nodes: the before/after picture
    assert widget.view == "merged" and "cluster:layers.1.attn" in svg_ids(widget.svg)
    assert widget.current == "node:swapped_layers_1_attn", "the call stays marked"
    # values for both sides: the replacement's first linear stands for the original's q
    assert "stands for the original's <code>linear_6</code>" in widget.stepper_html
    assert widget.stepper_html.count("<table") >= 2
    page_event(widget, event="button", name="step")
    assert widget.inside_current == f"node:{stepper.current.name}" != "node:linear"
    page_event(widget, event="button", name="step_out")
    assert stepper.frames == () and widget.inside_svg == "" and widget.view == "program"
    # run to a node inside the replacement, and stop there again at a breakpoint
    page_event(widget, event="button", name="restart")
    widget.select("layers.1.attn/scaled_dot_product_attention")
    assert widget.selected == "layers.1.attn" and "inside the swapped call" in widget.details
    page_event(widget, event="button", name="run_to")
    assert stepper.frames == ("layers.1.attn",)
    assert widget.inside_current == "node:scaled_dot_product_attention"
    assert "aten.scaled_dot_product_attention" in widget.details, "drawn: its op is known"
    page_event(widget, event="button", name="break")
    page_event(widget, event="button", name="restart")
    page_event(widget, event="button", name="continue")
    assert stepper.frames == ("layers.1.attn",) and "breakpoint" in widget.stepper_html
    page_event(widget, event="click_inside", id="node:reshape")
    assert widget.selected_node == "layers.1.attn/reshape"
    page_event(widget, event="button", name="continue")
    assert stepper.done and widget.inside_svg == ""
    torch.testing.assert_close(stepper.output, widget.surgery.module(tokens))


class DoubledMLP(nn.Module):
    """An MLP replacement that doubles its output: wrong, and the LayerNorm after it does not
    take it back out."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        y = self.mlp(x)
        return y * 2


def test_compare_names_the_line_where_the_replacement_differs(gpt):
    widget, model, _ = gpt
    widget.swap(DoubledMLP(model.layers[0].mlp), name="layers.0.mlp")
    widget.compare()
    panel = html_unescape(widget.compare_html)
    line = inspect.getsourcelines(DoubledMLP.forward)[1] + 2
    assert "first differs here, inputs agree" in panel
    assert f"test_widget.py:{line}" in panel and "return y * 2" in panel


# -- overlays and culprits --------------------------------------------------------------------


def test_an_overlay_is_painted_recomputed_after_every_edit_and_kept_across_views(gpt):
    widget, model, _ = gpt
    widget.swap(DoubledMLP(model.layers[0].mlp), name="layers.0.mlp")
    assert widget.legend == "" and "data-gs-value" not in widget.tree, "precondition"
    page_event(widget, event="overlay", value="error")
    assert widget.overlay == "error" and widget.error == {}
    assert "error overlay" in widget.legend and "data-gs-value" in widget.tree
    values = widget.session.overlay_values()
    swapped = widget.session.scene.view.overlay
    assert swapped["node:swapped_layers_0_mlp"] > 1, "the wrong swap is hot"
    widget.show("split")
    assert widget.overlay == "error" and "error overlay" in widget.legend
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    assert widget.session.overlay_values() is not values, "computed again after the edit"
    assert widget.overlay == "error" and "error overlay" in widget.legend
    page_event(widget, event="overlay", value="latency")
    assert "latency overlay" in widget.legend
    page_event(widget, event="overlay", value="")
    assert widget.legend == "" and "data-gs-value" not in widget.tree
    page_event(widget, event="overlay", value="heat")
    assert "overlay: expected" in widget.error["message"] and widget.overlay == ""


def test_the_module_tree_is_made_again_only_when_what_it_shows_changed(gpt):
    widget, model, _ = gpt
    session = widget.session
    plain = tree_panel(session)
    assert "data-gs-value" not in plain and tree_panel(session) is plain, "kept as it is"
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    assert session.surgery.replacements, "precondition: the program changed"
    assert tree_panel(session) is plain, "the original program's tree: an edit leaves it"
    widget.show_overlay("error")
    painted = tree_panel(session)
    assert "data-gs-value" in painted and widget.tree == painted
    widget.swap(DoubledMLP(model.layers[0].mlp), name="layers.0.mlp")
    repainted = tree_panel(session)
    assert repainted != painted, "an overlay's values are the new program's"
    assert widget.tree == repainted
    widget.show_overlay("")
    assert tree_panel(session) == plain and widget.tree == plain


def test_compare_and_find_culprits_select_what_they_found_and_bring_it_into_view(gpt):
    widget, model, _ = gpt
    widget.swap(DoubledMLP(model.layers[0].mlp), name="layers.0.mlp")
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    assert widget.selected == "layers.1.attn", "precondition: the last swap is selected"
    scroll = widget.scroll
    page_event(widget, event="button", name="compare")
    assert widget.session.comparison.first_divergence == "layers.0.mlp"
    assert widget.selected == "layers.0.mlp" and widget.scroll == scroll + 1
    assert widget.marks["selected"], "its call is marked in the picture"
    widget.select("layers.1.attn")
    page_event(widget, event="button", name="bisect")
    assert widget.session.bisection.culprits == ("layers.0.mlp",)
    assert widget.selected == "layers.0.mlp" and widget.scroll == scroll + 2
    widget.undo().undo()
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    widget.select("layers.0")
    page_event(widget, event="button", name="compare")
    assert not widget.session.comparison.first_divergence, "precondition: all match"
    assert widget.selected == "layers.0", "nothing found: the selection stays"


def test_what_a_check_finds_is_opened_when_its_layer_is_one_box_until_the_next_edit():
    # a program swapped before the widget was made is drawn as a program, its layers as boxes:
    # the module a check names would be marked as its layer's box, and not shown
    from graphsurgeon.examples import TinyGPT

    model = TinyGPT(12).eval()
    tokens = model.example_input()
    surgery = gs.Surgery.from_model(model, (tokens,))
    surgery.swap("layers.7.mlp", DoubledMLP(copy.deepcopy(model.layers[7].mlp)))
    widget = gs.SurgeryWidget(surgery)
    viewer = widget.session.viewer
    widget.select("layers.7.mlp")
    assert widget.marks["selected"] == ["module:layers.7"], "precondition: inside a box"
    widget.select("layers.0")
    page_event(widget, event="button", name="compare")
    assert widget.session.comparison.first_divergence == "layers.7.mlp"
    own = viewer.scene.node_element(viewer.call_node("layers.7.mlp")).id
    assert own != "module:layers.7", "its own node is drawn (a hidden node's element is its box)"
    assert widget.selected == "layers.7.mlp" and widget.marks["selected"] == [own]
    assert viewer.revealed_by("check") == {"layers.7"}
    widget.swap(copy.deepcopy(model.layers[2].mlp), name="layers.2.mlp")
    assert viewer.revealed_by("check") == frozenset(), "it belonged to the program checked"
    widget.show("program")
    widget.select("layers.7.mlp")
    assert widget.marks["selected"] == ["module:layers.7"], "a box again"
    page_event(widget, event="button", name="bisect")  # the first culprit: the same
    assert widget.session.bisection.culprits == ("layers.7.mlp",)
    assert widget.marks["selected"] == [own], "its own node, again"
    widget.undo()
    page_event(widget, event="button", name="bisect")
    assert viewer.revealed_by("check") == {"layers.7"}
    widget.swap(copy.deepcopy(model.layers[7].mlp), name="layers.7.mlp")
    viewer.reveal("check", {"layers.7"})  # as an earlier check left it, in this program
    page_event(widget, event="button", name="compare")
    assert not widget.session.comparison.first_divergence, "precondition: all match"
    assert viewer.revealed_by("check") == frozenset(), "nothing found: what was opened closes"


def test_find_culprits_marks_the_wrong_swap_in_the_tree_and_the_picture(gpt):
    widget, model, _ = gpt
    widget.swap(FusedAttention(model.layers[1].attn), name="layers.1.attn")
    widget.swap(DoubledMLP(model.layers[0].mlp), name="layers.0.mlp")
    widget.swap(copy.deepcopy(model.layers[1].mlp), name="layers.1.mlp")
    page_event(widget, event="button", name="bisect")
    assert widget.error == {} and widget.session.bisection.culprits == ("layers.0.mlp",)
    runs = widget.session.bisection.runs
    assert "1 culprit" in widget.culprits_html and f"{runs} program runs" in widget.culprits_html
    assert 'data-gs-call="layers.0.mlp"' in widget.culprits_html
    assert widget.marks["culprits"] and set(widget.marks["culprits"]) <= svg_ids(widget.svg)
    assert widget.marks["culprit_modules"] == ["layers.0.mlp"]
    widget.undo()
    assert widget.marks["culprits"] == [] and widget.culprits_html == "", "cleared by an edit"


# -- regions: ops chosen by hand, fused, swapped, looked for elsewhere --------------------------


def test_a_region_of_shift_clicked_ops_is_swapped_for_the_replacement_picked(tiny_gpt, monkeypatch):
    model, tokens, ep = tiny_gpt
    surgery = gs.Surgery(ep, model=model, args=(tokens,))
    widget = gs.SurgeryWidget(surgery, namespace={"Tempered": Tempered})
    widget.expand("layers.0.attn")
    assert not widget.has_region and not widget.can_use_region, "precondition"
    page_event(widget, event="region", id="node:softmax")  # a shift-click
    assert widget.has_region and widget.can_use_region and widget.error == {}
    assert widget.marks["region"] == ["node:softmax"] and widget.selected is None
    # the picker shows the call the replacement must accept
    call = "(masked_fill: f32[1, 4, 16, 16]) → f32[1, 4, 16, 16]"
    assert call in html_unescape(widget.preview) and call in html_unescape(widget.region_html)
    assert not widget.can_swap_region
    page_event(widget, event="choose", value="ns:Tempered")
    assert widget.can_swap_region and not widget.can_swap
    scroll = widget.scroll
    page_event(widget, event="button", name="swap_region")
    assert widget.error == {} and not widget.has_region
    assert list(widget.surgery.replacements) == ["region:layers.0.attn"]
    # the call that replaced the region is selected, marked and brought into view
    assert widget.selected == "region:layers.0.attn" and widget.scroll == scroll + 1
    assert widget.marks["selected"]
    # the eager model with the first attention's softmax tempered the same way
    softmax, calls = torch.softmax, []

    def tempered_first(x, dim):
        calls.append(dim)
        return softmax(x / 2, dim=dim) if len(calls) == 1 else softmax(x, dim=dim)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "softmax", tempered_first)
        with torch.no_grad():
            expected = model(tokens)
    assert len(calls) == 2 and not torch.allclose(expected, model(tokens)), "precondition"
    torch.testing.assert_close(widget.surgery.module(tokens), expected)
    # stepped into as a swapped module is
    widget.select("region:layers.0.attn").run_to_selection()
    widget.step_into()
    assert widget.stepper.frames == ("region:layers.0.attn",) and widget.inside_current


def test_a_region_is_fused_or_says_why_it_cannot_be_one_call(gpt):
    widget, model, tokens = gpt
    widget.expand("layers.0.attn")
    page_event(widget, event="region", id="node:matmul")
    page_event(widget, event="region", id="node:softmax")
    assert not widget.can_use_region and "not convex" in widget.region_html
    page_event(widget, event="button", name="fuse_region")
    assert "not convex" in widget.error["message"] and widget.surgery.fused == ()
    page_event(widget, event="region", id="node:softmax")  # shift-click again: taken out
    page_event(widget, event="region", id="node:matmul")
    assert not widget.has_region and widget.region_html.count("Shift-click") == 1
    widget.region(["matmul", "div"])
    assert widget.can_use_region
    page_event(widget, event="button", name="fuse_region")
    assert widget.error == {} and widget.surgery.fused == ("region:layers.0.attn",)
    assert torch.equal(widget.surgery.module(tokens), model(tokens)), "fused: bit for bit"
    assert "1 fused" in widget.caption


def test_a_shift_drag_rectangle_adds_every_op_it_holds_to_the_region(gpt):
    widget, model, tokens = gpt
    widget.expand("layers.0.attn")
    assert not widget.has_region, "precondition"
    # what the page sends for the elements whose centre is inside the rectangle: ops, the
    # cluster's input and output are not ops and are left out
    ids = ["node:div", "node:masked_fill", "node:softmax"]
    assert all(f'id="{i}"' in widget.svg for i in ids), "precondition: they are drawn"
    page_event(widget, event="region_add", ids=ids)
    assert widget.error == {} and widget.marks["region"] == ids
    assert widget.can_use_region, "three ops in a row make one call"
    page_event(widget, event="region_add", ids=["node:softmax"])  # again: still in, once
    assert widget.marks["region"] == ids
    page_event(widget, event="button", name="fuse_region")
    assert widget.error == {} and widget.surgery.fused == ("region:layers.0.attn",)
    assert torch.equal(widget.surgery.module(tokens), model(tokens)), "fused: bit for bit"
    # a rectangle over nothing that computes says so
    page_event(widget, event="region_add", ids=[])
    assert "holds no op" in widget.error["message"] and not widget.has_region
    page_event(widget, event="region_add", ids="node:matmul")  # not a list: refused
    assert widget.error["type"] == "WidgetError"


def test_find_similar_marks_the_matches_and_lists_the_near_misses_with_what_differs(gpt):
    widget, _, _ = gpt
    widget.expand("layers.0.attn")
    widget.region(["softmax"])
    page_event(widget, event="button", name="find_similar")
    assert widget.error == {} and "<b>2</b> places compute the same" in widget.region_html
    marked = widget.marks["similar"]
    assert "node:softmax" in marked and "module:layers.1.attn" in marked, "a box holds one"
    assert set(marked) <= svg_ids(widget.svg)
    twice = gs.SurgeryWidget(gs.Surgery.from_model(GeluTwice(), (torch.randn(2, 4),)))
    twice.region(["gelu"])
    found = twice.find_similar()
    assert [m.nodes for m in found.matches] == [("gelu",)]
    assert twice.marks["near"] == ["node:gelu_1"]
    assert "near-miss" in twice.region_html and "constant &#x27;tanh&#x27;" in twice.region_html


def test_find_similar_after_a_swap_lists_only_what_the_program_still_has():
    widget = gs.SurgeryWidget(gs.Surgery.from_model(SiluBlocks().eval(), (torch.randn(2, 4),)))
    region = ["linear", "sigmoid", "mul"]
    widget.region(region)
    assert widget.find_similar().calls == ("blocks.0", "blocks.1", "blocks.2"), "precondition"
    widget.swap(nn.Linear(4, 4), name="blocks.1")  # its linear_1 is gone from the program
    widget.region(region)
    found = widget.find_similar()
    assert found.calls == ("blocks.0", "blocks.2"), "a place the swap removed is not listed"
    assert "node:linear_1" not in widget.marks["similar"], "nor marked"
    assert "<b>2</b> places compute the same" in widget.region_html
    assert "1 place left out: earlier swaps removed its nodes" in widget.region_html
    widget.fuse("blocks.2")  # a fused call still computes its nodes: its match stays
    widget.region(region)
    assert widget.find_similar().calls == ("blocks.0", "blocks.2")


def test_a_search_that_finds_nothing_clears_the_last_ones_results(gpt):
    widget, _, _ = gpt
    widget.search("aten.gelu")
    assert widget.matches and widget.marks["matches"] and widget.has_matches, "precondition"
    page_event(widget, event="search", value="nothing-like-this")
    assert "no module or node matches 'nothing-like-this'" in widget.error["message"]
    assert widget.matches == [] and widget.marks["matches"] == [] and not widget.has_matches
    assert widget.search_html == "" and widget.search_text == ""
    assert widget.session.match_index == -1
    widget.search("aten.gelu")
    with pytest.raises(gs.errors.WidgetError, match="no module or node matches"):
        widget.search("nothing-like-this")  # from code too
    assert widget.matches == [] and widget.marks["matches"] == []
    page_event(widget, event="search", value="layers.1.atn")
    assert widget.error["message"].count("'layers.1.attn'") == 1, "each suggestion once"


def test_a_swapped_module_is_found_once_by_a_regex():
    widget = gs.SurgeryWidget(gs.Surgery.from_model(Chain().eval(), (torch.randn(2, 4),)))
    widget.search(r"act$")
    assert [(m.name, m.kind) for m in widget.matches] == [("act", "module")], "precondition"
    widget.swap(nn.GELU(), name="act")
    widget.search(r"act$")
    assert [(m.name, m.kind) for m in widget.matches] == [("act", "module")]
    widget.search("act")
    assert [m.name for m in widget.matches].count("act") == 1
    assert widget.search_html.count("data-gs-match=") == len(widget.matches)
    widget.undo()
    widget.fuse("act")  # a fused module too
    widget.search(r"act$")
    assert [(m.name, m.kind) for m in widget.matches] == [("act", "module")]


# -- what the page sends: trusted no more than it must be --------------------------------------


def test_a_huge_id_from_the_page_comes_back_as_a_short_error_that_says_what_is_wrong():
    widget = gs.SurgeryWidget(gs.Surgery.from_model(Chain().eval(), (torch.randn(2, 4),)))
    huge = "node:" + "x" * 1_000_000
    page_event(widget, event="click", id=huge)
    message = widget.error["message"]
    assert len(message) < 400, len(message)
    assert message.startswith("the picture has no element 'node:xxx") and "…" in message
    assert "(1,000,005 characters)" in message, "the full length is noted"
    assert len(widget.error["details"]) < 20_000, "the traceback's copy of it too"
    page_sets(widget, selected="y" * 1_000_000)  # a name through the selection trait
    assert "has no module or node 'yyy" in widget.error["message"]
    assert len(widget.error["message"]) < 1_000 and widget.selected is None
    page_event(widget, event="search", value="z " * 500_000)  # a name with spaces
    assert "no module or node matches" in widget.error["message"]
    assert len(widget.error["message"]) < 1_100
    widget.select("act")
    assert widget.error == {}


def test_a_boolean_from_the_page_is_true_or_false_and_nothing_else(gpt):
    widget, _, _ = gpt
    for value in ("false", "true", 0, 1, None, [], {"on": True}):
        page_event(widget, event="nan", value=value)
        assert widget.break_on_nan is False, value
        assert widget.error["message"].startswith("nan: expected true or false"), value
    page_event(widget, event="nan", value=True)
    assert widget.break_on_nan is True and widget.error == {}
    page_event(widget, event="nan", value=False)
    assert widget.break_on_nan is False and widget.error == {}


def _another_value(value):
    """A value of the same JSON type as ``value`` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, "x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    if isinstance(value, bytes):
        return value + b"x"
    return "x"


def test_the_page_cannot_set_what_the_kernel_writes():
    widget = gs.SurgeryWidget(gs.Surgery.from_model(Chain().eval(), (torch.randn(2, 4),)))
    page_sets(widget, swapped=["act"])  # the form in which a page sends it
    assert widget.swapped == [] and list(widget.surgery.replacements) == []
    assert "the page set 'swapped', which only the kernel writes" in widget.error["message"]
    assert sent(widget, "swapped")[-1] == [], "the page is sent the kernel's value again"
    # every trait the panels write is the kernel's, and so are the buttons and the messages
    inputs, outputs = gs.SurgeryWidget.PAGE_INPUTS, gs.SurgeryWidget.OUTPUT_TRAITS
    written = set(panel_values(widget.session, set(PARTS))) | {"actions", "menus", "error", "busy"}
    assert written - set(widget.keys) == {"svg", "clicks", "tree"}, "sent packed"
    written &= set(widget.keys)
    assert written - inputs <= outputs and inputs == {"selected"} and not inputs & outputs
    for trait in sorted(outputs - {"error"}):
        kept = copy.deepcopy(getattr(widget, trait))
        page_sets(widget, **{trait: _another_value(kept)})
        assert getattr(widget, trait) == kept, trait
        assert f"the page set {trait!r}" in widget.error["message"], trait
    page_sets(widget, error={})
    assert widget.error["message"].startswith("the page set 'error'"), "not cleared by the page"
    page_sets(widget, selected="act")  # what the page may set works as before
    assert widget.selected == "act" and widget.error == {}


# -- structure: one table of actions, no import circle, no private reach ----------------------


def test_the_buttons_click_and_the_page_messages_come_from_one_actions_table(gpt):
    widget, _, _ = gpt
    names = [action.name for action in ACTIONS]
    assert list(widget.BUTTONS) == names and len(set(names)) == len(names)
    assert [a["name"] for a in widget.actions] == names, "the page builds the same buttons"
    assert [a["key"] for a in widget.actions] == [a.key for a in ACTIONS]
    keys = [action.key for action in ACTIONS if action.key]
    assert keys and len(set(keys)) == len(keys), "shortcuts exist and do not clash"
    for action in ACTIONS:  # each calls a session method that needs no argument
        method = getattr(SurgerySession, action.method)
        parameters = list(inspect.signature(method).parameters.values())[1:]
        assert all(p.default is not inspect.Parameter.empty for p in parameters), action
        assert set(action.enabled_by) <= set(widget.trait_names()), action
    script = (Path(gs.__file__).parent / "widget" / "static" / "widget.js").read_text()
    for action in ACTIONS:  # the page keeps no copy of its own
        assert f'"{action.name}"' not in script and action.tooltip not in script, action.name
    # a button message from the page runs the action's session method, through the table
    pressed: list[str] = []
    for action in ACTIONS:
        setattr(widget.session, action.method, lambda name=action.name: pressed.append(name))
    for action in ACTIONS:
        page_event(widget, event="button", name=action.name)
        assert widget.error == {}, action.name
    assert pressed == names


def test_each_action_has_one_name_the_method_of_the_session_and_of_the_widget(gpt):
    widget, _, _ = gpt
    for action in ACTIONS:
        assert action.method == action.name, action
        assert callable(getattr(SurgerySession, action.name, None)), action.name
        assert callable(getattr(gs.SurgeryWidget, action.name, None)), action.name
    # the widget's method, w.click(name) and the page's button message reach the same
    # session method
    pressed: list[str] = []

    def pressing(name):
        return lambda *_args, **_kwargs: pressed.append(name)

    for action in ACTIONS:
        pressed.clear()
        setattr(widget.session, action.name, pressing(action.name))
        getattr(widget, action.name)()
        widget.click(action.name)
        page_event(widget, event="button", name=action.name)
        assert pressed == [action.name] * 3 and widget.error == {}, (action.name, widget.error)
    # the names buttons had before are still taken, for code and notebooks written with them
    for old, name in OLD_NAMES.items():
        pressed.clear()
        widget.click(old)
        page_event(widget, event="button", name=old)
        assert pressed == [name, name], old
    assert not set(OLD_NAMES) & set(widget.BUTTONS), "the buttons carry the one name"


def test_a_container_name_opens_and_collapses_the_calls_it_covers_as_a_highlight_reads_it(gpt):
    widget, _, _ = gpt
    ep = widget.surgery.program
    covered = graph_view(ep, highlight="layers").highlighted
    assert covered == ("layers.0", "layers.1"), "precondition: the highlight covers each layer"
    widget.collapse("layers")
    ids = svg_ids(widget.svg)
    assert {"module:layers.0", "module:layers.1"} <= ids or "modules:layers.0..layers.1" in ids
    widget.expand("layers")
    assert widget.error == {}
    ids = svg_ids(widget.svg)
    assert {f"cluster:{call}" for call in covered} <= ids, "each call it covers, opened"
    widget.select("layers")
    assert set(widget.marks["selected"]) == {f"cluster:{call}" for call in covered}
    page_event(widget, event="toggle", id="layers")  # open: collapses it
    assert not {f"cluster:{call}" for call in covered} & svg_ids(widget.svg)


def test_a_container_that_covers_no_call_is_refused_saying_why():
    widget = gs.Surgery.from_model(NeverCalled(), (torch.randn(2, 4),)).widget(namespace={})
    with pytest.raises(gs.errors.UnknownModuleError, match=r"'spare' covers no call.*never"):
        widget.expand("spare")
    page_event(widget, event="toggle", id="spare")
    assert widget.error["type"] == "UnknownModuleError"
    with pytest.raises(gs.errors.UnknownNameError, match="Did you mean 'spare'"):
        widget.expand("spar")


def test_the_widget_reads_programs_and_inputs_through_the_one_door(tiny_gpt):
    model, tokens, ep = tiny_gpt
    with pytest.raises(
        gs.errors.InputStructureError,
        match="SurgeryWidget: args: expected a tuple of positional inputs such as \\(x,\\), got a list",
    ):
        gs.SurgeryWidget(ep, args=[tokens])
    surgery = gs.Surgery(ep, model=model)
    with pytest.raises(gs.errors.InputStructureError, match="SurgeryWidget: args: expected a"):
        gs.SurgeryWidget(surgery, args=[tokens])
    swapped = gs.swap(ep, {"layers.0.mlp": GeluTanhMLP(model.layers[0].mlp)})
    with pytest.raises(gs.errors.NotAProgramError, match=r"made by gs\.swap or gs\.fuse"):
        gs.SurgeryWidget(swapped)
    widget = gs.SurgeryWidget(surgery, args=tokens, namespace={})  # a lone tensor: (x,)
    assert surgery.args is None and surgery.kwargs == {}, "the Surgery given is not changed"
    assert widget.verify() and widget.step().ran, "the widget runs on its own inputs"
    assert widget.surgery is surgery and surgery.args is None


def test_the_widget_is_in_no_import_circle_but_surgery_widget():
    circles = circles_but_surgery_widget()
    assert not [c for c in circles if any(m.startswith("graphsurgeon.widget") for m in c)]


# What IPython calls on any object to display it: public, whatever its underscores say.
_DISPLAY_PROTOCOL = {"_repr_html_", "_repr_mimebundle_"}


def _private_reaches(module: str, source: str) -> list[str]:
    """What the ``source`` of ``module`` takes that another module or object keeps private:
    a name with a leading underscore imported from another module; a module private to
    another stage (``render._writer``; a module of graphsurgeon itself, such as ``_meta``, is
    shared by design); an attribute with a leading underscore of anything but ``self``,
    ``cls`` or ``super()`` (also through ``getattr``)."""
    own = module.rpartition(".")[0]
    found = []
    for target, name, _scope, line in imports_of(module, source):
        if target == "__future__" or target == own or target.startswith(own + "."):
            continue
        parts = target.split(".")
        shared = parts[0] == "graphsurgeon" and len(parts) == 2
        if name.startswith("_") or (any(p.startswith("_") for p in parts) and not shared):
            found.append(f"line {line}: imports {target} {name}".rstrip())
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            attribute, owner = node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            attribute, owner = node.args[1].value, node.args[0]
        else:
            continue
        if not attribute.startswith("_") or attribute.endswith("__"):
            continue  # public, or a dunder
        if attribute in _DISPLAY_PROTOCOL:
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
            continue
        found.append(f"line {node.lineno}: reads {ast.unparse(owner)}.{attribute}")
    return found


def test_the_widget_imports_no_private_name_and_reads_no_private_attribute():
    reaches = (
        "from ..render._writer import call_signature\n"
        "from ..display import _TREE_STYLE\n"
        "from .. import _meta\n"
        "import torch._ops\n"
        "position = surgery._position + self._seen\n"
        "rows = getattr(picture, '_lookups')\n"
    )
    found = _private_reaches("graphsurgeon.widget._session", reaches)
    # every reach is seen, but _meta (shared by design) and self._seen (its own)
    assert len(found) == 5, found
    widget = sorted(m for m in MODULES if m.startswith("graphsurgeon.widget"))
    # the face, the widget, the session, its six concerns, panels, the collector's hold, and
    # the picture as the page gets it (tiles)
    assert len(widget) == 12, widget
    for module in widget:
        source = MODULES[module].read_text()
        assert _private_reaches(module, source) == [], module
        # a Picture is read through its lookups, never as rows of fields by position
        assert not re.search(r"\.(edge_)?rows\b", source), module


def test_the_verify_badges_say_why_a_verdict_is_what_it_is():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    widget = gs.Surgery.from_model(PassesMaskOnlyWhenExported(), (x,)).widget()
    widget.select("inner")
    widget.surgery.swap("inner", MaskedInner())
    page_event(widget, event="button", name="verify")
    assert "not faithful: eager passes other arguments" in widget.verify_html
    assert "in eager, &#x27;inner&#x27; gets mask=None" in widget.verify_html
    # outputs far below atol: the badge says the verdict is atol's
    small = nn.Sequential(nn.Linear(4, 4, bias=False)).eval()
    with torch.no_grad():
        small[0].weight.mul_(1e-6)
    widget = gs.Surgery.from_model(small, (x,)).swap("0", copy.deepcopy(small[0])).widget()
    page_event(widget, event="button", name="verify")
    assert "faithful, decided by atol" in widget.verify_html


# -- the gradients toggle: Verify, Compare and Find culprits on the backward too ------------------


@pytest.fixture
def norms_widget():
    """A widget on a 4-layer stack with a fused RMSNorm (a hand-written backward) in every
    block, the one of layers.2 with a weight gradient twice what it should be."""
    torch.manual_seed(0)
    model = NormStack(dim=8, layers=4)
    x = torch.randn(2, 3, 8)
    s = gs.Surgery.from_model(model, (x,))
    for name, replacement in fused_norms(model, {"layers.2.norm": "weight factor"}).items():
        s.swap(name, replacement)
    return gs.SurgeryWidget(s), model, x


def test_the_gradients_toggle_makes_every_check_look_at_the_backward(norms_widget):
    widget, _, _ = norms_widget
    # the precondition: the forward alone finds nothing wrong
    assert widget.verify() and widget.compare().first_divergence is None
    assert widget.find_culprits().culprits == ()
    assert widget.gradients is False and "gradients" not in widget.verify_html.lower()
    page_event(widget, event="gradients", value=True)
    assert widget.error == {} and widget.gradients is True and widget.session.gradients
    page_event(widget, event="button", name="verify")
    # faithful (the eager model carries the same wrong backward), not equal to the original
    report = widget.session.report
    assert report and report.backward and report.original.backward
    original = report.original
    assert not original and original.outputs_ok
    assert [g.path for g in original.gradient_mismatches] == ["grad of layers.2.norm.weight"]
    assert "grad of layers.2.norm.weight" in widget.verify_html
    page_event(widget, event="button", name="compare")
    cmp = widget.session.comparison
    assert cmp.first_divergence == "layers.2.norm" and cmp.first_divergence_pass == "backward"
    assert "DIVERGES in backward" in widget.compare_html
    assert "the backward first differs here, inputs agree" in widget.compare_html
    assert "grad_x = grad_normed * rstd" not in widget.compare_html  # a factor, not the mean
    assert "grad_weight = grad_weight * 2" in widget.compare_html
    page_event(widget, event="button", name="find_culprits")
    assert widget.session.bisection.culprits == ("layers.2.norm",)
    assert widget.marks["culprit_modules"] == ["layers.2.norm"]
    # from code: backward= sets the toggle the page shows
    assert widget.verify(backward=False).original and widget.gradients is False
    assert not widget.compare(backward=True).ok and widget.gradients is True
    with pytest.raises(gs.errors.WidgetError, match="backward='yes'"):
        widget.verify(backward="yes")
    page_event(widget, event="gradients", value="on")
    assert widget.error["message"].startswith("gradients: expected true or false")


def test_the_grad_overlays_paint_the_wrong_backward(norms_widget):
    widget, _, _ = norms_widget
    widget.show_overlay("own grad error")
    values = widget.session.viewer.overlay_values()
    lit = {call for call, value in values.calls.items() if value > 1 and call.endswith("norm")}
    assert lit == {"layers.2.norm"} and "own grad error" in widget.legend


def test_a_region_of_a_node_the_program_lacks_is_refused_and_the_region_kept(gpt):
    widget, _, _ = gpt
    widget.expand("layers.0.attn")
    widget.region(["matmul", "div"])
    assert widget.can_use_region  # precondition: a region to keep
    with pytest.raises(gs.errors.UnknownNodeError, match=r"'matmull'.*Did you mean 'matmul'"):
        widget.region(["matmul", "matmull"])
    assert widget.can_use_region and "matmull" in widget.error["message"]
    widget.fuse_region()
    assert widget.surgery.fused == ("region:layers.0.attn",)


def test_a_search_row_shows_the_end_of_a_long_name_that_tells_the_matches_apart():
    from collections import OrderedDict

    block = nn.Sequential(
        OrderedDict(attention_projection_q=nn.Linear(4, 4), attention_projection_k=nn.Linear(4, 4))
    )
    model = nn.Sequential(OrderedDict(encoder_block_with_a_long_name=block))
    x = torch.randn(2, 4)
    widget = gs.SurgeryWidget(gs.export(model, (x,)), args=(x,))
    widget.search("attention_projection")
    names = [m.name for m in widget.matches]
    assert "encoder_block_with_a_long_name.attention_projection_q" in names  # precondition
    html = widget.search_html
    for name in ("attention_projection_q", "attention_projection_k"):
        full = f"encoder_block_with_a_long_name.{name}"
        assert f"<code>…{name}</code>" in html  # the row: the end that differs
        assert f'title="{full} (module Linear' in html  # the tooltip: the whole name
