"""Surgery: a program and the swaps made to it, with history, undo/redo, diff and checks.

A Surgery never changes the program it starts from. Its current state is the set of swaps and
fused calls made so far; ``module`` is the program with those (built by the one pass behind
:func:`graphsurgeon.swap` and :func:`graphsurgeon.fuse`, once per state). Every operation either
succeeds or leaves the Surgery exactly as it was.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from ._hierarchy import (
    COUNT_SIDE_EFFECTS,
    carry_module_types,
    describe_dynamic,
    program_dynamic_shapes,
    rebuild_hierarchy,
)
from ._meta import (
    split_call_name,
)
from .compare import Comparison, compare
from .errors import ExportError, SurgeryError, VerifyError, a_type
from .export import export
from .partition import ModuleTree, module_tree
from .swap import FUSE, Diff, rewrite, swap_info
from .verify import VerifyReport, eager_reference, verify

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
    """

    def __init__(
        self,
        program: ExportedProgram,
        *,
        model: torch.nn.Module | None = None,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ):
        if not isinstance(program, ExportedProgram):
            hint = (
                "use gs.Surgery.from_model(model, args) to start from a model"
                if isinstance(program, torch.nn.Module)
                else "export a model with gs.export(model, args) first"
            )
            raise SurgeryError(
                f"Surgery: expected an ExportedProgram, got {a_type(program)}; {hint}"
            )
        self.program = program
        self.model = model
        self.args = args
        self.kwargs = dict(kwargs or {})
        # Each state is the full mapping {name: replacement, or FUSE}; the history lists how
        # it was reached.
        self._states: list[dict[str, Any]] = [{}]
        self._steps: list[HistoryEntry] = []
        self._position = 0
        self._modules: dict[int, GraphModule] = {}
        self._verified: dict[int, VerifyReport] = {}  # state -> its last verify report

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
        if isinstance(args, torch.Tensor):
            args = (args,)  # a lone tensor is the one input; anything else export checks
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
    def module(self) -> GraphModule:
        """The current program as a runnable GraphModule (built once per state)."""
        module = self._modules.get(self._position)
        if module is None:
            module = rewrite(self.program, self._states[self._position])
            self._modules[self._position] = module
        return module

    @property
    def tree(self) -> ModuleTree:
        """The module tree of the original program."""
        return module_tree(self.program)

    # -- operations -----------------------------------------------------------------------

    def swap(self, name: str, replacement: torch.nn.Module) -> Surgery:
        """Swap ``name`` (every call of a module, or ``"name@k"`` one call) for ``replacement``.

        Swapping a name again replaces the earlier replacement (or its fusing). Errors are those
        of :func:`graphsurgeon.swap`; after an error the Surgery is unchanged.
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

    def _change(self, name: str, value: Any, entry: HistoryEntry) -> Surgery:
        state = dict(self._states[self._position])
        state.pop(name, None)
        state[name] = value
        verb = "fuse" if value is FUSE else "swap"
        module = rewrite(self.program, state, verb=verb)  # raises before anything changes
        del self._states[self._position + 1 :]
        del self._steps[self._position :]
        self._modules = {k: v for k, v in self._modules.items() if k <= self._position}
        self._verified = {k: v for k, v in self._verified.items() if k <= self._position}
        self._states.append(state)
        self._steps.append(entry)
        self._position += 1
        self._modules[self._position] = module
        return self

    def undo(self) -> Surgery:
        """Go back one step."""
        if self._position == 0:
            raise SurgeryError("nothing to undo: no swap has been made (or all are undone)")
        self._position -= 1
        return self

    def redo(self) -> Surgery:
        """Go forward again over a step that :meth:`undo` went back over."""
        if self._position + 1 >= len(self._states):
            raise SurgeryError("nothing to redo: no step was undone since the last swap")
        self._position += 1
        return self

    def reset(self) -> Surgery:
        """Back to the original program; the history is kept, so :meth:`redo` still works."""
        self._position = 0
        return self

    # -- views and checks -----------------------------------------------------------------

    def diff(self) -> Diff:
        """Computation nodes removed, added and kept since the original program (the
        :class:`~graphsurgeon.swap.Diff` the before/after pictures draw too)."""
        return swap_info(self.module).diff

    def _inputs(self, args, kwargs, verb: str = "verify") -> tuple[tuple, dict]:
        error = VerifyError if verb == "verify" else SurgeryError
        if args is None:
            if self.args is None:
                raise error(
                    f"{verb}: no inputs: pass the example inputs, as in s.{verb}((x,)) or "
                    f"s.{verb}(args, kwargs), or give them when the Surgery starts: "
                    "gs.Surgery.from_model(model, args) or gs.Surgery(ep, args=(x,))"
                )
            return self.args, dict(self.kwargs) if kwargs is None else dict(kwargs)
        if isinstance(args, torch.Tensor):
            args = (args,)
        elif not isinstance(args, tuple):
            raise error(
                f"args: expected a tuple of the model's positional inputs, got {a_type(args)}; "
                "wrap a single input as (x,)"
            )
        return args, dict(kwargs or {})

    def verify(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        rtol: float = 1e-5,
        atol: float = 1e-5,
    ) -> VerifyReport:
        """Check the current program against its eager reference.

        With the model known (:meth:`from_model`, or ``model=``) the reference is a deep copy
        of it with the same replacements set; without it, the original program (which then
        checks that the replacements compute what the original modules did).
        """
        args, kwargs = self._inputs(args, kwargs)
        replacements = self.replacements  # fused calls compute what the original did
        if self.model is not None:
            reference: Any = eager_reference(self.model, replacements)
        else:
            reference = self.program
        report = verify(reference, self.module, args, kwargs, rtol=rtol, atol=atol)
        self._verified[self._position] = report
        return report

    def compare(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        rtol: float = 1e-5,
        atol: float = 1e-5,
    ) -> Comparison:
        """Compare each swapped call of the current program with the original module's nodes,
        on the inputs the call receives (:func:`graphsurgeon.compare`): where :meth:`verify`
        says the swaps are faithful, this says whether each replacement computes what it
        replaced."""
        args, kwargs = self._inputs(args, kwargs, verb="compare")
        return compare(self.program, self.module, args, kwargs, rtol=rtol, atol=atol)

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
            args, kwargs: example inputs, as for the original model (default: those given to
                :meth:`from_model`, or as ``args=``/``kwargs=``).
            export_options: passed to :func:`graphsurgeon.export`. ``dynamic_shapes`` is given
                as for the original model's forward (``({1: Dim("t")},)``); without it the
                program's own dynamic sizes are kept, with their ranges. Pass
                ``dynamic_shapes=None`` for a program with static sizes.

        Raises:
            SurgeryError: no inputs to export with, or a swap of a single call (``"name@1"``).
            ExportError: torch.export failed on the rebuilt hierarchy (the cause chained).

        Example:
            >>> import torch, graphsurgeon as gs
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),))
            >>> again = s.swap("1", torch.nn.GELU()).export()
            >>> gs.module_tree(again)["1"].type_name, gs.module_tree(again)["1"].swappable
            ('GELU', True)
        """
        args, kwargs = self._inputs(args, kwargs, verb="export")
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
        hierarchy, inlined = rebuild_hierarchy(self.program, replacements)
        kept = "dynamic_shapes" not in export_options
        if kept:
            export_options["dynamic_shapes"] = program_dynamic_shapes(self.program)
        try:
            with warnings.catch_warnings():
                # strict export reports the call counts of modules called several times,
                # which the rebuilt modules keep (and which are back at 0 after every run)
                warnings.filterwarnings("ignore", message=COUNT_SIDE_EFFECTS)
                program = export(hierarchy, args, kwargs, **export_options)
        except ExportError as error:
            text = str(error).replace(f" on {type(hierarchy).__name__}:", ":", 1).rstrip(".")
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
        carry_module_types(self.program, program, replacements, inlined)
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
        rows = []
        for i, step in enumerate(self._steps, start=1):
            undone = i > self._position
            mark = d.badge("undone", "warn") if undone else d.badge(f"step {i}", "ok")
            rows.append(
                [mark, d.escape(step.action), d.escape(step.name), d.escape(step.replacement_type)]
            )
        if rows:
            body += d.table(["", "", "module", "replacement"], rows, raw=range(4))
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
