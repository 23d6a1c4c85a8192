"""export(): torch.export with every module's call signature preserved where it can be.

torch.export can only swap a module back in when it was asked, at export time, to keep that
module's calling convention (``preserve_module_call_signature``). ``export`` fills that in for
every submodule by default. A module whose signature torch cannot preserve (for example one
called twice with different argument structures) is dropped from the request, the export is
retried, and the reason is kept so that :func:`graphsurgeon.module_tree` can show it.

``graphsurgeon.export`` is the function; the module's helpers are imported by name, as in
``from graphsurgeon.export import export_notes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from . import _derived, _meta
from ._meta import CALL_SUFFIX, ambiguous_name_message, traced_path_fqn
from ._program import as_inputs
from .errors import ExportError, UnknownModuleError, a_type, did_you_mean

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
        training: fqn -> whether that module was in training mode at export (the mode the
            program's nodes keep: a swapped program cannot change it).
        dims: torch's symbol of each dynamic size -> the name of the ``Dim`` it was exported
            with (``{"s77": "batch"}``), so messages and pictures say ``f32[batch, 16]``.

    The notes travel with the program: they are kept in ``ep.graph_module.meta["custom"]``,
    which ``torch.export.save`` writes and ``torch.export.load`` reads back.
    """

    dropped: Mapping[str, str] = field(default_factory=dict)
    module_types: Mapping[str, str] = field(default_factory=dict)
    parameters: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    requested: tuple[str, ...] = ()
    seconds: float = 0.0
    attempts: int = 1
    training: Mapping[str, bool] = field(default_factory=dict)
    dims: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The notes as JSON text (what the program carries)."""
        fields = dataclasses.asdict(self)
        return json.dumps({"version": 1, **fields}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ExportNotes | None:
        """Notes read back from :meth:`to_json`'s text; None for anything else."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.pop("version", None) != 1:
                return None
            data["parameters"] = {k: tuple(v) for k, v in data.get("parameters", {}).items()}
            data["requested"] = tuple(data.get("requested", ()))
            return cls(**data)
        except (TypeError, ValueError, AttributeError):
            return None

    def __repr__(self) -> str:
        kept = len(self.requested) - len(self.dropped)
        text = f"<ExportNotes: {kept} of {len(self.requested)} module signatures preserved"
        if self.dropped:
            text += f", {len(self.dropped)} dropped ({', '.join(self.dropped)})"
        return text + f"; {self.attempts} export attempt{'s' if self.attempts != 1 else ''}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from . import display as d

        kept = len(self.requested) - len(self.dropped)
        head = (
            f'<div class="gs-title">export notes {d.badge(f"{kept} preserved", "ok")} '
            + (d.badge(f"{len(self.dropped)} dropped", "warn") if self.dropped else "")
            + f' <span class="gs-muted">{self.attempts} torch.export attempt'
            f"{'s' if self.attempts != 1 else ''}, {self.seconds:.2f} s</span></div>"
        )
        dropped = ""
        if self.dropped:
            rows = [[fqn, self.module_types.get(fqn, ""), why] for fqn, why in self.dropped.items()]
            dropped = d.table(["dropped module", "type", "why torch could not preserve it"], rows)
        return d.bundle(head + dropped, repr(self), include, exclude)


# Where a program carries its notes: ep.graph_module.meta["custom"][_NOTES_KEY], which
# torch.export.save serializes (as JSON) and torch.export.load restores.
_NOTES_KEY = "graphsurgeon.export_notes"


def export_notes(ep: ExportedProgram) -> ExportNotes | None:
    """The notes :func:`export` kept for ``ep`` (also when it was saved and loaded again), or
    None when ``ep`` was made elsewhere."""

    def read() -> ExportNotes | None:
        meta = getattr(getattr(ep, "graph_module", None), "meta", None)
        custom = meta.get("custom") if isinstance(meta, dict) else None
        text = custom.get(_NOTES_KEY) if isinstance(custom, dict) else None
        return ExportNotes.from_json(text) if isinstance(text, str) else None

    if not isinstance(ep, ExportedProgram):
        return None
    return _derived.cached(ep, "export notes", read)


def record_notes(ep: ExportedProgram, notes: ExportNotes) -> None:
    """Keep ``notes`` for ``ep`` (made or exported again by graphsurgeon), in this process and
    in the program itself (it carries them through ``torch.export.save`` and ``load``)."""
    meta = ep.graph_module.meta
    custom = meta.get("custom")
    if not isinstance(custom, dict):
        custom = meta["custom"] = {}
    custom[_NOTES_KEY] = notes.to_json()
    _derived.derived(ep)["export notes"] = notes


def positional_parameters(module: torch.nn.Module) -> tuple[str, ...]:
    """The names of ``module.forward``'s positional parameters (the one reading: _meta)."""
    return tuple(_meta.parameter_names(module))


def qualified_type(module: torch.nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


_PRESERVE_FORMS = (
    "'all', 'none', a list of module names such as ['blocks.0', 'head'], or a predicate "
    "(fqn, module) -> bool"
)

# What a wrong ``preserve`` most likely meant.
_PRESERVE_HINTS = {
    type(None): " Use preserve='none' to preserve no module.",
    bool: " Use preserve='all' or preserve='none'.",
    dict: " For the names of its keys, pass list(preserve).",
}


def _select(model: torch.nn.Module, preserve: Preserve) -> list[str]:
    names = [name for name, _ in model.named_modules(remove_duplicate=False) if name]
    keywords = ""
    if isinstance(preserve, str):
        if preserve == "all":
            return list(dict.fromkeys(names))
        if preserve == "none":
            return []
        keywords = " ('all' and 'none' are the only other strings preserve takes.)"
        preserve = [preserve]
    if isinstance(preserve, torch.nn.Module):
        raise ExportError(
            f"preserve: got {a_type(preserve)} module; pass module names instead, "
            "as in model.named_modules(), e.g. preserve=['blocks.0']"
        )
    if callable(preserve):
        modules = dict(model.named_modules(remove_duplicate=False))
        selected = []
        for name in dict.fromkeys(names):
            try:
                chosen = preserve(name, modules[name])
            except Exception as error:
                raise ExportError(
                    f"preserve: the predicate failed on module {name!r} with "
                    f"{type(error).__name__}: {error}. It is called as predicate(fqn, module) "
                    "for every submodule and returns True to preserve it."
                ) from error
            if chosen:
                selected.append(name)
        return selected
    if isinstance(preserve, (Mapping, bytes, bytearray)) or not isinstance(preserve, Iterable):
        hint = next((h for kind, h in _PRESERVE_HINTS.items() if isinstance(preserve, kind)), "")
        raise ExportError(
            f"preserve={_clip(repr(preserve))}: expected {_PRESERVE_FORMS}; got "
            f"{a_type(preserve)}.{hint}"
        )
    wanted = list(dict.fromkeys(preserve))
    known = set(names)
    for position, fqn in enumerate(wanted):
        if not isinstance(fqn, str):
            raise ExportError(
                f"preserve: expected module names (str), got {_clip(repr(fqn))} ("
                f"{a_type(fqn)}) at position {position}; names are as in "
                "model.named_modules(), e.g. 'blocks.0.attn'"
            )
        if fqn not in known:
            raise UnknownModuleError(
                f"preserve: the model has no submodule {fqn!r}.{did_you_mean(fqn, known)} "
                "Names are fully qualified, as in model.named_modules() (e.g. 'blocks.0.attn')."
                f"{keywords}"
            )
    return wanted


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# torch names the module it could not preserve in these messages, as "_export_root.<fqn>".
_CULPRIT = re.compile(r"_export_root\.([A-Za-z0-9_.]+)")


def _culprits(error: BaseException, candidates: list[str]) -> list[str]:
    text = str(error)
    found = [m.rstrip(".:") for m in _CULPRIT.findall(text)]
    if isinstance(error, KeyError) and error.args and isinstance(error.args[0], str):
        # strict export fails on a module it reached by a path it cannot look up, and names
        # that path as it wrote it: KeyError: "getattr(L['self'], 'x y')" is module 'x y'
        found.append(traced_path_fqn(error.args[0]))
    return [f for f in dict.fromkeys(found) if f in candidates]


# A Hugging Face model that returns its key/value cache names the cache class in the error
# ("... got: DynamicCache(layers=[...])"); the library stays free of a transformers import.
_CACHE_CLASS = re.compile(r"\b([A-Z]\w*Cache)\b")


def _advice(model: torch.nn.Module, error: BaseException) -> str:
    """What to do about an export failure whose cause is well known, or ''."""
    texts = []
    seen: BaseException | None = error
    while seen is not None and len(texts) < 5:
        texts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    found = _CACHE_CLASS.search("\n".join(texts))
    config = getattr(model, "config", None)
    if found is None or not hasattr(config, "use_cache"):
        return ""
    return (
        f". The model builds a key/value cache ({found.group(1)}), which torch.export "
        "cannot carry: pass use_cache=False in kwargs, as in "
        "gs.export(model, args, {'use_cache': False}), or set model.config.use_cache = False "
        "before exporting"
    )


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
        args: example positional inputs, as for ``torch.export.export``. A single tensor
            (or number) is taken as the one positional input.
        kwargs: example keyword inputs.
        preserve: ``"all"`` (every submodule; ones torch cannot preserve are dropped, with the
            reason kept for :func:`module_tree`), ``"none"``, an iterable of fqns (all must be
            preservable, else :class:`ExportError`), or a predicate ``(fqn, module) -> bool``
            (treated like ``"all"`` for the modules it selects).
        dynamic_shapes: passed to ``torch.export.export``.
        strict: passed to ``torch.export.export``.

    Raises:
        ExportError: an argument export cannot use (``preserve=3``, a ``model`` that is not an
            nn.Module), or torch.export failed; the message says what to do where the cause is
            well known (a Hugging Face model exported with its key/value cache on: pass
            ``use_cache=False``).
        InputStructureError: ``args`` that are a list, a dict or None, or ``kwargs`` that are
            no mapping: refused as by every entry point
            (:func:`graphsurgeon._program.as_inputs`).
        UnknownModuleError: a name in ``preserve`` that the model does not have.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> ep = gs.export(model, (torch.randn(2, 4),))
        >>> sorted(e.fqn for e in ep.module_call_graph if e.signature)
        ['', '0', '1']
    """
    if not isinstance(model, torch.nn.Module):
        hint = (
            " It is exported already: gs.swap, gs.partition and the others take it as it is."
            if isinstance(model, ExportedProgram)
            else " Wrap a function in an nn.Module whose forward calls it."
        )
        raise ExportError(f"export: expected an nn.Module, got {a_type(model)}.{hint}")
    # read as every entry point reads inputs (a lone tensor or number is the one input)
    args, kwargs = as_inputs(args, kwargs, verb="export")
    for name, _ in model.named_modules(remove_duplicate=False):
        if any(CALL_SUFFIX.search(part) for part in name.split(".")):
            raise ExportError(ambiguous_name_message(name, f"the model ({type(model).__name__})"))
    wanted = _select(model, preserve)
    tolerant = not (isinstance(preserve, Iterable) and not isinstance(preserve, str))
    keep = list(wanted)
    dropped: dict[str, str] = {}
    attempts = 0
    start = time.perf_counter()

    calls = _CallRecord(model)

    def run(preserved: list[str]) -> ExportedProgram:
        with (
            _results_of_their_own(model, preserved, enabled=not strict),
            calls.watch(preserved, enabled=not strict),
        ):
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
                        f"{calls.why(culprits[0], error)}. Remove it from preserve, or use "
                        "preserve='all' to drop such modules automatically."
                    ) from error
                recorded = [fqn for fqn in keep if fqn in calls.problems]
                if recorded and tolerant:
                    # The message does not name a module, but the failed run called one in a
                    # way no call signature can hold (a string argument, say): torch stops
                    # there. Drop those and export again: one more attempt, where narrowing
                    # down by bisection would take two per halving.
                    for fqn in recorded:
                        dropped[fqn] = calls.why(fqn, error)
                        keep.remove(fqn)
                    continue
                if keep and tolerant:
                    # The message does not name a module: find out whether preserving is
                    # the problem at all before blaming any module.
                    keep, more = _bisect_failures(run, keep)
                    attempts += more["attempts"]
                    dropped.update(
                        {fqn: calls.why(fqn, problem) for fqn, problem in more["dropped"].items()}
                    )
                    if more["clean"] and more["dropped"]:
                        continue
                raise ExportError(
                    f"torch.export failed on {type(model).__name__}: {_short(error)}"
                    f"{_advice(model, error)}"
                ) from error
            for fqn in culprits:
                dropped[fqn] = calls.why(fqn, error)
                keep.remove(fqn)
    notes = ExportNotes(
        dropped=dropped,
        module_types={n: qualified_type(m) for n, m in model.named_modules(remove_duplicate=False)},
        parameters={
            n: positional_parameters(m) for n, m in model.named_modules(remove_duplicate=False)
        },
        requested=tuple(wanted),
        seconds=time.perf_counter() - start,
        attempts=attempts,
        training={n: m.training for n, m in model.named_modules(remove_duplicate=False)},
        dims=_dim_names(ep, model, args, kwargs, dynamic_shapes),
    )
    record_notes(ep, notes)
    return ep


def _dim_names(
    ep: ExportedProgram, model: torch.nn.Module, args: tuple, kwargs: Any, dynamic_shapes: Any
) -> dict[str, str]:
    """torch's symbol -> the user's ``Dim`` name, for each dynamic size named by a ``Dim``
    (best effort: {} where the dynamic shapes cannot be lined up with the program's inputs)."""
    if dynamic_shapes is None:
        return {}
    from torch.export.dynamic_shapes import _combine_args, _tree_map_with_path

    specs: dict[int, Any] = {}

    def record(path: Any, value: Any, spec: Any) -> None:
        if isinstance(value, torch.Tensor) and spec is not None:
            specs[id(value)] = spec

    try:
        combined = _combine_args(model, args, kwargs)
        if isinstance(dynamic_shapes, (tuple, list)):
            combined = type(dynamic_shapes)(combined.values())
        _tree_map_with_path(record, combined, dynamic_shapes)
        leaves, spec = pytree.tree_flatten((args, dict(kwargs or {})))
    except Exception:  # a structure torch itself reports when it exports: nothing to name
        return {}
    inputs = [
        node
        for node, input_spec in zip(
            (n for n in ep.graph.nodes if n.op == "placeholder"), ep.graph_signature.input_specs
        )
        if input_spec.kind.name == "USER_INPUT"
    ]
    if ep.call_spec.in_spec is not None and spec != ep.call_spec.in_spec:
        return {}
    names: dict[str, str] = {}
    for leaf, node in zip(leaves, inputs):
        shape_spec, value = specs.get(id(leaf)), node.meta.get("val")
        if shape_spec is None or not isinstance(value, torch.Tensor):
            continue
        items = shape_spec.items() if isinstance(shape_spec, Mapping) else enumerate(shape_spec)
        for dim, wanted in items:
            name = getattr(wanted, "__name__", None)
            if not isinstance(name, str) or hasattr(wanted, "root") or not 0 <= dim < value.dim():
                continue  # Dim.AUTO, a derived Dim (2 * batch: named by its root's name)
            expression = getattr(getattr(value.shape[dim], "node", None), "expr", None)
            if expression is not None and getattr(expression, "is_Symbol", False):
                names.setdefault(str(expression), name)
    return names


@contextlib.contextmanager
def _results_of_their_own(model: torch.nn.Module, preserved: list[str], enabled: bool = True):
    """While exporting: every preserved module that returns a tensor that existed before it ran
    (its input itself: an in-place op, ``x.to`` to the dtype it has, nn.Identity; or its own
    parameter or buffer) returns an alias of it instead (``aten.alias``, a view: the same values
    and storage, so the model computes exactly what it did).

    Why: torch.export follows tensors by object, so in such a program every later read of that
    tensor, also a read of the module's *input* (a residual ``x + norm(x)``), reads the module's
    result, and swapping the module would hand the replacement's result to those readers too.
    With an alias of its own, the module's result is told apart from its input in the graph:
    a replacement's result goes where eager code would put it. The hooks are removed afterwards;
    the model is not changed. (Strict export traces hooks without object identity: not done.)
    """
    handles = []
    if enabled:
        modules = dict(model.named_modules(remove_duplicate=False))
        hooked: set[int] = set()
        for fqn in preserved:
            module = modules.get(fqn)
            if module is None or id(module) in hooked:
                continue
            hooked.add(id(module))
            handles.append(module.register_forward_hook(_alias_old_tensors, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _alias_old_tensors(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
    leaves = pytree.tree_leaves(output)
    if not any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return None
    old = {id(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    old.update(id(t) for t in module.parameters())
    old.update(id(t) for t in module.buffers())
    if not any(isinstance(leaf, torch.Tensor) and id(leaf) in old for leaf in leaves):
        return None
    return pytree.tree_map(
        lambda t: (
            torch.ops.aten.alias.default(t) if isinstance(t, torch.Tensor) and id(t) in old else t
        ),
        output,
    )


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


class _CallRecord:
    """How the preserved modules were called, and what they returned, while exporting: enough
    to say in the user's words why torch.export could not keep a module's call signature
    (torch's own message is an internal assertion: "Expected code to be unreachable, but got:
    'mul'")."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.problems: dict[str, str] = {}  # fqn -> the first thing torch cannot keep
        self.forms: dict[str, list[str]] = {}  # fqn -> how it was called, one entry per form

    @contextlib.contextmanager
    def watch(self, preserved: list[str], enabled: bool = True):
        handles = []
        if enabled:  # strict export traces hooks too: nothing is recorded there
            modules = dict(self.model.named_modules(remove_duplicate=False))
            for fqn in preserved:
                module = modules.get(fqn)
                if module is None:
                    continue
                names = positional_parameters(module)
                handles.append(
                    module.register_forward_pre_hook(
                        functools.partial(self._called, fqn, names), with_kwargs=True
                    )
                )
                handles.append(
                    module.register_forward_hook(
                        functools.partial(self._returned, fqn), with_kwargs=True
                    )
                )
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _called(self, fqn, names, module, args, kwargs) -> None:
        form = "(" + ", ".join([*names[: len(args)], *(f"{k}=…" for k in kwargs)]) + ")"
        if len(args) > len(names):
            form = f"({len(args)} positional" + (f", {', '.join(kwargs)}" if kwargs else "") + ")"
        forms = self.forms.setdefault(fqn, [])
        if form not in forms:
            forms.append(form)
        if fqn in self.problems:
            return
        flat, _ = pytree.tree_flatten_with_path((args, kwargs))
        for path, leaf in flat:
            where = _argument_text(path, names)
            if isinstance(leaf, str):
                self.problems[fqn] = (
                    f"it is called with a string argument ({where}={_clip(repr(leaf))}), and a "
                    "module's call signature can only hold tensors and numbers. Make the string "
                    "a setting of the module (an __init__ argument kept on self), or swap the "
                    "module that calls it"
                )
                return
            if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                self.problems[fqn] = (
                    f"it is called with a size that depends on a dynamic dimension ({where}), "
                    "and a module's call signature cannot hold one. Pass the tensor and read "
                    "its size inside the module, or swap the module that calls it"
                )
                return

    def _returned(self, fqn, module, args, kwargs, output) -> None:
        if fqn in self.problems:
            return
        flat, _ = pytree.tree_flatten_with_path(output)
        for path, leaf in flat:
            where = f"output{pytree.keystr(path)}" if path else "its output"
            if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                self.problems[fqn] = (
                    f"it returns a size that depends on a dynamic dimension ({where}, such as "
                    "x.shape[0] with a dynamic batch), and a module's call signature cannot hold "
                    "one. Return it as a tensor, or leave it out of what the module returns, "
                    "or swap the module that calls it"
                )
                return
            if leaf is not None and not isinstance(leaf, (torch.Tensor, int, float, bool, str)):
                self.problems[fqn] = (
                    f"it returns {a_type(leaf)} ({where}), and a module's call signature can "
                    "only hold tensors, numbers, strings and None. Return tensors, or swap "
                    "the module that calls it"
                )
                return

    def why(self, fqn: str, error: BaseException) -> str:
        """Why ``fqn``'s signature could not be kept, as a sentence: what was recorded about
        its calls, else torch's own message."""
        if fqn in self.problems:
            return self.problems[fqn]
        forms = self.forms.get(fqn, [])
        if len(forms) > 1:
            return (
                f"it is called in {len(forms)} different ways ({' and '.join(forms[:3])}), and "
                "torch.export keeps one call signature per module. Call it the same way every "
                "time (the same arguments by position or by keyword), or swap the module that "
                "calls it"
            )
        return f"torch.export could not keep its signature ({_short(error)})"


def _argument_text(path: tuple, names: tuple[str, ...]) -> str:
    """Where a leaf sits among a call's ``(args, kwargs)``: ``mode``, ``x``, ``cfg['a']``."""
    if not path:
        return "an argument"
    head, rest = path[0], path[1:]
    if getattr(head, "idx", None) == 0 and rest:  # args
        position = getattr(rest[0], "idx", 0)
        name = names[position] if position < len(names) else f"argument {position}"
        return name + pytree.keystr(rest[1:])
    if rest:  # kwargs
        key = getattr(rest[0], "key", "")
        return str(key) + pytree.keystr(rest[1:])
    return pytree.keystr(path)


# torch.export and the tracers under it log warnings and whole tracebacks through these (and
# their children, which inherit the level of "torch"). Each is quieted only while it is at its
# default level or above: one the user turned on for debugging (TORCH_LOGS) is left as it is.
_QUIET_LOGGERS = (
    "torch",
    "torch.export",
    "torch._export",
    "torch._dynamo",
    "torch.fx.experimental.symbolic_shapes",
)


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """Keep an export graphsurgeon makes on its own (a replacement exported for
    ``Stepper.step_into`` or ``Comparison.locate``, ``Surgery.export()``) from writing to the
    notebook: torch's
    loggers are silenced, Python warnings ignored and what torch prints to ``sys.stderr`` (the
    partial graph of a failed export) dropped. Whatever fails is raised as usual, for the caller
    to report as one message; the logger levels, the warning filters and ``sys.stderr`` are
    restored afterwards.
    """
    existing = logging.root.manager.loggerDict
    names = [
        n for n, lg in existing.items() if n.startswith("torch.") and isinstance(lg, logging.Logger)
    ]
    quieted = []
    for name in dict.fromkeys((*_QUIET_LOGGERS, *sorted(names))):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET and name != "torch":
            continue  # inherits its level: quiet with "torch", or as loud as the user set it
        if logger.level == logging.NOTSET or logger.level >= logging.WARNING:
            quieted.append((logger, logger.level))
    try:
        for logger, _ in quieted:
            logger.setLevel(logging.CRITICAL + 1)
        # torch prints the partial graph of a failed export straight to sys.stderr, past its
        # loggers
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in quieted:
            logger.setLevel(level)
