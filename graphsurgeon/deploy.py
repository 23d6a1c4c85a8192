"""After surgery: the swapped program compiled with ``torch.compile`` or packaged ahead of time
with AOTInductor, a failure said in one line.

A Surgery ships as its program exported again (:meth:`~graphsurgeon.Surgery.export`): a new
ExportedProgram of aten ops, with every module call signature kept, in which the replacements'
Python is gone. :func:`compiled` runs it under ``torch.compile`` once on the example inputs, so
that what cannot compile fails here; :func:`package` writes it as an AOTInductor package
(``torch._inductor.aoti_compile_and_package``), which ``torch._inductor.aoti_load_package``
loads in any process. Either result is a candidate of :func:`graphsurgeon.verify` and of
``s.verify(candidate=...)``, whose report names it ("an AOTInductor package").

What fails is raised as one :class:`~graphsurgeon.errors.DeployError` naming the step, the
replacement it failed in (from the failing node's module, when torch says which node) and
torch's reason in one line; the compiler's traceback is chained, not printed. Export's own
failures (data-dependent Python control flow, numpy) are :meth:`Surgery.export`'s
:class:`~graphsurgeon.errors.ExportError`, which names the replacement as well.

Example:
    >>> import torch, graphsurgeon as gs
    >>> from graphsurgeon.deploy import compiled
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> s = gs.Surgery.from_model(model, (torch.randn(2, 4),)).swap("1", torch.nn.GELU())
    >>> fast = compiled(s, backend="eager")  # the default backend is inductor
    >>> report = s.verify(candidate=fast)
    >>> bool(report), report.candidate_kind
    (True, "a torch.compile'd module")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch.export import ExportedProgram

from ._meta import inside
from ._program import as_program, is_surgery, not_a_program
from .errors import DeployError
from .export import quiet_export

__all__ = ["compiled", "package"]


def compiled(
    program: Any,
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> torch.nn.Module:
    """``torch.compile`` of what ``program`` ships, compiled now: run once on the inputs.

    Args:
        program: a Surgery (its program exported again, :meth:`Surgery.export`, with
            ``args``/``kwargs``) or an ExportedProgram (its ``module()``).
        args: example positional inputs (default: the Surgery's, or the program's own
            example inputs).
        kwargs: example keyword inputs.
        options: passed to ``torch.compile`` (``fullgraph=True`` unless given: a graph break
            would run part of the program as Python).

    Returns:
        The compiled module (``torch._dynamo``'s ``OptimizedModule``), called as the model is.
        The first call runs as the caller's grad mode says: with gradients on, torch.compile
        builds the training graph too.

    Raises:
        NotAProgramError: ``program`` is no Surgery or ExportedProgram (a ``gs.swap`` result:
            make the swaps in a Surgery, whose :meth:`~graphsurgeon.Surgery.export` ships).
        SurgeryError, ExportError: exporting the Surgery again failed (the message names the
            replacement, as :meth:`~graphsurgeon.Surgery.export` says).
        DeployError: torch.compile failed: the step, the replacement it failed in when torch
            names the node, and torch's reason in one line.
    """
    exported, replacements, read = _exported(program, args, kwargs, "compiled")
    args, kwargs = read.inputs(error=DeployError)
    options.setdefault("fullgraph", True)
    module = torch.compile(exported.module(), **options)
    try:
        with quiet_export():
            module(*args, **kwargs)  # torch.compile compiles on the first call
    except Exception as error:
        raise DeployError(_failure("torch.compile", error, exported, replacements)) from error
    return module


def package(
    program: Any,
    path: str | os.PathLike,
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> str:
    """Write what ``program`` ships as an AOTInductor package at ``path`` (a ``.pt2``).

    Load it with ``torch._inductor.aoti_load_package(path)``, in this process or another (a
    replacement that calls a custom op needs the op's library imported there too), and check it
    with ``s.verify(candidate=loaded)``. The package runs inference only.

    Args:
        program: a Surgery (its program exported again with ``args``/``kwargs``) or an
            ExportedProgram.
        path: where to write the package, a ``.pt2`` whose folder exists (checked first).
        args: example positional inputs for the export (default: the Surgery's).
        kwargs: example keyword inputs.
        options: passed to ``torch._inductor.aoti_compile_and_package`` as
            ``inductor_configs``.

    Returns:
        The path of the package written.

    Raises:
        NotAProgramError, SurgeryError, ExportError: as for :func:`compiled`.
        DeployError: the folder of ``path`` is missing, ``path`` is no ``.pt2``, or
            AOTInductor failed: the step, the replacement it failed in when torch
            names the node, and torch's reason in one line.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # said now, not after the compile
        raise DeployError(
            f"package: the folder of {path!r} does not exist; create it first "
            f"(os.makedirs({folder!r}))"
        )
    if not path.endswith(".pt2"):
        raise DeployError(f"package: {path!r}: an AOTInductor package is a .pt2 file")
    exported, replacements, _ = _exported(program, args, kwargs, "package")
    from torch._inductor import aoti_compile_and_package

    try:
        with quiet_export():
            written = aoti_compile_and_package(
                exported, package_path=path, inductor_configs=options or None
            )
    except Exception as error:
        step = "AOTInductor (aoti_compile_and_package)"
        raise DeployError(_failure(step, error, exported, replacements)) from error
    return os.fspath(written)


def _exported(value: Any, args: Any, kwargs: Any, verb: str) -> tuple[ExportedProgram, dict, Any]:
    """The ExportedProgram ``value`` ships, its replacements by name, and the program as the
    one door reads it with its inputs (``.inputs()``): a Surgery is exported again with them;
    an ExportedProgram is itself, its inputs by default the example inputs it keeps."""
    if isinstance(value, ExportedProgram):
        if args is None and value.example_inputs is not None:
            args, kwargs = value.example_inputs
        return value, {}, as_program(value, args, kwargs, verb=verb)
    if not is_surgery(value):  # refused as every verb refuses what is no program
        raise not_a_program(value, verb)
    read = as_program(value, args, kwargs, verb=verb)
    return value.export(read.args, read.kwargs), dict(value.replacements), read


def _failure(
    step: str, error: BaseException, program: ExportedProgram, replacements: Mapping[str, Any]
) -> str:
    """One line: ``torch.compile failed in the replacement for '1' (Custom): RuntimeError:
    ...`` (``in module '1' (Custom)`` without a Surgery; no place when torch names no node)."""
    where = _failing_module(error, program)
    place = ""
    if where is not None:
        fqn, type_name = where
        owner = next((n for n in replacements if inside(fqn, n)), None)
        if owner is not None:
            held = type(replacements[owner]).__name__
            inner = f", in its module {fqn!r} ({type_name})" if fqn != owner else ""
            place = f" in the replacement for {owner!r} ({held}{inner})"
        else:
            place = f" in module {fqn!r} ({type_name})"
    return f"{step} failed{place}: {_reason(error)}"


def _innermost(error: BaseException) -> BaseException:
    """The exception torch's wrappers carry (``BackendCompilerFailed.inner_exception``, the
    chained cause), the deepest one."""
    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "inner_exception", None) or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    return error


def _reason(error: BaseException) -> str:
    """torch's reason in one line: the innermost exception's type and first line of text."""
    inner = _innermost(error)
    lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    text = lines[0] if lines else "(no message)"
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(inner).__name__}: {text}"


def _failing_module(error: BaseException, program: ExportedProgram) -> tuple[str, str] | None:
    """The innermost module ``(fqn, type name)`` of the node torch failed on: the one module
    whose ops the error's text names (``r33.rmsnorm.default``), else the innermost node of the
    program's in the frames of the error's tracebacks (inductor lowers node by node); None
    when neither says."""
    errors = _chain(error)
    text = "\n".join(str(e) for e in errors)
    named = {
        found
        for node in program.graph.nodes
        if node.op == "call_function"
        and str(node.target) in text
        and (found := _module_of(node)) is not None
    }
    if len(named) == 1:
        return named.pop()
    # a compiler's own graphs may name modules otherwise: only the program's modules count
    known = {found for node in program.graph.nodes if (found := _module_of(node)) is not None}
    for each in reversed(errors):
        frames = []
        traceback = each.__traceback__
        while traceback is not None:
            frames.append(traceback.tb_frame)
            traceback = traceback.tb_next
        for frame in reversed(frames):  # the innermost frame first
            for value in frame.f_locals.values():
                if isinstance(value, torch.fx.Node) and _module_of(value) in known:
                    return _module_of(value)
    return None


def _chain(error: BaseException) -> list[BaseException]:
    """The error and every exception it carries, outermost first."""
    found: list[BaseException] = []
    while error is not None and all(error is not e for e in found):
        found.append(error)
        inner = getattr(error, "inner_exception", None)
        error = inner if isinstance(inner, BaseException) else error.__cause__ or error.__context__
    return found


def _module_of(node: torch.fx.Node) -> tuple[str, str] | None:
    """The innermost module of a node, from the module stack torch.export records (kept by
    the compilers on the nodes they make from it): ``(fqn, type name)``."""
    stack = node.meta.get("nn_module_stack") if isinstance(node.meta, dict) else None
    if not stack:
        return None
    fqn, type_name = list(stack.values())[-1]
    if not isinstance(fqn, str) or not fqn:
        return None
    type_name = type_name.__name__ if isinstance(type_name, type) else str(type_name)
    return fqn, type_name.rpartition(".")[2]
