"""verify(): output by output, pytree-aware, never raising on a mismatch."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import graphsurgeon as gs


class Returns(nn.Module):
    """Returns whatever ``make(x)`` builds: a way to get any output structure."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def forward(self, x):
        return self.make(x)


def test_equal_programs_match_and_the_report_is_truthy():
    x = torch.randn(3)
    report = gs.verify(
        Returns(lambda x: {"a": x * 2, "n": 3}), Returns(lambda x: {"a": x * 2, "n": 3}), (x,)
    )
    assert report and report.ok and len(report.leaves) == 2 and not report.mismatches
    assert "match" in str(report)


def test_a_mismatch_names_the_leaf_and_its_error():
    x = torch.ones(4)
    reference = Returns(lambda x: (x, {"logits": x * 2}))
    candidate = Returns(lambda x: (x, {"logits": x * 2 + 0.5}))
    report = gs.verify(reference, candidate, (x,))
    assert not report
    (bad,) = report.mismatches
    assert bad.path == "[1]['logits']"
    assert math.isclose(bad.max_abs, 0.5) and math.isclose(bad.max_rel, 0.25)
    assert "BAD [1]['logits']" in str(report)


def test_shape_dtype_and_structure_mismatches_are_reported_not_raised():
    x = torch.ones(2, 3)
    shape = gs.verify(Returns(lambda x: x), Returns(lambda x: x.T), (x,))
    assert not shape and "shape [3, 2]" in shape.mismatches[0].problem
    dtype = gs.verify(Returns(lambda x: x), Returns(lambda x: x.double()), (x,))
    assert not dtype and "dtype" in dtype.mismatches[0].problem
    structure = gs.verify(Returns(lambda x: (x, x)), Returns(lambda x: [x, x]), (x,))
    assert not structure and "[*, *]" in structure.structure_problem


def test_non_tensor_leaves_compare_by_equality():
    x = torch.ones(2)
    assert gs.verify(Returns(lambda x: (x, "a", 3)), Returns(lambda x: (x, "a", 3)), (x,))
    report = gs.verify(Returns(lambda x: (x, 3)), Returns(lambda x: (x, 4)), (x,))
    assert not report and "4 vs expected 3" in report.mismatches[0].problem


def test_nan_matches_nan_but_not_a_number():
    x = torch.tensor([1.0, float("nan")])
    assert gs.verify(Returns(lambda x: x), Returns(lambda x: x.clone()), (x,))
    assert not gs.verify(Returns(lambda x: x), Returns(lambda x: torch.nan_to_num(x)), (x,))


def test_tolerances_are_honoured():
    x = torch.ones(3)
    reference, candidate = Returns(lambda x: x), Returns(lambda x: x + 1e-3)
    assert not gs.verify(reference, candidate, (x,))
    assert gs.verify(reference, candidate, (x,), atol=2e-3)
    assert gs.verify(reference, candidate, (x,), rtol=2e-3, atol=0)


def test_programs_of_every_kind_can_be_compared():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    ep = gs.export(model, (x,))
    gm = gs.swap(ep, {})
    assert gs.verify(model, ep, (x,)) and gs.verify(ep, gm, (x,))


def test_a_program_that_fails_to_run_raises_verify_error_naming_it():
    x = torch.ones(3)

    def boom(x):
        raise RuntimeError("kaput")

    with pytest.raises(gs.errors.VerifyError, match=r"candidate.*kaput"):
        gs.verify(Returns(lambda x: x), Returns(boom), (x,))


class WritesInput(nn.Module):
    def forward(self, x):
        x.mul_(10)
        return x


def test_each_program_gets_its_own_copy_of_the_inputs():
    x = torch.ones(3)
    assert gs.verify(WritesInput(), WritesInput(), (x,))
    torch.testing.assert_close(x, torch.ones(3))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    values=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=8),
    noise=st.floats(0, 1e-2),
)
def test_the_verdict_agrees_with_torch_isclose(values, noise):
    a = torch.tensor(values, dtype=torch.float64)
    b = a + noise
    report = gs.verify(
        Returns(lambda x: a), Returns(lambda x: b), (torch.zeros(1),), rtol=1e-5, atol=1e-5
    )
    assert bool(report) == bool(torch.isclose(b, a, rtol=1e-5, atol=1e-5).all())
    assert math.isclose(report.max_abs, float((b - a).abs().max()), rel_tol=1e-9, abs_tol=1e-12)


def test_complex_outputs_compare_both_parts():
    z = torch.tensor([1 + 1j, 2 - 1j])
    assert gs.verify(Returns(lambda x: z), Returns(lambda x: z.clone()), (torch.zeros(1),))
    report = gs.verify(Returns(lambda x: z), Returns(lambda x: z.conj()), (torch.zeros(1),))
    assert not report and math.isclose(report.max_abs, 2.0)


def test_integer_and_bool_outputs_compare_exactly():
    ids = torch.tensor([1, 2, 3])
    assert gs.verify(Returns(lambda x: ids), Returns(lambda x: ids.clone()), (torch.zeros(1),))
    assert not gs.verify(Returns(lambda x: ids), Returns(lambda x: ids + 1), (torch.zeros(1),))
    mask = torch.tensor([True, False])
    assert not gs.verify(Returns(lambda x: mask), Returns(lambda x: ~mask), (torch.zeros(1),))
