"""export(): torch.export with every module's call signature preserved where it can be.

torch.export can only swap a module back in when it was asked, at export time, to keep that
module's calling convention (``preserve_module_call_signature``). ``export`` fills that in for
every submodule by default. A module whose signature torch cannot preserve (for example one
called twice with different argument structures) is dropped from the request, the export is
retried, and the reason is kept so that :func:`graphsurgeon.module_tree` can show it.
"""

from __future__ import annotations

import inspect
import re
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from .errors import ExportError, UnknownModuleError, did_you_mean

__all__ = ["ExportNotes", "export"]

Preserve = str | Iterable[str] | Callable[[str, torch.nn.Module], bool]


@dataclass(frozen=True)
class ExportNotes:
    """What :func:`export` knows about a program that the program itself does not record.

    Attributes:
        dropped: fqn -> why its call signature could not be preserved.
        module_types: fqn -> qualified type name of every module of the model.
        parameters: fqn -> the names of its forward's positional parameters (``("x",)``), so a
            fused call's inputs and a replacement's expected call can be named as in the model.
        requested: the fqns asked to be preserved (before any were dropped).
        seconds: wall time of the whole export, retries included.
        attempts: how many torch.export calls it took.
    """

    dropped: Mapping[str, str] = field(default_factory=dict)
    module_types: Mapping[str, str] = field(default_factory=dict)
    parameters: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    requested: tuple[str, ...] = ()
    seconds: float = 0.0
    attempts: int = 1


# Notes of the programs this process exported, without keeping the programs alive.
_NOTES: weakref.WeakKeyDictionary[ExportedProgram, ExportNotes] = weakref.WeakKeyDictionary()


def export_notes(ep: ExportedProgram) -> ExportNotes | None:
    """The notes :func:`export` kept for ``ep``, or None when ``ep`` was made elsewhere."""
    return _NOTES.get(ep)


def _positional_parameters(module: torch.nn.Module) -> tuple[str, ...]:
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):  # a forward without a readable signature (a builtin)
        return ()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in parameters if p.kind in kinds)


def _qualified_type(module: torch.nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _select(model: torch.nn.Module, preserve: Preserve) -> list[str]:
    names = [name for name, _ in model.named_modules(remove_duplicate=False) if name]
    if isinstance(preserve, str):
        if preserve == "all":
            return list(dict.fromkeys(names))
        if preserve == "none":
            return []
        preserve = [preserve]
    if callable(preserve):
        modules = dict(model.named_modules(remove_duplicate=False))
        return [n for n in dict.fromkeys(names) if preserve(n, modules[n])]
    wanted = list(dict.fromkeys(preserve))
    known = set(names)
    for fqn in wanted:
        if not isinstance(fqn, str):
            raise TypeError(f"preserve: expected module names (str), got {fqn!r}")
        if fqn not in known:
            raise UnknownModuleError(
                f"preserve: the model has no submodule {fqn!r}.{did_you_mean(fqn, known)} "
                "Names are fully qualified, as in model.named_modules() (e.g. 'blocks.0.attn')."
            )
    return wanted


# torch names the module it could not preserve in these messages, as "_export_root.<fqn>".
_CULPRIT = re.compile(r"_export_root\.([A-Za-z0-9_.]+)")


def _culprits(error: BaseException, candidates: list[str]) -> list[str]:
    text = str(error)
    found = [m.rstrip(".:") for m in _CULPRIT.findall(text)]
    return [f for f in dict.fromkeys(found) if f in candidates]


def _short(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}"[:300]


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    preserve: Preserve = "all",
    dynamic_shapes: Any = None,
    strict: bool = False,
) -> ExportedProgram:
    """Export ``model`` with module call signatures preserved, so its modules can be swapped.

    Args:
        model: the eager model. It is not modified.
        args, kwargs: example inputs, as for ``torch.export.export``.
        preserve: ``"all"`` (every submodule; ones torch cannot preserve are dropped, with the
            reason kept for :func:`module_tree`), ``"none"``, an iterable of fqns (all must be
            preservable, else :class:`ExportError`), or a predicate ``(fqn, module) -> bool``
            (treated like ``"all"`` for the modules it selects).
        dynamic_shapes, strict: passed to ``torch.export.export``.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> sorted(e.fqn for e in ep.module_call_graph if e.signature)
        ['', '0', '1']
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"export: expected an nn.Module, got {type(model).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    wanted = _select(model, preserve)
    tolerant = not (isinstance(preserve, Iterable) and not isinstance(preserve, str))
    keep = list(wanted)
    dropped: dict[str, str] = {}
    attempts = 0
    start = time.perf_counter()

    def run(preserved: list[str]) -> ExportedProgram:
        return torch.export.export(
            model,
            args,
            kwargs=dict(kwargs) if kwargs else None,
            dynamic_shapes=dynamic_shapes,
            strict=strict,
            preserve_module_call_signature=tuple(preserved),
        )

    while True:
        attempts += 1
        try:
            ep = run(keep)
            break
        except Exception as error:  # torch raises many unrelated types here
            culprits = _culprits(error, keep)
            if not culprits or not tolerant:
                if culprits:
                    raise ExportError(
                        f"torch.export cannot preserve the call signature of {culprits[0]!r}: "
                        f"{_short(error)}. Remove it from preserve, or use preserve='all' "
                        "to drop such modules automatically."
                    ) from error
                if keep and tolerant:
                    # The message does not name a module: find out whether preserving is
                    # the problem at all before blaming any module.
                    keep, more = _bisect_failures(run, keep)
                    attempts += more["attempts"]
                    dropped.update(more["dropped"])
                    if more["clean"] and more["dropped"]:
                        continue
                raise ExportError(
                    f"torch.export failed on {type(model).__name__}: {_short(error)}"
                ) from error
            for fqn in culprits:
                dropped[fqn] = _short(error)
                keep.remove(fqn)
    notes = ExportNotes(
        dropped=dropped,
        module_types={
            n: _qualified_type(m) for n, m in model.named_modules(remove_duplicate=False)
        },
        parameters={
            n: _positional_parameters(m) for n, m in model.named_modules(remove_duplicate=False)
        },
        requested=tuple(wanted),
        seconds=time.perf_counter() - start,
        attempts=attempts,
    )
    _NOTES[ep] = notes
    return ep


def _bisect_failures(run: Callable[[list[str]], ExportedProgram], keep: list[str]):
    """Find the preserved modules that make export fail when torch does not name them.

    ``run(preserved)`` exports with those fqns preserved. Returns (keep, {"dropped": {...},
    "attempts": n, "clean": bool}); "clean" is False when the export fails even with nothing
    preserved (the model itself does not export).
    """
    attempts = 0

    def works(subset: list[str]) -> tuple[bool, BaseException | None]:
        nonlocal attempts
        attempts += 1
        try:
            run(subset)
            return True, None
        except Exception as error:
            return False, error

    ok, _ = works([])
    if not ok:
        return keep, {"dropped": {}, "attempts": attempts, "clean": False}
    dropped: dict[str, str] = {}

    def search(group: list[str]) -> None:
        ok, error = works(group)
        if ok:
            return
        if len(group) == 1:
            dropped[group[0]] = _short(error)
            return
        mid = len(group) // 2
        search(group[:mid])
        search(group[mid:])

    search(keep)
    kept = [f for f in keep if f not in dropped]
    return kept, {"dropped": dropped, "attempts": attempts, "clean": True}
