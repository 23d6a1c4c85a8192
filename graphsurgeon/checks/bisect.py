"""bisect(): which of a Surgery's swaps explain its mismatch against the original program?

When many swaps together make a program compute something else, :func:`bisect` finds the few
that are to blame by running the program with subsets of the swaps, each built by the one
rewrite pass (``rewrite(ep, subset)``: exactly what ``gs.swap(ep, subset)`` gives) and compared
with the original program's outputs, computed once, as :func:`graphsurgeon.verify` compares
(``|a - b| <= atol + rtol * |a|``, integers exactly). Fused calls compute exactly what the
program did and are not candidates.

The search is adaptive group testing. Starting from the swaps that still mismatch (all of them
at first), it halves the group in graph order and runs the first half: if it mismatches, the
culprit is there; if not, it is in the second half, which is not run. At a single swap reached
that way it runs that swap alone, to be sure. Then it runs every swap but the culprits found
so far: if that matches, the search is over; if not, it looks for the next culprit among those.
When each wrong swap mismatches on its own, ``k`` culprits among ``n`` swaps cost at most
``2 + k * (ceil(log2 n) + 2)`` program runs (the original's and the full program's included),
never more than ``2 k ceil(log2 n) + 2`` for ``n >= 3``. A swap reached that way that matches
alone means swaps that are wrong only together: a smallest group of them that mismatches is
then found by splitting both halves (more runs). A subset is built and run once (the Surgery's
own module serves for the full set), and every run starts from the same random state. At the
end, each group of culprits and the rest are run once more (``k + 1`` runs): a program that
answers otherwise the second time (a replacement whose state changes between calls) would make
the search blame an innocent swap, and the result says so (:attr:`Bisection.disagreements`).

With ``backward=True`` every run also runs backward, from the same seeded upstream gradients
(drawn once from the original's outputs), and a subset mismatches when its outputs *or* the
gradients of the inputs and parameters differ from the original's (compared by name, as
``gs.verify(..., backward=True)`` compares them): a replacement whose forward is right and whose
hand-written backward is not is found the same way.

Example:
    >>> import torch, graphsurgeon as gs
    >>> model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(8)])
    >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),))
    >>> for i in range(8):  # faithful copies, except layer 5
    ...     new = torch.nn.Linear(4, 4)
    ...     _ = new.load_state_dict(model[i].state_dict())
    ...     s = s.swap(str(i), new if i != 5 else torch.nn.Linear(4, 4))
    >>> found = s.bisect()
    >>> found.culprits, found.runs <= 2 * 1 * 3 + 2 + 2, found.reliable
    (('5',), True, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from .._program import as_program
from ..errors import SurgeryError, a_type
from ..partition import program_index
from ..rewrite import rewrite, safe_path
from ._exec import RandomState, clone_inputs, keep_state, runnable_original
from ._grad import given_upstream, input_labels, run_backward
from .verify import checked_tolerance, compare_gradients, compare_outputs

__all__ = ["BisectRun", "Bisection", "bisect"]


@dataclass(frozen=True)
class BisectRun:
    """One program run of a :func:`bisect`.

    Attributes:
        swaps: the swaps in force for this run, in graph order (``()``: the original program,
            the reference every other run is compared with).
        mismatch: whether its outputs differ from the original's beyond tolerance (False for
            the reference itself).
        max_abs: the largest absolute difference at the outputs (NaN where none was measured:
            another shape, or the run failed).
        error: why the run failed (``"ReplacementError: ..."``), or ``""``; a run that fails
            counts as a mismatch.
        repeated: whether it runs again swaps that were run before: the culprits and the rest
            are run a second time at the end, to check that the program answers the same.
        differs: what differs from the original's: ``"outputs"``, ``"gradients"`` (with
            ``backward=True``), ``"outputs and gradients"``, or ``""`` (a match, a failed run,
            the reference).
        gradients: with ``backward=True``, the gradients that differ (``"grad of
            layers.1.norm.weight"``), in the original's order.
        grad_max_abs: with ``backward=True``, the largest absolute difference of a gradient
            (NaN where one could not be measured).
    """

    swaps: tuple[str, ...]
    mismatch: bool
    max_abs: float = 0.0
    error: str = ""
    repeated: bool = False  # a second run of swaps run before, to check the answer holds
    differs: str = ""
    gradients: tuple[str, ...] = ()
    grad_max_abs: float = 0.0

    @property
    def reference(self) -> bool:
        """Whether this is the original program's run (the reference)."""
        return not self.swaps


@dataclass(frozen=True, repr=False)
class Bisection:
    """What :func:`bisect` found: the swaps that explain the mismatch, and the runs it took.

    Attributes:
        culprits: the swaps to blame, in graph order (empty when everything matches).
        groups: the culprits as found: each group mismatches on its own; a group of several
            swaps mismatches only with all of them (they interact), not with fewer.
        swaps: every swap that was a candidate, in graph order (the Surgery's swaps; fused
            calls are exact and are not candidates).
        matches: whether the program with all its swaps matches the original (then there are
            no culprits).
        runs: how many programs were run, the original's run included.
        builds: how many programs were built for it (each subset once; the Surgery's module
            serves for the full set when its state is the program's).
        log: every run in the order made (:class:`BisectRun`), the reference first.
        rtol, atol: the tolerances of the comparison.
        disagreements: the sets of swaps whose two runs disagreed (one matched the original,
            the other did not): the program does not compute the same thing twice (a
            replacement whose state changes between calls, or a nondeterministic op), so the
            culprits cannot be trusted. Empty when every repeated run agreed.
        backward: whether the gradients were checked too (``bisect(backward=True)``): a run
            then mismatches when its outputs or its gradients differ.
        backward_notes: with ``backward``: what was not differentiated or not compared, and
            where the upstream gradients came from, in words.

    What holds: every group mismatches when run alone, and the program with every swap but the
    culprits matches the original (both seen in a run, or implied by runs made: the empty set
    is the original itself). When each wrong swap mismatches alone and the right ones never
    make a mismatch, the culprits are exactly the wrong swaps.
    """

    culprits: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    swaps: tuple[str, ...]
    matches: bool
    runs: int
    builds: int
    log: tuple[BisectRun, ...]
    rtol: float
    atol: float
    disagreements: tuple[tuple[str, ...], ...] = ()
    backward: bool = False
    backward_notes: tuple[str, ...] = ()

    @property
    def reliable(self) -> bool:
        """Whether every set of swaps run twice gave the same answer both times."""
        return not self.disagreements

    def _disagreement_text(self) -> str:
        sets = "; ".join(_swaps_text(d, self.swaps) for d in self.disagreements)
        return (
            f"two runs of the same swaps disagreed ({sets}): one matched the original and the "
            "other did not, so the program does not compute the same thing twice (a "
            "replacement whose state changes between calls, or a nondeterministic op) and "
            "these culprits may be wrong. Make the replacements deterministic and bisect again."
        )

    def _summary(self) -> str:
        count = len(self.swaps)
        swaps = f"{count} swap{'s' if count != 1 else ''}"
        runs = f"{self.runs} program run{'s' if self.runs != 1 else ''}"
        if self.backward:
            runs += ", outputs and gradients"
        if not self.swaps:
            return "bisect: nothing is swapped: no culprits"
        checked = " (outputs and gradients)" if self.backward else ""
        if self.matches:
            return (
                f"bisect: the program with all {swaps} matches the original{checked}: no "
                f"culprits ({runs})"
            )
        culprits = f"{len(self.culprits)} culprit{'s' if len(self.culprits) != 1 else ''}"
        text = f"bisect: {culprits} among {swaps} ({runs}): {', '.join(self.culprits)}"
        return text if self.reliable else text + " (UNRELIABLE: runs disagreed)"

    def _group_lines(self) -> list[str]:
        lines = []
        for group in self.groups:
            if len(group) > 1:
                lines.append(
                    f"{' + '.join(group)}: mismatch only together (each alone, or fewer, matches)"
                )
        return lines

    def __str__(self) -> str:
        lines = [self._summary()]
        tolerance = f"rtol={self.rtol:g}, atol={self.atol:g}"
        if self.backward:
            tolerance += "; outputs and gradients, from the same seeded upstream gradients"
        if not self.reliable:
            lines.append(f"  {self._disagreement_text()}")
        if self.culprits:
            lines.extend(f"  {line}" for line in self._group_lines())
            lines.append(f"  without them the program matches the original ({tolerance})")
        elif self.swaps:
            lines.append(f"  compared as gs.verify compares ({tolerance})")
        lines.extend(f"  note: {note}" for note in self.backward_notes)
        for number, run in enumerate(self.log, start=1):
            lines.append(f"  {number:>3}  {_run_text(run, self.swaps, self.backward)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        culprits = ", ".join(self.culprits) or "none"
        return (
            f"<Bisection: {len(self.culprits)} culprit{'s' if len(self.culprits) != 1 else ''} "
            f"of {len(self.swaps)} swaps ({culprits}), {self.runs} runs>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display as d

        if self.culprits:
            verdict = d.badge(f"{len(self.culprits)} culprit(s)", "bad")
        else:
            verdict = d.badge("no culprits", "ok")
        if self.backward:
            verdict += " " + d.badge("outputs and gradients", "info")
        title = (
            f'<div class="gs-title">bisect {verdict} {d.badge(f"{self.runs} runs", "info")}</div>'
            f"<div>{d.escape(self._summary())}</div>"
        )
        notes = "".join(f'<div class="gs-muted">{d.escape(g)}</div>' for g in self._group_lines())
        if not self.reliable:
            verdict += " " + d.badge("unreliable", "warn")
            notes = f"<div>{d.escape(self._disagreement_text())}</div>" + notes
        if self.culprits:
            notes += (
                f'<div class="gs-muted">without them the program matches the original '
                f"(rtol={self.rtol:g}, atol={self.atol:g})</div>"
            )
        notes += "".join(f'<div class="gs-muted">{d.escape(n)}</div>' for n in self.backward_notes)
        rows = []
        for number, run in enumerate(self.log, start=1):
            if run.reference:
                mark = d.badge("reference", "info")
            elif run.mismatch:
                mark = d.badge("mismatch", "bad")
            else:
                mark = d.badge("match", "ok")
            measured = "" if run.reference or math.isnan(run.max_abs) else f"{run.max_abs:.3g}"
            again = " (again)" if run.repeated else ""
            row = [
                str(number),
                mark,
                d.escape(_swaps_text(run.swaps, self.swaps) + again),
                measured,
            ]
            if self.backward:
                unmeasured = run.reference or run.error or math.isnan(run.grad_max_abs)
                row += [d.escape(run.differs), "" if unmeasured else f"{run.grad_max_abs:.3g}"]
            rows.append(row)
        head = ["run", "", "swaps in force", "max abs"]
        if self.backward:
            head += ["differs", "grad max abs"]
        numeric = (0, 3, 5) if self.backward else (0, 3)
        table = d.table(head, rows, numeric=numeric, raw=(1,))
        body = title + notes + d.details(f"the {len(self.log)} runs", table)
        return d.bundle(body, repr(self), include, exclude)


def _swaps_text(swaps: tuple[str, ...], every: tuple[str, ...]) -> str:
    """``"the original program"``, ``"all 10 swaps"``, or the names (shortened past six)."""
    if not swaps:
        return "the original program"
    if len(swaps) == len(every) and len(every) > 1:
        return f"all {len(every)} swaps"
    if len(swaps) <= 6:
        return ", ".join(swaps)
    return f"{', '.join(swaps[:3])} … {swaps[-1]} ({len(swaps)} swaps)"


def _run_text(run: BisectRun, every: tuple[str, ...], backward: bool = False) -> str:
    what = _swaps_text(run.swaps, every)
    if run.reference:
        return f"{what} (the reference)"
    if run.repeated:
        what += " (again)"
    if run.error:
        return f"{what}: MISMATCH, the run failed: {run.error}"
    if not run.mismatch:
        return f"{what}: match"
    measured = "" if math.isnan(run.max_abs) else f", max abs {run.max_abs:.3g}"
    if not run.gradients:  # the outputs alone differ
        return f"{what}: MISMATCH{' of the outputs' if backward else ''}{measured}"
    shown = ", ".join(run.gradients[:3]) + (" …" if len(run.gradients) > 3 else "")
    grads = f"{len(run.gradients)} gradient{'s' if len(run.gradients) != 1 else ''} ({shown})"
    if "outputs" in run.differs:
        return f"{what}: MISMATCH of the outputs{measured} and of {grads}"
    size = "" if math.isnan(run.grad_max_abs) else f", max abs {run.grad_max_abs:.3g}"
    return f"{what}: MISMATCH of {grads}{size}, the outputs match"


_SEEDED = "upstream gradients: standard normal, seeded (the same for every run)"
_GIVEN = "upstream gradients: grad_outputs as given (the same for every run)"


# -- the search ---------------------------------------------------------------------------------


class _Tests:
    """Runs programs with subsets of the swaps against the original's outputs, each subset once."""

    def __init__(
        self,
        program: ExportedProgram,
        replacements: Mapping[str, torch.nn.Module],
        order: Sequence[str],
        full_module: GraphModule | None,
        args: tuple,
        kwargs: Mapping[str, Any],
        rtol: float,
        atol: float,
        regions: Mapping[str, Any] | None = None,
        backward: bool = False,
        grad_outputs: Any = None,
    ):
        self.program = program
        self.backward = backward
        self.notes: dict[str, None] = {}  # with backward: what was not compared, once each
        self.regions = dict(regions or {})  # the regions of ops among the swaps (replace)
        self.replacements = replacements
        self.position = {name: i for i, name in enumerate(order)}
        self.full = frozenset(order)
        self.full_module = full_module
        self.args, self.kwargs = args, dict(kwargs)
        self.rtol, self.atol = rtol, atol
        self.known: dict[frozenset[str], bool] = {frozenset(): False}
        self.log: list[BisectRun] = []
        self.builds = 0
        self.start = RandomState()
        original = runnable_original(program)
        # the one naming of the inputs' gradients, for every run (from the model's signature)
        self.labels = input_labels(original, args, self.kwargs) if backward else []
        # with backward: the caller's grad_outputs (checked against the original's outputs)
        # or seeded ones; after the original's run, the tensors it used, for every run
        self.upstream: Any = None
        if grad_outputs is not None:

            def upstream(outputs: Any) -> tuple:
                return given_upstream(grad_outputs, outputs, "bisect: ", SurgeryError)

            self.upstream = upstream
        try:
            self.expected = self._run(original)
        except SurgeryError:
            raise
        except Exception as error:
            raise SurgeryError(
                f"bisect: running the original program failed: {type(error).__name__}: "
                f"{error}. Check the inputs: they are the model's, as for s.verify()."
            ) from error
        finally:
            self.start.restore()
        if backward:
            if self.expected.problem:
                raise SurgeryError(
                    f"bisect(backward=True): the original program: {self.expected.problem}. "
                    "Bisect without backward=True, or give inputs whose outputs need gradients."
                )
            self.upstream = self.expected.upstream
        self.log.append(BisectRun((), False))

    def ordered(self, names: frozenset[str] | set[str]) -> tuple[str, ...]:
        return tuple(sorted(names, key=self.position.__getitem__))

    def _run(self, module: torch.nn.Module) -> Any:
        """The module's outputs on copies of the inputs; with ``backward``, its
        :class:`~graphsurgeon.checks._grad.Backward` from the original's upstream gradients."""
        self.start.restore()  # every program runs from the same random state
        args, kwargs = clone_inputs(self.args), clone_inputs(self.kwargs)
        # a question, not a use: the state a run writes (statistics, caches) is put back
        if not self.backward:
            with torch.no_grad(), keep_state([module]) as state:
                return state.unshared(module(*args, **kwargs))
        with keep_state([module]) as state:
            run = run_backward(module, args, kwargs, self.labels, self.upstream)
            return dataclasses.replace(run, outputs=state.unshared(run.outputs))

    def _compared(self, swaps: tuple[str, ...], actual: Any, again: bool) -> BisectRun:
        """The run of ``swaps`` that gave ``actual``, compared with the original's."""
        if not self.backward:
            report = compare_outputs(self.expected, actual, rtol=self.rtol, atol=self.atol)
            differs = "" if report.ok else "outputs"
            return BisectRun(swaps, not report.ok, report.max_abs, "", again, differs)
        report = compare_outputs(
            self.expected.outputs, actual.outputs, rtol=self.rtol, atol=self.atol
        )
        checks, notes = compare_gradients(self.expected, actual, rtol=self.rtol, atol=self.atol)
        self.notes.update(dict.fromkeys(notes))
        wrong = tuple(check.path for check in checks if not check.ok)
        largest = max((check.max_abs for check in checks), default=0.0)
        if any(math.isnan(check.max_abs) for check in checks if not check.ok):
            largest = math.nan
        differs = " and ".join(
            what for what, bad in (("outputs", not report.ok), ("gradients", wrong)) if bad
        )
        mismatch = not report.ok or bool(wrong)
        return BisectRun(swaps, mismatch, report.max_abs, "", again, differs, wrong, largest)

    def mismatch(self, subset: frozenset[str], *, again: bool = False) -> bool:
        """Whether the program with the swaps ``subset`` differs from the original (each
        subset is run once; ``again``: run it another time, whatever is known)."""
        if subset in self.known and not again:
            return self.known[subset]
        swaps = self.ordered(subset)
        if subset == self.full and self.full_module is not None:
            module: torch.nn.Module = self.full_module
        else:
            requests = {name: self.replacements[name] for name in swaps}
            module = rewrite(self.program, requests, regions=self.regions)
            self.builds += 1
        try:
            actual = self._run(module)
        except Exception as error:  # a program that fails to run does not match
            run = BisectRun(swaps, True, math.nan, f"{type(error).__name__}: {error}", again)
        else:
            run = self._compared(swaps, actual, again)
        finally:
            self.start.restore()
        self.log.append(run)
        if not again:
            self.known[subset] = run.mismatch
        return run.mismatch

    def disagreements(self, subsets: Sequence[frozenset[str]]) -> list[tuple[str, ...]]:
        """The ``subsets`` (each run before) whose second run gives another answer."""
        return [
            self.ordered(subset)
            for subset in subsets
            if self.mismatch(subset, again=True) != self.known[subset]
        ]

    def halves(self, group: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        middle = (len(group) + 1) // 2
        return group[:middle], group[middle:]

    def isolate(self, group: tuple[str, ...]) -> tuple[str, ...]:
        """A culprit (or a group of swaps that mismatch only together) among ``group``, which
        is known to mismatch."""
        candidates, inferred = group, False
        while len(candidates) > 1:
            first, second = self.halves(candidates)
            if self.mismatch(frozenset(first)):
                candidates, inferred = first, False
            else:
                # with no interactions, the culprit is in the second half: not run to know it
                candidates, inferred = second, True
        if inferred and not self.mismatch(frozenset(candidates)):
            # It matches alone: swaps of the group mismatch only together. Find a smallest
            # set of them that does.
            found = self.minimal(group, ())
            candidates = found if self.mismatch(frozenset(found)) else group
        return candidates

    def minimal(self, group: tuple[str, ...], kept: tuple[str, ...]) -> tuple[str, ...]:
        """A subset of ``group`` that mismatches together with ``kept``, from which no swap
        can be left out (when mismatching is monotone: more wrong swaps never match). The
        caller knows that ``kept`` with all of ``group`` mismatches."""
        if kept and self.mismatch(frozenset(kept)):
            return ()
        if len(group) == 1:
            return group
        first, second = self.halves(group)
        if self.mismatch(frozenset(kept + first)):
            return self.minimal(first, kept)
        if self.mismatch(frozenset(kept + second)):
            return self.minimal(second, kept)
        needed_first = self.minimal(first, kept + second)
        needed_second = self.minimal(second, kept + needed_first)
        return self.ordered(set(needed_first + needed_second))


def _graph_order(
    program: ExportedProgram, names: Sequence[str], regions: Mapping[str, Any] | None = None
) -> list[str]:
    """The swap names in the order their first call (or region of ops) runs in the program."""
    index = program_index(program)
    position = {node: i for i, node in enumerate(index.nodes)}
    regions = regions or {}

    def first_node(name: str) -> int:
        if name in regions:
            nodes = [index.by_name[n] for n in regions[name].nodes if n in index.by_name]
            return min((position[n] for n in nodes), default=len(position))
        calls = index.resolve(name).calls
        starts = [position[index.call_nodes[c][0]] for c in calls if index.call_nodes.get(c)]
        return min(starts, default=len(position))

    return sorted(names, key=lambda name: (first_node(name), name))


def _state_is_the_programs(program: ExportedProgram, module: GraphModule) -> bool:
    """Whether ``module``'s copies of the program's buffers still hold the program's values (a
    run in training mode writes them: then the module is not what a fresh build would be)."""
    for spec in program.graph_signature.input_specs:
        if spec.kind.name != "BUFFER":
            continue
        source = program.constants if spec.persistent is False else program.state_dict
        try:
            mine = module.get_buffer(safe_path(spec.target))
        except AttributeError:
            return False
        theirs = source[spec.target]
        if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
            return False
        if not torch.equal(mine, theirs):
            return False
    return True


def bisect(
    surgery: Any,
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    backward: bool = False,
    grad_outputs: Any = None,
) -> Bisection:
    """The smallest set of a Surgery's swaps that explains its mismatch against the original.

    Args:
        surgery: a :class:`graphsurgeon.Surgery` (it is not changed).
        args: the model's positional inputs (default: the Surgery's, as for ``s.verify()``).
        kwargs: its keyword inputs (default: the Surgery's).
        rtol: the relative tolerance, as for :func:`graphsurgeon.verify`.
        atol: the absolute tolerance, as for :func:`graphsurgeon.verify`.
        backward: also run backward, from the same seeded upstream gradients in every run, and
            count a run as a mismatch when its gradients (of the floating inputs and the
            parameters, by name) differ too, as ``gs.verify(..., backward=True)`` compares.
        grad_outputs: with ``backward=True``, the upstream gradients of every run, one tensor
            (or None) per output leaf in the structure of the outputs, as for
            :func:`graphsurgeon.verify` (default: seeded standard-normal ones).

    The program with all the Surgery's swaps is run against the original program (``ep``,
    not the eager model: a swap is to blame when its replacement does not compute what the
    module did). When it matches, there are no culprits. Otherwise the swaps are searched by
    adaptive group testing (see the module docstring), each run a program built with a subset
    of the swaps by the one rewrite pass. What is guaranteed: each group of culprits mismatches
    alone, and the program with every swap but the culprits matches; when each wrong swap
    mismatches on its own (no interactions), the culprits are exactly the wrong swaps, found in
    at most ``2 + k (ceil(log2 n) + 2)`` runs for ``k`` culprits of ``n`` swaps, and ``k + 1``
    more that run the answer again to check it holds (``.disagreements``). Swaps that are
    wrong only together are found as one group (more runs). Swaps whose errors cancel out, so
    that all of them together match, are not culprits.

    Every program runs from the same random state (dropout draws the same masks in each), and
    the caller's random stream is left as it was; buffers a run writes are put back.

    Raises:
        SurgeryError: no inputs, a tolerance that is not a number >= 0, or the original
            program fails to run on the inputs (with ``backward=True``: or no output of it
            needs a gradient). A program with swaps that fails to run is a
            mismatch, not an error: the run's log says why.
    """
    source = as_program(surgery, args, kwargs, verb="bisect")  # a model: refused as everywhere
    if source.surgery is None:
        raise SurgeryError(
            f"bisect: expected a gs.Surgery, got {a_type(surgery)}; start one with "
            "gs.Surgery(ep, args=(x,)) or gs.Surgery.from_model(model, args) and make the swaps"
        )
    program, replacements = surgery.program, surgery.replacements
    rtol = checked_tolerance("rtol", rtol, SurgeryError, "bisect: ")
    atol = checked_tolerance("atol", atol, SurgeryError, "bisect: ")
    if not isinstance(backward, bool):
        raise SurgeryError(f"bisect: backward={backward!r}: expected True or False")
    if grad_outputs is not None and not backward:
        raise SurgeryError(
            "bisect: grad_outputs are the upstream gradients of a backward run: pass "
            "backward=True with them, or leave them out"
        )
    args, kwargs = source.inputs(error=SurgeryError)
    regions = dict(getattr(surgery, "regions", {}) or {})
    order = tuple(_graph_order(program, list(replacements), regions))
    if not order:
        return Bisection((), (), (), True, 0, 0, (), rtol, atol, backward=backward)
    module = surgery.module
    full_module = module if _state_is_the_programs(program, module) else None
    tests = _Tests(
        program,
        replacements,
        order,
        full_module,
        args,
        kwargs,
        rtol,
        atol,
        regions,
        backward,
        grad_outputs,
    )
    everything = frozenset(order)
    groups: list[tuple[str, ...]] = []
    found: set[str] = set()
    matches = not tests.mismatch(everything)
    if not matches:
        while True:
            rest = everything - found
            if not rest or not tests.mismatch(rest):
                break
            group = tests.isolate(tests.ordered(rest))
            groups.append(group)
            found.update(group)
    # The search trusts each run's answer: a program that answers differently when run again
    # (a replacement that is wrong on every other call) makes it blame an innocent swap. The
    # final answer's runs are made once more, and a disagreement is said, not hidden.
    final = [frozenset(group) for group in groups] + [everything - found]
    final = [subset for subset in dict.fromkeys(final) if subset and subset in tests.known]
    disagreements = tests.disagreements(final) if not matches else []
    return Bisection(
        culprits=tests.ordered(found),
        groups=tuple(groups),
        swaps=order,
        matches=matches,
        runs=len(tests.log),
        builds=tests.builds,
        log=tuple(tests.log),
        rtol=rtol,
        atol=atol,
        disagreements=tuple(disagreements),
        backward=backward,
        backward_notes=(*tests.notes, _SEEDED if grad_outputs is None else _GIVEN)
        if backward
        else (),
    )
