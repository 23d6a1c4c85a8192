"""A SurgeryWidget's replacement picker: what it offers, what was chosen, and for what.

:class:`Picker` owns the replacement the next swap uses: a copy of the original, identity, a
module or class of the user's namespace, or an expression evaluated there. It belongs to the
selection it was chosen for (or to the region, while one is chosen): selecting another module
clears it, so a second Swap never reuses the first's. Which classes are offered is the
engine's rule (:mod:`graphsurgeon._replacements`: a library's building block is no
replacement), and so is whether one fits the selected call: its forward takes the arguments
the program passes (:func:`graphsurgeon.rewrite.call_misfit`, what a swap refuses by). Those
that fit are offered first.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from .._replacements import is_library_class, required_arguments
from ..errors import WidgetError
from ..partition import program_index, split_call_name
from ..rewrite import call_misfit

__all__ = ["REGION", "Candidate", "Picker", "module_from"]

#: What a replacement chosen for the region (not for a module) is chosen for.
REGION = "<region>"


@dataclass(frozen=True)
class Candidate:
    """A replacement the picker offers: ``key`` identifies it, ``label`` is what is shown;
    ``fits``: whether its forward takes the arguments of the selected call (None: not known,
    no module call selected or its signature not preserved), ``why`` why not."""

    key: str
    label: str
    fits: bool | None = None
    why: str = ""


class _CopyMarker:
    def __repr__(self) -> str:
        return "<a copy of the original>"


#: The choice "a copy of the original": made from the module swapped when it is swapped.
COPY = _CopyMarker()


class Picker:
    """The replacement chosen in a :class:`~graphsurgeon.widget.SurgerySession`.

    State: :attr:`replacement` (the module, :data:`COPY`, or None: nothing chosen),
    :attr:`replacement_label` (what the picker and the preview call it),
    :attr:`replacement_key` (its picker key: ``"copy"``, ``"ns:fast"``, ``"expression"``,
    ``"module"``) and :attr:`replacement_for` (the selection it was chosen for, or
    :data:`REGION`).
    """

    def __init__(self, session: Any, namespace: Callable[[], Mapping[str, Any]]):
        self.session = session
        self._namespace = namespace
        self.replacement: Any = None
        self.replacement_label = ""
        self.replacement_key = ""
        self.replacement_for: str | None = None

    # -- what is offered ------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """What the picker offers for the selection: a copy of the original, identity, then
        the ``nn.Module`` instances of the user's namespace (not the model or one of its own
        submodules) and the classes that can be built (not the model's own classes, nor a
        library's): with no arguments, or from the original module
        (``FusedAttention(original)``, made from ``s.original(name)``). Those whose forward
        fits the selected call come first, in that order, then the others (:meth:`misfit`)."""
        found = [
            Candidate("copy", "a copy of the original"),
            Candidate("identity", "identity (nn.Identity)"),
        ]
        # each one's forward as the swap will call it: bound (a class's: ``self`` left out)
        forwards: dict[str, Any] = {"identity": torch.nn.Identity().forward}
        try:
            namespace = dict(self._namespace())
        except Exception:  # a namespace that cannot be read offers nothing, it is not an error
            namespace = {}
        model = self.session.surgery.model
        own = {id(m) for m in model.modules()} if model is not None else set()
        # the model's own classes: a fresh one is no replacement ("a copy of the original" is)
        own_types = {type(m) for m in model.modules()} if model is not None else set()
        for key, value in namespace.items():
            if key.startswith("_"):
                continue
            if isinstance(value, torch.nn.Module):
                if isinstance(value, torch.fx.GraphModule) or id(value) in own:
                    continue  # a program, or the model (or part of it) being operated on
                found.append(Candidate(f"ns:{key}", f"{key}: {type(value).__name__} (instance)"))
                forwards[f"ns:{key}"] = value.forward
            elif (
                isinstance(value, type)
                and issubclass(value, torch.nn.Module)
                and not is_library_class(value)
                and value not in own_types
            ):
                needed = required_arguments(value)
                if needed == 0:
                    found.append(Candidate(f"ns:{key}", f"{key}: class, built as {key}()"))
                elif needed == 1:
                    found.append(Candidate(f"ns:{key}", f"{key}: class, built as {key}(original)"))
                forwards[f"ns:{key}"] = functools.partial(value.forward, None)
        call = self._selected_call()
        if call is None:
            return found
        judged = [replace(found[0], fits=True)]  # the original's own copy takes its call
        for candidate in found[1:]:
            why = self._misfit(forwards[candidate.key], call)
            judged.append(replace(candidate, fits=why is None, why=why or ""))
        return [c for c in judged if c.fits] + [c for c in judged if not c.fits]

    def misfit(self, module: torch.nn.Module | None = None) -> str | None:
        """Why ``module`` (default: the replacement chosen) cannot take the arguments of the
        selected call, as the preview says it: ``forward(x): too many positional arguments;
        the call passes 2: hidden_states, attention_mask``; None when it can (or when that is
        not known: a copy of the original, no module call selected)."""
        module = self.replacement_module if module is None else module
        call = self._selected_call()
        if module is None or call is None:
            return None
        return self._misfit(module.forward, call)

    def _selected_call(self) -> str | None:
        """The call a replacement chosen now is called as (the selected module's first), or
        None: nothing selected, a region, or a call whose signature was not preserved."""
        session = self.session
        selected = session.selection.selected
        if selected is None or session.regions.region:
            return None
        calls = session.calls_of(selected)
        if not calls or session.partitions[calls[0]].signature is None:
            return None
        return calls[0]

    def _misfit(self, forward: Any, call: str) -> str | None:
        """:func:`call_misfit` of a bound ``forward`` against ``call``, said with the call's
        argument names."""
        in_spec = self.session.partitions[call].signature.in_spec
        problem = call_misfit(forward, in_spec)
        if problem is None:
            return None
        args_spec, kwargs_spec = in_spec.children()
        index = program_index(self.session.surgery.program)
        fqn = split_call_name(call)[0]
        names = [*index.parameter_names(fqn, args_spec.num_children), *kwargs_spec.context]
        count = len(names)
        passes = f"{count} argument{'s' if count != 1 else ''}" + (
            f": {', '.join(names)}" if names else ""
        )
        return f"forward{inspect.signature(forward)}: {problem}; the call passes {passes}"

    def refresh_candidates(self) -> None:
        """Read the namespace again (the picker got the focus: a class defined in a new cell
        is offered at once)."""
        self.session.touch("choice")

    # -- what is chosen -------------------------------------------------------------------

    @property
    def can_swap(self) -> bool:
        """Whether Swap has what it needs: a selection and a replacement chosen for it."""
        selected = self.session.selection.selected
        return (
            selected is not None
            and self.replacement is not None
            and self.replacement_for == selected
        )

    @property
    def swap_ahead(self) -> tuple[str, torch.nn.Module] | None:
        """The swap that Swap would make now, when it is known ahead: ``(the selection, the
        module chosen for it)``. None when Swap is not ready, or when the choice is a copy of
        the original (made when the swap is)."""
        if not self.can_swap or self.replacement is COPY:
            return None
        return self.replacement_for, self.replacement

    @property
    def can_swap_region(self) -> bool:
        """Whether Swap region has what it needs: nodes that can be one call, and a
        replacement chosen for them."""
        return self.session.regions.region_plan is not None and self.replacement_for == REGION

    @property
    def replacement_module(self) -> torch.nn.Module | None:
        """The module chosen, as the preview names its arguments (None: a copy of the
        original, or nothing chosen)."""
        return None if self.replacement is COPY else self.replacement

    def set(self, replacement: Any, label: str, key: str) -> None:
        """Make ``replacement`` the choice (None: nothing chosen), for the region while one is
        chosen, else for the selection."""
        self.replacement, self.replacement_label, self.replacement_key = replacement, label, key
        if replacement is None:
            self.replacement_for = None
        else:
            region = self.session.regions.region
            self.replacement_for = REGION if region else self.session.selection.selected
        self.session.touch("choice")

    def clear(self) -> None:
        """Choose nothing."""
        self.set(None, "", "")

    def keep_for(self, selected: str | None) -> None:
        """The selection became ``selected``: a replacement chosen for another module goes
        (one chosen for the region stays while the region does)."""
        region = self.session.regions.region
        if self.replacement_for != selected and not (self.replacement_for == REGION and region):
            self.clear()

    def _chosen_for(self, verb: str) -> str:
        """What a choice made now is for: the region, else the selection."""
        if self.session.regions.region:
            return REGION
        selected = self.session.selection.selected
        if selected is None:
            raise WidgetError(
                f"{verb}: select a module first (click it, or w.select(name)); a replacement "
                "is chosen for the module it replaces"
            )
        return selected

    def choose(self, key: str | None) -> None:
        """Pick the replacement the next swap of the selection uses: ``"copy"`` (a deep copy
        of the original module), ``"identity"``, or ``"ns:<name>"`` from the namespace (a
        class is built with no arguments, or from the original module); ``""`` (the picker's
        first line) or None chooses nothing. It belongs to the selection: selecting another
        module clears it."""
        if key is None or key == "":
            self.clear()
            return
        chosen_for = self._chosen_for("choose")
        if key == "copy":
            self.set(COPY, "a copy of the original", key)
        elif key == "identity":
            self.set(torch.nn.Identity(), "identity", key)
        elif isinstance(key, str) and key.startswith("ns:"):
            name = key[3:]
            namespace = dict(self._namespace())
            if name not in namespace:
                raise WidgetError(f"the namespace has no {name!r} (any more): pick again")
            module = module_from(namespace[name], name, self._original_of(chosen_for))
            self.set(module, name, key)
        else:
            raise WidgetError(f"choose: unknown replacement {key!r}")

    def choose_expression(self, text: str) -> None:
        """Evaluate ``text`` (``MyAttn(dim=64)``) in the user's namespace: the module (or
        class, then built with no arguments or from the original module) is the replacement
        the next swap of the selection uses."""
        chosen_for = self._chosen_for("expression")
        text = (text or "").strip()
        if not text:
            raise WidgetError("expression: type one, such as MyAttn(dim=64)")
        namespace = dict(self._namespace())
        try:
            value = eval(text, namespace)  # the user's own expression, in their own kernel
        except Exception as error:
            raise WidgetError(
                f"the expression {text!r} failed: {type(error).__name__}: {error}"
            ) from error
        self.set(module_from(value, text, self._original_of(chosen_for)), text, "expression")

    def use(self, module: torch.nn.Module, label: str | None = None) -> None:
        """Make ``module`` the replacement the next swap of the selection uses."""
        self._chosen_for("use")
        label = label or type(module).__name__
        self.set(module_from(module, label), label, "module")

    def for_swap(self, name: str) -> torch.nn.Module:
        """The module a swap of ``name`` uses: the one chosen for it (a copy of the original
        made now); raises when none is, or when it was chosen for another module."""
        if self.replacement is None:
            raise WidgetError(
                f"swap {name!r}: pick a replacement first (the picker, or w.swap(module))"
            )
        if self.replacement_for != name:  # chosen for the selection; swapping another name
            raise WidgetError(
                f"swap {name!r}: the replacement {self.replacement_label!r} was chosen for "
                f"{self.replacement_for!r}, not for {name!r}; select {name!r} and pick one "
                f"for it, or pass it: w.swap(module, name={name!r})"
            )
        if self.replacement is COPY:
            return self.original(name)
        return self.replacement

    def for_region(self, call_text: str) -> torch.nn.Module:
        """The module a swap of the region uses: the one chosen for it."""
        if self.replacement_for != REGION or self.replacement is None:
            raise WidgetError(
                f"swap region: pick the replacement first (the picker); it is called as {call_text}"
            )
        if self.replacement is COPY:
            raise WidgetError(
                "swap region: a region has no module to copy: pick a module, or fuse it"
            )
        return self.replacement

    def original(self, name: str) -> torch.nn.Module:
        """A copy of the original module ``name`` (:meth:`graphsurgeon.Surgery.original`)."""
        surgery = self.session.surgery
        if surgery.model is None:
            self.session.busy("rebuilding the program's modules…")  # once: the Surgery keeps them
        return surgery.original(name)

    def _original_of(self, chosen_for: str) -> Callable[[], torch.nn.Module] | None:
        return None if chosen_for == REGION else (lambda: self.original(chosen_for))


def module_from(
    value: Any, label: str, original: Callable[[], torch.nn.Module] | None = None
) -> torch.nn.Module:
    """The replacement ``value`` stands for: a module as it is; a class built with no
    arguments or, when it takes one, from the original module (``original()``)."""
    if isinstance(value, type) and issubclass(value, torch.nn.Module):
        needed = required_arguments(value)
        if needed == 1 and original is not None:
            built = f"{label}(original)"
            try:
                return value(original())
            except Exception as error:
                raise WidgetError(
                    f"{built} failed ({type(error).__name__}: {error}); type the call in the "
                    f"expression box, such as {value.__name__}(...)"
                ) from error
        try:
            return value()
        except TypeError as error:
            raise WidgetError(
                f"{label}() needs arguments ({error}); type the call in the expression box, "
                f"such as {value.__name__}(...)"
            ) from error
    if isinstance(value, torch.nn.Module):
        return value
    raise WidgetError(
        f"{label} is {type(value).__name__}, not an nn.Module: a replacement is a module "
        "(an instance, or a class built with no arguments or from the original module)"
    )
