"""verify(): output by output, pytree-aware, never raising on a mismatch."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys

import pytest
import torch
from helpers.check_models import (
    Count,
    Dropping,
    Ema,
    Louder,
    Normalize,
    Rebuilds,
    Returns,
    ReturnsValue,
    UsesCache,
    WritesInput,
)
from helpers.grad_models import BUGS, FusedRMSNorm, NormStack, RMSNorm, fused_norms, hf_norm
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks._grad import seeded_upstream
from graphsurgeon.checks.verify import compare_leaf, eager_reference
from graphsurgeon.errors import VerifyError


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


# --- integers and bools: exact, never through float64, whatever the tolerances ---------------


def constant(value):
    """A program that returns ``value`` whatever its input."""
    return Returns(lambda x: value)


ZERO = (torch.zeros(1),)


def test_token_ids_one_apart_mismatch_at_the_default_tolerances():
    ids, off = torch.tensor([100000]), torch.tensor([100001])
    # precondition: within the default tolerance as floats (1e-5 * 100000 == 1)
    assert torch.isclose(off.double(), ids.double(), rtol=1e-5, atol=1e-5).all()
    report = gs.verify(constant(ids), constant(off), ZERO)
    assert not report
    assert report.leaves[0].problem == "integers differ at 1 of 1 positions (largest difference 1)"
    assert report.leaves[0].max_abs == 1.0


@pytest.mark.parametrize(("rtol", "atol"), [(1e-5, 1e-5), (0.0, 0.0), (1.0, 10.0)])
def test_int64_beyond_2_to_the_53_differ_whatever_the_tolerances(rtol, atol):
    big, next_ = torch.tensor([2**53, 7]), torch.tensor([2**53 + 1, 7])
    assert torch.equal(big.double(), next_.double())  # precondition: float64 cannot tell them apart
    report = gs.verify(constant(big), constant(next_), ZERO, rtol=rtol, atol=atol)
    assert not report and "integers differ at 1 of 2 positions" in report.leaves[0].problem


@pytest.mark.parametrize(("rtol", "atol"), [(1e-5, 1e-5), (0.0, 0.0)])
def test_python_ints_beyond_2_to_the_53_differ(rtol, atol):
    assert float(2**53) == float(2**53 + 1)  # precondition
    report = gs.verify(constant(2**53), constant(2**53 + 1), ZERO, rtol=rtol, atol=atol)
    assert not report and report.leaves[0].max_abs == 1.0
    assert not gs.verify(constant(True), constant(1), ZERO)  # a bool is not an int


def test_the_largest_integer_difference_is_exact_past_int64():
    low, high = torch.tensor([-(2**63), 5]), torch.tensor([2**63 - 1, 5])
    leaf = gs.verify(constant(low), constant(high), ZERO).leaves[0]
    assert not leaf.ok and f"largest difference {2**64 - 1}" in leaf.problem
    top = torch.tensor([2**64 - 1, 3], dtype=torch.uint64)
    bottom = torch.tensor([0, 3], dtype=torch.uint64)
    leaf = gs.verify(constant(top), constant(bottom), ZERO).leaves[0]
    assert not leaf.ok and f"largest difference {2**64 - 1}" in leaf.problem
    assert gs.verify(constant(top), constant(top.clone()), ZERO)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    pairs=st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)),
        min_size=1,
        max_size=6,
    ),
    same=st.booleans(),
)
def test_integer_verdict_and_gap_are_exact(pairs, same):
    a = torch.tensor([p for p, _ in pairs], dtype=torch.int64)
    b = a.clone() if same else torch.tensor([q for _, q in pairs], dtype=torch.int64)
    leaf = gs.verify(constant(a), constant(b), ZERO, rtol=1.0, atol=1.0).leaves[0]
    gaps = [abs(p - q) for p, q in zip(a.tolist(), b.tolist())]
    assert leaf.ok == (max(gaps) == 0)
    if not leaf.ok:
        assert f"largest difference {max(gaps)}" in leaf.problem
        assert f"at {sum(g > 0 for g in gaps)} of {len(gaps)} positions" in leaf.problem


def test_bool_masks_report_how_many_positions_differ():
    mask = torch.tensor([True, False, True])
    flipped = mask.clone()
    flipped[1] = True
    leaf = gs.verify(constant(mask), constant(flipped), ZERO, rtol=1, atol=1).leaves[0]
    assert not leaf.ok and leaf.problem.startswith("bools differ at 1 of 3 positions")


# --- devices -------------------------------------------------------------------------------


def test_meta_outputs_against_cpu_are_a_mismatch_that_says_so():
    x = torch.randn(2, 3)
    report = gs.verify(Returns(lambda x: x * 2), Returns(lambda x: (x * 2).to("meta")), (x,))
    assert not report
    assert report.leaves[0].problem == "device meta vs expected cpu"
    assert "MISMATCH" in str(report) and "device meta vs expected cpu" in str(report)
    backwards = gs.verify(Returns(lambda x: x.to("meta")), Returns(lambda x: x), (x,))
    assert not backwards and backwards.leaves[0].problem == "device cpu vs expected meta"


def test_meta_against_meta_compares_shape_and_dtype_and_says_values_were_not():
    def meta(shape, dtype=torch.float32):
        return constant(torch.empty(shape, dtype=dtype, device="meta"))

    report = gs.verify(meta((2, 3)), meta((2, 3)), ZERO)
    assert report and "values not compared" in report.leaves[0].problem
    assert "values not compared" in str(report)
    assert math.isnan(report.max_abs)  # no error was measured: not 0
    assert not gs.verify(meta((2, 3)), meta((3, 2)), ZERO)
    assert not gs.verify(meta((2, 3)), meta((2, 3), torch.float64), ZERO)


def test_the_report_max_abs_does_not_depend_on_the_order_of_the_leaves():
    ones = torch.ones(2)
    first = gs.verify(constant((ones, ones)), constant((ones + 1, ones[:1])), ZERO)
    second = gs.verify(constant((ones, ones)), constant((ones[:1], ones + 1)), ZERO)
    assert math.isnan(first.max_abs) and math.isnan(second.max_abs)


# --- other leaves ----------------------------------------------------------------------------


def test_python_float_nan_matches_nan_and_floats_use_the_tolerances():
    nan = float("nan")
    assert gs.verify(constant((nan, 1.0)), constant((nan, 1.0)), ZERO)
    assert not gs.verify(constant(nan), constant(1.0), ZERO)
    assert not gs.verify(constant(1.0), constant(nan), ZERO)
    assert gs.verify(constant(1.0), constant(1.0 + 1e-9), ZERO)
    assert not gs.verify(constant(1.0), constant(1.1), ZERO)
    assert gs.verify(constant(math.inf), constant(math.inf), ZERO)
    assert not gs.verify(constant(math.inf), constant(-math.inf), ZERO)
    assert gs.verify(constant(complex(nan, 1)), constant(complex(nan, 1)), ZERO)
    assert not gs.verify(constant(1 + 1j), constant(1 - 1j), ZERO)


def test_numpy_arrays_compare_by_dtype_shape_and_values():
    np = pytest.importorskip("numpy")
    a = np.array([[1.0, np.nan], [3.0, 4.0]], dtype=np.float32)
    assert gs.verify(constant(a), constant(a.copy()), ZERO)
    assert gs.verify(constant(a), constant(a + np.float32(1e-7)), ZERO)
    assert not gs.verify(constant(a), constant(a + 1), ZERO)
    assert "dtype float64 vs expected float32" in (
        gs.verify(constant(a), constant(a.astype(np.float64)), ZERO).leaves[0].problem
    )
    assert "shape" in gs.verify(constant(a), constant(a.T.copy()[:1]), ZERO).leaves[0].problem
    ids = np.array([2**53, 100000], dtype=np.int64)
    leaf = gs.verify(constant(ids), constant(ids + np.int64(1)), ZERO).leaves[0]
    assert not leaf.ok and "integers differ at 2 of 2 positions" in leaf.problem
    assert gs.verify(constant(np.array(["a", "b"])), constant(np.array(["a", "b"])), ZERO)
    assert not gs.verify(constant(np.array(["a", "b"])), constant(np.array(["a", "c"])), ZERO)
    swapped_bytes = a.astype(a.dtype.newbyteorder(">"))
    assert gs.verify(constant(swapped_bytes), constant(swapped_bytes.copy()), ZERO)
    assert not gs.verify(constant(a), constant(torch.from_numpy(a)), ZERO)


# torch warns that these tensor kinds are beta, deprecated or a prototype: the user's to see.
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_tensors_compare_by_their_values_and_layout(layout):
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])

    def make(t):
        return t.to_sparse() if layout == "coo" else t.to_sparse_csr()

    assert gs.verify(constant(make(dense)), constant(make(dense.clone())), ZERO)
    assert not gs.verify(constant(make(dense)), constant(make(dense * 2)), ZERO)
    other_layout = gs.verify(constant(make(dense)), constant(dense), ZERO)
    assert not other_layout and "layout torch.strided vs expected" in other_layout.leaves[0].problem
    ids = torch.tensor([[0, 2**53], [1, 0]])
    assert not gs.verify(constant(make(ids)), constant(make(ids + ids.bool())), ZERO)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_quantized_tensors_compare_dequantized():
    x = torch.tensor([0.0, 0.5, 1.0])
    quantized = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
    assert gs.verify(constant(quantized), constant(quantized.clone()), ZERO)
    other = torch.quantize_per_tensor(x + 0.2, 0.1, 0, torch.quint8)
    assert not gs.verify(constant(quantized), constant(other), ZERO)


def test_strings_none_and_lists_as_leaves_compare_without_raising():
    assert gs.verify(constant(("a", None)), constant(("a", None)), ZERO)
    assert not gs.verify(constant("a"), constant("b"), ZERO)
    assert not gs.verify(constant(None), constant(0), ZERO)
    nested = [1, [torch.ones(2), {"k": 2.0}]]
    same = [1, [torch.ones(2), {"k": 2.0}]]
    assert compare_leaf("x", nested, same).ok  # a leaf that is itself a list
    off = compare_leaf("x", nested, [1, [torch.ones(2) * 2, {"k": 2.0}]])
    assert not off.ok and "x[1][0]" in off.problem
    shape = compare_leaf("x", nested, [1, [torch.ones(2)]])
    assert not shape.ok


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
def test_nested_tensors_compare_part_by_part():
    parts = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    nested = torch.nested.nested_tensor(parts)
    assert gs.verify(constant(nested), constant(torch.nested.nested_tensor(parts)), ZERO)
    moved = torch.nested.nested_tensor([parts[0], parts[1] + 1])
    leaf = gs.verify(constant(nested), constant(moved), ZERO).leaves[0]
    assert not leaf.ok and leaf.problem.startswith("<1>: values differ")
    fewer = gs.verify(constant(nested), constant(torch.nested.nested_tensor(parts[:1])), ZERO)
    assert not fewer and "of 1 parts vs expected 2" in fewer.leaves[0].problem
    assert not gs.verify(constant(nested), constant(parts[0]), ZERO)


class Opaque:
    """A value verify was never taught: its == returns an array, as numpy's does."""

    def __eq__(self, other):
        return [True, False]

    __hash__ = object.__hash__


class Explodes:
    def __eq__(self, other):
        raise RuntimeError("no comparing me")

    __hash__ = object.__hash__


@pytest.mark.parametrize("value", [Opaque(), Explodes()])
def test_a_leaf_it_cannot_compare_is_a_mismatch_not_an_exception(value):
    report = gs.verify(constant(value), constant(value), ZERO)
    assert not report
    assert report.leaves[0].problem.startswith(f"cannot compare {type(value).__name__}")


def test_a_tensor_against_a_non_tensor_is_a_mismatch():
    report = gs.verify(constant(torch.ones(1)), constant(1.0), ZERO)
    assert not report and report.leaves[0].problem == "float vs expected Tensor"


# --- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rtol", "atol"])
@pytest.mark.parametrize(
    ("value", "said"),
    [
        (-1, "=-1: expected a finite number >= 0"),
        ("1e-3", "='1e-3': expected a finite number >= 0 such as {name}=1e-5, got a str"),
        (None, "=None: expected a finite number >= 0 such as {name}=1e-5, got None"),
        (float("nan"), "=nan: expected a finite number >= 0"),
        (float("inf"), "=inf: expected a finite number >= 0"),
        (True, "=True: expected a finite number >= 0 such as {name}=1e-5, got a bool"),
        (torch.tensor(1e-3), "got a Tensor"),
    ],
)
def test_bad_tolerances_raise_verify_error_naming_the_argument(name, value, said):
    ran = []
    model = Returns(lambda x: ran.append(1) or x)
    with pytest.raises(gs.errors.VerifyError) as caught:
        gs.verify(model, model, ZERO, **{name: value})
    assert str(caught.value).startswith(name) and said.format(name=name) in str(caught.value)
    assert not ran  # refused before running anything
    with pytest.raises(gs.errors.VerifyError, match=f"^{name}="):
        compare_leaf("", torch.ones(1), torch.ones(1), **{name: value})


def test_good_tolerances_of_every_numeric_type_are_accepted():
    np = pytest.importorskip("numpy")
    x = torch.ones(2)
    for value in (0, 1, 1e-3, np.float32(1e-3), np.float64(0.0)):
        assert gs.verify(Returns(lambda x: x), Returns(lambda x: x), (x,), rtol=value, atol=value)


def test_args_that_are_not_a_tuple_are_one_argument_and_kwargs_must_be_a_mapping():
    x = torch.ones(2)
    assert gs.verify(Returns(lambda x: x), Returns(lambda x: x), x)
    # kwargs are refused as by every entry point (graphsurgeon._program.as_inputs)
    with pytest.raises(gs.InputStructureError, match=r"kwargs: expected a mapping.*got a list"):
        gs.verify(Returns(lambda x: x), Returns(lambda x: x), (x,), [x])


# --- nothing is mutated ------------------------------------------------------------------------


def _state(tensors):
    return {name: t.detach().clone() for name, t in tensors.items()}


def _same(before, after):
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.fixture
def train_mode_program():
    torch.manual_seed(0)
    model = Normalize().train()
    x = torch.randn(4, 3) * 3 + 1
    ep = gs.export(model, (x,))
    # precondition: running the model in train mode moves its running statistics
    probe = Normalize().train()
    probe.load_state_dict(model.state_dict())
    before = _state(probe.state_dict())
    with torch.no_grad():
        probe(x)
    assert not _same(before, _state(probe.state_dict()))
    return model, ep, x


def test_verify_leaves_the_program_and_the_model_unchanged(train_mode_program):
    model, ep, x = train_mode_program
    program_before, model_before = _state(ep.state_dict), _state(model.state_dict())
    gs.verify(ep, model, (x,))
    assert _same(program_before, _state(ep.state_dict))
    assert _same(model_before, _state(model.state_dict()))
    assert model.training


def test_verify_leaves_a_train_mode_program_unchanged(train_mode_program):
    model, ep, x = train_mode_program
    before = _state(ep.state_dict)
    gs.verify(ep, copy.deepcopy(model), (x,))  # a copy: ep's tensors are the model's own
    assert _same(before, _state(ep.state_dict))


def test_verify_leaves_a_train_mode_eager_model_unchanged(train_mode_program):
    model, _, x = train_mode_program
    before = _state(model.state_dict())
    gs.verify(copy.deepcopy(model), model, (x,))  # no program involved
    assert _same(before, _state(model.state_dict()))


def test_the_relative_error_against_an_expected_zero_is_infinite_not_a_huge_number():
    x = torch.zeros(1)
    for expected, got in (
        (torch.tensor([False, True]), torch.tensor([True, True])),
        (torch.tensor([0, 5]), torch.tensor([1, 5])),
        (torch.tensor([0.0, 1.0]), torch.tensor([1e-3, 1.0])),
    ):
        (leaf,) = gs.verify(ReturnsValue(expected), ReturnsValue(got), (x,)).leaves
        assert not leaf.ok and leaf.max_rel == math.inf and 0 < leaf.max_abs < math.inf
    (leaf,) = gs.verify(
        ReturnsValue(torch.tensor([2.0])), ReturnsValue(torch.tensor([2.5])), (x,)
    ).leaves
    assert leaf.max_rel == pytest.approx(0.25)


# --- verify never changes the model, and compares what was returned -------------------------


def _buffers_as_they_are(model: nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    return {name: (id(b), b.detach().clone()) for name, b in model.named_buffers()}


@pytest.mark.parametrize("make", [Ema, Rebuilds], ids=["reassigned", "added-deleted-shadowed"])
def test_verify_leaves_a_model_whose_forward_changes_its_buffers_exactly_as_it_was(make):
    x = torch.randn(4, 3)
    probe = make()
    before = _buffers_as_they_are(probe)
    with torch.no_grad():
        probe(x)
    assert _buffers_as_they_are(probe).keys() != before.keys() or any(
        id_ != before[name][0] for name, (id_, _) in _buffers_as_they_are(probe).items()
    )  # precondition: a plain run changes which tensors the model holds
    model = make()
    before = _buffers_as_they_are(model)
    persistent = set(model.state_dict())
    attributes = {k for k, v in vars(model).items() if isinstance(v, torch.Tensor)}
    assert gs.verify(model, copy.deepcopy(model), (x,))
    after = _buffers_as_they_are(model)
    assert after.keys() == before.keys()
    for name, (id_, value) in before.items():
        assert after[name][0] == id_ and torch.equal(after[name][1], value), name
    assert set(model.state_dict()) == persistent
    assert {k for k, v in vars(model).items() if isinstance(v, torch.Tensor)} == attributes


def test_an_output_that_is_a_buffer_the_run_writes_is_compared_as_it_was_returned():
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert Count()(x).item() == 1.0  # precondition: the counter returns 1.0, not 0.0
    report = gs.verify(Count(), constant(torch.zeros(())), (x,))
    assert not report and math.isclose(report.leaves[0].max_abs, 1.0)
    assert gs.verify(Count(), Count(), (x,))
    model = Count()
    gs.verify(model, Count(), (x,))
    assert model.n.item() == 0.0  # and the model's counter is put back


def test_a_kv_cache_output_of_a_wrong_swap_is_a_mismatch_for_the_program_and_the_surgery():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep = gs.export(UsesCache().eval(), (x,))
    louder = Louder()
    with torch.no_grad():  # precondition: the programs' outputs really differ
        assert not torch.allclose(gs.swap(ep, {})(x), gs.swap(ep, {"proj": louder})(x))
    gm = gs.swap(ep, {"proj": louder})
    report = gs.verify(ep, gm, (x,))
    assert not report and report.leaves[0].problem.startswith("values differ beyond tolerance")
    assert not gs.Surgery(ep, args=(x,)).swap("proj", Louder()).verify()
    assert gs.verify(ep, gs.swap(ep, {}), (x,))  # the program against itself still matches


# --- complex NaN, random ops, dicts, dataclasses ------------------------------------------------


NAN = float("nan")


@pytest.mark.parametrize(
    ("expected", "actual", "ok"),
    [
        (complex(NAN, 1), complex(5, NAN), False),  # NaN in another component
        (complex(NAN, 1), complex(NAN, 2), False),  # same NaN, the other components differ
        (complex(NAN, 1), complex(NAN, 1), True),
        (complex(1, NAN), complex(1 + 1e-9, NAN), True),  # within tolerance
        (complex(NAN, NAN), complex(NAN, NAN), True),
        (complex(NAN, NAN), complex(NAN, 1), False),
    ],
)
def test_complex_nan_compares_component_by_component(expected, actual, ok):
    a, b = torch.tensor([expected, 2 + 2j]), torch.tensor([actual, 2 + 2j])
    assert torch.isnan(a[0]) and torch.isnan(b[0])  # precondition: torch calls both NaN
    assert bool(gs.verify(constant(a), constant(b), ZERO)) is ok
    assert bool(gs.verify(constant(expected), constant(actual), ZERO)) is ok  # Python numbers


def test_complex_values_without_nan_keep_the_modulus_rule():
    a = torch.tensor([3 + 4j, 1 + 0j])
    b = a + torch.tensor([3e-5j, 0])  # 3e-5 apart: beyond 1e-5 + 1e-5 * 1, within * |5|
    assert gs.verify(constant(a), constant(b), ZERO, rtol=1e-5, atol=0)
    assert not gs.verify(constant(a[1:]), constant(a[1:] + 3e-5j), ZERO, rtol=1e-5, atol=0)


def test_a_faithful_swap_of_a_train_mode_model_with_dropout_matches():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    model = Dropping().train()
    ep = gs.export(model, (x,))
    with torch.no_grad():  # precondition: two runs draw different masks
        assert not torch.equal(model(x), model(x))
    swapped = gs.swap(ep, {"o": copy.deepcopy(model.o)})
    reference = eager_reference(model, {"o": copy.deepcopy(model.o)})
    state = torch.random.get_rng_state()
    report = gs.verify(reference, swapped, (x,))
    assert report and report.max_abs == 0.0
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream is untouched
    assert not gs.verify(reference, gs.swap(ep, {"o": Louder()}), (x,))


def test_dict_outputs_compare_key_by_key_in_any_order():
    x = torch.ones(2)
    ab = Returns(lambda x: {"a": x + 1, "b": [x * 2, {"c": x, "d": 1}]})
    ba = Returns(lambda x: {"b": [x * 2, {"d": 1, "c": x}], "a": x + 1})
    report = gs.verify(ab, ba, (x,))
    assert report and [leaf.path for leaf in report.leaves] == [
        "['a']",
        "['b'][0]",
        "['b'][1]['c']",
        "['b'][1]['d']",
    ]
    off = gs.verify(ab, Returns(lambda x: {"b": [x * 3, {"d": 1, "c": x}], "a": x + 1}), (x,))
    assert not off and [leaf.path for leaf in off.mismatches] == ["['b'][0]"]
    other_keys = gs.verify(ab, Returns(lambda x: {"a": x + 1, "z": x}), (x,))
    assert not other_keys and other_keys.structure_problem
    assert compare_leaf("", {"a": 1, "b": 2}, {"b": 2, "a": 1}).ok  # a dict leaf, directly


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    loss: float | None = None
    cache: list = dataclasses.field(default_factory=list)
    note: str = dataclasses.field(default="", compare=False)


def test_unregistered_dataclass_outputs_compare_field_by_field():
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError):  # precondition: its own == cannot compare tensors
        bool(Output(x * 2) == Output(x * 2))
    make = Returns(lambda x: Output(x * 2, 0.5, [x], note="a"))
    assert gs.verify(make, Returns(lambda x: Output(x * 2, 0.5, [x], note="b")), (x,))
    off = gs.verify(make, Returns(lambda x: Output(x * 2 + 1, 0.5, [x])), (x,))
    assert not off and off.leaves[0].problem.startswith(".logits: values differ")
    loss = gs.verify(make, Returns(lambda x: Output(x * 2, 0.7, [x])), (x,))
    assert not loss and ".loss" in loss.leaves[0].problem
    other = gs.verify(make, Returns(lambda x: (x * 2,)), (x,))
    assert not other


def test_where_no_values_were_compared_the_report_says_so_and_prints_no_nan():
    meta = constant(torch.empty(2, 3, device="meta"))
    report = gs.verify(meta, meta, ZERO)
    assert report and not report.values_compared
    assert "no values compared" in str(report) and "max abs nan" not in str(report)
    assert "no values compared" in report._repr_html_() and ">nan<" not in report._repr_html_()
    shape = gs.verify(constant(torch.ones(2)), constant(torch.ones(3)), ZERO)
    assert "no values compared" in str(shape) and "nan" not in str(shape)
    nan_apart = gs.verify(constant(torch.tensor([NAN])), constant(torch.tensor([1.0])), ZERO)
    assert nan_apart.values_compared and "NaN in different places" in str(nan_apart)


# --- memory: compared block by block, with the results of one pass ------------------------------


def _pair(draw_seed: int, dtype: torch.dtype, shape: tuple[int, ...]):
    generator = torch.Generator().manual_seed(draw_seed)
    if dtype.is_floating_point or dtype.is_complex:
        a = torch.randn(shape, generator=generator, dtype=dtype)
        b = a + 1e-5 * torch.randn(shape, generator=generator, dtype=dtype)
        flat_a, flat_b = a.view(-1), b.view(-1)
        special = torch.randint(0, a.numel(), (3,), generator=generator)
        flat_a[special[0]] = flat_b[special[0]] = NAN
        flat_a[special[1]] = flat_b[special[1]] = math.inf
        flat_b[special[2]] += 1  # one value clearly beyond the tolerance
        return a, b
    a = torch.randint(-100, 100, shape, generator=generator).to(dtype)
    b = a.clone()
    b.view(-1)[torch.randint(0, a.numel(), (4,), generator=generator)] += 1
    return a, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.int32])
@pytest.mark.parametrize("transposed", [False, True])
def test_comparing_in_small_blocks_gives_the_results_of_one_pass(monkeypatch, dtype, transposed):
    verify_module = sys.modules["graphsurgeon.checks._leaves"]  # where the blocks are cut
    for seed in range(5):
        a, b = _pair(seed, dtype, (7, 13, 5))
        if transposed:  # strided differently on each side: the blocks must still agree
            a, b = a.transpose(0, 2), b.transpose(0, 2).contiguous()
        whole = compare_leaf("", a, b)
        monkeypatch.setattr(verify_module, "_BLOCK", 6)  # about 80 blocks, some mid-row
        assert compare_leaf("", a, b) == whole
        monkeypatch.undo()
        assert not whole.ok  # precondition: something to find in some block


# --- the worst error relative to the tolerance ----------------------------------------------------


def test_an_ok_beside_a_large_max_rel_explains_itself_by_the_tolerance():
    # a value near 0 carries a large relative error that atol covers: allclose says ok
    expected = torch.tensor([1e-3, 0.5, 2.0])
    actual = expected + torch.tensor([5.23e-6, 1e-6, -4e-6])
    report = gs.verify(constant(expected), constant(actual), ZERO)
    (leaf,) = report.leaves
    assert report and leaf.max_rel > 100 * report.rtol, "precondition: max rel far above rtol"
    by_hand = (
        (actual.double() - expected.double()).abs() / (1e-5 + 1e-5 * expected.double().abs())
    ).max()
    assert math.isclose(leaf.tolerance_ratio, float(by_hand), rel_tol=1e-9)
    assert 0.4 < leaf.tolerance_ratio < 0.6
    assert f"{leaf.tolerance_ratio:.2g}x of tolerance" in str(report)
    html = report._repr_html_()
    assert "of tolerance" in html and f"{leaf.tolerance_ratio:.2g}x" in html
    bad = gs.verify(constant(expected), constant(expected + 1e-3), ZERO)
    assert not bad and bad.leaves[0].tolerance_ratio > 1
    assert "x of tolerance" in str(bad)


def test_the_tolerance_ratio_is_never_nan():
    zeros = torch.zeros(3)
    exact = compare_leaf("", zeros, zeros.clone(), rtol=1e-5, atol=0)
    assert exact.ok and exact.tolerance_ratio == 0.0, "0 / 0 is no error"
    off = compare_leaf("", zeros, zeros + 1e-9, rtol=1e-5, atol=0)
    assert not off.ok and off.tolerance_ratio == math.inf, "no tolerance at an expected 0"
    ints = compare_leaf("", torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert (
        not ints.ok
        and ints.tolerance_ratio == math.inf
        and "inf of tolerance"
        in str(gs.verify(constant(torch.tensor([1, 2])), constant(torch.tensor([1, 3])), ZERO))
    )
    assert compare_leaf("", torch.tensor([1, 2]), torch.tensor([1, 2])).tolerance_ratio == 0.0
    number = compare_leaf("", 2.0, 2.00001)
    assert number.ok and math.isclose(number.tolerance_ratio, 1e-5 / (1e-5 + 2e-5), rel_tol=1e-6)
    nan_apart = compare_leaf("", torch.tensor([NAN, 1.0]), torch.tensor([1.0, 1.0]))
    assert nan_apart.tolerance_ratio == math.inf
    meta = gs.verify(
        constant(torch.empty(2, device="meta")), constant(torch.empty(2, device="meta")), ZERO
    )
    assert meta.leaves[0].tolerance_ratio == 0.0 and "of tolerance" not in str(meta)


# --- the shape of a mismatch ----------------------------------------------------------------------


def test_a_mismatch_is_broken_down_by_axis():
    a = torch.randn(1, 12, 64)
    b = a.clone()
    b[:, :11] += 0.1  # what a forgotten causal mask does: every token but the last is off
    report = gs.verify(constant(a), constant(b), ZERO)
    (leaf,) = report.leaves
    assert leaf.differing == ((range(0, 1),), (range(0, 11),), (range(0, 64),))
    assert leaf.by_axis == "dim 1: 0–10 differ, 11 matches"
    assert (
        "values differ beyond tolerance at 704 of 768 positions; dim 1: 0–10 differ, 11 matches"
        in str(report)
    )
    assert "dim 1: 0–10 differ, 11 matches" in report._repr_html_()
    columns = b.clone()
    columns[:] = a
    columns[..., 5] += 1
    columns[..., 40:43] += 1
    assert compare_leaf("", a, columns).by_axis == "dim 2: 5, 40–42 differ, 0–4, 6–39, 43–63 match"
    everywhere = compare_leaf("", a, a + 1)
    assert everywhere.by_axis == "spread over every index of every dimension"
    assert compare_leaf("", a, a.clone()).by_axis == "" and compare_leaf("", a, a).differing == ()


def test_many_ranges_are_merged_and_the_text_is_capped():
    a = torch.zeros(2, 1000)
    b = a.clone()
    b[:, ::2] = 1  # every other column: 500 ranges
    leaf = compare_leaf("", a, b)
    assert len(leaf.differing[1]) == 500 and all(len(r) == 1 for r in leaf.differing[1])
    assert leaf.by_axis.startswith(
        "dim 1: 0, 2, 4, 6, … (496 more) differ, 1, 3, 5, 7, … (496 more) match"
    )
    assert len(leaf.by_axis) <= 240
    ints = compare_leaf("", torch.arange(6).view(2, 3), torch.tensor([[0, 1, 2], [3, 9, 5]]))
    assert ints.by_axis == "dim 0: 1 differs, 0 matches; dim 1: 1 differs, 0, 2 match"
    nan_apart = compare_leaf(
        "", torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, NAN], [3.0, 4.0]])
    )
    assert nan_apart.by_axis == "dim 0: 0 differs, 1 matches; dim 1: 1 differs, 0 matches"
    parts = compare_leaf(
        "", [torch.ones(3), torch.ones(3)], [torch.ones(3), torch.tensor([1.0, 2.0, 1.0])]
    )
    assert parts.by_axis == "[1]: dim 0: 1 differs, 0, 2 match"


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    block=st.sampled_from([1, 2, 3, 7, 64]),
    seed=st.integers(0, 2**16),
)
def test_the_breakdown_by_axis_is_the_same_whatever_the_blocks(shape, block, seed):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=generator)
    differs = torch.rand(shape, generator=generator) < 0.2
    b = torch.where(differs, a + 1, a)
    verify_module = sys.modules["graphsurgeon.checks._leaves"]  # where the blocks are cut
    original = verify_module._BLOCK
    verify_module._BLOCK = block  # blocks cut mid-row, by rows, or the whole tensor
    try:
        leaf = compare_leaf("", a, b)
    finally:
        verify_module._BLOCK = original
    if not bool(differs.any()):
        assert leaf.ok and leaf.differing == ()
        return
    for dim, ranges in enumerate(leaf.differing):
        others = tuple(d for d in range(len(shape)) if d != dim)
        along = differs.any(dim=others) if others else differs
        flagged = [i for r in ranges for i in r]
        assert flagged == along.nonzero().flatten().tolist()


def test_a_match_decided_by_atol_alone_says_so_and_suggests_a_tolerance():
    """Was: outputs of ~2e-5 matched a first conv tripled (5% off) with a plain "match"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    model = model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e-3)
    x = torch.randn(1, 3, 16, 16)
    wrong = copy.deepcopy(model[0])
    with torch.no_grad():
        wrong.weight.mul_(3.0)
    gm = gs.swap(gs.export(model, (x,)), {"0": wrong})
    report = gs.verify(model, gm, (x,))
    assert report and report.decided_by_atol == report.leaves
    assert "decided by atol" in str(report).splitlines()[0]
    assert "decided by atol" in report._repr_html_()
    suggested = float(re.search(r"pass atol=([0-9.e-]+)", report.atol_note).group(1))
    assert 1e-11 < suggested < 1e-9
    assert not gs.verify(model, gm, (x,), atol=suggested)  # the suggestion finds the error
    # outputs of an ordinary size: nothing to say
    same = nn.Linear(4, 4).eval()
    plain = gs.verify(same, same, (torch.randn(2, 4),))
    assert plain and plain.decided_by_atol == () and "note" not in str(plain)


# -- backward=True: the gradients too ------------------------------------------------------


def _autograd_gradients(model, x, upstream):
    """torch's own autograd on ``model``: the gradient of the input and of every parameter."""
    x = x.detach().requires_grad_(True)
    names, params = zip(*model.named_parameters())
    grads = torch.autograd.grad(model(x), (x, *params), upstream)
    return {"grad of input x": grads[0]} | {f"grad of {n}": g for n, g in zip(names, grads[1:])}


@pytest.mark.parametrize("bug", BUGS)
def test_backward_verdict_is_the_one_torch_autograd_gives(bug):
    norm = RMSNorm(8)
    fused = FusedRMSNorm(norm, bug)
    x = torch.randn(2, 5, 8)
    report = gs.verify(norm, fused, (x,), backward=True)
    # the precondition: the forward matches whatever the backward does
    assert report.outputs_ok and report.backward and report.gradients_ok is not None
    upstream = seeded_upstream(norm(x).detach().requires_grad_(True))[0]
    expected = _autograd_gradients(norm, x, upstream)
    actual = _autograd_gradients(fused, x, upstream)
    assert sorted(leaf.path for leaf in report.gradients) == sorted(expected)
    differ = {
        name
        for name in expected
        if not torch.allclose(actual[name], expected[name], rtol=1e-5, atol=1e-5)
    }
    assert {leaf.path for leaf in report.gradient_mismatches} == differ
    assert bool(report) is (not differ) and (bug is None) is (not differ)
    if bug == "weight factor":
        (leaf,) = report.gradient_mismatches
        expected_abs = (expected["grad of weight"]).abs().max().item()
        assert leaf.path == "grad of weight" and leaf.max_abs == pytest.approx(expected_abs)
        assert leaf.max_rel == pytest.approx(1.0) and "MISMATCH, 1 of 2" in str(report)


def test_backward_names_the_parameter_of_the_wrong_swap_in_a_program():
    model = NormStack(dim=8, layers=4)
    x = torch.randn(2, 3, 8)
    ep = gs.export(model, (x,))
    bugs = {"layers.2.norm": "weight factor"}
    gm = gs.swap(ep, fused_norms(model, bugs))
    assert gs.verify(model, gm, (x,))  # the forward alone matches
    report = gs.verify(model, gm, (x,), backward=True)
    assert not report and report.outputs_ok
    assert [leaf.path for leaf in report.gradient_mismatches] == ["grad of layers.2.norm.weight"]
    # every parameter of the model and the input are compared, by the model's names
    names = {f"grad of {n}" for n, _ in model.named_parameters()} | {"grad of input x"}
    assert {leaf.path for leaf in report.gradients} == names
    right = gs.swap(ep, fused_norms(model))
    assert gs.verify(model, right, (x,), backward=True)
    assert gs.verify(ep, right, (x,), backward=True)


def test_backward_leaves_the_model_and_its_grads_alone():
    model = NormStack(dim=8, layers=2)
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(2, 8, requires_grad=True)
    gs.verify(model, copy.deepcopy(model), (x,), backward=True)
    assert all(p.grad is None for p in model.parameters()) and x.grad is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_backward_says_what_is_not_differentiated():
    class Gathers(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4))
            self.frozen = nn.Parameter(torch.randn(4), requires_grad=False)
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x, index):
            return (x * self.weight * self.frozen * self.scale)[index]

    x, index = torch.randn(4), torch.tensor([0, 2])
    report = gs.verify(Gathers(), Gathers(), (x, index), backward=True)
    notes = " ".join(report.backward_notes)
    assert "input index (torch.int64)" in notes and "1 buffer" in notes
    assert "parameter frozen: requires_grad=False" in notes
    assert {leaf.path for leaf in report.gradients} == {"grad of input x", "grad of weight"}


def test_backward_with_no_output_that_needs_a_gradient_says_so_and_does_not_pass():
    report = gs.verify(lambda x: x.argmax(), lambda x: x.argmax(), (torch.randn(5),), backward=True)
    assert report.outputs_ok and not report
    assert "no output needs a gradient" in report.backward_problem
    assert "NOT CHECKED" in str(report)


def test_backward_from_given_upstream_gradients():
    norm = RMSNorm(4)
    x = torch.randn(3, 4)
    zero = torch.zeros(3, 4)
    # a zero upstream gradient hides the planted bug; ones show it
    assert gs.verify(
        norm, FusedRMSNorm(norm, "weight factor"), (x,), backward=True, grad_outputs=zero
    )
    assert not gs.verify(
        norm,
        FusedRMSNorm(norm, "weight factor"),
        (x,),
        backward=True,
        grad_outputs=torch.ones(3, 4),
    )
    with pytest.raises(VerifyError, match=r"grad_outputs leaf 0 has shape \[4\]"):
        gs.verify(norm, norm, (x,), backward=True, grad_outputs=torch.ones(4))
    with pytest.raises(VerifyError, match="pass backward=True"):
        gs.verify(norm, norm, (x,), grad_outputs=zero)


def test_backward_failure_names_the_side():
    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("not written yet")

    with pytest.raises(
        VerifyError, match=r"candidate .* forward and backward failed: .*not written"
    ):
        gs.verify(lambda x: x * 2, Broken.apply, (torch.ones(2),), backward=True)


@pytest.mark.parametrize(
    "family", ["llama", "gemma", "gemma3", "qwen2", "qwen3", "mistral", "t5", "olmo2", "phi3"]
)
def test_right_custom_backward_norms_of_the_llama_family_give_no_false_alarm(family):
    norm = hf_norm(family, 16)
    x = torch.randn(2, 7, 16) * 3
    report = gs.verify(norm, FusedRMSNorm(norm), (x,), backward=True)
    assert report.backward and len(report.gradients) == 2, report
    assert report, report
    assert not gs.verify(norm, FusedRMSNorm(norm, "missing mean"), (x,), backward=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-1e6, 1e6, allow_nan=False),
            st.sampled_from([0.0, 1e-9, 1e-6, 1e-3, 1.0]),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([0.0, 1e-5, 1e-2]),
    st.sampled_from([0.0, 1e-8, 1e-5]),
)
def test_the_finite_fast_path_gives_the_figures_of_the_general_one(values, rtol, atol):
    from graphsurgeon.checks._leaves import _Tally

    # pairs: equal, nearly equal, zeros on one or both sides
    x = torch.tensor([v if keep else 0.0 for v, _, keep in values], dtype=torch.float64)
    y = torch.tensor(
        [(v if keep else 0.0) * (1 + e) + e for v, e, keep in values], dtype=torch.float64
    )
    general, fast = _Tally(), _Tally()
    general.add(x.clone(), y.clone(), rtol, atol)
    fast.add_finite(x.numpy().copy(), (x - y).abs().numpy(), rtol, atol)
    assert dataclasses.astuple(fast) == dataclasses.astuple(general)


@pytest.mark.parametrize("rtol, atol", [(1e-5, 1e-8), (1e-2, 0.0), (0.0, 1e-5), (0.0, 0.0)])
def test_the_finite_fast_path_counts_values_on_and_just_past_the_tolerance_as_the_general_one(
    rtol, atol
):
    from graphsurgeon.checks._leaves import _Tally

    x = torch.tensor([1.0, 3.0, 1e-3, 0.0, 7.5, 0.0], dtype=torch.float64)
    allowed = x.abs() * rtol + atol
    on = x + allowed
    for _ in range(4):  # the last value within the tolerance, one ulp from the line
        on = torch.where((on - x) > allowed, torch.nextafter(on, x), on)
    past = torch.nextafter(on, on + 1)  # the first value past it
    x_all, y_all = torch.cat([x, x]), torch.cat([on, past])
    error = (x_all - y_all).abs()
    general, fast = _Tally(), _Tally()
    general.add(x_all.clone(), y_all.clone(), rtol, atol)
    fast.add_finite(x_all.numpy().copy(), error.numpy(), rtol, atol)
    assert 0 < general.beyond < len(x_all)  # precondition: values on both sides of the line
    assert dataclasses.astuple(fast) == dataclasses.astuple(general)


@pytest.mark.parametrize("block", [6, 2**18])
@pytest.mark.parametrize("shape", [(7, 13, 5), (40,), (3, 1, 9)])
def test_the_pattern_of_a_finite_mismatch_is_the_one_a_second_pass_finds(monkeypatch, block, shape):
    from graphsurgeon.checks._leaves import _beyond_tolerance, _pattern

    monkeypatch.setattr(sys.modules["graphsurgeon.checks._leaves"], "_BLOCK", block)
    for seed in range(4):
        generator = torch.Generator().manual_seed(seed)
        a = torch.randn(shape, generator=generator)
        b = a + 1e-7 * torch.randn(shape, generator=generator)
        wrong = torch.randint(0, a.numel(), (seed + 1,), generator=generator)
        b.view(-1)[wrong] += 1  # a few values clearly beyond the tolerance
        leaf = compare_leaf("", a, b)
        assert not leaf.ok and leaf.differing  # precondition: a finite mismatch with a pattern
        again = _pattern(a, b, _beyond_tolerance(torch.float64, 1e-5, 1e-5))
        assert (leaf.differing, leaf.by_axis) == (again["differing"], again["by_axis"])


def _float32_pairs(values):
    x = torch.tensor([v if keep else 0.0 for v, _, keep in values], dtype=torch.float32)
    y = torch.tensor(
        [(v if keep else 0.0) * (1 + e) + e * 1e-3 for v, e, keep in values], dtype=torch.float32
    )
    return x, y


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.floats(-(2.0**100), 2.0**100, width=32),
                st.floats(-(2.0**-120), 2.0**-120, width=32),  # subnormals among them
            ),
            st.sampled_from([0.0, 1e-9, 1e-7, 1e-6, 1e-3]),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([0.0, 1e-5, 1e-4, 1e-2, 1.0]),
    st.sampled_from([0.0, 1e-30, 1e-8, 1e-5]),
)
def test_the_float32_screen_gives_the_general_paths_figures_whenever_it_decides(values, rtol, atol):
    from graphsurgeon.checks._leaves import _screened, _Tally, _Work

    x, y = _float32_pairs(values)
    figures = _screened(x.numpy(), y.numpy(), rtol, atol, _Work(len(x)))
    if figures is None:
        return
    general = _Tally()
    general.add(x.double(), y.double(), rtol, atol)  # the path that never screens
    assert general.beyond == 0, "the screen decides only values within the tolerance"
    assert figures == (general.max_abs, general.max_rel, general.ratio, general.scale)


@pytest.mark.parametrize("noise", [0.0, 1e-7, 1e-5])
def test_the_float32_screen_decides_gradients_within_the_tolerance(noise):
    # the property test above passes vacuously where the screen refuses: here it must decide
    from graphsurgeon.checks._leaves import _screened, _Tally, _Work

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=generator) * 1e-3
    y = x * (1 + noise * torch.randn(4096, generator=generator))
    figures = _screened(x.numpy(), y.numpy(), 1e-4, 1e-6, _Work(len(x)))
    general = _Tally()
    general.add(x.double(), y.double(), 1e-4, 1e-6)
    assert figures == (general.max_abs, general.max_rel, general.ratio, general.scale)


def test_the_float32_screen_finds_the_largest_ratio_where_float32_ranks_it_second():
    # two values whose error/tolerance quotients float32 orders the other way round (the
    # first is the larger in float64, 0.33763393403 against 0.33763393142): the screen must
    # look at every position near the rounded maximum, not only at the rounded maximum
    from graphsurgeon.checks._leaves import _screened, _Tally, _Work

    x = torch.tensor([1.1268937587738037, 2.327340602874756])
    y = torch.tensor([1.126932144165039, 2.3274195194244385])
    wide_x, wide_y = x.double(), y.double()
    float32_ratios = (x - y).abs() / (x.abs() * 1e-4 + 1e-6)
    float64_ratios = (wide_x - wide_y).abs() / (wide_x.abs() * 1e-4 + 1e-6)
    # precondition: the two precisions rank the positions differently
    assert float32_ratios.argmax() != float64_ratios.argmax()
    general = _Tally()
    general.add(wide_x, wide_y, 1e-4, 1e-6)
    figures = _screened(x.numpy(), y.numpy(), 1e-4, 1e-6, _Work(2))
    assert figures == (general.max_abs, general.max_rel, general.ratio, general.scale)


def test_the_float32_screen_leaves_values_near_or_past_the_tolerance_to_the_float64_path():
    from graphsurgeon.checks._leaves import _screened, _Work

    x = torch.ones(8)
    near, past = x.clone(), x.clone()
    near[3] += 0.8e-4  # 0.8 of rtol=1e-4: within it, but too near to screen
    past[5] += 2e-4
    for y in (near, past):
        assert _screened(x.numpy(), y.numpy(), 1e-4, 1e-30, _Work(8)) is None
    assert compare_leaf("", x, near, rtol=1e-4, atol=1e-30).ok
    assert not compare_leaf("", x, past, rtol=1e-4, atol=1e-30).ok


@pytest.mark.parametrize("block", [5, 2**16])
@pytest.mark.parametrize("noise", [0.0, 1e-7, 3e-5, 1.0])
def test_float32_leaves_compare_as_the_same_values_in_float64(monkeypatch, block, noise):
    # float64 leaves never take the float32 screen: the figures, verdict and pattern of a
    # float32 leaf must be exactly those of its values widened
    leaves = sys.modules["graphsurgeon.checks._leaves"]
    monkeypatch.setattr(leaves, "_BLOCK", block)
    monkeypatch.setattr(leaves, "_SCREEN_LEAST", 1)  # this small leaf is screened too
    decided = []
    screened = leaves._screened

    def counted(*args):
        figures = screened(*args)
        decided.append(figures is not None)
        return figures

    monkeypatch.setattr(leaves, "_screened", counted)
    generator = torch.Generator().manual_seed(7)
    a = torch.randn(6, 11, generator=generator) * torch.logspace(-30, 20, 11)
    b = a * (1 + noise * torch.randn(6, 11, generator=generator))
    b[2, 3] = a[2, 3]  # some values equal
    a[4, 0] = b[4, 0] = 0.0  # 0 against 0: no error
    narrow = compare_leaf("x", a, b, rtol=1e-4, atol=1e-6)
    wide = compare_leaf("x", a.double(), b.double(), rtol=1e-4, atol=1e-6)
    assert narrow == wide
    assert narrow.max_abs > 0 or noise == 0  # precondition: values differ where meant to
    if noise <= 1e-7:  # precondition: the screen decided the leaf (all its blocks)
        assert decided and all(decided), decided


@pytest.mark.parametrize("size", [1, 7, 256, 257, 3000])
def test_runs_of_flags_are_found_alike_in_short_and_long_vectors(size):
    from graphsurgeon.checks._leaves import _ranges

    flags = torch.rand(size, generator=torch.Generator().manual_seed(size)) < 0.3
    flags[-1] = True  # a run that reaches the end
    expected, start = [], None
    for position, flag in enumerate([*flags.tolist(), False]):
        if flag and start is None:
            start = position
        if not flag and start is not None:
            expected.append(range(start, position))
            start = None
    assert expected  # precondition: runs to find
    assert _ranges(flags) == tuple(expected)
