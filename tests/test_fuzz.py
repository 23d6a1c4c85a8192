"""Random programs and swap sets (tests/helpers/fuzzing.py), a bounded run: one test per feature.

Each test forces its features into every program it draws and asserts they are there, so a
change to the strategy cannot quietly stop covering them. The examples are derandomized: every
run explores the same ones (``python tools/fuzz.py`` explores thousands more, with seeds).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from helpers.fuzzing import (
    GRAD_BUGS,
    BlockSpec,
    Call,
    Case,
    LeafSpec,
    Mismatch,
    P,
    ReadState,
    RegionNames,
    V,
    check_case,
    describe,
    features,
)
from helpers.fuzzing import cases as all_cases
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import graphsurgeon as gs

# Situations the engine is known to get wrong, left out of the bounded run so that it stays a
# regression test (tools/fuzz.py draws them; give each a strict xfail that forces it). None is
# open: reads_written_state (a parent reading a buffer its child wrote in place) was the last.
ENGINE_GAPS: frozenset[str] = frozenset()
cases = functools.partial(all_cases, exclude=ENGINE_GAPS)

# About 0.1 s a case on one thread (drawing it runs the program once; then export, swap, two
# runs of the swapped program and of the eager reference): the file takes about a minute. A
# failure is reported as drawn, not shrunk: shrinking re-exports hundreds of programs (minutes),
# and the printed case is small and replays with tools/fuzz.py --replay.
settings.register_profile(
    "fuzz-bounded",
    max_examples=12,
    derandomize=True,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.generate],
    # drawing a case runs the program once (to find its calls): slow for hypothesis's taste
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
BOUNDED = settings.get_profile("fuzz-bounded")


def _check(case, *required: str) -> None:
    result = check_case(case)
    missing = set(required) - features(case, result.facts)
    assert not missing, f"the strategy lost {sorted(missing)}"


@settings(BOUNDED, max_examples=36)
@given(case=cases())
def test_random_programs_with_random_swap_sets(case):
    _check(case)


@pytest.mark.parametrize("required", [("shared", "one_call"), ("loop", "calls_apart")])
@BOUNDED
@given(data=st.data())
def test_modules_called_several_times(required, data):
    # a shared submodule, a loop over one block; one call swapped alone, or two calls apart
    _check(data.draw(cases(require=required)), *required)


@pytest.mark.parametrize(
    "required",
    [("dict", "partial_unpack"), ("tuple", "reordered_unpack"), ("dataclass", "whole_struct")],
)
@BOUNDED
@given(data=st.data())
def test_structured_outputs_consumed_in_varied_ways(required, data):
    # all leaves, some, out of order, or the structure passed whole to another submodule
    _check(data.draw(cases(require=required)), *required)


@BOUNDED
@given(case=cases(require={"buffer"}))
def test_buffers_mutated_in_place(case):
    _check(case, "buffer")


@BOUNDED
@given(case=cases(require={"kwargs", "constants"}))
def test_keyword_and_constant_arguments(case):
    _check(case, "kwargs", "constants")


@BOUNDED
@given(case=cases(require={"dynamic"}))
def test_dynamic_batch_run_at_another_size(case):
    _check(case, "dynamic")


@BOUNDED
@given(case=cases(require={"pass_through"}))
def test_pass_through_outputs_swapped_or_refused(case):
    # in a program torch.export made itself, refused exactly when the value passed through is
    # read after the call; in gs.export's, always swapped
    _check(case, "pass_through")


@pytest.mark.parametrize("required", [("returns_input", "in_place"), ("internal_cast",)])
@BOUNDED
@given(data=st.data())
def test_modules_returning_or_writing_their_input(required, data):
    # x.to(the dtype x has), x.mul_(0.5), an RMSNorm whose input the caller reads again
    _check(data.draw(cases(require=required)), *required)


@BOUNDED
@given(case=cases(require={"constant_outputs", "buffer_outputs"}))
def test_constant_and_buffer_outputs(case):
    _check(case, "constant_outputs", "buffer_outputs")


@BOUNDED
@given(case=cases(require={"torch_export", "returns_input", "pass_through"}))
def test_programs_torch_export_made_itself(case):
    # a call returning a tensor from before it, read after the call, must be refused there
    _check(case, "torch_export", "returns_input", "pass_through")


@BOUNDED
@given(case=cases(require={"aliased"}))
def test_one_tensor_passed_to_two_arguments(case):
    _check(case, "aliased")


@BOUNDED
@given(case=cases(require={"same_replacement"}))
def test_one_replacement_serving_several_modules(case):
    _check(case, "same_replacement")


@BOUNDED
@given(case=cases(require={"conflict"}))
def test_overlapping_requests_are_refused(case):
    _check(case, "conflict", "refused")


@BOUNDED
@given(case=cases(require={"pattern_replace"}))
def test_inline_pattern_replaced_beside_swaps(case):
    # s.replace after the swaps: gs.find must match the gate in each gated call, and nowhere else
    _check(case, "pattern_replace")


@BOUNDED
@given(case=cases(require={"reads_child_state"}))
def test_a_parent_reading_a_swapped_childs_state(case):
    # the replacement holds it (the read takes the replacement's), or lacks it, or holds it with
    # another shape or dtype (refused, naming it)
    _check(case, "reads_child_state")


@BOUNDED
@given(case=cases(require={"reads_written_state"}))
def test_a_parent_reading_a_buffer_its_swapped_child_wrote(case):
    # after the child is swapped (whole, or one call of it), the read takes the buffer as the
    # replacement wrote it, as in eager; a replacement lacking the buffer is refused
    _check(case, "reads_written_state")


@BOUNDED
@given(case=cases(require={"param_write"}))
def test_a_replacement_writing_the_parameter_it_is_handed(case):
    # after two runs: the outputs of each equal eager's, the user's model and the program are
    # unchanged, and the swapped program's copy equals the reference's
    _check(case, "param_write")


@BOUNDED
@given(case=cases(require={"region_name"}))
def test_region_names_apart_from_module_and_call_names(case):
    # a name colliding with a module, a call, an @k name or a region in force is refused and
    # leaves the Surgery as it was; the request it named is then swapped as the module or call
    _check(case, "region_name")


# -- the refusal rule for state read outside a module, on fixed programs ----------------------

# x -> act0 -> + self.act0.lin.bias (read by the root) -> out
READS_BIAS = BlockSpec(
    inputs=1,
    children=(("act0", LeafSpec("act", "tanh")),),
    steps=(Call("act0", (V(0),)), ReadState("act0.lin.bias", V(1))),
    returns=(("", ((2, 1.0),)),),
)


@pytest.mark.parametrize(
    ("swapped", "kind", "refused"),
    [
        ("act0", "copy", False),
        ("act0", "wrapped", True),
        ("act0", "reshaped", True),
        ("act0", "retyped", True),
        ("act0.lin", "copy", False),
        ("act0.lin", "wrapped", True),
    ],
)
def test_a_replacement_must_hold_what_a_parent_reads_of_its_module(swapped, kind, refused):
    case = _fixed_case(READS_BIAS, swapped, kind)
    result = check_case(case)
    assert result.refused == refused
    assert ("state_read_refused" in features(case, result.facts)) == refused


@pytest.mark.parametrize("view", ["whole", "t", "row", "diagonal"])
def test_a_written_parameter_is_the_swapped_programs_own_copy(view):
    # x -> scale0(x, self.w0 or a view of it) -> @ self.w0 (read again, as written) -> out
    spec = BlockSpec(
        inputs=1,
        children=(("scale0", LeafSpec("scale", "sin")),),
        steps=(Call("scale0", (V(0), P("w0", view))), ReadState("w0", V(1))),
        returns=(("", ((2, 1.0),)),),
    )
    case = _fixed_case(spec, "scale0", "writes")
    assert not check_case(case).refused
    assert "param_write" in features(case)


@pytest.mark.parametrize("verb", ["fuse", "swap"])
@pytest.mark.parametrize("before_swaps", [True, False], ids=["region first", "swap first"])
def test_a_region_named_like_a_call_leaves_the_call_to_its_swap(verb, before_swaps):
    # x -> act0 -> act0 (call act0@1, swapped) -> * 0.5 (the region) -> out
    spec = BlockSpec(
        inputs=1,
        children=(("act0", LeafSpec("act", "tanh")),),
        steps=(Call("act0", (V(0),)), Call("act0", (V(1),))),
        returns=(("", ((2, 0.5),)),),
    )
    tried = ("act0@1", "act0", "act0.lin", "gate@2", "act0@5")
    region = RegionNames(verb, "act0.part", tried, in_force=True, before_swaps=before_swaps)
    case = dataclasses.replace(_fixed_case(spec, "act0@1", "wrapped"), region=region)
    assert not check_case(case).refused
    assert "region_name" in features(case)


def _fixed_case(spec: BlockSpec, swapped: str, kind: str) -> Case:
    """``spec`` run on one input, ``swapped`` swapped for a replacement of ``kind``."""
    return Case(
        program=spec,
        second_input="none",
        dynamic=False,
        swaps=((swapped, 0),),
        replacements=((swapped.partition("@")[0], 0.25),),  # a copy of the module
        seed=0,
        replacement_kinds=(kind,),
    )


# -- replacements with a hand-written backward, right and wrong --------------------------------


@settings(BOUNDED, max_examples=24)
@given(case=cases(require={"custom_backward"}))
def test_replacements_with_a_custom_backward_right_and_wrong(case):
    # gs.verify(backward=True) must pass a right one and call a wrong one a backward mismatch
    # with the forward matching; torch's autograd on the eager models decides which is which
    _check(case, "custom_backward")


# x -> act0 -> act1 (x2, a loop) -> out ; and y read by act1's first call through a sum
TWO_ACTS = BlockSpec(
    inputs=1,
    children=(("act0", LeafSpec("act", "sigmoid")), ("act1", LeafSpec("act", "tanh"))),
    steps=(Call("act0", (V(0),)), Call("act1", (V(1),), times=2)),
    returns=(("main", ((2, 1.0),)), ("aux", ((1, -0.5),))),
)


def _grad_case(*grad_swaps: tuple[str, str], exporter: str = "gs") -> Case:
    return Case(TWO_ACTS, "none", False, (), (), 0, exporter, grad_swaps=grad_swaps)


@pytest.mark.parametrize("bug", GRAD_BUGS)
@pytest.mark.parametrize("exporter", ["gs", "torch"])
def test_each_planted_gradient_error_is_a_backward_mismatch(bug, exporter):
    case = _grad_case(("act0", "right"), ("act1", bug), exporter=exporter)
    result = check_case(case)
    assert not result.refused and result.replaced_calls == 3  # act0 once, act1 twice
    found = features(case, result.facts)
    assert "custom_backward" in found and ("wrong_backward" in found) is (bug != "right")
    assert "CustomBackwardAct" in describe(case)


@pytest.mark.parametrize("bug", ["right", "factor"])
def test_a_verify_that_ignores_the_gradients_fails_the_check(bug, monkeypatch):
    # the check is no rubber stamp: a verify that does not look at the gradients (a right
    # backward called wrong, or a wrong one called right) is a fuzzer mismatch
    real = gs.verify

    def lying(*args, **kwargs):
        report = real(*args, **kwargs)
        wrong = bug == "right"  # the opposite of the truth
        gradients = tuple(dataclasses.replace(g, ok=not wrong) for g in report.gradients)
        return dataclasses.replace(report, gradients=gradients, ok=not wrong)

    monkeypatch.setattr(gs, "verify", lying)
    with pytest.raises(Mismatch, match="custom backward"):
        check_case(_grad_case(("act1", bug)))
