"""A swapped program checks its inputs as ``ep.module()`` does, and its replacements at the call."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.export_models import (
    Attend,
    FromDict,
    FromTuple,
    LinearTimesN,
    NoInit,
    NoInitNoForward,
    OneArgument,
    OneTokenFewer,
    RaisesTypeError,
    ResidualLinear,
)
from helpers.models import TwoLinear
from torch import nn
from torch.export import Dim

import graphsurgeon as gs
from graphsurgeon.checks.verify import eager_reference


def _refused_by_torch(ep, *args):
    """The precondition of each guard test: torch's own ep.module() refuses these inputs too."""
    with pytest.raises(Exception):  # noqa: B017 - torch raises several types here
        ep.module()(*args)


def test_a_static_batch_size_is_checked_like_ep_module():
    x = torch.randn(2, 4)
    ep = gs.export(TwoLinear().eval(), (x,))
    gm = gs.swap(ep, {"a": nn.Linear(4, 4)})
    wrong = torch.randn(3, 4)
    _refused_by_torch(ep, wrong)
    with pytest.raises(gs.GuardError, match=r"input 'x': dimension 0 is 3.*exported for 2"):
        gm(wrong)
    with pytest.raises(gs.GuardError, match="dimension 1 is 5"):
        gm(torch.randn(2, 5))
    assert gm(x).shape == (2, 4)


def test_a_constant_input_must_equal_its_value_at_export():
    x = torch.randn(2, 4)
    ep = gs.export(LinearTimesN().eval(), (x, 5))
    gm = gs.swap(ep, {"a": nn.Linear(4, 4)})
    _refused_by_torch(ep, x, 6)
    with pytest.raises(gs.GuardError, match=r"input 'n' is int 6.*exported with n=5"):
        gm(x, 6)
    assert gm(x, 5).shape == (2, 4)


def test_dynamic_dims_keep_working_within_their_range():
    x = torch.randn(2, 4)
    batch = Dim("batch", min=2, max=64)
    ep = gs.export(TwoLinear().eval(), (x,), dynamic_shapes=({0: batch},))
    replacement = nn.Linear(4, 4)
    gm = gs.swap(ep, {"a": replacement})
    model = TwoLinear().eval()
    model.load_state_dict(ep.module().state_dict())
    for size in (2, 7, 64):
        inputs = torch.randn(size, 4)
        expected = model.b(torch.relu(replacement(inputs)))
        torch.testing.assert_close(gm(inputs), expected)
    _refused_by_torch(ep, torch.randn(100, 4))
    with pytest.raises(gs.GuardError, match=r"dimension 0 of 'x' is 100, above .* \(64"):
        gm(torch.randn(100, 4))


def test_a_dict_missing_a_key_names_the_path():
    x = torch.randn(2, 4)
    ep = gs.export(FromDict().eval(), ({"a": x, "b": x},))
    gm = gs.swap(ep, {"a": nn.Linear(4, 4)})
    _refused_by_torch(ep, {"a": x})
    with pytest.raises(gs.errors.InputStructureError, match=r"d\['b'\] is missing"):
        gm({"a": x})
    assert gm({"a": x, "b": x}).shape == (2, 4)


def test_a_short_tuple_names_the_path():
    x = torch.randn(2, 4)
    ep = gs.export(FromTuple().eval(), ((x, x),))
    gm = gs.swap(ep, {"a": nn.Linear(4, 4)})
    with pytest.raises(gs.errors.InputStructureError, match="t is a tuple of 1 where the program"):
        gm((x,))


def test_a_container_where_a_tensor_was_exported_is_a_structure_error():
    x = torch.randn(2, 4)
    ep = gs.export(TwoLinear().eval(), (x,))
    gm = gs.swap(ep, {"a": nn.Linear(4, 4)})
    with pytest.raises(gs.errors.InputStructureError) as caught:
        gm({"a": x})
    message = str(caught.value)
    assert "input 'x' is a dict {'a': tensor[2, 4]}" in message
    assert "tensor([[" not in message  # the structure, not the tensor's contents


@pytest.fixture(scope="module")
def attend():
    torch.manual_seed(0)
    model = Attend().eval()
    h = torch.randn(2, 3, 8)
    return model, h, gs.export(model, (h,))


def test_a_replacement_whose_forward_cannot_take_the_call_is_refused_at_swap(attend):
    _model, _h, ep = attend

    with pytest.raises(gs.errors.ReplacementError) as caught:
        gs.swap(ep, {"attn": OneArgument()})
    message = str(caught.value)
    assert "attn(query: f32[2, 3, 8], key: f32[2, 3, 8], value: f32[2, 3, 8]" in message
    assert "need_weights=False" in message and "forward(x)" in message


def test_a_replacement_without_super_init_says_so(attend):
    _model, _h, ep = attend

    with pytest.raises(gs.errors.ReplacementError, match=r"does not call super\(\).__init__"):
        gs.swap(ep, {"attn": NoInit()})


@pytest.mark.parametrize(
    ("make", "got"),
    [
        (lambda q: q[..., :4], r"f32\[2, 3, 4\]"),
        (lambda q: q.double(), r"f64\[2, 3, 8\]"),
        (lambda q: q.to("meta"), r"f32\[2, 3, 8\] on the meta device"),
    ],
    ids=["shape", "dtype", "meta device"],
)
def test_a_wrong_output_is_reported_at_the_call_by_name(attend, make, got):
    _model, h, ep = attend

    class Wrong(nn.Module):
        def forward(self, q, k, v, need_weights=True):
            return make(q), None

    gm = gs.swap(ep, {"attn": Wrong()})
    with pytest.raises(
        gs.errors.ReplacementError,
        match=rf"'attn' \(Wrong\) returned {got} for output \[0\], the program expects "
        r"f32\[2, 3, 8\]",
    ):
        gm(h)


def test_self_attention_with_one_value_in_three_arguments_swaps_and_compares(attend):
    model, h, ep = attend
    replacement = copy.deepcopy(model.attn)
    with torch.no_grad():
        replacement.out_proj.weight.mul_(0.5)
    gm = gs.swap(ep, {"attn": replacement})
    reference = copy.deepcopy(model)
    reference.attn = replacement
    with torch.no_grad():
        assert not torch.allclose(reference(h), model(h))  # precondition: the swap shows
        torch.testing.assert_close(gm(h), reference(h))
    comparison = gs.compare(ep, gm, (h,))
    assert [call.call_name for call in comparison.calls] == ["attn"]
    assert comparison.first_divergence == "attn"
    same = gs.compare(ep, gs.swap(ep, {"attn": copy.deepcopy(model.attn)}), (h,))
    assert same.first_divergence is None


def test_a_wrong_dynamic_size_is_reported_at_the_call_with_the_size_expected():
    torch.manual_seed(0)
    model, x = ResidualLinear().eval(), torch.randn(2, 6, 8)
    tokens = torch.export.Dim("tokens", min=2, max=32)
    ep = gs.export(model, (x,), dynamic_shapes=({1: tokens},))
    gm = gs.swap(ep, {"attn": OneTokenFewer()})
    for length in (6, 11):  # the size expected is the one this run has, not the export's
        with pytest.raises(
            gs.errors.ReplacementError,
            match=rf"'attn' \(OneTokenFewer\) returned f32\[2, {length - 1}, 8\] for its output, "
            rf"the program expects f32\[2, {length}, 8\]",
        ):
            gm(torch.randn(2, length, 8))
    right = gs.swap(ep, {"attn": nn.Tanh()})
    y = torch.randn(2, 11, 8)
    torch.testing.assert_close(right(y), torch.tanh(y) + y)


def test_a_replacement_that_is_no_module_is_named_with_its_type(attend):
    _model, _h, ep = attend
    with pytest.raises(gs.errors.ReplacementError, match=r"'attn' is an int, not a torch.nn"):
        gs.swap(ep, {"attn": 3})


def test_eager_reference_checks_the_model_names_and_replacements(attend):
    model, _h, _ep = attend

    with pytest.raises(gs.errors.VerifyError, match=r"does not call super\(\).__init__"):
        eager_reference(model, {"attn": NoInitNoForward()})
    with pytest.raises(gs.errors.VerifyError, match=r"no submodule 'atn'.*'attn'"):
        eager_reference(model, {"atn": nn.Identity()})
    with pytest.raises(gs.errors.VerifyError, match=r"is an int, not a torch.nn.Module"):
        eager_reference(3, {})


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda gm, x: gm(x, x), "too many positional arguments"),
        (lambda gm, x: gm(), "missing a required argument: 'h'"),
        (lambda gm, x: gm(x, other=x), "unexpected keyword argument 'other'"),
    ],
    ids=["one too many", "none", "unknown keyword"],
)
def test_a_call_with_arguments_the_forward_cannot_take_is_a_structure_error(attend, call, why):
    _model, h, ep = attend
    for program in (gs.swap(ep, {}), gs.fuse(ep, "fc"), gs.swap(ep, {}, interpret=True)):
        with pytest.raises(gs.InputStructureError, match=rf"forward\(h\).*{why}"):
            call(program, h)


def test_a_type_error_inside_the_program_is_not_taken_for_a_wrong_call(attend):
    _model, h, ep = attend

    with pytest.raises(TypeError, match="the replacement's own error") as caught:
        gs.swap(ep, {"attn": RaisesTypeError()})(h)
    assert not isinstance(caught.value, gs.InputStructureError)
