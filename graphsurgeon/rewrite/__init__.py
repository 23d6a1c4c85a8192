"""The one rewrite pass behind swap() and fuse(): module calls of an exported program replaced, in one pass.

How it works. The exported graph is copied node by node, in its own order, into a new graph
that is already "unlifted" (parameters and buffers become attributes, user inputs become the
model's own arguments). When the copy reaches the first node of a call that is being swapped,
it emits one ``call_module`` of the replacement, with the arguments rebuilt from the preserved
call signature (constants passed as their values), skips the call's own nodes, and binds each of
the call's output nodes, by name, to the matching leaf of the replacement's output. Nodes that
used those outputs now use the replacement's. Nothing is legalized or reordered, no node is
copied twice, the graph is compiled once.

The same pass fuses (:func:`graphsurgeon.fuse`): a fused call is replaced by a GraphModule cut
from the call's own nodes (:func:`cut_call`), so it computes bit for bit what the program did.

Pytree glue is only emitted where a value is really taken apart: a leaf is a ``getitem`` chain
made on first use, and a structure that is exactly another call's output (or an argument of the
model) is passed through whole instead of being flattened and rebuilt.

What the result refuses: the program's first node checks the inputs as ``ep.module()`` does
(structure, static and dynamic sizes, constant inputs: :mod:`graphsurgeon.rewrite._guards`), and what
each replacement returns is checked at its call (structure, dtype, static sizes).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import threading
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from .. import _meta
from ..partition import call_name, program_index, split_call_name
from . import _turns
from ._builder import _Builder, compiled_parts, input_guard
from ._cut import cut_call
from ._parts import forget_lines
from ._plan import FUSE, FunctionModule, _plan, as_module, call_misfit, check_module
from ._turns import interactive, pause_point, waiting_for_rewrite
from ._writer import _exported_mode, safe_path
from .info import _COMPUTATION, Diff, Region, SwapInfo, swap_info

__all__ = [
    "FUSE",
    "FunctionModule",
    "Region",
    "interactive",
    "pause_point",
    "waiting_for_rewrite",
    "Diff",
    "SwapInfo",
    "as_module",
    "call_misfit",
    "check_module",
    "cut_call",
    "rewrite",
    "safe_path",
    "swap_info",
    "warm_up",
    "WarmUp",
]

# One rewrite at a time, whichever thread asks (:func:`warm_up` runs on its own): a rewrite
# writes caches its program's rewrites share (compiled parts, the statements of its nodes)
# and turns the cyclic collector off and back on, which is process-wide.
_REWRITING = threading.RLock()


# -- the verbs ----------------------------------------------------------------------------------


def _forget_source_with(module: GraphModule) -> None:
    """When ``module`` is collected, drop its generated code from torch.fx's cache of sources.

    torch.fx keeps the source of every GraphModule it ever compiled (for tracebacks), never
    freed: ~0.4 MB for a 4,000-node program, so a session that swaps again and again (a Surgery
    rebuilding its states) would grow without bound. Only the program's own forward is dropped
    (not the replacements', which belong to the user), and only once nothing can run it."""
    loader = getattr(torch.fx.graph_module, "_loader", None)
    sources = getattr(loader, "eval_cache", None)
    key = getattr(getattr(type(module).forward, "__code__", None), "co_filename", None)
    if isinstance(sources, dict) and key in sources:
        weakref.finalize(module, _forget_source, sources, key)


def _forget_source(sources: dict, key: str) -> None:
    sources.pop(key, None)
    forget_lines(key)  # run by the collector, on whichever thread it runs


def _interpreted_forward(gm: GraphModule):
    # Parameters are named as the model's arguments (placeholder targets), not as the
    # placeholder nodes, which fx renames when they shadow a builtin ("input" -> "input_1").
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    arguments = inspect.Signature([inspect.Parameter(n, parameter) for n in names])

    def forward(self, *args, **kwargs):
        bound = arguments.bind(*args, **kwargs)
        return torch.fx.Interpreter(self).run(*bound.args)

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter("self", parameter), *arguments.parameters.values()]
    )
    return types.MethodType(forward, gm)


def rewrite(
    ep: ExportedProgram,
    modules: Mapping[str, Any],
    *,
    interpret: bool = False,
    verb: str = "swap",
    weak: bool = False,
    regions: Mapping[str, Region] | None = None,
) -> GraphModule:
    """The one pass behind :func:`swap` and :func:`graphsurgeon.fuse`: ``modules`` maps names to
    replacements, or to :data:`FUSE` for calls to fuse; a name in ``regions`` is a
    :class:`Region` of ops that are no module's (``Surgery.replace``), replaced as one call
    like a module's. ``weak``: the result refers to ``ep`` without keeping it alive (for a
    cache of ``ep``'s own)."""
    with _turns.waiting_for_rewrite():
        _REWRITING.acquire()
    try:
        return _rewrite(ep, modules, interpret, verb, weak, regions)
    finally:
        _REWRITING.release()


def _rewrite(
    ep: ExportedProgram,
    modules: Mapping[str, Any],
    interpret: bool,
    verb: str,
    weak: bool,
    regions: Mapping[str, Region] | None,
) -> GraphModule:
    index = program_index(ep, verb)
    regions = dict(regions or {})
    requests = _plan(index, modules, verb, regions)
    # The pass allocates many small objects and no cycles that matter; the cyclic collector
    # would otherwise run dozens of times over the whole heap while it does. (Not in a
    # warm-up: it pauses for clicks, which would then run without the collector.)
    was_enabled = gc.isenabled() and not _turns.in_warm_up()
    if was_enabled:
        gc.disable()
    try:
        builder = _Builder(index, requests)
        gm = builder.build()
    finally:
        if was_enabled:
            gc.enable()
    calls = {r.call_name: r.module for r in requests}
    given = {}
    for name, module in modules.items():
        given[name] = module
        if module is FUSE:
            fqn, k = split_call_name(name)
            given[name] = calls[call_name(fqn, k or 0)] if k is not None else calls.get(name)
    gm.meta[_meta.INFO] = SwapInfo(
        _program=weakref.ref(ep) if weak else ep,
        requests=given,
        calls=calls,
        fused=tuple(r.call_name for r in requests if r.fused),
        installed_at={r.call_name: safe_path(r.install_path) for r in requests},
        call_nodes={r.call_name: r.call_node.name for r in requests},
        partitions={r.call_name: r.partition for r in requests},
        regions={r.call_name: r.region for r in requests if r.region is not None},
        node_map=builder.node_map,
        copies=builder.copies,
        given_state=tuple(sorted(builder.attribute_target(t) for t in builder.given_state)),
        result_nodes=tuple(
            n.name
            for n in gm.graph.nodes
            if n.op in _COMPUTATION and _meta.GUARD not in n.meta  # input checks change nothing
        ),
    )
    _forget_source_with(gm)
    mode = _exported_mode(index)
    gm._exported_mode = mode
    if mode.training is not None:
        gm.training = mode.training  # the root's own flag only: replacements keep theirs
    if interpret:
        gm.forward = _interpreted_forward(gm)
    return gm


def warm_up(
    ep: ExportedProgram,
    modules: Mapping[str, Any],
    *,
    regions: Mapping[str, Region] | None = None,
    delay: float = 0.0,
    keep: Callable[[GraphModule], None] | None = None,
    hold: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> WarmUp:
    """Builds ``rewrite(ep, modules)`` on a background thread, ``delay`` seconds from now: the
    code it compiled and the statements it wrote stay in ``ep``'s cache (:mod:`._parts`), so
    the next rewrite of ``ep`` compiles only what it changes. The program built is given to
    ``keep`` (called on that thread), or dropped.

    The first swap of a 384-layer program otherwise compiles all of its ~200 parts, about
    0.26 s of the ~0.65 s it takes; a widget has this done once its user's clicks pause
    (``Surgery.build_in_background``). It pauses while an action someone waits for runs (a click:
    :func:`._turns.interactive`), so it never slows one down. A rewrite asked for meanwhile
    waits for this one to finish (:data:`_REWRITING`); one that came first leaves nothing to
    do, unless the program built is kept. Then, if nothing waits, it runs the collector's full
    pass that the build's objects bring due, which would otherwise land in a later click;
    unless the build runs inside ``hold()`` (a context made on its thread: the widget's
    collector hold, for a build the next click may want at once), whose business the passes
    then are. Nothing is reported: a failure here is the next rewrite's to raise, with its own
    message.

    Example:
        >>> import torch, graphsurgeon as gs
        >>> from graphsurgeon.rewrite import warm_up
        >>> ep = gs.export(torch.nn.Sequential(torch.nn.Linear(2, 2)), (torch.randn(1, 2),))
        >>> warm_up(ep, {}).join()
    """
    program = weakref.ref(ep)  # a program the user drops meanwhile is not kept for this

    def build() -> None:
        thread.begun = True
        live = program()
        if live is None:
            return
        held = hold() if hold is not None else contextlib.nullcontext()
        with held, _turns.warming(), _REWRITING:
            if keep is None and compiled_parts(live).code:
                return  # a rewrite came first: it compiled the parts (nothing to keep)
            # a failure is the next rewrite's to raise, where it is asked for
            with contextlib.suppress(Exception):
                built = rewrite(live, dict(modules), regions=regions, weak=keep is None)
                if keep is not None:
                    keep(built)
                del built
        # the collector's full pass that this build's many objects bring due, run now while
        # nothing waits: else it lands in the next click (0.5 s at 384 layers)
        if hold is None and _turns.idle():
            gc.collect()

    # made here, on the caller's thread: they parse with ast (torch's guards; the module paths
    # of a strict export), which Python 3.11 cannot do on two threads at once (a notebook
    # parses each cell with it). Both are kept with the program: a widget has made the index.
    with contextlib.suppress(Exception):  # a failure is the next rewrite's to raise
        program_index(ep)
        input_guard(ep)
    thread = WarmUp(delay, build)
    thread.start()
    return thread


class WarmUp(threading.Timer):
    """The thread of a :func:`warm_up`: ``begun`` once its delay is over (``cancel()`` before
    then calls it off), done when it is no longer ``is_alive()``."""

    def __init__(self, delay: float, build: Callable[[], None]):
        super().__init__(delay, build)
        self.name = "graphsurgeon warm-up"
        self.daemon = True  # never keeps a kernel from exiting
        self.begun = False
