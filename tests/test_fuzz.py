"""Random programs and swap sets (tests/helpers/fuzzing.py), a bounded run: one test per feature.

Each test forces its features into every program it draws and asserts they are there, so a
change to the strategy cannot quietly stop covering them. The examples are derandomized: every
run explores the same ones (``python tools/fuzz.py`` explores thousands more, with seeds).
"""

from __future__ import annotations

import pytest
from helpers.fuzzing import cases, check_case, features
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# About 0.1 s a case on one thread (drawing it runs the program once; then export, swap, two
# runs of the swapped program and of the eager reference): the file takes about 30 s. A failure
# is reported as drawn, not shrunk: shrinking re-exports hundreds of programs (minutes), and the
# printed case is small and replays with tools/fuzz.py --replay.
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
