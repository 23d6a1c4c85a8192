"""Surgery: a program and the swaps made to it, with history, undo/redo, diff and checks.

A Surgery never changes the program it starts from. Its current state is the set of swaps and
fused calls made so far; ``module`` is the program with those (built by the one pass behind
:func:`graphsurgeon.swap` and :func:`graphsurgeon.fuse`). Every operation either succeeds or
leaves the Surgery exactly as it was.

Memory stays bounded in long sessions: each state is kept as its request (``{name:
replacement}``, a few objects), and only the last :attr:`Surgery.keep_built` states used keep
their built GraphModule (several MB each on a large program). A state that is needed again
after that, by undo, redo or reset, is built again from its request: the same node names, the
same outputs, and its buffers as that state left them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from . import _meta
from ._hierarchy import (
    carry_module_types,
    describe_dynamic,
    program_dynamic_shapes,
    rebuild_hierarchy,
    region_path,
)
from ._meta import inside, split_call_name
from ._program import as_inputs, as_program, not_a_program
from .checks._eager_calls import call_differences
from .checks.compare import Comparison, compare
from .checks.verify import VerifyReport, eager_reference, verify
from .errors import (
    ConflictError,
    ExportError,
    GraphSurgeonError,
    SurgeryError,
    VerifyError,
    a_type,
)
from .export import export, quiet_export
from .partition import ModuleTree, call_name, module_tree, program_index
from .patterns.region import RegionPlan, example_inputs, region_of
from .rewrite import (
    FUSE,
    Diff,
    Region,
    WarmUp,
    as_module,
    rewrite,
    safe_path,
    swap_info,
    waiting_for_rewrite,
    warm_up,
)

__all__ = ["Diff", "HistoryEntry", "Surgery"]


@dataclass(frozen=True)
class HistoryEntry:
    """One step of a Surgery: ``swap`` of ``name`` by a module of type ``replacement_type``, or
    ``fuse`` of ``name`` (``replacement_type`` is then ``"fused"``)."""

    action: str
    name: str
    replacement_type: str

    def __str__(self) -> str:
        return f"{self.action} {self.name} -> {self.replacement_type}"


class Surgery:
    """Swap modules of an exported program step by step, with undo/redo and checks.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> s = gs.Surgery.from_model(model, (x,))
        >>> s.swap("1", torch.nn.GELU()).swap("0", torch.nn.Linear(4, 4))
        <Surgery: 2 swaps (1, 0), 2 steps>
        >>> s.undo().history[-1].name
        '1'
        >>> bool(s.verify())
        True

    Only the last :attr:`keep_built` states used keep their built :attr:`module`; an older
    one is built again when it is needed (see the module docstring).
    """

    #: How many states keep their built GraphModule (the current one and the last ones used,
    #: so undo/redo between neighbours is instant); None keeps every state built.
    keep_built: int | None = 3

    def __init__(
        self,
        program: ExportedProgram,
        *,
        model: torch.nn.Module | None = None,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ):
        if not isinstance(program, ExportedProgram):
            raise not_a_program(program, "Surgery")
        self.program = program
        self.model = model
        # the example inputs, read once as every entry point reads inputs; each verb runs on
        # them when given none (graphsurgeon._program.as_program falls back on them)
        if args is None:
            self.args, self.kwargs = None, as_inputs((), kwargs, verb="Surgery")[1]
        else:
            self.args, self.kwargs = as_inputs(args, kwargs, verb="Surgery")
        # Each state is the full mapping {name: replacement, or FUSE}; the history lists how
        # it was reached.
        self._states: list[dict[str, Any]] = [{}]
        self._steps: list[HistoryEntry] = []
        self._position = 0
        # state -> its built module, least recently used first (at most keep_built of them)
        self._built: OrderedDict[int, GraphModule] = OrderedDict()
        # state -> the buffers its module had changed (BatchNorm statistics, caches) when it
        # was dropped from _built: a rebuilt module starts from them, not from the program's
        self._changed_buffers: dict[int, dict[str, torch.Tensor]] = {}
        self._verified: dict[int, VerifyReport] = {}  # state -> its last verify report
        self._version = 0  # bumped by every change of the current state
        # every region of ops a replace made a call (by name): facts about the program, kept for
        # every state (a state's mapping says which are replaced)
        self._regions: dict[str, Region] = {}
        self._rebuilt: torch.nn.Module | None = None  # the program's own modules, for original()
        # a background build of the current state (build_in_background), and what it built
        self._warming: WarmUp | None = None
        self._warmed: tuple[dict[str, Any], dict[str, Region], GraphModule] | None = None
        # the next state built ahead of the swap that makes it (prepare_swap: the widget's
        # swap set up in its picker), taken by that swap while nothing it reads changed
        self._ahead: _Ahead | None = None

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None = None,
        **export_options: Any,
    ) -> Surgery:
        """Export ``model`` with :func:`graphsurgeon.export` and start a Surgery on it.

        The model is kept (not modified) as the eager reference for :meth:`verify`, and the
        example inputs as the default inputs of :meth:`verify` and :meth:`export`.
        """
        args, kwargs = as_inputs(args, kwargs, verb="Surgery.from_model")
        program = export(model, args, kwargs, **export_options)
        return cls(program, model=model, args=args, kwargs=kwargs)

    # -- state ----------------------------------------------------------------------------

    @property
    def replacements(self) -> dict[str, torch.nn.Module]:
        """The swaps in force: ``{name: replacement}``, in the order they were made."""
        return {n: m for n, m in self._states[self._position].items() if m is not FUSE}

    @property
    def fused(self) -> tuple[str, ...]:
        """The names fused so far (in force), in the order they were fused."""
        return tuple(n for n, m in self._states[self._position].items() if m is FUSE)

    @property
    def history(self) -> tuple[HistoryEntry, ...]:
        """The steps that led to the current state (undone steps are not listed)."""
        return tuple(self._steps[: self._position])

    @property
    def version(self) -> int:
        """A number that changes whenever the current state changes (a swap, a fuse, undo,
        redo, reset): a view that drew version ``v`` is up to date while ``s.version == v``."""
        return self._version

    @property
    def position(self) -> int:
        """How many of :attr:`steps` are in force (the others were undone and can be redone)."""
        return self._position

    @property
    def steps(self) -> tuple[HistoryEntry, ...]:
        """Every step made, those undone included (after the first :attr:`position`)."""
        return tuple(self._steps)

    @property
    def can_undo(self) -> bool:
        """Whether :meth:`undo` has a step to go back over."""
        return self._position > 0

    @property
    def can_redo(self) -> bool:
        """Whether :meth:`redo` has an undone step to go forward over."""
        return self._position + 1 < len(self._states)

    @property
    def last_verify(self) -> VerifyReport | None:
        """The report of the last :meth:`verify` of the current state, or None."""
        return self._verified.get(self._position)

    def original(self, name: str) -> torch.nn.Module:
        """A copy of module ``name`` as the program has it (``"layers.0.mlp"``, ``"blk@1"``):
        the model's own when the Surgery knows the model, else rebuilt from the program (its
        parameters and buffers, and a graph of its nodes that runs as the program ran it).
        A replacement made from it starts out computing what the original did.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> s = gs.Surgery(gs.export(model, (torch.randn(1, 2),)))
            >>> copied = s.original("0")
            >>> torch.equal(copied.weight, model[0].weight) and copied.weight is not model[0].weight
            True
        """
        fqn = program_index(self.program).resolve(name).fqn  # an unknown name: raises
        if self.model is not None:
            return copy.deepcopy(self.model.get_submodule(fqn))
        if self._rebuilt is None:  # the program's own modules, rebuilt once (slow)
            self._rebuilt, _ = rebuild_hierarchy(self.program, {})
        return copy.deepcopy(self._rebuilt.get_submodule(fqn))

    @property
    def module(self) -> GraphModule:
        """The current program as a runnable GraphModule.

        The same object each time while the state stays among the last :attr:`keep_built`
        used; after that, built again from the state's request (same node names and outputs,
        the buffers as the state left them).
        """
        position = self._position
        if position not in self._built:
            self._take_warmed()  # the program a warm-up built for this state (the widget's)
        module = self._built.get(position)
        if module is None:
            module = rewrite(self.program, self._states[position], regions=self._regions)
            changed = self._changed_buffers.pop(position, {})
            for name, value in changed.items():
                _put_buffer(module, name, value)
            self._keep(position, module)
        else:
            self._built.move_to_end(position)
        return module

    def build_in_background(self, delay: float = 0.0) -> WarmUp | None:
        """Build the current program on a background thread, ``delay`` seconds from now, while
        you do something else: :attr:`module` then takes the program built (if the state is
        still the current one), and the next edit compiles only the code it changes. A
        384-layer program's first build takes about 0.5 s, half of it compiling its code.

        The build pauses while a widget action runs (a click is never slowed by it); anything
        that needs the program meanwhile waits for it to finish. Asked again before the
        delay is over, it begins ``delay`` from then instead. :class:`SurgeryWidget` asks for
        one when it opens and after each action, so that it begins once the clicks pause.

        Returns:
            The thread (``.join()`` waits for it), or None when the current program is built
            already (or built in the background, waiting to be taken).

        Example:
            >>> import torch, graphsurgeon as gs
            >>> s = gs.Surgery(gs.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),)))
            >>> s.build_in_background().join()
            >>> s.module is s.module, s.build_in_background()
            (True, None)
        """
        if self._position in self._built:
            return None
        state = self._states[self._position]
        warming, warmed = self._warming, self._warmed
        if warming is not None and not warming.begun:
            warming.cancel()  # begins `delay` from now instead
        elif warming is not None and warming.is_alive():
            return warming  # under way
        elif warmed is not None and warmed[0] is state and warmed[1] == self._regions:
            return None  # built, waiting to be taken
        regions = dict(self._regions)

        def keep(module: GraphModule) -> None:
            # on the warm-up's thread: handed over whole, taken by _warmed_up on this one
            self._warmed = (state, regions, module)

        self._warming = warm_up(self.program, dict(state), regions=regions, delay=delay, keep=keep)
        return self._warming

    def _take_warmed(self) -> None:
        """Keep the program a warm-up built for the current state as its built module (and
        drop one built for another state)."""
        position = self._position
        module = self._warmed_up(None if position in self._built else position)
        if module is not None:
            for name, value in self._changed_buffers.pop(position, {}).items():
                _put_buffer(module, name, value)
            self._keep(position, module)

    def _warmed_up(self, position: int | None) -> GraphModule | None:
        """The program a warm-up built for state ``position``, if that is what it built (a
        warm-up under way is waited for, one not started yet called off); else None, and
        what it built is dropped (``position`` None: dropped in any case)."""
        warming, self._warming = self._warming, None
        if warming is not None:
            warming.cancel()
            with waiting_for_rewrite():  # a warm-up paused for this very action goes on
                warming.join()
        warmed, self._warmed = self._warmed, None
        if warmed is None:
            return None
        state, regions, module = warmed
        if position is None or state is not self._states[position] or regions != self._regions:
            return None  # built for another state (since undone, or replaced)
        return module

    def _forget_built(self) -> None:
        """Drop every built state (``gs.forget(s)``: its program's graph was edited in place)."""
        self._built.clear()
        self._changed_buffers.clear()
        self._rebuilt = None
        self._warmed_up(None)  # built from the graph as it was: dropped
        self.drop_prepared()

    def _keep(self, position: int, module: GraphModule) -> None:
        """Keep ``module`` as the built state ``position``, dropping the least recently used
        built states beyond :attr:`keep_built` (their changed buffers are kept)."""
        self._built[position] = module
        self._built.move_to_end(position)
        limit = self.keep_built
        while limit is not None and len(self._built) > max(1, limit):
            old_position, old = self._built.popitem(last=False)
            changed = _changed_buffers(self.program, old, self._states[old_position])
            if changed:
                self._changed_buffers[old_position] = changed

    @property
    def tree(self) -> ModuleTree:
        """The module tree of the original program."""
        return module_tree(self.program)

    # -- operations -----------------------------------------------------------------------

    def swap(self, name: str, replacement: torch.nn.Module) -> Surgery:
        """Swap ``name`` (every call of a module, or ``"name@k"`` one call) for ``replacement``.

        Swapping a name again replaces the earlier replacement (or its fusing). So does a later
        request that covers every call an earlier one named: ``s.swap("blk@1", a)`` then
        ``s.swap("blk", b)`` leaves ``{"blk": b}``, every call of ``blk`` running ``b`` (undo
        brings ``a`` back). Requests that overlap otherwise are refused, saying which step holds
        what and what to do: one call of a module swapped as a whole (``"blk"`` then
        ``"blk@1"``), a module inside a fused or swapped one, a module around a swapped or fused
        one. Other errors are those of :func:`graphsurgeon.swap`; after an error the Surgery is
        unchanged.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> class Twice(torch.nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.blk = torch.nn.Linear(2, 2)
            ...     def forward(self, x):
            ...         return self.blk(self.blk(x))
            >>> s = gs.Surgery.from_model(Twice(), (torch.randn(1, 2),))
            >>> list(s.swap("blk@1", torch.nn.Tanh()).swap("blk", torch.nn.ReLU()).replacements)
            ['blk']
        """
        if replacement is FUSE:
            return self.fuse(name)
        return self._change(
            name, replacement, HistoryEntry("swap", name, type(replacement).__name__)
        )

    def fuse(self, name: str) -> Surgery:
        """Fuse ``name``: its nodes become one call of a GraphModule of their own (see
        :func:`graphsurgeon.fuse`); the program computes exactly what it did."""
        return self._change(name, FUSE, HistoryEntry("fuse", name, "fused"))

    def _next_state(self, name: str, value: Any) -> dict[str, Any]:
        """The state a swap (or fuse: ``value`` FUSE) of ``name`` makes from the current one;
        a request the Surgery refuses raises (the rewrite checks the rest when it builds)."""
        state = dict(self._states[self._position])
        state.pop(name, None)
        for earlier in self._overlapping(state, name, value):
            del state[earlier]  # covered by the new request: it replaces them
        state[name] = value
        return state

    def _change(self, name: str, value: Any, entry: HistoryEntry) -> Surgery:
        state = self._next_state(name, value)
        verb = "fuse" if value is FUSE else "swap"
        # a warm-up's program of the state left is kept as that state's (an undo to it is
        # then immediate); dropped here, its many cycles would cost the collector a pass
        self._take_warmed()
        module = self._take_ahead(state)
        if module is None:  # raises before anything changes
            module = rewrite(self.program, state, verb=verb, regions=self._regions)
        return self._commit(state, entry, module)

    def prepare_swap(
        self,
        name: str,
        replacement: torch.nn.Module,
        *,
        delay: float = 0.0,
        hold: Callable[[], contextlib.AbstractContextManager] | None = None,
        then: Callable[[GraphModule], Any] | None = None,
    ) -> WarmUp | None:
        """Build, on a background thread ``delay`` seconds from now, the program that
        ``swap(name, replacement)`` would make: that swap then takes the program built
        instead of building it, so it costs what follows the build (a picture, in a widget).
        The :class:`SurgeryWidget` asks for it once a replacement is chosen for the selection
        (its Swap button is then ready): a swap at 384 layers takes 0.2 s to build. The build
        pauses while a widget action runs, as :meth:`build_in_background`'s does; it runs
        inside ``hold()`` when given (a context made on its thread, such as the widget's hold
        of the collector: see :func:`graphsurgeon.rewrite.warm_up`), and ``then(program)``
        after it, on that thread (the widget works out what the swap's picture reads:
        :func:`graphsurgeon.render.analyze`); a failure there is dropped.

        The swap takes it only if it makes the same state (the same requests, the same
        replacement objects), and nothing the build read of the replacements has changed since
        (their modules, their parameters and buffers, and those tensors' in-place versions):
        else it builds as it would have. One swap is prepared at a time: preparing another
        drops the last, and so do every change of the state and :meth:`drop_prepared`. A
        request the Surgery refuses prepares nothing; one the build refuses fails quietly on
        its thread, and the swap raises as it would have.

        Returns:
            The thread (``.join()`` waits for it), or None when nothing is prepared (refused,
            or no change: the swap is in force already).

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> s = gs.Surgery(gs.export(model, (torch.randn(1, 2),)))
            >>> gelu = torch.nn.GELU()
            >>> s.prepare_swap("1", gelu).join()
            >>> list(s.swap("1", gelu).replacements), s.prepare_swap("1", gelu)
            (['1'], None)
        """
        try:
            state = self._next_state(name, replacement)
        except GraphSurgeonError:
            self.drop_prepared()
            return None
        if _same_requests(state, self._states[self._position]):
            self.drop_prepared()  # no change: the swap just made, its choice still standing
            return None
        ahead = self._ahead
        if ahead is not None and ahead.made_for(state, self._regions):
            return ahead.thread  # asked again (each action asks): under way, or built
        self.drop_prepared()
        ahead = _Ahead(state, dict(self._regions))

        def keep(module: GraphModule) -> None:
            # on the build's thread; read once the thread is done
            if then is not None:
                with contextlib.suppress(Exception):  # a picture's business, not the swap's
                    then(module)
            ahead.module = module

        ahead.thread = warm_up(
            self.program, dict(state), regions=ahead.regions, delay=delay, keep=keep, hold=hold
        )
        self._ahead = ahead
        return ahead.thread

    def _take_ahead(self, state: Mapping[str, Any]) -> GraphModule | None:
        """The program built ahead for ``state`` (:meth:`prepare_swap`), when that is the
        state it was built for and nothing the build read has changed since (the
        replacements' modules, parameters and buffers, and those tensors' in-place versions);
        a build under way is waited for. Else None, and the build is dropped."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        thread = ahead.thread
        if not ahead.made_for(state, self._regions):
            thread.cancel()  # (one under way finishes on its own; what it builds is dropped)
            return None
        thread.cancel()  # not begun: called off; begun: waited for (paused, it goes on)
        with waiting_for_rewrite():
            thread.join()
        if ahead.module is None or ahead.fingerprint != _fingerprint(state):
            return None
        return ahead.module

    def drop_prepared(self) -> None:
        """Forget the swap :meth:`prepare_swap` built or is building (one not begun is called
        off; one under way finishes on its own, and what it built is dropped)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.thread.cancel()

    def _commit(self, state: dict[str, Any], entry: HistoryEntry, module: GraphModule) -> Surgery:
        """Make ``state`` (built as ``module``) the next step, dropping any undone ones."""
        self.drop_prepared()
        position = self._position
        del self._states[position + 1 :]
        del self._steps[position:]
        for later in [k for k in self._built if k > position]:
            del self._built[later]
        self._changed_buffers = {k: v for k, v in self._changed_buffers.items() if k <= position}
        self._verified = {k: v for k, v in self._verified.items() if k <= position}
        self._states.append(state)
        self._steps.append(entry)
        self._position += 1
        self._version += 1
        self._keep(self._position, module)
        return self

    def replace(
        self,
        pattern: Any,
        replacement: Any,
        example_args: tuple[Any, ...],
        example_kwargs: Mapping[str, Any] | None = None,
        *,
        matches: Any = None,
    ) -> Surgery:
        """Replace every match of ``pattern`` (or the ``matches=`` chosen: indices into
        ``gs.find(...)``'s matches, or those Match objects) by one call of ``replacement``, in one
        step: a pattern of ops that is no module's (Hugging Face's ``apply_rotary_pos_emb``, an
        activation written inline) swapped as a module is.

        ``pattern`` is a function or a module, traced on ``example_args`` (see
        :func:`graphsurgeon.find`: a pattern traced at one shape matches at others);
        ``replacement`` is a module, or a plain function, whose forward takes the pattern's
        arguments and returns what the pattern returns (a function runs as a module calling
        it, named after it). Each match becomes a call named ``"<pattern>:<the module call it
        is in>"`` (``rope:layers.0.self_attn``), checked at the call like a swap, drawn,
        stepped into, compared and exported again like one; undo takes the whole step back.
        A match whose values are read elsewhere than its results, or that is not convex, is
        one of ``find``'s near-misses, never replaced. Raises :class:`SurgeryError` when
        nothing matches (saying what came close).

        Example:
            >>> import torch, graphsurgeon as gs
            >>> class Block(torch.nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.lin = torch.nn.Linear(4, 4)
            ...     def forward(self, x):
            ...         h = self.lin(x)
            ...         return h * torch.sigmoid(h)  # SiLU, written inline
            >>> model = torch.nn.Sequential(Block(), Block())
            >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),))
            >>> def silu(x):
            ...     return x * torch.sigmoid(x)
            >>> s.replace(silu, torch.nn.SiLU(), (torch.randn(3, 4),)).history[-1].name
            'silu (2 matches)'
            >>> list(s.replacements)
            ['silu:0', 'silu:1']
        """
        from .patterns.find import find

        example_args, example_kwargs = as_inputs(
            example_args, example_kwargs, verb="replace", names=("example_args", "example_kwargs")
        )
        found = find(self.program, pattern, example_args, example_kwargs)
        chosen = _chosen_matches(found, matches)
        label = found.pattern  # the pattern's name, as find decides it
        if not chosen:
            near = "; ".join(f"{m.call or '(top)'}: {m.reason}" for m in found.near_misses[:3])
            raise SurgeryError(
                f"replace: {label!r} occurs nowhere in the program"
                + (f" (near misses: {near})" if near else "")
                + ". gs.find(program, pattern, example_args) lists what it looked for."
            )
        replacement = as_module(label, replacement)
        regions = _regions_of(found, chosen, label, pattern, example_args, example_kwargs)
        state = dict(self._states[self._position])
        for name in regions:
            state.pop(name, None)
            state[name] = replacement
        known = {**self._regions, **regions}
        module = rewrite(self.program, state, regions=known)  # raises before anything changes
        self._regions = known
        count = f"{len(regions)} match{'es' if len(regions) != 1 else ''}"
        entry = HistoryEntry("replace", f"{label} ({count})", type(replacement).__name__)
        return self._commit(state, entry, module)

    @property
    def regions(self) -> dict[str, Region]:
        """The regions of ops a :meth:`replace` made calls, that are replaced now, by name."""
        state = self._states[self._position]
        return {name: region for name, region in self._regions.items() if name in state}

    def region_signature(self, nodes: Any, name: str | None = None) -> RegionPlan:
        """What the ops ``nodes`` (node names of the program, as the picture names them) would
        be as one call: its name, the values it takes and returns, and ``call_text``, the call
        a replacement must accept (``(linear: f32[2, 4]) → f32[2, 4]``). Raises
        :class:`SurgeryError` saying which node is in the way when they cannot be one call (not
        convex, a part of a module call, a value that is no tensor). See
        :mod:`graphsurgeon.patterns.region`."""
        # a name only undone steps used is free again: the next change drops them from redo
        taken = {n for state in self._states[: self._position + 1] for n in state}
        return region_of(
            program_index(self.program), nodes, name, taken=taken & self._regions.keys()
        )

    def fuse_region(self, nodes: Any, name: str | None = None) -> Surgery:
        """Make the ops ``nodes`` one call that runs the program's own nodes (a fused region,
        drawn as one box, stepped into like a fused module call); one step, undone by
        :meth:`undo`. Named ``name``, by default ``"region:<the call it sits in>"``."""
        plan = self.region_signature(nodes, name)
        return self._region_step(plan, FUSE, HistoryEntry("fuse", plan.region.name, "fused"))

    def swap_region(self, nodes: Any, replacement: Any, name: str | None = None) -> Surgery:
        """Replace the ops ``nodes`` by one call of ``replacement`` (a module, or a plain
        function), whose forward takes the region's inputs and returns its results (:meth:`region_signature` says which): checked
        at the call, verified, drawn, stepped into and compared as a swapped module is.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
            >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),))
            >>> s.swap_region(["tanh"], torch.nn.Sigmoid()).history[-1].name
            'region:1'
        """
        plan = self.region_signature(nodes, name)
        replacement = as_module(plan.region.name, replacement)
        entry = HistoryEntry("swap", plan.region.name, type(replacement).__name__)
        return self._region_step(plan, replacement, entry)

    def find_similar(self, nodes: Any) -> Any:
        """Where else the program computes what the ops ``nodes`` compute: the region traced as
        a pattern (its own nodes, with the program's weights) and looked for with
        :func:`graphsurgeon.find`; the region itself is one of the matches. Sizes are those the
        region ran with, so identical layers match; near-misses say what differs."""
        from .patterns.find import find
        from .rewrite import cut_call
        from .rewrite._plan import region_partition

        index = program_index(self.program)
        plan = self.region_signature(nodes)
        pattern = cut_call(index, plan.region.name, partition=region_partition(index, plan.region))
        return find(self.program, pattern, example_inputs(index, plan))

    def _region_step(self, plan: RegionPlan, value: Any, entry: HistoryEntry) -> Surgery:
        region = plan.region
        state = dict(self._states[self._position])
        index = program_index(self.program)
        for other, other_value in state.items():
            calls = _calls(index, other) if other not in self._regions else None
            held = {n.name for c in calls or () for n in index.call_nodes.get(c, ())}
            if other in self._regions:
                held = set(self._regions[other].nodes)
            if held & set(region.nodes):
                step, undo = self._step_text(other, {})
                verb = "fuse" if value is FUSE else "swap"
                raise ConflictError(
                    f"cannot {verb} the region {region.name!r}: its ops are in {other!r}, "
                    f"{_what(other_value)} in {step}, so the program does not run them as they "
                    f"were. {undo[0].upper()}{undo[1:]} first: that frees them."
                )
        state[region.name] = value
        known = {**self._regions, region.name: region}
        module = rewrite(self.program, state, regions=known)  # raises before anything changes
        self._regions = known
        return self._commit(state, entry, module)

    def _overlapping(self, state: Mapping[str, Any], name: str, value: Any) -> list[str]:
        """The requests of ``state`` that the new request ``name`` covers entirely (calls of
        the same module: it replaces them). Any other overlap raises a ConflictError in the
        Surgery's words: which step made the request in the way, and what to do. Names that do
        not resolve are left to the rewrite pass, which says what is wrong with them."""
        if not isinstance(name, str):
            return []  # the rewrite pass says what a name must be
        index = program_index(self.program)
        calls = _calls(index, name)
        if calls is None:
            return []
        made = {step.name: i for i, step in enumerate(self.history, start=1)}
        fqn = split_call_name(name)[0]
        nodes = {n for c in calls for n in index.call_nodes.get(c, ())}
        covered = []
        for other, other_value in state.items():
            region = self._regions.get(other)
            if region is not None:
                if {n.name for n in nodes} & set(region.nodes):
                    raise ConflictError(self._holds_region(name, value, other, other_value))
                continue
            other_calls = _calls(index, other)
            if other_calls is None:
                continue
            other_fqn = split_call_name(other)[0]
            if fqn == other_fqn:
                if set(other_calls) <= set(calls):
                    covered.append(other)
                elif set(other_calls) & set(calls):
                    raise ConflictError(
                        self._one_call_of_a_whole(name, value, other, other_value, made)
                    )
                continue
            if any(n in nodes for c in other_calls for n in index.call_nodes.get(c, ())):
                step, undo = self._step_text(other, made)
                raise ConflictError(
                    _nested(name, value, fqn, other, other_value, other_fqn, step, undo)
                )
        return covered

    def _step_of(self, name: str) -> int:
        """The step (1-based) that made the request ``name`` in force now, or 0."""
        for step in range(self._position, 0, -1):
            if self._states[step].get(name) is not self._states[step - 1].get(name):
                return step
        return 0

    def _holds_region(self, name: str, value: Any, region: str, region_value: Any) -> str:
        """The message for a module request whose nodes hold a region of ops that a step
        replaced or fused (:meth:`replace`, :meth:`swap_region`, :meth:`fuse_region`)."""
        step, undo = self._step_text(region, {})
        number = self._step_of(region)
        made = f"{step} ({self._steps[number - 1]})" if number else step
        what = "fused" if region_value is FUSE else f"replaced by a {type(region_value).__name__}"
        if value is FUSE:
            return (
                f"cannot fuse {name!r}: the ops of {region!r} in it were {what} in {made}, and a "
                f"fused call runs the program's own ops. {undo[0].upper()}{undo[1:]}: that "
                f"frees {name!r} to be fused."
            )
        return (
            f"cannot swap {name!r}: the ops of {region!r} in it were {what} in {made}, and the "
            f"replacement for {name!r} would run instead of them. Put what {region!r} should "
            f"run inside the replacement for {name!r}, then {undo}: that frees {name!r} to be "
            "swapped."
        )

    def _step_text(self, other: str, made: Mapping[str, int]) -> tuple[str, str]:
        """``("step 2", "undo step 2 (s.undo() 3 times)")``: the step that made the request
        ``other``, and how to go back over it from here."""
        step = made.get(other) or self._step_of(other)
        back = self._position - step + 1
        how = "s.undo()" if back == 1 else f"s.undo() {back} times"
        return f"step {step}", f"undo step {step} ({how})"

    def _one_call_of_a_whole(
        self, name: str, value: Any, other: str, other_value: Any, made: Mapping[str, int]
    ) -> str:
        """The message for one call of a module requested while the whole module is."""
        fqn, _ = split_call_name(name)
        step, undo = self._step_text(other, made)
        calls = [f"{fqn}@{i}" for i in range(len(_calls(program_index(self.program), fqn)))]
        verb = "fuse" if value is FUSE else "swap"
        return (
            f"cannot {verb} {name!r} alone: {other!r} is {_what(other_value)} as a whole in "
            f"{step}, which covers every call of {fqn!r} ({', '.join(map(repr, calls))}). "
            f"To give {name!r} a request of its own, {undo} and request each call on its own "
            f"({' and '.join(map(repr, calls))}); or {verb} {fqn!r} again to change what every "
            "call runs."
        )

    def undo(self) -> Surgery:
        """Go back one step (its module is built again if it was dropped: see
        :attr:`keep_built`)."""
        if self._position == 0:
            raise SurgeryError("nothing to undo: no swap has been made (or all are undone)")
        self._position -= 1
        self._version += 1
        self.drop_prepared()
        return self

    def redo(self) -> Surgery:
        """Go forward again over a step that :meth:`undo` went back over."""
        if self._position + 1 >= len(self._states):
            raise SurgeryError("nothing to redo: no step was undone since the last swap")
        self._position += 1
        self._version += 1
        self.drop_prepared()
        return self

    def reset(self) -> Surgery:
        """Back to the original program; the history is kept, so :meth:`redo` still works."""
        if self._position:
            self._position = 0
            self._version += 1
            self.drop_prepared()
        return self

    # -- views and checks -----------------------------------------------------------------

    def diff(self) -> Diff:
        """Computation nodes removed, added and kept since the original program (the
        :class:`~graphsurgeon.swap.Diff` the before/after pictures draw too)."""
        return swap_info(self.module).diff

    def verify(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        rtol: float = 1e-5,
        atol: float = 1e-5,
        backward: bool = False,
        grad_outputs: Any = None,
        candidate: Any = None,
    ) -> VerifyReport:
        """Check the current program (or ``candidate``, what was made of it), with two verdicts.

        *Faithful*: with the model known (:meth:`from_model`, or ``model=``), the report is
        against a deep copy of it with the same replacements set: is the swapped program what
        eager PyTorch would compute with those modules? *Equal to the original*: its
        ``.original`` is the same program against the original model, untouched: does it still
        compute what the original did (a buggy replacement is faithful, and differs)? Without
        the model, the report is against the original program only (``.original`` is None).
        The report is truthy when the first verdict holds. ``candidate``: what ships instead
        of :attr:`module`, such as the AOTInductor package of :meth:`export`'s program
        (:func:`graphsurgeon.deploy.package`), checked with the same two verdicts; its report
        is not kept as this state's :attr:`last_verify`.

        With ``backward=True`` both verdicts also compare the gradients of every floating input
        and parameter, from the same upstream gradients (``grad_outputs``, or seeded ones), as
        :func:`graphsurgeon.verify` does: the program's parameters are named as the model's
        (``"grad of layers.3.norm.weight"``), and a replacement's parameter that the original
        module names otherwise is not compared against the original (the notes say which).

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),)).swap("1", torch.nn.GELU())
            >>> report = s.verify(backward=True)
            >>> bool(report), report.gradients_ok, bool(report.original), len(report.gradients)
            (True, True, False, 3)
        """
        args, kwargs = as_program(self, args, kwargs, verb="verify").inputs(error=VerifyError)
        grads = {"backward": backward, "grad_outputs": grad_outputs}
        replacements = self.replacements  # fused calls and regions compute what the original did
        module = self.module if candidate is None else candidate
        # a swapped region of ops is no module of the model: eager has nowhere to hold its
        # replacement (a fused region runs the program's own ops and changes nothing)
        swapped_regions = [self._regions[n] for n in replacements if n in self._regions]
        if self.model is None or swapped_regions:
            # no eager model, or swapped regions of ops: nothing eager holds the replacement
            # where the program runs it, so the one reference is the original
            reference = self.program if self.model is None else self.model
            report = verify(reference, module, args, kwargs, rtol=rtol, atol=atol, **grads)
            against = "the original program" if self.model is None else "the original model"
            if self.model is not None:
                what = (
                    "swapped regions of ops"
                    if all(r.type_name == "region" for r in swapped_regions)
                    else "replaced patterns of ops"
                )
                against += (
                    f" ({what} have no eager module to check the swap with: patch the "
                    "function in the model and gs.verify against it)"
                )
            report = dataclasses.replace(report, against=against)
        else:
            reference = eager_reference(self.model, replacements)
            report = verify(reference, module, args, kwargs, rtol=rtol, atol=atol, **grads)
            original = (
                verify(self.model, module, args, kwargs, rtol=rtol, atol=atol, **grads)
                if replacements
                else report
            )
            differences = ()
            if not report.structure_problem and not report.outputs_ok:
                # the replacement may be right and eager call it otherwise (T5 passes its
                # self-attention mask=None; the program, the mask it made)
                differences = call_differences(self.program, self.model, replacements, args, kwargs)
            report = dataclasses.replace(
                report,
                against="the eager model with the same replacements",
                original=dataclasses.replace(original, against="the original model"),
                call_differences=differences,
            )
        if candidate is None:
            self._verified[self._position] = report
        return report

    def compare(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        rtol: float = 1e-5,
        atol: float = 1e-5,
        backward: bool = False,
    ) -> Comparison:
        """Compare each swapped call of the current program with the original module's nodes,
        on the inputs the call receives (:func:`graphsurgeon.compare`): where :meth:`verify`
        says the swaps are faithful, this says whether each replacement computes what it
        replaced. With ``backward=True``, each call's gradients too, from the upstream gradient
        the swapped program's backward gives its outputs (``CallComparison.backward_ok``)."""
        args, kwargs = as_program(self, args, kwargs, verb="compare").inputs(error=SurgeryError)
        return compare(
            self.program, self.module, args, kwargs, rtol=rtol, atol=atol, backward=backward
        )

    def bisect(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        rtol: float = 1e-5,
        atol: float = 1e-5,
        backward: bool = False,
        grad_outputs: Any = None,
    ) -> Any:
        """The smallest set of this Surgery's swaps that explains its mismatch against the
        original program: a :class:`~graphsurgeon.checks.bisect.Bisection` with ``.culprits`` (in
        graph order), ``.runs`` and the log of runs (:func:`graphsurgeon.checks.bisect.bisect` says
        how, and what it guarantees). With ``backward=True`` a set of swaps mismatches when its
        outputs or its gradients differ from the original's (a wrong hand-written backward),
        every run backward from ``grad_outputs`` (as for :meth:`verify`) or seeded ones.
        The Surgery is not changed."""
        from .checks.bisect import bisect

        return bisect(
            self,
            args,
            kwargs,
            rtol=rtol,
            atol=atol,
            backward=backward,
            grad_outputs=grad_outputs,
        )

    def export(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **export_options: Any,
    ) -> ExportedProgram:
        """The current program exported again, every module call signature preserved, so it
        can be partitioned, swapped and drawn like the original.

        torch does not preserve call signatures when it exports a flat GraphModule (such as
        :attr:`module`), so this exports the program's module hierarchy instead, rebuilt from
        the program's own graph: one module per module of the program, holding its parameters
        and buffers (copies: the program is not touched) and running the nodes of its calls,
        called by its parent with the arguments the program recorded; each replacement is set
        at its name. The re-exported program computes what :attr:`module` computes; fused
        calls are a view and are not kept. Its module tree has the original modules' types, and
        the replacements' own submodules can be swapped in turn.

        Args:
            args: example positional inputs, as for the original model (default: those
                given to :meth:`from_model`, or as ``args=``).
            kwargs: example keyword inputs (default: those given with them).
            export_options: passed to :func:`graphsurgeon.export`. ``dynamic_shapes`` is given
                as for the original model's forward (``({1: Dim("t")},)``); without it the
                program's own dynamic sizes are kept, with their ranges. Pass
                ``dynamic_shapes=None`` for a program with static sizes.

        torch.export's own warnings, logs and printed tracebacks are kept out of the output
        while it runs; a failure is the one message of the error raised.

        Raises:
            SurgeryError: no inputs to export with, a swap of a single call (``"name@1"``),
                a TorchScript replacement (``torch.jit.script(module)``), or one holding
                torch.ao's packed quantized weights (``quantize_dynamic``), which torch.export
                cannot trace.
            ExportError: torch.export failed on the rebuilt hierarchy (the cause chained);
                the message names the replacement it failed in, when it can tell.

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),))
            >>> again = s.swap("1", torch.nn.GELU()).export()
            >>> gs.module_tree(again)["1"].type_name, gs.module_tree(again)["1"].swappable
            ('GELU', True)
        """
        args, kwargs = as_program(self, args, kwargs, verb="export").inputs(error=SurgeryError)
        replacements = self.replacements
        single_calls = [name for name in replacements if split_call_name(name)[1] is not None]
        if single_calls:
            raise SurgeryError(
                f"cannot export again with {single_calls[0]!r} swapped: it swaps one call of a "
                "module, and an exported program records one module per name. Swap every call "
                f"of {split_call_name(single_calls[0])[0]!r} instead, or export the flat "
                "program with torch.export.export(s.module, args) (its module signatures are "
                "then not preserved, so it cannot be swapped again)."
            )
        untraceable = _untraceable_in(replacements)
        if untraceable is not None:
            name, path, module, kind = untraceable
            raise SurgeryError(_untraceable_message(name, path, module, kind, replacements[name]))
        regions = self.regions
        hierarchy, inlined = rebuild_hierarchy(self.program, replacements, regions)
        kept = "dynamic_shapes" not in export_options
        if kept:
            export_options["dynamic_shapes"] = program_dynamic_shapes(self.program)
        try:
            # torch.export logs warnings (also about the call counts the rebuilt modules keep)
            # and prints whole tracebacks of what fails: the error below says it in one message
            with quiet_export():
                program = export(hierarchy, args, kwargs, **export_options)
        except ExportError as error:
            text = str(error).replace(f" on {type(hierarchy).__name__}:", ":", 1).rstrip(".")
            where = _failing_replacement(error, replacements)
            if where is not None:
                text = text.replace("torch.export failed:", f"torch.export failed in {where}:", 1)
            hint = ""
            if kept and export_options["dynamic_shapes"] is not None:
                hint = (
                    f". The program has dynamic sizes ({describe_dynamic(self.program)}), "
                    "which export() keeps unless told otherwise: if a replacement makes one of "
                    "them static, pass dynamic_shapes=... as for the original model's forward, "
                    "or dynamic_shapes=None for a program with static sizes"
                )
            raise ExportError(f"export() could not export the program again: {text}{hint}") from (
                error
            )
        placed = {
            region_path(regions[n]) if n in regions else n: m for n, m in replacements.items()
        }
        carry_module_types(self.program, program, placed, inlined)
        return program

    def widget(self, **options: Any) -> Any:
        """The interactive app on this Surgery: ``gs.SurgeryWidget(self, **options)``."""
        from .widget import SurgeryWidget

        return SurgeryWidget(self, **options)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        """The current program drawn against the original (removed nodes greyed, each
        replacement one box), the history with the undone steps greyed, and the last verify
        of this state."""
        from . import display as d
        from .drawing import draw
        from .errors import MissingDependencyError

        swaps, fused = self.replacements, self.fused
        badges = [d.badge(f"{len(swaps)} swap{'s' if len(swaps) != 1 else ''}", "info")]
        if fused:
            badges.append(d.badge(f"{len(fused)} fused", "info"))
        body = f'<div class="gs-title">Surgery {" ".join(badges)}</div>'
        body += d.history_table(self._steps, self._position)  # the widget's panel's too
        report = self._verified.get(self._position)
        if report is not None:
            body += report._repr_html_()
        try:
            picture = draw(self, diff="merged" if swaps else None)._repr_html_()
        except MissingDependencyError as missing:
            picture = f'<div class="gs-muted">{d.escape(missing)}</div>'
        return d.bundle(body + picture, repr(self), include, exclude)

    def __repr__(self) -> str:
        swaps, fused = self.replacements, self.fused
        count = len(swaps)
        text = f"<Surgery: {count} swap{'s' if count != 1 else ''} ({', '.join(swaps) or 'none'})"
        if fused:
            text += f", {len(fused)} fused ({', '.join(fused)})"
        return text + f", {self._position} step{'s' if self._position != 1 else ''}>"


# -- helpers ------------------------------------------------------------------------------------


def _nested(
    name: str,
    value: Any,
    fqn: str,
    other: str,
    other_value: Any,
    other_fqn: str,
    step: str,
    undo: str,
) -> str:
    """The message for a request whose nodes overlap an earlier request of another module:
    inside it, around it, or sharing nodes with it (``step``, ``undo``: the step that made
    the other request, and how to go back over it, as :meth:`Surgery._step_text` says)."""
    verb = "fuse" if value is FUSE else "swap"
    was = f"{_what(other_value)} in {step}"
    if inside(fqn, other_fqn, strictly=True):  # the new request is inside the earlier one
        if other_value is FUSE:
            return (
                f"cannot {verb} {name!r}: it is inside {other!r}, which is fused ({step}): "
                "a fused call runs the program's own nodes as one module, so nothing "
                f"inside it can be {'fused' if value is FUSE else 'swapped'} on its own. "
                f"To {verb} {name!r}, undo the fuse of {other!r} first: {undo}."
            )
        return (
            f"cannot {verb} {name!r}: it is inside {other!r}, which is {was}, so the "
            f"program no longer runs it. Put what {name!r} should run inside the replacement "
            f"for {other!r} and swap {other!r} again, or {undo} and {verb} {name!r} alone."
        )
    if inside(other_fqn, fqn, strictly=True):  # the new request is around the earlier one
        if value is FUSE and other_value is FUSE:
            return (
                f"cannot fuse {name!r}: {other!r} inside it is fused already ({step}), and "
                f"one fused call cannot hold another. To fuse {name!r} (which then holds "
                f"{other!r} too), {undo} first."
            )
        if value is FUSE:
            return (
                f"cannot fuse {name!r}: {other!r} inside it is {was}, and a fused call "
                f"runs the program's own nodes. To fuse {name!r}, {undo} first."
            )
        return (
            f"cannot swap {name!r}: {other!r} inside it is {was}, and the replacement for "
            f"{name!r} would run instead of it. Put what {other!r} should run inside the "
            f"replacement for {name!r}, then {undo} and swap {name!r}."
        )
    return (
        f"cannot {verb} {name!r}: it shares nodes with {other!r}, {was}. Request only one "
        f"of them: {undo} first, or {verb} another module."
    )


def _calls(index: Any, name: str) -> list[str] | None:
    """The calls request ``name`` covers (``"blk"``: all of them, ``"blk@1"``: one), or None
    when it names none (the rewrite pass says why)."""
    fqn, k = split_call_name(name)
    calls = index.calls_of.get(fqn) if fqn else None
    if not calls:
        return None
    if k is None:
        return list(calls)
    wanted = call_name(fqn, k)
    return [wanted] if wanted in calls else None


def _what(value: Any) -> str:
    """``"fused"``, or ``"swapped for a Linear"``."""
    return "fused" if value is FUSE else f"swapped for a {type(value).__name__}"


def _program_buffers(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """The program's buffers, by the attribute path a rewritten module holds its copy at."""
    buffers = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "BUFFER":
            source = program.constants if spec.persistent is False else program.state_dict
            buffers[safe_path(spec.target)] = source[spec.target]
    return buffers


def _changed_buffers(
    program: ExportedProgram, module: GraphModule, state: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """The buffers of ``module`` (the rewrite of ``program`` with ``state``) whose values are
    no longer the program's: running it wrote them (BatchNorm statistics in training mode, a
    cache). A buffer that cannot be matched to one of the program's is counted as changed. The
    replacements' own buffers are not the module's: they stay with the replacements."""
    original = _program_buffers(program)
    theirs = {id(b) for r in state.values() if r is not FUSE for b in r.buffers()}
    changed: dict[str, torch.Tensor] = {}
    for name, value in module.named_buffers():
        if id(value) in theirs:
            continue
        before = original.get(name)
        same = (
            before is not None
            and before.shape == value.shape
            and before.dtype == value.dtype
            and torch.equal(before, value)
        )
        if not same:
            changed[name] = value
    return changed


def _put_buffer(module: GraphModule, name: str, value: torch.Tensor) -> None:
    """Give ``module``'s buffer ``name`` the value ``value`` (in place, so that every part of
    the module that shares that buffer sees it)."""
    try:
        current = module.get_buffer(name)
    except AttributeError:
        return  # a module built from the same request has the same buffers; never here
    if current.shape == value.shape and current.dtype == value.dtype:
        with torch.no_grad():
            current.copy_(value)
    else:  # forward gave it another shape: the module holds that tensor now
        owner, _, leaf = name.rpartition(".")
        module.get_submodule(owner).register_buffer(leaf, value)


def _untraceable_in(
    replacements: Mapping[str, torch.nn.Module],
) -> tuple[str, str, torch.nn.Module, str] | None:
    """The first replacement holding what torch.export cannot trace: ``(call name, path of the
    module, that module, "script" | "packed")``. A TorchScript module; or a module whose state
    is a TorchScript object, as the packed weights of torch.ao's quantized modules
    (``quantize_dynamic``'s ``DynamicQuantizedLinear``), which run eagerly but do not export."""
    for name, replacement in replacements.items():
        for sub, module in replacement.named_modules(remove_duplicate=False):
            path = f"{name}.{sub}" if sub else name
            if isinstance(module, torch.jit.ScriptModule):
                return name, path, module, "script"
            if any(isinstance(v, torch.ScriptObject) for v in vars(module).values()):
                # name the module the user made (the quantized Linear), not its holder
                owner = sub.rpartition(".")[0] if sub else ""
                owner_path = f"{name}.{owner}" if owner else name
                return name, owner_path, replacement.get_submodule(owner), "packed"
    return None


def _untraceable_message(
    name: str, path: str, module: torch.nn.Module, kind: str, replacement: torch.nn.Module
) -> str:
    """Why a replacement cannot be exported again, and what to do."""
    if kind == "script":
        origin = getattr(module, "original_name", "") or type(module).__name__
        what, detail, cause = "a TorchScript module", f" (scripted {origin})", "TorchScript"
        advice = (
            f"Swap {name!r} for the eager module it was made from (before torch.jit.script or "
            "torch.jit.trace) and export again"
        )
    else:
        origin = f"{type(module).__module__}.{type(module).__name__}"
        what = "a module whose weights are packed in a TorchScript object"
        detail = f" ({origin})"
        cause = "such packed weights (torch.ao's quantized modules run eagerly, not in export)"
        advice = (
            "Quantize with plain tensors instead (int8 weights and scales as buffers, computed "
            "with torch._weight_int8pack_mm or dequantized in forward; or torchao's quantize_) "
            "and export again"
        )
    where = (
        f"{name!r} is swapped for {what}{detail}"
        if path == name
        else f"the replacement for {name!r} ({type(replacement).__name__}) holds {what} at "
        f"{path!r}{detail}"
    )
    return (
        f"cannot export again: {where}, and torch.export cannot trace {cause}. {advice}; "
        f"s.module runs the replacement as it is."
    )


def _failing_replacement(
    error: BaseException, replacements: Mapping[str, torch.nn.Module]
) -> str | None:
    """Where a failed export failed inside a replacement: ``"the replacement for 'b' (DataDep,
    at model.py:12)"``, from the innermost frame of the error's tracebacks that runs a
    replacement (or one of its submodules); None when none does (strict export traces the
    replacement's code without running its frames)."""
    owners = {}
    for name, replacement in replacements.items():
        for _, module in replacement.named_modules(remove_duplicate=False):
            owners.setdefault(id(module), (name, replacement))
    found = None
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback = error.__traceback__
        while traceback is not None:
            frame = traceback.tb_frame
            owner = owners.get(id(frame.f_locals.get("self")))
            if owner is not None:
                found = (owner, frame.f_code.co_filename, traceback.tb_lineno)
            traceback = traceback.tb_next
        error = error.__cause__ or error.__context__
    if found is None:
        return None
    (name, replacement), filename, line = found
    return (
        f"the replacement for {name!r} ({type(replacement).__name__}, at "
        f"{os.path.basename(filename)}:{line})"
    )


def _chosen_matches(found: Any, matches: Any) -> list[Any]:
    """The matches ``matches=`` names (None: all): indices into ``found``, or Match objects."""
    if matches is None:
        return list(found.matches)
    if isinstance(matches, int) or not isinstance(matches, (list, tuple, set, frozenset)):
        matches = [matches]
    chosen = []
    for item in matches:
        if isinstance(item, int) and not isinstance(item, bool):
            if not 0 <= item < len(found.matches):
                raise SurgeryError(
                    f"replace: matches={item!r}: there are {len(found.matches)} matches "
                    f"(0 to {len(found.matches) - 1})"
                )
            chosen.append(found.matches[item])
        elif item in found.matches:
            chosen.append(item)
        else:
            raise SurgeryError(
                f"replace: matches= takes indices into gs.find(...)'s matches or those Match "
                f"objects, got {a_type(item)}"
            )
    return sorted(dict.fromkeys(chosen), key=lambda m: m.index)


def _regions_of(
    found: Any,
    chosen: list[Any],
    label: str,
    pattern: Any,
    example_args: tuple,
    example_kwargs: Mapping[str, Any] | None,
) -> dict[str, Region]:
    """Each chosen match as a :class:`Region`: its call signature is the pattern's (the values
    it reads, the constants it was called with; what it returns, as the pattern returns it)."""
    import torch.utils._pytree as pytree
    from torch.export.exported_program import ModuleCallSignature
    from torch.export.graph_signature import ConstantArgument, TensorArgument

    kwargs = dict(example_kwargs or {})
    with torch.no_grad():
        returned = pattern(*example_args, **kwargs)
    flat, in_spec = pytree.tree_flatten((tuple(example_args), kwargs))
    flat_out, out_spec = pytree.tree_flatten(returned)
    try:
        parameters = tuple(_meta.parameter_names(pattern, len(example_args)))
    except (TypeError, ValueError):
        parameters = ()
    if not parameters or parameters[0].startswith("arg"):
        import inspect

        try:
            parameters = tuple(inspect.signature(pattern).parameters)[: len(example_args)]
        except (TypeError, ValueError):
            parameters = ()
    names: dict[str, int] = {}
    regions: dict[str, Region] = {}
    for match in chosen:
        tensors = iter(match.inputs)
        inputs = []
        for value in flat:
            if isinstance(value, torch.Tensor):
                name = next(tensors, None)
                inputs.append(TensorArgument(name=name) if name else ConstantArgument("", None))
            else:
                inputs.append(ConstantArgument(name="", value=value))
        outputs = []
        results = iter(match.outputs)
        for value in flat_out:
            if isinstance(value, torch.Tensor):
                name = next(results, None)
                outputs.append(TensorArgument(name=name) if name else ConstantArgument("", None))
            else:
                outputs.append(ConstantArgument(name="", value=value))
        base = f"{label}:{match.call or '(top)'}"
        count = names.get(base, 0)
        names[base] = count + 1
        name = base if count == 0 else f"{base}#{count}"
        signature = ModuleCallSignature(
            inputs=inputs, outputs=outputs, in_spec=in_spec, out_spec=out_spec
        )
        regions[name] = Region(name, match.call, match.nodes, signature, label, parameters)
    return regions


class _Ahead:
    """A state built ahead of the change that makes it (:meth:`Surgery.prepare_swap`)."""

    __slots__ = ("fingerprint", "module", "regions", "state", "thread")

    def __init__(self, state: dict[str, Any], regions: dict[str, Region]):
        self.state = state
        self.regions = regions
        self.fingerprint = _fingerprint(state)  # what the build reads of the replacements
        self.module: GraphModule | None = None  # set by the build's thread when it is done
        self.thread: WarmUp | None = None

    def made_for(self, state: Mapping[str, Any], regions: Mapping[str, Region]) -> bool:
        """Whether this is the build of ``state`` (the same requests, in the same order, by
        identity) with the same regions: a program is made of those alone, whichever state
        the change was made from."""
        return regions == self.regions and _same_requests(state, self.state)


def _same_requests(state: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether two states hold the same requests, in the same order, by identity."""
    return list(state) == list(other) and all(value is other[n] for n, value in state.items())


def _fingerprint(state: Mapping[str, Any]) -> tuple:
    """What a rewrite of ``state`` reads of its replacements when it builds: their module
    trees (each module, its type, its own ``forward`` if it has one, its mode), and their
    parameters and buffers with each tensor's in-place version. A program built ahead is taken
    only while this is the same: a replacement changed in between (a weight written in place,
    a submodule replaced) is built again."""
    prints = []
    for name, value in state.items():
        if not isinstance(value, torch.nn.Module):
            prints.append((name, id(value)))
            continue
        modules = tuple(
            (path, id(module), type(module), id(module.__dict__.get("forward")), module.training)
            for path, module in value.named_modules(remove_duplicate=False)
        )
        tensors = tuple(
            (path, id(tensor), _version(tensor))
            for path, tensor in (
                *value.named_parameters(remove_duplicate=False),
                *value.named_buffers(remove_duplicate=False),
            )
        )
        prints.append((name, modules, tensors))
    return tuple(prints)


def _version(tensor: torch.Tensor) -> int | None:
    """A tensor's in-place version (None for one that keeps none: an inference tensor)."""
    try:
        return tensor._version
    except RuntimeError:
        return None
