"""export(): signatures preserved for every module, unpreservable ones dropped with a reason."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.export_models import (
    GatedMLP,
    MetaDecoder,
    NotExportable,
    PlusThenLinear,
    TwoStructures,
    UsesMode,
    UsesSize,
)
from torch import nn

import graphsurgeon as gs
from graphsurgeon.export import export_notes


def preserved(ep):
    return {e.fqn for e in ep.module_call_graph if e.signature is not None and e.fqn}


def test_all_modules_are_preserved_by_default():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))
    ep = gs.export(model, (torch.randn(3, 4),))
    assert preserved(ep) == {"0", "1", "1.0", "1.1"}


def test_preserve_a_list_of_names_or_a_predicate():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))
    x = torch.randn(3, 4)
    assert preserved(gs.export(model, (x,), preserve=["1.1"])) == {"1.1"}
    linear_only = gs.export(model, (x,), preserve=lambda fqn, m: isinstance(m, nn.Linear))
    assert preserved(linear_only) == {"0", "1.1"}
    assert preserved(gs.export(model, (x,), preserve="none")) == set()


def test_an_unknown_name_in_preserve_says_did_you_mean():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(gs.errors.UnknownModuleError, match=r"'2'.*named_modules"):
        gs.export(model, (torch.randn(3, 4),), preserve=["2"])


def test_a_module_torch_cannot_preserve_is_dropped_and_the_reason_kept():
    model, x = TwoStructures(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    notes = export_notes(ep)
    assert "inner" in notes.dropped
    assert "inner" not in preserved(ep) and "tail" in preserved(ep)
    info = gs.module_tree(ep)["inner"]
    assert not info.preserved and not info.swappable
    # in the user's words, not torch's "in_spec mismatch for _export_root.inner: TreeSpec(..."
    assert "it is called in 2 different ways" in info.reason and "TreeSpec" not in info.reason
    torch.testing.assert_close(ep.module()(x), model(x))


def test_why_torch_could_not_keep_a_signature_is_said_in_the_users_words():
    ep = gs.export(UsesMode(), (torch.randn(2, 4),))
    reason = gs.module_tree(ep)["m"].reason
    # torch says "AssertionError: Expected code to be unreachable, but got: 'mul'"
    assert "called with a string argument (mode='mul')" in reason and "unreachable" not in reason
    batch = torch.export.Dim("batch")
    ep = gs.export(UsesSize(), (torch.randn(3, 4),), dynamic_shapes=({0: batch},))
    reason = gs.module_tree(ep)["m"].reason
    # torch says "Only Tensors or scalars are supported as pytree flattened inputs, got: s77"
    assert "returns a size that depends on a dynamic dimension (output[1]" in reason
    assert "s77" not in reason


def test_a_module_called_in_a_way_no_signature_holds_costs_one_retry_not_a_bisection():
    # torch's message ("Expected code to be unreachable, but got: 'mul'") names no module,
    # but the failed run saw the module take a string: dropped at once, exported once more
    model, x = UsesMode(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    notes = export_notes(ep)
    assert list(notes.dropped) == ["m"] and notes.attempts == 2
    assert preserved(ep) == {n for n, _ in model.named_modules() if n and n != "m"}
    torch.testing.assert_close(ep.module()(x), model(x))


def test_asking_explicitly_for_an_unpreservable_module_is_an_error_naming_it():
    model, x = TwoStructures(), torch.randn(2, 4)
    with pytest.raises(gs.ExportError, match=r"'inner'") as caught:
        gs.export(model, (x,), preserve=["inner", "tail"])
    assert caught.value.__cause__ is not None


def test_a_model_that_does_not_export_raises_export_error_with_the_cause():
    with pytest.raises(gs.ExportError, match="NotExportable") as caught:
        gs.export(NotExportable(), (torch.randn(3),))
    assert caught.value.__cause__ is not None


def test_strict_export_preserves_too():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    ep = gs.export(model, (torch.randn(3, 4),), strict=True)
    assert preserved(ep) == {"0", "1"}


def test_dynamic_shapes_are_passed_through():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    batch = torch.export.Dim("batch", min=1, max=128)
    ep = gs.export(model, (torch.randn(3, 4),), dynamic_shapes=({0: batch},))
    assert ep.module()(torch.randn(17, 4)).shape == (17, 4)


def test_export_leaves_the_model_as_it_was():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    before = copy.deepcopy(model.state_dict())
    gs.export(model, (torch.randn(3, 4),))
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_a_model_on_the_meta_device_exports_and_swaps_without_weights():
    with torch.device("meta"):
        model = MetaDecoder()
        tokens = torch.zeros(1, 8, dtype=torch.long)
    ep = gs.export(model, (tokens,))
    assert all(p.device.type == "meta" for p in ep.state_dict.values())
    with torch.device("meta"):
        replacement = GatedMLP(1024, 128)
    gm = gs.swap(ep, {"mlps.1": replacement})
    out = gm(tokens)
    assert out.device.type == "meta" and out.shape == (1, 8, 32000)
    assert gs.module_tree(ep)["mlps.1"].swappable


def test_notes_record_types_and_attempts():
    model, x = TwoStructures(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    notes = export_notes(ep)
    assert notes.module_types["inner.lin"] == "torch.nn.modules.linear.Linear"
    assert notes.attempts == 2 and notes.seconds > 0
    assert export_notes(torch.export.export(model, (x,))) is None


def test_a_failure_that_names_no_module_is_narrowed_down_by_bisection(monkeypatch):
    real_export = torch.export.export

    def export_failing_on_a(model, args, kwargs=None, **options):
        if "a" in options.get("preserve_module_call_signature", ()):
            raise RuntimeError("something went wrong somewhere")
        return real_export(model, args, kwargs, **options)

    monkeypatch.setattr(torch.export, "export", export_failing_on_a)
    ep = gs.export(PlusThenLinear(), (torch.randn(1, 2),))
    notes = export_notes(ep)
    assert set(notes.dropped) == {"a"} and "something went wrong" in notes.dropped["a"]
    assert "b" in preserved(ep) and notes.attempts > 2


# --- arguments a user can get wrong ------------------------------------------------------------


def small():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(3, 4)


def test_the_small_model_exports_with_good_arguments():
    # precondition of the tests below: only the argument under test is wrong
    model, x = small()
    assert preserved(gs.export(model, (x,), preserve=["0"])) == {"0"}
    assert preserved(gs.export(model, x)) == {"0", "1"}  # one tensor: one input, as always


@pytest.mark.parametrize(
    ("preserve", "said"),
    [
        (3, r"preserve=3: expected 'all', 'none', a list of module names .* got an int\.$"),
        (None, r"preserve=None: .*got None\. Use preserve='none'"),
        (True, r"preserve=True: .*got a bool\. Use preserve='all' or preserve='none'"),
        ({"0": True}, r"preserve=\{'0': True\}: .*got a dict\. For the names of its keys"),
        (b"0", r"preserve=b'0': .*got a bytes"),
        (["0", 1], r"preserve: expected module names \(str\), got 1 \(an int\) at position 1"),
        (nn.ReLU(), r"preserve: got a ReLU module; pass module names"),
        (lambda fqn: True, r"predicate failed on module '0' with TypeError.*predicate\(fqn, mod"),
    ],
)
def test_a_bad_preserve_raises_export_error_saying_what_it_takes(preserve, said):
    model, x = small()
    with pytest.raises(gs.ExportError, match=said):
        gs.export(model, (x,), preserve=preserve)


def test_a_string_preserve_that_is_no_module_names_the_keywords():
    model, x = small()
    with pytest.raises(gs.errors.UnknownModuleError, match=r"'ALL'.*'all' and 'none' are the only"):
        gs.export(model, (x,), preserve="ALL")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (None, r"got None; pass \(\) for a model that takes no positional inputs"),
        ("list", r"got a list; pass tuple\(args\) when the list holds the inputs"),
        ("dict", r"got a dict; keyword inputs go in kwargs"),
        ("x", r"got a str; pass \(args,\) when the model really takes a string"),
        ("module", r"got a Sequential; is the order of model and args swapped"),
        ("generator", r"got a generator; pass tuple\(args\)"),
    ],
)
def test_args_that_are_obviously_not_inputs_raise_input_structure_error(args, said):
    # refused as by every entry point (graphsurgeon._program.as_inputs), naming the verb
    model, x = small()
    args = {
        "list": [x],
        "dict": {"input": x},
        "module": model,
        "generator": (t for t in [x]),
    }.get(args, args)
    with pytest.raises(
        gs.InputStructureError,
        match=r"^export: args: expected a tuple of positional inputs.*" + said,
    ):
        gs.export(model, args)


def test_kwargs_that_are_not_a_mapping_and_a_model_that_is_not_a_module_raise_export_error():
    model, x = small()
    # kwargs are refused as by every entry point (graphsurgeon._program.as_inputs)
    with pytest.raises(gs.InputStructureError, match=r"kwargs: expected a mapping.*got a list"):
        gs.export(model, (x,), [x])
    with pytest.raises(gs.ExportError, match=r"expected an nn.Module, got a function"):
        gs.export(lambda x: x, (x,))
    ep = gs.export(model, (x,))
    with pytest.raises(gs.ExportError, match=r"got an ExportedProgram\. It is exported already"):
        gs.export(ep, (x,))
