"""Random small programs and random swap sets for the swap engine, each checked end to end.

A drawn :class:`Case` is plain data: a program (:class:`BlockSpec`, a tree of blocks whose
``forward`` interprets a list of :class:`Call` and :class:`ReadState` steps), how the model is
called and exported, and a swap set. Its ``repr`` is a Python expression that rebuilds it, so a
failing case found by a long run can be replayed exactly
(``check_case(eval(text, vars(fuzzing)))``); :func:`describe` prints it as the pseudo-code of
each ``forward``.

What the strategy puts in programs on purpose (:data:`FEATURES`; ``cases(require=...)`` forces
any of them):

- ``shared``, ``loop``: one submodule called from several steps, or in a Python loop; its calls
  are ``name``, ``name@1``, ...
- ``dict``, ``tuple``, ``dataclass``: a submodule returning a structure (a registered dataclass
  for the last), built in another order than it is returned; ``partial_unpack``,
  ``reordered_unpack``: its leaves taken out in part, or out of order; ``whole_struct``: the
  structure passed whole to another submodule, which reads some of its leaves.
- ``buffer``: a submodule adding to its own buffer in place (checked after the run too).
- ``kwargs``, ``constants``: arguments by keyword, and float / bool / int arguments.
- ``dynamic``: exported with a dynamic batch dimension, run on another batch size.
- ``pass_through``: a submodule returning one of its inputs unchanged.
- ``returns_input``: a submodule returning its input converted to the dtype it has
  (``x.to(torch.float32)``, ``.float()``, ``.type_as(x)``: the very same tensor);
  ``in_place``: one writing its input in place (and returning a new tensor, or the input);
  ``internal_cast``: an RMSNorm-like one whose first ``x.to(torch.float32)`` is its input, read
  again by the caller; ``constant_outputs``: one returning a tensor and an int, float, bool or
  None the caller uses; ``buffer_outputs``: one returning its own buffer, written in place (a
  cache).
- ``torch_export``: the program made by ``torch.export.export`` itself (every module's
  signature preserved) rather than by ``gs.export``.
- ``aliased``: the same tensor passed to two arguments, ``sub(h, h)``.
- ``same_replacement``: one replacement object serving several requests; ``one_call``: one
  call of a module called more than once (``"name@1"``); ``calls_apart``: two calls of one
  module swapped with two different replacements; ``conflict``: an overlapping pair of
  requests (a module and a request inside it, or a module and one of its calls), which must be
  refused.
- ``reads_child_state``: a block reading a child's, or a deeper module's, parameter or buffer
  directly (``v + self.act0.lin.bias``, ``v @ self.blk1.act0.lin.weight``), and that module
  (or one between) swapped whole. Its replacement (:data:`REPLACEMENT_KINDS`) most often holds
  that state under the same names (a shifted copy of the module, every value moved, so that a
  read of the original's shows), else lacks it (``Shifted``, whose copy sits under ``inner.``)
  or holds it with another shape or dtype. ``reads_written_state``: the state read is a
  buffer the child wrote in place before the read (``self.counter0.total`` after
  ``counter0(x)``; forced, with a swap of that module, whole or one call of it);
  ``cases(exclude=...)`` can leave it out (:data:`EXCLUDABLE`).
- ``param_write``: a block handing a child its own parameter or a view of it
  (``scale(h, self.w0.t())``, ``[1]``, ``.diagonal()``), the child swapped for a replacement
  that writes what it is handed in place under no_grad (``w.mul_(2)``).
- ``custom_backward``: instead of a swap set, ``op(lin(x))`` modules (:class:`Act`) swapped
  for replacements computing the same with a hand-written backward (:class:`CustomBackwardAct`,
  a ``torch.autograd.Function``), right or with one planted gradient error (:data:`GRAD_BUGS`:
  a factor on the weight's gradient, a dropped term, a swapped sign), checked with
  ``gs.verify(..., backward=True)`` (see :func:`check_custom_backward`).
- ``region_name``: in a Surgery, beside the swaps (before or after them), a region of one
  top-level op (``fuse_region``, or ``swap_region`` by a module computing the same), first
  under names that collide with a module's fqn, a call name ``fqn@k`` or any name ending in
  ``@k`` (among them the name of a request of the case, swapped afterwards), then under a
  name of its own (plain, the default, or one that only looks like a module's: ``act0.part``,
  ``region:act0``, ``act0#1``, ``act0@x``), then now and then a second region under the name
  now in force.

What the check expects (:func:`check_case`; a ``custom_backward`` case, see
:func:`check_custom_backward`): the swapped program computes what the eager
reference computes (a deep copy of the model with the replacements set, see
:func:`reference_model`), outputs of two runs and then every buffer and every parameter handed
to a replacement, to rtol = atol = 1e-5. A block's read of ``self.child.attr`` means what it
means in eager: the replacement's attribute once the child is swapped whole, the module's own
while a swap of one call leaves it in place. A replacement writing a parameter it is handed
writes the swapped program's own copy, as eager writes the reference's: after both runs the
user's model and the ExportedProgram hold what they held, bit for bit (checked in every case).
The swapped program's call index, read from its program's, is the one a read of its own graph
makes, down to which neighbours share a chain object (:func:`_check_call_index`).
``gs.module_tree`` must note, on a swappable module, what a block outside it reads of its
state, exactly for the modules whose state is so read. With a region step, each colliding
name is refused with a ``SurgeryError`` ("cannot be named", or "exists already" for a name in
force) that leaves the Surgery as it was (version, position, swaps, fused), the region's own
name is taken as it is, and in the end the Surgery holds every request under its own name
(a module or a call, never a region) and the region under its name; a region computes what
its op did, so the reference is the same.
The engine may refuse a swap set only under its documented rules:

1. In a program torch.export made itself (``torch_export``), a call returning a tensor from
   before it ran (one of its inputs, unchanged, converted to the dtype it has or written in
   place; its own buffer), when that tensor is read after the call (the graph cannot tell the
   module's output from that tensor): ``NotSwappableError`` naming the call. Which calls fall
   under it is found independently of the engine, by running the model eagerly and recording
   which tensors each call returns that existed before it and which tensors every later torch
   operation reads (:func:`analyze`). ``gs.module_tree`` must agree, module by module: not
   swappable, with a reason, exactly for the modules with such a call. ``gs.export`` keeps
   such results apart from the tensors they alias, so in its programs no call is refused.
2. Two requests claiming the same call, or a module and a request inside it: ``ConflictError``.
3. A request swapping a module whole while a block outside it reads the module's state
   directly, when the replacement does not hold, at that attribute path, a tensor of the same
   shape and dtype: ``ReplacementError`` naming the attribute. Which requests fall under it is
   found independently of the engine: the attributes read, from the program's blocks
   (:func:`outside_reads`), looked up on the replacement object as eager's ``getattr`` would
   (:func:`unfit_replacements`). (A tied weight, which the engine exempts, never occurs here.)

Any other refusal, and any other exception, is a failure. torch.export's own rule, that a
module called several times keeps its signature only if every call passes the same argument
structure, is kept by the strategy (a module's first call fixes how it is called), so every
module is preserved.

Every program is small (Linear(3, 3) and elementwise ops on a batch of 3 rows), so a case,
export included, takes a small fraction of a second.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from hypothesis import assume, currently_in_test_context
from hypothesis import strategies as st
from torch import nn
from torch.overrides import TorchFunctionMode

import graphsurgeon as gs
from graphsurgeon._calls import CallIndex, call_index
from graphsurgeon.export import export_notes
from graphsurgeon.swap import swap_info

from .references import assert_close_tree, clone_tree, differs

__all__ = [
    "FEATURES",
    "GRAD_BUGS",
    "OUTCOMES",
    "ActFunction",
    "Block",
    "BlockSpec",
    "Call",
    "Case",
    "CaseResult",
    "CustomBackwardAct",
    "Facts",
    "LeafSpec",
    "Mismatch",
    "Reference",
    "S",
    "Shifted",
    "UnexpectedRefusal",
    "Unobservable",
    "V",
    "analyze",
    "build_model",
    "cases",
    "check_case",
    "check_custom_backward",
    "describe",
    "features",
    "reference_model",
]

FEATURES = (
    "shared",
    "loop",
    "dict",
    "tuple",
    "dataclass",
    "partial_unpack",
    "reordered_unpack",
    "whole_struct",
    "buffer",
    "kwargs",
    "constants",
    "dynamic",
    "pass_through",
    "returns_input",
    "in_place",
    "internal_cast",
    "constant_outputs",
    "buffer_outputs",
    "torch_export",
    "pattern_replace",
    "aliased",
    "same_replacement",
    "one_call",
    "calls_apart",
    "conflict",
    "reads_child_state",
    "reads_written_state",
    "param_write",
    "region_name",
    "custom_backward",
)
# the features cases(exclude=...) can leave out (a situation an engine defect was known in:
# leaving it out shows what else fails)
EXCLUDABLE = frozenset({"reads_written_state"})
# what the check of a case came to, counted beside the features (see :func:`features`)
OUTCOMES = (
    "pass_through_read",
    "pass_through_swapped",
    "state_read_refused",
    "refused",
    "wrong_backward",
)

EXPORT_BATCH = 3  # rows of the example inputs the program is exported with
RUN_BATCH = 5  # rows the program is run on when its batch dimension is dynamic
RUNS = 2  # each swapped program runs twice: buffers carry over from the first run
RTOL = ATOL = 1e-5

# Ops that keep values small (neg only flips them): a ReLU could erase what a replacement
# changes, and growth through loops and buffers would turn float32 rounding into failures.
OPS = {"tanh": torch.tanh, "sin": torch.sin, "sigmoid": torch.sigmoid, "neg": torch.neg}

# -- the program, as plain data -------------------------------------------------------------


@dataclass(frozen=True)
class V:
    """Argument: the block's ``index``-th tensor value (its inputs come first)."""

    index: int


@dataclass(frozen=True)
class S:
    """Argument: the ``index``-th structured output of an earlier call in the block, whole."""

    index: int


@dataclass(frozen=True)
class P:
    """Argument: the block's own parameter ``name`` (3 x 3), or a view of it (``view``, one of
    :data:`VIEWS`): what a parent hands a child as ``child(x, self.w0.t())``."""

    name: str
    view: str = "whole"


VIEWS = {
    "whole": lambda w: w,
    "t": lambda w: w.t(),
    "row": lambda w: w[1],
    "diagonal": lambda w: w.diagonal(),
}
VIEW_TEXT = {"whole": "", "t": ".t()", "row": "[1]", "diagonal": ".diagonal()"}


@dataclass(frozen=True)
class LeafSpec:
    """A leaf submodule: ``kind`` is one of :data:`LEAF_KINDS`.

    ``layout`` is the structure a ``split`` or ``passthrough`` returns (``dict``, ``tuple``,
    ``dataclass``); ``keys`` is the order a ``split`` builds its parts in, or the parts a
    ``gather`` reads, in order.
    """

    kind: str
    op: str = "tanh"
    layout: str = ""
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Call:
    """One step of a block's forward: ``child(*args, **kwargs)``.

    A structured result is kept whole (for later ``S`` arguments) and the leaves named in
    ``unpack`` become tensor values, in that order. ``times > 1`` is a loop,
    ``for _ in range(times): v = child(v, *constants)``.
    """

    child: str
    args: tuple = ()
    kwargs: tuple = ()  # ((name, argument), ...)
    unpack: tuple[str, ...] = ()
    times: int = 1


@dataclass(frozen=True)
class ReadState:
    """A step reading a parameter or buffer directly, ``self.<path>``: a child's or a deeper
    module's (``self.blk0.counter1.total``), or the block's own (``self.w0``), combined with
    the ``value``-th tensor by :func:`with_state` into a new tensor value."""

    path: str
    value: V


@dataclass(frozen=True)
class BlockSpec:
    """A container: ``forward(a, b=None)`` runs ``steps`` over its children and returns
    ``returns``, a weighted sum of values per output key (``""``: one tensor, else a dict). It
    holds a parameter of its own for each name a :class:`P` argument of its steps gives.

    Every returned value is computed (``coefficient * value``), so a block never returns one of
    its inputs unchanged: pass-through outputs come only from the ``passthrough`` leaf.
    """

    inputs: int
    children: tuple  # ((name, LeafSpec | BlockSpec), ...)
    steps: tuple  # (Call | ReadState, ...)
    returns: tuple  # ((key, ((value index, coefficient), ...)), ...)


@dataclass(frozen=True)
class RegionNames:
    """A region of ops the check makes in a Surgery beside the case's swaps, and the names it
    tries for it first.

    The region is a top-level op of the program (no module's): fused (``verb`` ``"fuse"``, by
    ``fuse_region``) or swapped for a module computing the same (``"swap"``, by
    ``swap_region``). Each of ``collisions`` (a module's fqn, a call name ``fqn@k``, a name
    ending in ``@k``) is tried first and must be refused; then the region is made under
    ``name`` (None: the default name), which must be taken as it is; with ``in_force``, a
    second region under the name now in force must be refused. ``before_swaps`` says whether
    this happens before the case's swaps or after them.
    """

    verb: str
    name: str | None
    collisions: tuple[str, ...]
    in_force: bool
    before_swaps: bool


@dataclass(frozen=True)
class Case:
    """A program, how it is called and exported, and the swap set to check.

    ``second_input`` says whether the root's second input ``y`` is absent (``"none"``), passed
    positionally or by keyword. ``swaps`` maps request names (``"blk1.act0"``, ``"act0@1"``) to
    replacement numbers; replacement ``n`` copies module ``replacements[n][0]`` and shifts its
    outputs by ``replacements[n][1]``, one object however many requests use it; it is made as
    ``replacement_kinds[n]`` says (:data:`REPLACEMENT_KINDS`; ``"wrapped"`` when absent).
    ``seed`` seeds the weights and the inputs. ``region``: a region made beside the swaps.
    """

    program: BlockSpec
    second_input: str
    dynamic: bool
    swaps: tuple[tuple[str, int], ...]
    replacements: tuple[tuple[str, float], ...]
    seed: int
    exporter: str = "gs"  # "gs": gs.export; "torch": torch.export.export, every module preserved
    replace_shift: float | None = None  # set: replace the inline gate by GateShift(shift)
    replacement_kinds: tuple[str, ...] = ()
    region: RegionNames | None = None
    # custom_backward: ((fqn of an Act, bug), ...), each swapped for a CustomBackwardAct with
    # that bug (GRAD_BUGS; "right" for none); the case then has no other swaps
    grad_swaps: tuple[tuple[str, str], ...] = ()


# -- the modules ------------------------------------------------------------------------------


@dataclasses.dataclass
class Parts:
    """A registered-pytree dataclass output."""

    p: torch.Tensor
    q: torch.Tensor
    r: torch.Tensor


pytree.register_dataclass(Parts)

PART_OPS = {"p": torch.sin, "q": torch.cos, "r": torch.tanh}
PART_KEYS = ("p", "q", "r")
ROUTE_KEYS = ("out", "skip")
POSITION = {"p": 0, "q": 1, "r": 2, "out": 0, "skip": 1}


def leaf_of(structure, key: str) -> torch.Tensor:
    """The leaf ``key`` of a dict, tuple or :class:`Parts` output."""
    if isinstance(structure, dict):
        return structure[key]
    if isinstance(structure, tuple):
        return structure[POSITION[key]]
    return getattr(structure, key)


def package(layout: str, values: dict[str, torch.Tensor]):
    """``values`` (in canonical key order) as the ``layout`` structure."""
    if layout == "dict":
        return dict(values)
    if layout == "tuple":
        return tuple(values.values())
    return Parts(**values)


class Act(nn.Module):
    """``op(lin(x))``."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return OPS[self.op](self.lin(x))


class Knobs(nn.Module):
    """Uses every constant it is given, so a constant passed wrongly shows in the numbers."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(3, 3)

    def forward(self, x, scale: float = 1.0, flip: bool = False, repeats: int = 1):
        y = self.lin(x) * scale
        for _ in range(repeats):
            y = OPS[self.op](y)
        return y.flip(-1) if flip else y


class Mix(nn.Module):
    """Two tensor arguments, so the same tensor can be passed to both."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(3, 3)

    def forward(self, a, b):
        return OPS[self.op](self.lin(a)) * torch.tanh(b) + 0.5 * b


class Split(nn.Module):
    """Returns parts p, q, r as ``layout``, built in the order ``keys``, returned p, q, r."""

    def __init__(self, layout: str, keys: tuple[str, ...]):
        super().__init__()
        self.layout = layout
        self.keys = keys
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        built = {key: PART_OPS[key](h) * (i + 1) for i, key in enumerate(self.keys)}
        return package(self.layout, {key: built[key] for key in PART_KEYS})


class Gather(nn.Module):
    """Takes a :class:`Split` output whole and reads the parts ``keys``, in that order."""

    def __init__(self, op: str, keys: tuple[str, ...]):
        super().__init__()
        self.op = op
        self.keys = keys
        self.lin = nn.Linear(3, 3)

    def forward(self, parts):
        out = self.lin(leaf_of(parts, self.keys[0]))
        for key in self.keys[1:]:
            out = out * 0.5 + leaf_of(parts, key)
        return OPS[self.op](out)


class Counter(nn.Module):
    """Adds the batch mean of its input to its own buffer in place, every call."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(3, 3)
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x.mean(0))
        return OPS[self.op](self.lin(x) + self.total)


class PassThrough(nn.Module):
    """Returns ``(out, skip)`` as ``layout``, ``skip`` being its second argument unchanged."""

    def __init__(self, op: str, layout: str):
        super().__init__()
        self.op = op
        self.layout = layout
        self.lin = nn.Linear(3, 3)

    def forward(self, x, skip):
        out = OPS[self.op](self.lin(x)) * torch.sigmoid(skip)
        return {"out": out, "skip": skip} if self.layout == "dict" else (out, skip)


CONVERSIONS = {
    "to": lambda x: x.to(torch.float32),
    "float": lambda x: x.float(),
    "type_as": lambda x: x.type_as(x),
}


class Cast(nn.Module):
    """Returns its input converted to the dtype it has (``layout`` says how): at run time, the
    input itself."""

    def __init__(self, op: str, layout: str):
        super().__init__()
        self.op = op
        self.layout = layout

    def forward(self, x):
        return CONVERSIONS[self.layout](x)


class InPlace(nn.Module):
    """Writes its input in place (``x.mul_(0.5)``), then returns ``op(lin(x))`` (``layout``
    ``new``) or the input itself, added to in place (``same``)."""

    def __init__(self, op: str, layout: str):
        super().__init__()
        self.op = op
        self.layout = layout
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x.mul_(0.5)
        y = OPS[self.op](self.lin(x))
        return y if self.layout == "new" else x.add_(y)


class Norm(nn.Module):
    """RMSNorm as Llama's: its first ``x.to(torch.float32)`` is, at run time, ``x`` itself."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.weight = nn.Parameter(torch.rand(3) + 0.5)

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * OPS[self.op](h)


CONSTANTS = {"int": 3, "float": 0.5, "bool": True, "none": None}


class ConstOut(nn.Module):
    """Returns ``(op(lin(x)), k)``, ``k`` a constant (``layout`` says which) the caller uses."""

    def __init__(self, op: str, layout: str):
        super().__init__()
        self.op = op
        self.layout = layout
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return OPS[self.op](self.lin(x)), CONSTANTS[self.layout]


def use_constant(value: torch.Tensor, k) -> torch.Tensor:
    """What a block does with a :class:`ConstOut`'s result: every constant shows."""
    if k is None:
        return value
    if isinstance(k, bool):
        return value if k else -value
    return value * k


class BufOut(nn.Module):
    """A cache: folds the batch mean of ``op(lin(x))`` into its own buffer in place and returns
    the buffer itself."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(3, 3)
        self.register_buffer("cache", torch.zeros(3))

    def forward(self, x):
        self.cache.mul_(0.5).add_(OPS[self.op](self.lin(x)).mean(0))
        return self.cache


def gate(x):
    """An inline gate, ``x * sigmoid(x)``: a function, no module's (what ``s.replace`` finds)."""
    return x * torch.sigmoid(x)


class Gated(nn.Module):
    """``gate(op(lin(x)))``, the gate called through an attribute so that a reference can patch
    it (as one patches Hugging Face's ``apply_rotary_pos_emb``)."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(3, 3)
        self.gate = gate

    def forward(self, x):
        return self.gate(OPS[self.op](self.lin(x)))


class GateShift(nn.Module):
    """What replaces the gate: another function of the same value."""

    def __init__(self, shift: float):
        super().__init__()
        self.shift = shift

    def forward(self, x):
        return shifted_gate(x, self.shift)


def shifted_gate(x, shift: float):
    return x * torch.sigmoid(x) * 0.5 + shift


class Scale(nn.Module):
    """``op(lin(x) @ w)`` (``* w`` for a vector): ``w`` is the caller's own parameter, or a view
    of it (:class:`P`), which a replacement may write in place."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(3, 3)

    def forward(self, x, w):
        h = self.lin(x)
        return OPS[self.op](h @ w if w.dim() == 2 else h * w)


LEAF_TYPES = {
    "act": Act,
    "knobs": Knobs,
    "mix": Mix,
    "split": Split,
    "gather": Gather,
    "counter": Counter,
    "passthrough": PassThrough,
    "cast": Cast,
    "inplace": InPlace,
    "norm": Norm,
    "const": ConstOut,
    "bufout": BufOut,
    "gated": Gated,
    "scale": Scale,
}
LEAF_KINDS = tuple(LEAF_TYPES)


def _resolve(block: nn.Module, argument, values, structures):
    """The value a :class:`Call` argument stands for in a running block."""
    if isinstance(argument, V):
        return values[argument.index]
    if isinstance(argument, S):
        return structures[argument.index]
    if isinstance(argument, P):
        return VIEWS[argument.view](block.get_parameter(argument.name))
    return argument  # a constant: float, bool or int


def state_at(module: nn.Module, path: str) -> torch.Tensor:
    """``module.<path>`` read as model code reads it (``self.blk0.lin.bias``: attribute by
    attribute, so a swapped module's replacement answers for it, as in eager).

    A :class:`CallRouter`, the reference's stand-in for one-call swaps, is read through to the
    module it routes the other calls to: a one-call swap leaves the module in place, and the
    program keeps reading its state.
    """
    held = module
    for part in path.split("."):
        if isinstance(held, CallRouter):
            held = held.original
        held = getattr(held, part)
    return held


def with_state(value: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """What a :class:`ReadState` step makes of a value and the state it reads: ``value @ state``
    for a matrix (a weight), ``value + state`` for a vector (a bias, a buffer)."""
    return value @ state if state.dim() == 2 else value + state


def own_parameters(spec: BlockSpec) -> list[str]:
    """The names of a block's own parameters, in the order its steps first pass them."""
    names = [
        argument.name
        for step in spec.steps
        if isinstance(step, Call)
        for argument in (*step.args, *(a for _, a in step.kwargs))
        if isinstance(argument, P)
    ]
    return list(dict.fromkeys(names))


class Block(nn.Module):
    """A container whose forward interprets its :class:`BlockSpec` (plain Python control flow,
    which torch.export traces away)."""

    def __init__(self, spec: BlockSpec):
        super().__init__()
        self.spec = spec
        for name, child in spec.children:
            self.add_module(name, build_module(child))
        for name in own_parameters(spec):
            self.register_parameter(name, nn.Parameter(torch.randn(3, 3) * 0.5))

    def forward(self, a, b=None):
        values = [a] if b is None else [a, b]
        structures = []
        for step in self.spec.steps:
            if isinstance(step, ReadState):
                values.append(with_state(values[step.value.index], state_at(self, step.path)))
                continue
            child = self.get_submodule(step.child)
            args = [_resolve(self, x, values, structures) for x in step.args]
            kwargs = {k: _resolve(self, x, values, structures) for k, x in step.kwargs}
            if step.times > 1:
                value = args[0]
                for _ in range(step.times):
                    value = child(value, *args[1:], **kwargs)
                values.append(value)
                continue
            out = child(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                values.append(out)
            elif isinstance(out, tuple) and len(out) == 2 and not isinstance(out[1], torch.Tensor):
                values.append(use_constant(*out))  # a ConstOut's (tensor, constant)
            else:
                structures.append(out)
                values.extend(leaf_of(out, key) for key in step.unpack)
        outputs = {
            key: sum(values[i] * coefficient for i, coefficient in terms)
            for key, terms in self.spec.returns
        }
        return outputs.get("", outputs)


class Program(Block):
    """The root: ``forward(x, y=None)``, so the second input can be passed by keyword."""

    def forward(self, x, y=None):
        return super().forward(x, y)


def build_module(spec) -> nn.Module:
    """The module a :class:`LeafSpec` or :class:`BlockSpec` describes."""
    if isinstance(spec, BlockSpec):
        return Block(spec)
    if spec.kind == "split":
        return Split(spec.layout, spec.keys)
    if spec.kind == "gather":
        return Gather(spec.op, spec.keys)
    if spec.kind in ("passthrough", "cast", "inplace", "const"):
        return LEAF_TYPES[spec.kind](spec.op, spec.layout)
    return LEAF_TYPES[spec.kind](spec.op)


def build_model(spec: BlockSpec) -> Program:
    """The root module of ``spec`` (weights from torch's current random state)."""
    model = Program(spec)
    model.eval()
    return model


def module_specs(spec: BlockSpec, prefix: str = "") -> dict[str, LeafSpec | BlockSpec]:
    """``{fqn: spec}`` of every submodule written in ``spec`` (Linear layers left out)."""
    found = {}
    for name, child in spec.children:
        fqn = prefix + name
        found[fqn] = child
        if isinstance(child, BlockSpec):
            found.update(module_specs(child, fqn + "."))
    return found


@functools.lru_cache(maxsize=4096)
def held_state(spec: LeafSpec | BlockSpec) -> tuple[tuple[str, bool], ...]:
    """The parameters and buffers a module of ``spec`` holds, its submodules' included:
    ``(path, is a buffer)`` (``("lin.bias", False)``, ``("counter1.total", True)``). Every
    buffer of these modules is written in place by a call of the module that holds it."""
    with torch.random.fork_rng(devices=[]):  # the weights are thrown away: leave torch's seed
        module = build_module(spec)
    parameters = [(name, False) for name, _ in module.named_parameters()]
    return tuple(parameters + [(name, True) for name, _ in module.named_buffers()])


def reads_a_buffer(block: BlockSpec, step: ReadState) -> bool:
    """Whether a :class:`ReadState` of ``block`` reads a buffer (one a call wrote before the
    read: a child exists from its first call on) rather than a parameter."""
    child, _, attribute = step.path.partition(".")
    spec = dict(block.children).get(child)
    return spec is not None and (attribute, True) in held_state(spec)


def written_read_owners(spec: BlockSpec) -> set[str]:
    """The modules holding, themselves or in a submodule, a buffer that a block outside them
    reads directly after a call wrote it in place (``self.counter0.total`` after
    ``counter0(x)``)."""
    owners = set()
    for block, prefix, step in _walk_steps(spec):
        if isinstance(step, ReadState) and reads_a_buffer(block, step):
            parts = step.path.split(".")
            owners |= {prefix + ".".join(parts[:end]) for end in range(1, len(parts))}
    return owners


def outside_reads(spec: BlockSpec) -> dict[str, tuple[str, ...]]:
    """fqn -> the attributes of that module (its parameters and buffers, its submodules'
    included) that a block outside it reads directly (a :class:`ReadState` of an ancestor):
    eager, once the whole module is swapped, reads the replacement's attribute of that name, so
    a replacement must hold one of the same shape and dtype, or the swap is refused."""
    found: dict[str, list[str]] = {}
    for _, prefix, step in _walk_steps(spec):
        if isinstance(step, ReadState):
            parts = step.path.split(".")
            for end in range(1, len(parts)):
                owner, attribute = ".".join(parts[:end]), ".".join(parts[end:])
                found.setdefault(prefix + owner, []).append(attribute)
    return {fqn: tuple(dict.fromkeys(attributes)) for fqn, attributes in found.items()}


def interface(spec: LeafSpec | BlockSpec | None) -> tuple:
    """What a replacement must accept and return to serve a module of this spec (``None``: the
    ``lin`` Linear of a leaf): a copy of any module with the same interface does (a
    :class:`Gather` reads any :class:`Split` layout)."""
    if spec is None:
        return ("linear",)
    if isinstance(spec, BlockSpec):
        return ("block", spec.inputs, tuple(key for key, _ in spec.returns))
    if spec.kind in ("split", "passthrough", "const"):
        return (spec.kind, spec.layout)
    return (spec.kind,)


# -- replacements and the eager reference --------------------------------------------------


class Shifted(nn.Module):
    """A replacement computing something else: a copy of a module, every output leaf scaled by
    0.5 and shifted. It takes any arguments and returns the copy's structure."""

    def __init__(self, original: nn.Module, shift: float):
        super().__init__()
        self.inner = copy.deepcopy(original)
        self.shift = shift

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: t * 0.5 + self.shift, out)


class _ShiftedCopy:
    """What :func:`make_replacement` adds to a module's class for a replacement that holds what
    the module holds: the module's own forward, every output leaf scaled by 0.5 and shifted."""

    shift: float

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: t * 0.5 + self.shift, out)


class _WritesWeight(_ShiftedCopy):
    """A shifted copy of a :class:`Scale` that first writes the weight it is given in place
    (``w.mul_(2)``, under no_grad, as an optimizer step would). The caller hands it its own
    parameter: eager writes its own copy of the model's parameter at every run, and so must
    the swapped program, never the user's model or the program."""

    def forward(self, x, w):
        with torch.no_grad():
            w.mul_(2)
        return super().forward(x, w)


@functools.cache
def _shifted_class(cls: type, writes: bool = False) -> type:
    """The class of a shifted copy of a ``cls`` module (one per class, so copies share it)."""
    mixin, prefix = (_WritesWeight, "Writes") if writes else (_ShiftedCopy, "")
    return type(f"{prefix}Shifted{cls.__name__}", (mixin, cls), {"__module__": __name__})


# How a replacement is made (Case.replacement_kinds), and what a parent that reads the swapped
# module's state directly finds on it:
REPLACEMENT_KINDS = {
    # Shifted(copy): the copy's state sits under `inner.`, none under the module's own names
    "wrapped": "Shifted",
    # a copy of the module itself, outputs shifted and every parameter and buffer moved by the
    # shift: it holds what the module holds, under the same names, with other values
    "copy": "ShiftedCopy",
    # such a copy, but each attribute read outside the module has another shape, or is float64
    "reshaped": "ShiftedCopy",
    "retyped": "ShiftedCopy",
    # such a copy of a Scale, which first writes the weight it is given in place
    "writes": "WritesShiftedCopy",
}
# the kinds whose replacement holds the state a parent reads, as the module held it
HOLDS_STATE = frozenset({"copy", "writes"})


def make_replacement(
    original: nn.Module, shift: float, kind: str = "wrapped", read: Iterable[str] = ()
) -> nn.Module:
    """A replacement for ``original`` of ``kind`` (:data:`REPLACEMENT_KINDS`); ``read`` are the
    attributes of ``original`` the program reads outside its calls, those a ``"reshaped"`` or
    ``"retyped"`` replacement holds otherwise."""
    if kind == "wrapped":
        return Shifted(original, shift)
    replacement = copy.deepcopy(original)
    replacement.__class__ = _shifted_class(type(original), writes=kind == "writes")
    replacement.shift = shift
    with torch.no_grad():
        # moved, so that a read of the original's state where eager reads the replacement's
        # shows in the numbers
        for tensor in itertools.chain(replacement.parameters(), replacement.buffers()):
            tensor.add_(shift)
    for attribute in read if kind in ("reshaped", "retyped") else ():
        owner_path, _, leaf = attribute.rpartition(".")
        owner = replacement.get_submodule(owner_path)
        old = getattr(owner, leaf)
        if kind == "reshaped":
            new = torch.zeros(*old.shape[:-1], old.shape[-1] + 1)
        else:
            new = old.detach().double()
        setattr(owner, leaf, nn.Parameter(new) if isinstance(old, nn.Parameter) else new)
    return replacement


# A replacement with a hand-written backward (custom_backward): right, or with one error
GRAD_BUGS = ("right", "factor", "dropped term", "swapped sign")
# d op(pre) / d pre, from the op's input ``pre`` and output ``out``
_SLOPES = {
    "tanh": lambda pre, out: 1 - out * out,
    "sin": lambda pre, out: torch.cos(pre),
    "sigmoid": lambda pre, out: out * (1 - out),
    "neg": lambda pre, out: -torch.ones_like(out),
}


class ActFunction(torch.autograd.Function):
    """``op(x @ weight.T + bias)``, as :class:`Act` computes it, with its backward by hand.

    ``bug`` (:data:`GRAD_BUGS`) plants one error in the backward, the forward stays exact:
    ``"factor"``: the weight's gradient twice what it is; ``"dropped term"``: the input's
    gradient leaves out the op's derivative; ``"swapped sign"``: the input's gradient negated.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, op, bug):
        pre = nn.functional.linear(x, weight, bias)  # bit for bit what nn.Linear computes
        out = OPS[op](pre)
        ctx.save_for_backward(x, weight, pre, out)
        ctx.op, ctx.bug = op, bug
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, pre, out = ctx.saved_tensors
        through = grad * _SLOPES[ctx.op](pre, out)
        grad_x = (grad if ctx.bug == "dropped term" else through) @ weight
        if ctx.bug == "swapped sign":
            grad_x = -grad_x
        rows = through.reshape(-1, through.shape[-1])
        grad_weight = rows.t() @ x.reshape(-1, x.shape[-1])
        if ctx.bug == "factor":
            grad_weight = grad_weight * 2
        return grad_x, grad_weight, rows.sum(0), None, None


class CustomBackwardAct(nn.Module):
    """A replacement for an :class:`Act` computing the same forward through
    :class:`ActFunction` (a copy of its ``lin``, so its parameters have the same names)."""

    def __init__(self, act: Act, bug: str = "right"):
        super().__init__()
        if bug not in GRAD_BUGS:
            raise ValueError(f"bug={bug!r}: expected one of {GRAD_BUGS}")
        self.op, self.bug = act.op, bug
        self.lin = copy.deepcopy(act.lin)

    def forward(self, x):
        bug = None if self.bug == "right" else self.bug
        return ActFunction.apply(x, self.lin.weight, self.lin.bias, self.op, bug)


class CallRouter(nn.Module):
    """Eager stand-in for one-call swaps: the k-th call of the module in a forward of the model
    (counted from 0; the reference resets the count) goes to ``by_call[k]``, every other call to
    ``original``."""

    def __init__(self, original: nn.Module, by_call: dict[int, nn.Module]):
        super().__init__()
        self.original = original
        # a ModuleDict would copy nothing, but holding the replacements as plain attributes
        # keeps their buffers out of this module's state: they are compared one by one
        self.by_call = by_call
        self.calls = 0

    def forward(self, *args, **kwargs):
        k, self.calls = self.calls, self.calls + 1
        return self.by_call.get(k, self.original)(*args, **kwargs)


def split_request(name: str) -> tuple[str, int | None]:
    """``"a.b@2"`` -> ``("a.b", 2)``; ``"a.b"`` -> ``("a.b", None)``."""
    fqn, at, index = name.partition("@")
    return fqn, (int(index) if at else None)


@dataclass(frozen=True)
class Reference:
    """An eager reference: ``model`` to run, ``originals`` (fqn -> its copy of each original
    submodule, swapped or not) and ``replacements`` (request -> its copy of the replacement),
    to read their buffers after the run, and ``ran``, the calls each original really ran."""

    model: nn.Module
    originals: dict[str, nn.Module]
    replacements: dict[str, nn.Module]
    ran: collections.Counter[str]  # fqn -> how many times its original module ran


def reference_model(model: nn.Module, requests: dict[str, nn.Module]) -> Reference:
    """What swapping ``requests`` should compute: a deep copy of ``model`` with each replacement
    set by setattr (a request ``"name@k"`` by a :class:`CallRouter` at ``name``).

    Unlike ``references.eager_reference``, the model and the replacements are copied in one
    ``deepcopy``, so a replacement serving several requests stays one object (one buffer), as it
    is in the swapped program.
    """
    reference, replacements = copy.deepcopy((model, requests))
    originals = dict(reference.named_modules())
    routers: list[CallRouter] = []

    def restart_counts(*_):  # calls are numbered per forward of the model, as torch.export does
        for router in routers:
            router.calls = 0

    reference.register_forward_pre_hook(restart_counts)
    ran: collections.Counter[str] = collections.Counter()
    for fqn, module in originals.items():
        module.register_forward_pre_hook(lambda *_, fqn=fqn: ran.update((fqn,)))
    by_fqn: dict[str, dict[int | None, nn.Module]] = {}
    for name, replacement in replacements.items():
        fqn, index = split_request(name)
        by_fqn.setdefault(fqn, {})[index] = replacement
    for fqn, routes in by_fqn.items():
        parent_name, _, attribute = fqn.rpartition(".")
        parent = reference.get_submodule(parent_name)
        if None in routes:  # every call; the swap set is an antichain, so nothing else here
            setattr(parent, attribute, routes[None])
        else:
            routers.append(CallRouter(originals[fqn], routes))
            setattr(parent, attribute, routers[-1])
    return Reference(reference, originals, replacements, ran)


# -- what the model does, found eagerly ------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What one eager run of a program shows, independently of the engine.

    ``calls``: fqn -> its call names in order (``name``, ``name@1``, ...). ``blocked``: call
    name -> why the engine must refuse it in a program torch.export made itself (it returns a
    tensor from before the call, one of its inputs or its own buffer, and that tensor is read
    after the call).
    """

    calls: dict[str, tuple[str, ...]]
    blocked: dict[str, str]
    # fqn -> the shapes and dtypes of what its first call returned: a replacement serves two
    # modules only if they return alike (a block returning a buffer returns no batch)
    returns: dict[str, str] = dataclasses.field(default_factory=dict)

    def refused(self, request: str) -> list[str]:
        """The blocked calls a request covers."""
        fqn, index = split_request(request)
        names = self.calls[fqn] if index is None else (call_name(fqn, index),)
        return [name for name in names if name in self.blocked]


def call_name(fqn: str, index: int) -> str:
    """torch.export's name of a module's ``index``-th call: ``fqn``, ``fqn@1``, ..."""
    return fqn if index == 0 else f"{fqn}@{index}"


class _ReadLog(TorchFunctionMode):
    """Records, for every tensor a torch operation reads, the last time it was read."""

    def __init__(self):
        super().__init__()
        self.clock = itertools.count()
        self.last_read: dict[int, int] = {}
        self.alive: list[torch.Tensor] = []  # keeps ids unique for the whole run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # reading .shape is not an operation on the values (and makes no node in the graph)
        if getattr(func, "__name__", "") != "__get__":
            now = next(self.clock)
            for leaf in pytree.tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor):
                    self.last_read[id(leaf)] = now
                    self.alive.append(leaf)
        return func(*args, **kwargs)


def _tensor_leaves(value) -> list[torch.Tensor]:
    """The tensors among ``value``'s pytree leaves."""
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def analyze(spec: BlockSpec, second_input: str = "none") -> Facts:
    """Run the program once eagerly and find every call and every blocked call."""
    model = build_model(spec)
    log = _ReadLog()
    counts: dict[str, int] = {}
    calls: dict[str, list[str]] = {}
    pending: list[tuple[str, list[torch.Tensor]]] = []
    returned_unchanged: list[tuple[str, int, torch.Tensor]] = []  # (call, end time, tensor)
    returns: dict[str, str] = {}

    def before(fqn):
        def hook(module, args, kwargs):
            index = counts.get(fqn, 0)
            counts[fqn] = index + 1
            name = call_name(fqn, index)
            calls.setdefault(fqn, []).append(name)
            pending.append((name, _tensor_leaves((args, kwargs))))

        return hook

    def after(module, args, kwargs, output):
        name, inputs = pending.pop()
        fqn = name.partition("@")[0]
        returns.setdefault(fqn, _shapes_text(output))
        end = next(log.clock)
        existing = [*inputs, *module.parameters(), *module.buffers()]  # from before the call
        for leaf in _tensor_leaves(output):
            if any(leaf is i for i in existing):
                returned_unchanged.append((name, end, leaf))

    for fqn, module in model.named_modules():
        if fqn:
            module.register_forward_pre_hook(before(fqn), with_kwargs=True)
            module.register_forward_hook(after, with_kwargs=True)
    args, kwargs = model_inputs(second_input, EXPORT_BATCH)
    with torch.no_grad(), log:
        out = model(*args, **kwargs)
    model_outputs = _tensor_leaves(out)
    blocked = {}
    for name, end, tensor in returned_unchanged:
        if any(tensor is o for o in model_outputs):
            blocked.setdefault(name, "returns a tensor from before it that the model returns")
        elif log.last_read.get(id(tensor), -1) > end:
            blocked.setdefault(name, "returns a tensor from before it that is read after the call")
    return Facts({fqn: tuple(names) for fqn, names in calls.items()}, blocked, returns)


def _shapes_text(value) -> str:
    """The structure of ``value`` with its tensors' shapes and dtypes."""
    leaves, spec = pytree.tree_flatten(value)
    shapes = [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t for t in leaves]
    return f"{spec} {shapes}"


def model_inputs(second_input: str, batch: int) -> tuple[tuple, dict]:
    """Random ``(args, kwargs)`` for the root, ``batch`` rows each."""
    x = torch.randn(batch, 3)
    if second_input == "none":
        return (x,), {}
    y = torch.randn(batch, 3)
    return ((x, y), {}) if second_input == "positional" else ((x,), {"y": y})


# -- the strategy -----------------------------------------------------------------------------

COEFFICIENTS = (1.0, 0.5, -1.0, 2.0, -0.5)
SCALES = (0.5, 2.5, -1.5)
LAYOUTS = ("dict", "tuple", "dataclass")
_KNOB_PARAMETERS = ("scale", "flip", "repeats")
# features planted as steps of the root block, and the step kind that plants each
_PLANTED_STEPS = {
    "shared": "again",
    "loop": "loop",
    "dict": "split:dict",
    "tuple": "split:tuple",
    "dataclass": "split:dataclass",
    "partial_unpack": "split:partial",
    "reordered_unpack": "split:reordered",
    "whole_struct": "gather",
    "buffer": "counter",
    "kwargs": "knobs:kwargs",
    "constants": "knobs:constants",
    "pass_through": "passthrough",
    "returns_input": "cast",
    "in_place": "inplace",
    "internal_cast": "norm",
    "constant_outputs": "const",
    "buffer_outputs": "bufout",
    "pattern_replace": "gated",
    "aliased": "mix:aliased",
    "reads_child_state": "read:child",
    "reads_written_state": "read:buffer",
    "param_write": "scale",
    "custom_backward": "act",
}


def chance(draw, one_in: int) -> bool:
    """True about once in ``one_in`` draws.

    Not ``integers(0, n) == 0``: hypothesis draws the lower bound far more often than its share
    (it generates many examples near the simplest one), which would make rare choices common.
    """
    return draw(st.integers(0, one_in - 1)) == one_in // 2


class _BlockDrawer:
    """Draws one block: its steps, creating children as they are first called.

    torch.export preserves a module's call signature only when every call passes the same
    argument structure (the same positional count and keyword names, the same layout of a
    structured argument; constant values may differ). A child's first call fixes that form in
    ``forms`` and later calls reuse it.
    """

    def __init__(
        self,
        draw,
        inputs: int,
        depth: int,
        output_keys: tuple[str, ...],
        written_reads: bool = True,
    ):
        self.draw = draw
        self.inputs = inputs
        self.depth = depth
        self.written_reads = written_reads  # whether a read may take a buffer a child wrote
        self.output_keys = output_keys
        self.children: dict[str, LeafSpec | BlockSpec] = {}
        self.forms: dict[str, tuple] = {}
        self.steps: list[Call] = []
        self.n_values = inputs
        self.split_layouts: dict[int, str] = {}  # structure index of each split output
        self.n_structures = 0
        self.read: set[int] = set()
        self.reserved: set[int] = set()  # values no later step or return may read
        self.weights: list[str] = []  # the block's own, made as a step first passes them

    # values, names, forms

    def readable(self) -> list[int]:
        """Indices of the values a step or the return may still read."""
        return [i for i in range(self.n_values) if i not in self.reserved]

    def value(self) -> V:
        """A tensor argument: one of the readable values."""
        # shrinks towards the most recent value: chains are the common case
        candidates = self.readable()
        index = candidates[-1 - self.draw(st.integers(0, len(candidates) - 1))]
        self.read.add(index)
        return V(index)

    def new_child(self, spec) -> str:
        """Add a child, named after its kind and position (``act0``, ``blk3``)."""
        prefix = "blk" if isinstance(spec, BlockSpec) else spec.kind
        name = f"{prefix}{len(self.children)}"
        self.children[name] = spec
        return name

    def form(self, name: str, draw_form):
        """How child ``name`` is called: drawn at its first call, the same at every other."""
        if name not in self.forms:
            self.forms[name] = draw_form()
        return self.forms[name]

    def keyword(self, flavour: str = "") -> bool:
        """Whether a tensor argument is passed by keyword (always for the ``kwargs`` flavour)."""
        return flavour == "kwargs" or self.draw(st.booleans())

    def op(self) -> str:
        """An elementwise op for a new leaf."""
        return self.draw(st.sampled_from(sorted(OPS)))

    def add(self, call: Call | ReadState, result: str) -> None:
        """Record a step; ``result`` is "tensor" or "structure" (plus the leaves unpacked)."""
        self.steps.append(call)
        if result == "tensor":
            self.n_values += 1
        else:
            self.n_structures += 1
            self.n_values += len(call.unpack)

    # steps

    def step(self, kind: str) -> None:
        """Add one step of ``kind`` (``"split:dict"``: kind ``split``, flavour ``dict``)."""
        kind, _, flavour = kind.partition(":")
        getattr(self, "step_" + kind)(flavour)

    def available_kinds(self) -> list[str]:
        """The step kinds that can come next."""
        kinds = ["act", "knobs", "mix", "split", "counter", "passthrough", "loop"]
        kinds += ["cast", "inplace", "norm", "const", "bufout", "gated", "scale", "read"]
        if self.split_layouts:
            kinds.append("gather")
        if self.children:
            kinds.append("again")
        if self.depth > 0:
            kinds.append("block")
        return kinds

    def step_act(self, flavour: str = "", name: str | None = None) -> None:
        """``act(v)``; each ``step_*`` calls child ``name`` again, or a new child when None."""
        name = name or self.new_child(LeafSpec("act", self.op()))
        self.add(Call(name, (self.value(),)), "tensor")

    def knob_form(self, flavour: str) -> tuple[int, tuple[str, ...]]:
        """How a :class:`Knobs` is called: how many constants positionally, which by keyword
        (the others left to their defaults)."""
        low = 1 if flavour == "constants" else 0
        high = 2 if flavour == "kwargs" else 3  # leave a parameter to pass by keyword
        n_positional = self.draw(st.integers(low, high))
        keywords = [
            parameter
            for i, parameter in enumerate(_KNOB_PARAMETERS[n_positional:])
            if (flavour == "kwargs" and i == 0) or self.draw(st.booleans())
        ]
        return n_positional, tuple(keywords)

    def knob_arguments(self, name: str, flavour: str) -> tuple[tuple, tuple]:
        """Constants for a call of :class:`Knobs` ``name``, in its form; values drawn anew."""
        n_positional, keywords = self.form(name, lambda: self.knob_form(flavour))
        constants = {
            "scale": self.draw(st.sampled_from(SCALES)),
            "flip": self.draw(st.booleans()),
            "repeats": self.draw(st.integers(1, 2)),
        }
        positional = tuple(constants[p] for p in _KNOB_PARAMETERS[:n_positional])
        return positional, tuple((k, constants[k]) for k in keywords)

    def step_knobs(self, flavour: str = "", name: str | None = None) -> None:
        """``knobs(v, 2.5, flip=True)``; flavours ``kwargs`` and ``constants``."""
        if flavour == "kwargs" and self.draw(st.booleans()):
            # keywords that are tensors rather than constants: mix(a, b=h)
            return self.step_mix("kwargs")
        name = name or self.new_child(LeafSpec("knobs", self.op()))
        positional, keywords = self.knob_arguments(name, flavour)
        self.add(Call(name, (self.value(), *positional), keywords), "tensor")

    def two_values(self, flavour: str) -> tuple[V, V]:
        """Two tensor arguments; one value twice now and then, always for ``aliased``."""
        first = self.value()
        if flavour == "aliased" or chance(self.draw, 4):
            return first, first  # sub(h, h)
        return first, self.value()

    def step_mix(self, flavour: str = "", name: str | None = None) -> None:
        """``mix(a, b)`` or ``mix(a, b=h)``, with ``a`` and ``b`` the same value now and then."""
        name = name or self.new_child(LeafSpec("mix", self.op()))
        a, b = self.two_values(flavour)
        if self.form(name, lambda: self.keyword(flavour)):
            self.add(Call(name, (a,), (("b", b),)), "tensor")
        else:
            self.add(Call(name, (a, b)), "tensor")

    def unpack(self, keys: tuple[str, ...], flavour: str, required: str | None = None) -> tuple:
        """An ordered selection of ``keys``: all of them, some, out of order."""
        chosen = self.draw(st.permutations(keys))
        low = 1 if required or flavour in ("partial", "reordered") else 0
        high = len(keys) - 1 if flavour == "partial" else len(keys)
        if flavour == "reordered":
            low = max(low, 2)
        size = self.draw(st.integers(low, high))
        chosen = list(chosen[:size])
        if flavour == "reordered" and chosen == sorted(chosen, key=keys.index):
            chosen.reverse()
        if required and required not in chosen:
            chosen[0] = required
        return tuple(chosen)

    def step_split(self, flavour: str = "", name: str | None = None) -> None:
        """``s = split(v)`` and some of its leaves taken out; flavours: a layout, ``partial``,
        ``reordered``."""
        if name is None:
            layout = flavour if flavour in LAYOUTS else self.draw(st.sampled_from(LAYOUTS))
            order = tuple(self.draw(st.permutations(PART_KEYS)))
            name = self.new_child(LeafSpec("split", op="", layout=layout, keys=order))
        call = Call(name, (self.value(),), unpack=self.unpack(PART_KEYS, flavour))
        self.split_layouts[self.n_structures] = self.children[name].layout
        self.add(call, "structure")

    def step_gather(self, flavour: str = "", name: str | None = None) -> None:
        """``gather(s)``: a split output passed whole (a split first, if there is none)."""
        if not self.split_layouts:
            self.step_split()
        if name is None:
            n_keys = self.draw(st.integers(1, 3))
            keys = tuple(self.draw(st.permutations(PART_KEYS)))[:n_keys]
            name = self.new_child(LeafSpec("gather", self.op(), keys=keys))
        some_layout = self.draw(st.sampled_from(sorted(set(self.split_layouts.values()))))
        keyword, layout = self.form(name, lambda: (self.keyword(), some_layout))
        if layout not in self.split_layouts.values():
            self.step_split(layout)
        matching = [i for i, kind in self.split_layouts.items() if kind == layout]
        structure = S(self.draw(st.sampled_from(matching)))
        if keyword:
            self.add(Call(name, (), (("parts", structure),)), "tensor")
        else:
            self.add(Call(name, (structure,)), "tensor")

    def step_counter(self, flavour: str = "", name: str | None = None) -> None:
        """``counter(v)``, which adds to its buffer in place."""
        name = name or self.new_child(LeafSpec("counter", self.op()))
        self.add(Call(name, (self.value(),)), "tensor")

    def step_cast(self, flavour: str = "", name: str | None = None) -> None:
        """``cast(v)``: ``v`` itself, converted to the dtype it has."""
        if name is None:
            layout = self.draw(st.sampled_from(sorted(CONVERSIONS)))
            name = self.new_child(LeafSpec("cast", "", layout=layout))
        self.add(Call(name, (self.value(),)), "tensor")

    def step_inplace(self, flavour: str = "", name: str | None = None) -> None:
        """``inplace(v)``: writes ``v`` in place (later reads of ``v`` see it)."""
        if name is None:
            layout = self.draw(st.sampled_from(("new", "same")))
            name = self.new_child(LeafSpec("inplace", self.op(), layout=layout))
        self.add(Call(name, (self.value(),)), "tensor")

    def step_norm(self, flavour: str = "", name: str | None = None) -> None:
        """``norm(v)``, RMSNorm-like; the block's return reads ``v`` again (a residual)."""
        name = name or self.new_child(LeafSpec("norm", self.op()))
        argument = self.value()
        self.add(Call(name, (argument,)), "tensor")
        self.read.discard(argument.index)  # so the return reads it again

    def step_const(self, flavour: str = "", name: str | None = None) -> None:
        """``y, k = const(v)``, then ``y * k`` (or ``-y``, ``y``): the constant shows."""
        if name is None:
            layout = self.draw(st.sampled_from(sorted(CONSTANTS)))
            name = self.new_child(LeafSpec("const", self.op(), layout=layout))
        self.add(Call(name, (self.value(),)), "tensor")

    def step_bufout(self, flavour: str = "", name: str | None = None) -> None:
        """``bufout(v)``: its own buffer, written in place and returned."""
        name = name or self.new_child(LeafSpec("bufout", self.op()))
        self.add(Call(name, (self.value(),)), "tensor")

    def step_gated(self, flavour: str = "", name: str | None = None) -> None:
        """``gated(v)``: its value gated by an inline function (a pattern, no module's)."""
        name = name or self.new_child(LeafSpec("gated", self.op()))
        self.add(Call(name, (self.value(),)), "tensor")

    def step_scale(self, flavour: str = "", name: str | None = None) -> None:
        """``scale(v, self.w0)``, or a view of ``w0`` (``.t()``, ``[1]``, ``.diagonal()``): the
        block hands a child its own parameter, which a replacement may write in place."""
        name = name or self.new_child(LeafSpec("scale", self.op()))
        # one view per child: a module keeps its signature only if every call passes alike
        keyword, view = self.form(
            name, lambda: (self.keyword(), self.draw(st.sampled_from(sorted(VIEWS))))
        )
        if self.weights and self.draw(st.booleans()):
            parameter = self.draw(st.sampled_from(self.weights))
        else:
            parameter = f"w{len(self.weights)}"
            self.weights.append(parameter)
        weight = P(parameter, view)
        if keyword:
            self.add(Call(name, (self.value(),), (("w", weight),)), "tensor")
        else:
            self.add(Call(name, (self.value(), weight)), "tensor")

    def child_state(self) -> list[tuple[str, bool]]:
        """``(path, is a buffer)`` of every parameter and buffer of the children (and of their
        submodules): what a :class:`ReadState` may read."""
        return [
            (f"{name}.{held}", is_buffer)
            for name, spec in self.children.items()
            for held, is_buffer in held_state(spec)
        ]

    def step_read(self, flavour: str = "") -> None:
        """``v + self.child.bias`` (a vector) or ``v @ self.child.lin.weight`` (a matrix): a
        child's or a deeper module's state read directly, a buffer the child wrote in place
        among them (unless the strategy leaves those out); unless ``flavour`` is ``child``,
        now and then the block's own parameter, which a replacement may have written. Flavour
        ``buffer``: a buffer a child wrote."""
        if flavour == "buffer":
            kinds, allowed = ("counter", "bufout"), {True}
        else:
            kinds, allowed = ("counter", "norm", "bufout", "act"), {False, self.written_reads}
        if not any(is_buffer in allowed for _, is_buffer in self.child_state()):
            # a child holding state to read: a buffer written in place, a weight, a Linear's
            self.step(self.draw(st.sampled_from([k for k in kinds if self.holds(k, allowed)])))
        paths = [path for path, is_buffer in self.child_state() if is_buffer in allowed]
        if flavour == "":
            paths += self.weights
        self.add(ReadState(self.draw(st.sampled_from(paths)), self.value()), "tensor")

    @staticmethod
    def holds(kind: str, allowed: set[bool]) -> bool:
        """Whether a leaf of ``kind`` holds state of the ``allowed`` sorts (buffer or not)."""
        return any(is_buffer in allowed for _, is_buffer in held_state(LeafSpec(kind)))

    def step_passthrough(self, flavour: str = "", name: str | None = None) -> None:
        """``s = passthrough(x, skip)``: half the time nothing in this block reads ``skip``
        again, so the call is swappable unless an enclosing block reads it."""
        if name is None:
            layout = self.draw(st.sampled_from(("dict", "tuple")))
            name = self.new_child(LeafSpec("passthrough", self.op(), layout=layout))
        x, skip = self.two_values(flavour)
        if self.draw(st.booleans()):
            # nothing reads the value it passes through after the call (in this block): the
            # engine swaps such a call
            unpack = ("out",)
            self.reserved.add(skip.index)
        else:
            # its computed output is always taken: without it the call changes nothing
            unpack = self.unpack(ROUTE_KEYS, "", required="out")
        if self.form(name, self.keyword):
            self.add(Call(name, (x,), (("skip", skip),), unpack=unpack), "structure")
        else:
            self.add(Call(name, (x, skip), unpack=unpack), "structure")

    def draw_child_block(self, inputs: int, output_keys: tuple[str, ...]) -> BlockSpec:
        """A nested block, one level shallower, of 1 to 3 random steps."""
        inner = _BlockDrawer(self.draw, inputs, self.depth - 1, output_keys, self.written_reads)
        inner.fill(self.draw(st.integers(1, 3)), planted=())
        return inner.spec()

    def step_block(self, flavour: str = "", name: str | None = None) -> None:
        """``blk(a)``, ``blk(a, b)`` or ``blk(a, b=h)``: a nested block, its result a tensor or
        a dict of two."""
        if name is None:
            inputs = self.draw(st.integers(1, 2))
            output_keys = self.draw(st.sampled_from((("",), ("main", "aux"))))
            name = self.new_child(self.draw_child_block(inputs, output_keys))
        spec = self.children[name]
        values = tuple(self.value() for _ in range(spec.inputs))
        if spec.inputs == 2 and self.form(name, self.keyword):
            args, kwargs = values[:1], (("b", values[1]),)
        else:
            args, kwargs = values, ()
        if spec.returns[0][0] == "":
            self.add(Call(name, args, kwargs), "tensor")
        else:
            unpack = self.unpack(("main", "aux"), "", required="main")
            self.add(Call(name, args, kwargs, unpack=unpack), "structure")

    def loopable(self) -> list[str]:
        """Children taking one tensor (and constants) and returning one tensor."""
        return [
            name
            for name, spec in self.children.items()
            if (isinstance(spec, BlockSpec) and spec.inputs == 1 and spec.returns[0][0] == "")
            or (isinstance(spec, LeafSpec) and spec.kind in ("act", "knobs", "counter", "gated"))
        ]

    def step_loop(self, flavour: str = "") -> None:
        """``for _ in range(n): v = child(v)`` over a new or an existing child."""
        existing = self.loopable()
        if existing and self.draw(st.booleans()):
            name = self.draw(st.sampled_from(existing))
        else:
            kind = self.draw(st.sampled_from(("act", "knobs", "counter", "block")))
            if kind == "block" and self.depth > 0:
                name = self.new_child(self.draw_child_block(1, ("",)))
            else:
                name = self.new_child(LeafSpec("knobs" if kind == "block" else kind, self.op()))
        spec = self.children[name]
        positional, keywords = (), ()
        if isinstance(spec, LeafSpec) and spec.kind == "knobs":
            positional, keywords = self.knob_arguments(name, "")
        times = self.draw(st.integers(2, 3))
        self.add(Call(name, (self.value(), *positional), keywords, times=times), "tensor")

    def step_again(self, flavour: str = "") -> None:
        """Call an existing child once more (a shared submodule)."""
        if not self.children:
            self.step_act()
        name = self.draw(st.sampled_from(list(self.children)))
        spec = self.children[name]
        kind = "block" if isinstance(spec, BlockSpec) else spec.kind
        getattr(self, "step_" + kind)("", name=name)

    def fill(self, n_steps: int, planted: Iterable[str]) -> None:
        """The planted steps, then ``n_steps`` random ones."""
        for kind in planted:
            self.step(kind)
        for _ in range(n_steps):
            self.step(self.draw(st.sampled_from(self.available_kinds())))

    def spec(self) -> BlockSpec:
        """The block drawn so far, with its return."""
        # every value no step read is returned, so no leaf taken out is dead; then some more
        readable = self.readable()
        unread = [i for i in readable if i >= self.inputs and i not in self.read]
        extra = self.draw(st.lists(st.sampled_from(readable), max_size=2))
        used = sorted(set(unread) | set(extra)) or [readable[-1]]
        terms = [(i, self.draw(st.sampled_from(COEFFICIENTS))) for i in used]
        if self.output_keys == ("",):
            returns = (("", tuple(terms)),)
        else:
            cut = self.draw(st.integers(1, max(1, len(terms) - 1)))
            main, aux = terms[:cut], terms[cut:] or [(terms[-1][0], 0.5)]
            returns = (("main", tuple(main)), ("aux", tuple(aux)))
        return BlockSpec(self.inputs, tuple(self.children.items()), tuple(self.steps), returns)


@st.composite
def programs(
    draw,
    require: frozenset[str] = frozenset(),
    depth: int = 2,
    exclude: frozenset[str] = frozenset(),
) -> BlockSpec:
    """A random root block; each feature in ``require`` is planted as a step of the root, none
    in ``exclude`` (see :data:`EXCLUDABLE`) is drawn."""
    inputs = draw(st.integers(1, 2))
    output_keys = draw(st.sampled_from((("",), ("main", "aux"))))
    planted = [_PLANTED_STEPS[f] for f in sorted(require) if f in _PLANTED_STEPS]
    needs_calls = require & {"one_call", "calls_apart", "conflict"}
    if needs_calls and "again" not in planted and "loop" not in planted:
        planted.append(draw(st.sampled_from(("again", "loop"))))  # a module called twice
    if "same_replacement" in require:
        planted += ["act", "act"]  # two modules one replacement can serve
    root = _BlockDrawer(draw, inputs, depth, output_keys, "reads_written_state" not in exclude)
    root.fill(draw(st.integers(0 if planted else 1, 4)), draw(st.permutations(planted)))
    return root.spec()


def overlap(a: str, b: str) -> bool:
    """Whether two requests claim the same calls, or may: the same module unless both name
    different single calls, or a module and its own descendant (any calls of either)."""
    (fqn_a, index_a), (fqn_b, index_b) = split_request(a), split_request(b)
    if fqn_a == fqn_b:
        return index_a is None or index_b is None or index_a == index_b
    return fqn_a.startswith(fqn_b + ".") or fqn_b.startswith(fqn_a + ".")


def _antichain(requests: Iterable[str]) -> list[str]:
    """The requests in order, dropping any that overlaps one kept before."""
    kept: list[str] = []
    for request in requests:
        if not any(overlap(request, other) for other in kept):
            kept.append(request)
    return kept


def conflicting(requests: Iterable[str]) -> list[tuple[str, str]]:
    """The pairs of requests the engine must refuse as a ConflictError: a call requested twice
    (``"m"`` with ``"m@1"``), or a module with any request inside it. (A single call of a
    parent with a call of its child may or may not share nodes; the strategy never draws it.)"""
    requests = list(requests)
    return [(a, b) for a, b in itertools.combinations(requests, 2) if overlap(a, b)]


@st.composite
def swap_sets(
    draw,
    spec: BlockSpec,
    facts: Facts,
    require: frozenset[str] = frozenset(),
    exporter: str = "gs",
    accepted: bool = False,
):
    """Requests and their replacements for ``spec``: ``(swaps, replacements, kinds)``.

    The requests are an antichain (no two claim the same call, none is inside another), but for
    ``require={"conflict"}`` (or now and then), where one overlapping pair is added on purpose.
    Biases, so that rare situations come often: a call that must be refused, calls of one module
    swapped apart, one replacement for several modules, a module whose state a parent reads
    swapped whole, a module handed its caller's parameter swapped for one that writes it.
    ``accepted``: a swap set the engine must accept (no conflict, every replacement holding
    what the program reads of it), so that what comes after the swap is checked.
    """
    specs = module_specs(spec)
    reads = outside_reads(spec)
    whole = sorted(facts.calls)
    multi = {fqn: len(names) for fqn, names in facts.calls.items() if len(names) > 1}
    one_call = sorted(f"{fqn}@{k}" for fqn, n in multi.items() for k in range(n))
    planted: dict[str, tuple[str, ...]] = {}  # feature -> its requests, kept in front
    apart: tuple[str, ...] = ()  # two calls of one module, each with its own replacement
    shared: tuple[str, ...] = ()  # two modules served by one replacement
    if multi and ("one_call" in require or chance(draw, 4)):
        planted["one_call"] = (draw(st.sampled_from(one_call)),)
    if multi and ("calls_apart" in require or chance(draw, 6)):
        fqn = draw(st.sampled_from(sorted(multi)))
        apart = tuple(f"{fqn}@{k}" for k in draw(st.permutations(range(multi[fqn])))[:2])
        planted["calls_apart"] = apart
    by_interface: dict[tuple, list[str]] = {}
    for fqn in whole:
        by_interface.setdefault(interface(specs.get(fqn)), []).append(fqn)
    # two modules of one interface, neither inside the other (a block may hold a block like it)
    # (a copy of one module need not hold what a parent reads of the other: none is read)
    pairs = [
        (a, b)
        for group in by_interface.values()
        for a, b in itertools.permutations(group, 2)
        if not overlap(a, b) and facts.returns.get(a) == facts.returns.get(b)
        if a not in reads and b not in reads
    ]
    if pairs and ("same_replacement" in require or chance(draw, 4)):
        shared = draw(st.sampled_from(pairs))
        planted["same_replacement"] = shared
    blocked = facts.blocked if exporter == "torch" else {}
    if blocked and chance(draw, 6):
        planted["refused"] = (draw(st.sampled_from(sorted(blocked))),)
    passing = [
        fqn
        for fqn in whole
        if interface(specs.get(fqn))[0] == "passthrough"
        and (exporter != "torch" or not facts.refused(fqn))
    ]
    if passing and draw(st.booleans()):
        planted["pass_through_swapped"] = (draw(st.sampled_from(passing)),)
    read_owners = sorted(fqn for fqn in reads if fqn in facts.calls)
    if read_owners and ("reads_child_state" in require or chance(draw, 3)):
        planted["reads_child_state"] = (draw(st.sampled_from(read_owners)),)
    written = sorted(written_read_owners(spec))
    if written and "reads_written_state" in require:
        planted["reads_written_state"] = (draw(st.sampled_from(written)),)
    scales = [fqn for fqn in whole if interface(specs.get(fqn))[0] == "scale"]
    if scales and ("param_write" in require or chance(draw, 2)):
        scale_calls = [r for r in one_call if split_request(r)[0] in scales]
        planted["param_write"] = (draw(st.sampled_from(scales + scale_calls)),)
    # what is required goes first: the antichain keeps the earlier of two overlapping requests
    first = [r for f in sorted(planted, key=lambda f: f not in require) for r in planted[f]]
    drawn = draw(st.lists(st.sampled_from(whole + one_call), min_size=1, max_size=4))
    requests = _antichain(first + drawn)
    gated = [fqn for fqn in whole if interface(specs.get(fqn))[0] == "gated"]
    if gated and "pattern_replace" in require:
        # one gated module no swap covers, whose gate s.replace will replace
        kept = draw(st.sampled_from(gated))
        requests = [r for r in requests if not overlap(split_request(r)[0], kept)]
    if "conflict" in require or (not accepted and chance(draw, 10)):
        requests = _with_conflict(draw, requests, whole, one_call, multi)
    # replacement n copies module replacements[n][0]; a request may reuse an earlier one of its
    # own interface (by plan for ``shared``, never for ``apart``, else by chance), unless a
    # parent reads the state of either module (a copy holds what its own module holds)
    replacements: list[tuple[str, float]] = []
    kinds: list[str] = []
    swaps: dict[str, int] = {}
    writes = planted.get("param_write", ())
    for request in requests:
        fqn, _ = split_request(request)
        compatible = [
            n
            for n, (source, _) in enumerate(replacements)
            if interface(specs.get(source)) == interface(specs.get(fqn))
            and facts.returns.get(source) == facts.returns.get(fqn)
            and source not in reads
            and fqn not in reads
        ]
        if request in apart:
            compatible = [n for n in compatible if n not in {swaps.get(r) for r in apart}]
        partner = [r for r in shared if r != request and r in swaps] if request in shared else []
        if partner:  # whichever of the pair comes first (a conflict may reorder them)
            swaps[request] = swaps[partner[0]]
        elif compatible and request not in writes and chance(draw, 3):
            swaps[request] = draw(st.sampled_from(compatible))
        else:
            swaps[request] = len(replacements)
            replacements.append((fqn, 0.25 * (len(replacements) + 1)))
            kinds.append(
                _replacement_kind(draw, request, specs, reads, request in writes, accepted)
            )
    # a case's kinds are left out when every replacement is a plain Shifted
    if all(kind == "wrapped" for kind in kinds):
        kinds = []
    return tuple(swaps.items()), tuple(replacements), tuple(kinds)


def _replacement_kind(draw, request: str, specs, reads, writes: bool, accepted: bool) -> str:
    """How the replacement first made for ``request`` is made (:data:`REPLACEMENT_KINDS`).

    For a module whose state a parent reads, swapped whole: most often a copy holding that
    state, else one lacking it, or holding it with another shape or dtype (which the engine
    must refuse; never when the swap set must be ``accepted``). A :class:`Scale` (handed its
    caller's weight) is swapped for one writing that weight in place when planted, or half the
    time.
    """
    fqn, index = split_request(request)
    spec = specs.get(fqn)
    if isinstance(spec, LeafSpec) and spec.kind == "scale" and (writes or draw(st.booleans())):
        return "writes"  # it holds the Scale's state too
    if fqn in reads and index is None:
        if accepted:
            return "copy"
        return draw(st.sampled_from(("copy", "copy", "copy", "wrapped", "reshaped", "retyped")))
    # a one-call swap leaves the module in place (its state is read from it): either kind
    return "copy" if chance(draw, 6) else "wrapped"


def _with_conflict(draw, requests, whole, one_call, multi) -> list[str]:
    """``requests`` plus an overlapping pair: a parent and a request inside it, or a module and
    one of its calls."""
    parents = [fqn for fqn in whole if any(f.startswith(fqn + ".") for f in whole)]
    if parents and (not multi or draw(st.booleans())):
        parent = draw(st.sampled_from(parents))
        inside = [r for r in whole + one_call if split_request(r)[0].startswith(parent + ".")]
        pair = [parent, draw(st.sampled_from(inside))]
    elif multi:
        fqn = draw(st.sampled_from(sorted(multi)))
        pair = [fqn, f"{fqn}@{draw(st.integers(0, multi[fqn] - 1))}"]
    else:
        return requests
    return [r for r in requests if r not in pair] + list(draw(st.permutations(pair)))


@st.composite
def cases(draw, require: Iterable[str] = (), exclude: Iterable[str] = ()) -> Case:
    """A random :class:`Case`; every feature in ``require`` (see :data:`FEATURES`) is in it,
    none in ``exclude`` (see :data:`EXCLUDABLE`)."""
    require, exclude = frozenset(require), frozenset(exclude)
    unknown = require - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; choose from {FEATURES}")
    if "custom_backward" in require and len(require) > 1:
        raise ValueError(
            "custom_backward cases swap acts for replacements with a hand-written backward and "
            "nothing else: require it alone"
        )
    if exclude - EXCLUDABLE or exclude & require:
        raise ValueError(
            f"cannot leave out {sorted(exclude)} while requiring {sorted(require)}: the "
            f"strategy can leave out {sorted(EXCLUDABLE)}"
        )
    spec = draw(programs(require, exclude=exclude))
    second_input = "none" if spec.inputs == 1 else draw(st.sampled_from(("positional", "keyword")))
    facts = analyze(spec, second_input)
    acts = [
        fqn
        for fqn, child in module_specs(spec).items()
        if isinstance(child, LeafSpec) and child.kind == "act" and fqn in facts.calls
    ]
    if acts and (require == {"custom_backward"} or (not require and chance(draw, 2))):
        return draw(custom_backward_cases(spec, second_input, acts))
    # what comes after a swap is checked only when the engine accepts the swap set
    accepted = bool(require & {"param_write", "region_name"})
    # s.replace works on what gs.export makes (its calls' structure is known)
    torch_made = "torch_export" in require or (
        "pattern_replace" not in require and not accepted and chance(draw, 4)
    )
    exporter = "torch" if torch_made else "gs"
    swaps, replacements, kinds = draw(swap_sets(spec, facts, require, exporter, accepted))
    dynamic = "dynamic" in require or draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    has_gate = any(
        isinstance(child, LeafSpec) and child.kind == "gated"
        for child in module_specs(spec).values()
    )
    replace = has_gate and exporter == "gs"  # a gate is rare enough: replace it when there
    shift = draw(st.sampled_from((0.25, -0.5))) if replace else None
    region = None
    if "region_name" in require or chance(draw, 6):
        region = draw(region_names(facts, [name for name, _ in swaps]))
    return Case(
        spec, second_input, dynamic, swaps, replacements, seed, exporter, shift, kinds, region
    )


@st.composite
def custom_backward_cases(draw, spec: BlockSpec, second_input: str, acts: list[str]) -> Case:
    """A ``custom_backward`` :class:`Case` of ``spec``: one to three of its ``acts`` swapped for
    :class:`CustomBackwardAct` replacements, each right or with a planted bug."""
    chosen = draw(st.lists(st.sampled_from(acts), min_size=1, max_size=3, unique=True))
    grad_swaps = tuple((fqn, draw(st.sampled_from(GRAD_BUGS))) for fqn in chosen)
    exporter = "torch" if chance(draw, 4) else "gs"
    dynamic, seed = draw(st.booleans()), draw(st.integers(0, 2**16))
    return Case(spec, second_input, dynamic, (), (), seed, exporter, grad_swaps=grad_swaps)


@st.composite
def region_names(draw, facts: Facts, requests: list[str]) -> RegionNames:
    """A :class:`RegionNames`: names that collide with a module's fqn, a call name, or end in
    ``@k`` (the first, when the case swaps something, the name of one of its requests, which
    must then swap the module or call it names), and a name of its own that must be taken:
    plain, the default, or one that only looks like a module's (``act0.part``,
    ``region:act0``, ``act0#1``, ``act0@x``)."""
    fqns = sorted(facts.calls)
    calls = [name for names in facts.calls.values() for name in names[1:]]
    collisions = [draw(st.sampled_from(requests))] if requests else []
    for _ in range(draw(st.integers(0 if collisions else 1, 2))):
        kind = draw(st.sampled_from(("module", "call", "suffix")))
        if kind == "call" and calls:
            collisions.append(draw(st.sampled_from(calls)))
        elif kind == "suffix":
            # a call a module does not have, or a name no module has, ending in @k
            base = draw(st.sampled_from(["gate", "region", *fqns]))
            collisions.append(f"{base}@{draw(st.integers(0, 4))}")
        else:
            collisions.append(draw(st.sampled_from(fqns)))
    fqn = draw(st.sampled_from(fqns))
    own = (None, "gate", "squash", f"region:{fqn}", f"{fqn}.part", f"{fqn}#1", f"{fqn}@x")
    return RegionNames(
        verb=draw(st.sampled_from(("fuse", "swap"))),
        name=draw(st.sampled_from(own)),
        collisions=tuple(dict.fromkeys(collisions)),
        in_force=draw(st.booleans()),
        before_swaps=draw(st.booleans()),
    )


# -- what a case covers, and how to read it ----------------------------------------------------


def _walk_steps(spec: BlockSpec, prefix: str = ""):
    """``(block, fqn prefix, step)`` for every step of every block."""
    for step in spec.steps:
        yield spec, prefix, step
    for name, child in spec.children:
        if isinstance(child, BlockSpec):
            yield from _walk_steps(child, f"{prefix}{name}.")


def _gated_outside_swaps(case: Case) -> list[str]:
    """The gated modules no swap of the case covers (whose gate ``s.replace`` replaces)."""
    swapped = {split_request(name)[0] for name, _ in case.swaps}
    return [
        fqn
        for fqn, spec in module_specs(case.program).items()
        if isinstance(spec, LeafSpec) and spec.kind == "gated"
        if not any(fqn == s or fqn.startswith(s + ".") for s in swapped)
    ]


def unfit_requests(case: Case) -> list[str]:
    """The requests swapping a module whole whose state a parent reads, with a replacement that
    does not hold it as the module did (by its kind: :data:`HOLDS_STATE`); the strategy never
    lets such a module share a replacement with another, so the kind tells."""
    reads = outside_reads(case.program)
    kinds = dict(enumerate(case.replacement_kinds))
    return [
        name
        for name, n in case.swaps
        if split_request(name)[1] is None and split_request(name)[0] in reads
        if kinds.get(n, "wrapped") not in HOLDS_STATE
    ]


def features(case: Case, facts: Facts | None = None) -> set[str]:
    """The :data:`FEATURES` a case has; given its ``facts``, also the :data:`OUTCOMES`:
    ``pass_through_read`` (a call of it must be refused), ``pass_through_swapped`` (a
    pass-through call is swapped), ``state_read_refused`` (a replacement lacks what a parent
    reads) and ``refused`` (the swap set must be refused); then ``param_write`` and
    ``region_name`` only when the swap set is accepted, as they are checked only then."""
    found = set()
    counts: dict[str, int] = {}
    for block, prefix, step in _walk_steps(case.program):
        if isinstance(step, ReadState):
            continue  # counted with the requests: what matters is a swap of what it reads
        child = dict(block.children)[step.child]
        counts[prefix + step.child] = counts.get(prefix + step.child, 0) + 1
        if step.times > 1:
            found.add("loop")
        arguments = list(step.args) + [a for _, a in step.kwargs]
        if step.kwargs:
            found.add("kwargs")
        if any(isinstance(a, (bool, int, float)) for a in arguments):
            found.add("constants")
        tensors = [a for a in arguments if isinstance(a, V)]
        if len(tensors) != len(set(tensors)):
            found.add("aliased")
        kind = child.kind if isinstance(child, LeafSpec) else "block"
        if kind == "split":
            found.add(child.layout)
            if 0 < len(step.unpack) < len(PART_KEYS):
                found.add("partial_unpack")
        planted = {
            "gather": "whole_struct",
            "counter": "buffer",
            "passthrough": "pass_through",
            "cast": "returns_input",
            "inplace": "in_place",
            "norm": "internal_cast",
            "const": "constant_outputs",
            "bufout": "buffer_outputs",
        }
        if kind in planted:
            found.add(planted[kind])
        keys = PART_KEYS + ROUTE_KEYS + ("main", "aux")
        if list(step.unpack) != sorted(step.unpack, key=keys.index):
            found.add("reordered_unpack")
    if any(n > 1 for n in counts.values()):
        found.add("shared")  # one child called from several steps
    if case.dynamic:
        found.add("dynamic")
    if case.exporter == "torch":
        found.add("torch_export")
    if case.replace_shift is not None and _gated_outside_swaps(case):
        found.add("pattern_replace")
    requests = [name for name, _ in case.swaps]
    numbers = [n for _, n in case.swaps]
    if len(numbers) != len(set(numbers)):
        found.add("same_replacement")
    one_call = [split_request(r) for r in requests if "@" in r]
    if one_call:
        found.add("one_call")
    if len({fqn for fqn, _ in one_call}) < len(one_call):
        found.add("calls_apart")
    if conflicting(requests):
        found.add("conflict")
    reads = outside_reads(case.program)
    if any(split_request(r)[1] is None and split_request(r)[0] in reads for r in requests):
        found.add("reads_child_state")
    if written_read_owners(case.program):
        # swapped or not: module_tree must note the read on every module holding the buffer
        found.add("reads_written_state")
    if case.grad_swaps:
        found.add("custom_backward")
        if any(bug != "right" for _, bug in case.grad_swaps):
            found.add("wrong_backward")
    kinds = dict(enumerate(case.replacement_kinds))
    later = set()  # checked after the swap: only when it is accepted
    if any(kinds.get(n) == "writes" for _, n in case.swaps):
        later.add("param_write")
    if case.region is not None:
        later.add("region_name")
    if facts is None:
        return found | later
    unfit = unfit_requests(case)
    if unfit:
        found.add("state_read_refused")
    torch_made = case.exporter == "torch"
    if facts.blocked and torch_made:
        found.add("pass_through_read")
    if conflicting(requests) or unfit or (torch_made and any(facts.refused(r) for r in requests)):
        found.add("refused")
    else:
        found |= later
        if any(
            isinstance(spec := module_specs(case.program).get(split_request(r)[0]), LeafSpec)
            and spec.kind == "passthrough"
            for r in requests
        ):
            found.add("pass_through_swapped")
    return found


def _argument_text(argument) -> str:
    """A :class:`Call` argument as :func:`describe` writes it: ``v3``, ``s0``, ``2.5``,
    ``self.w0.t()``."""
    if isinstance(argument, V):
        return f"v{argument.index}"
    if isinstance(argument, S):
        return f"s{argument.index}"
    if isinstance(argument, P):
        return f"self.{argument.name}{VIEW_TEXT[argument.view]}"
    return repr(argument)


def _block_lines(spec: BlockSpec, name: str, signature: str, indent: str) -> list[str]:
    """A block as pseudo-code: its children (blocks written out in full), then its steps."""
    lines = [f"{indent}{name}{signature}:"]
    inner = indent + "    "
    for child_name, child in spec.children:
        if isinstance(child, BlockSpec):
            lines += _block_lines(
                child, child_name, "(v0, v1)" if child.inputs == 2 else "(v0)", inner
            )
        else:
            extras = ", ".join(
                f"{k}={getattr(child, k)!r}" for k in ("op", "layout", "keys") if getattr(child, k)
            )
            lines.append(f"{inner}{child_name} = {LEAF_TYPES[child.kind].__name__}({extras})")
    for parameter in own_parameters(spec):
        lines.append(f"{inner}{parameter} = Parameter(randn(3, 3) * 0.5)")
    n_values, n_structures = spec.inputs, 0
    for step in spec.steps:
        if isinstance(step, ReadState):
            # with_state: @ a matrix, + a vector
            value = _argument_text(step.value)
            lines.append(f"{inner}v{n_values} = with_state({value}, self.{step.path})")
            n_values += 1
            continue
        arguments = [_argument_text(a) for a in step.args]
        arguments += [f"{k}={_argument_text(a)}" for k, a in step.kwargs]
        call = f"{step.child}({', '.join(arguments)})"
        if step.times > 1:
            first = _argument_text(step.args[0])
            rest = ", ".join(
                [_argument_text(a) for a in step.args[1:]]
                + [f"{k}={_argument_text(a)}" for k, a in step.kwargs]
            )
            lines.append(
                f"{inner}v{n_values} = {first}; for _ in range({step.times}): "
                f"v{n_values} = {step.child}(v{n_values}{', ' + rest if rest else ''})"
            )
            n_values += 1
            continue
        child = dict(spec.children)[step.child]
        structured = (isinstance(child, LeafSpec) and child.kind in ("split", "passthrough")) or (
            isinstance(child, BlockSpec) and child.returns[0][0] != ""
        )
        if not structured:
            lines.append(f"{inner}v{n_values} = {call}")
            n_values += 1
            continue
        taken = [f"v{n_values + i}" for i in range(len(step.unpack))]
        keys = ", ".join(repr(k) for k in step.unpack)
        unpacked = f"; {', '.join(taken)} = s{n_structures}[{keys}]" if taken else ""
        lines.append(f"{inner}s{n_structures} = {call}{unpacked}")
        n_structures += 1
        n_values += len(step.unpack)
    outputs = [
        f"{key!r}: " * bool(key) + " + ".join(f"{c}*v{i}" for i, c in terms)
        for key, terms in spec.returns
    ]
    body = outputs[0] if spec.returns[0][0] == "" else "{" + ", ".join(outputs) + "}"
    lines.append(f"{inner}return {body}")
    return lines


def describe(case: Case) -> str:
    """The case as pseudo-code: each block's forward, the swap set, the seed."""
    if case.second_input == "none":
        signature = "(x=v0)"
    else:
        signature = f"(x=v0, y=v1; y passed {case.second_input})"
    lines = _block_lines(case.program, "model", signature, "")
    batch = f"dynamic batch, exported at {EXPORT_BATCH}, run at {RUN_BATCH}"
    lines.append(f"batch: {batch if case.dynamic else f'static {EXPORT_BATCH}'}; seed {case.seed}")
    exporter = "gs.export" if case.exporter == "gs" else "torch.export.export (all preserved)"
    lines.append(f"exported by {exporter}")
    kinds = dict(enumerate(case.replacement_kinds))
    made = ", ".join(
        f"R{n} = {_replacement_text(kinds.get(n, 'wrapped'), fqn, shift)}"
        for n, (fqn, shift) in enumerate(case.replacements)
    )
    swaps = ", ".join(f"{name!r}: R{n}" for name, n in case.swaps)
    if case.grad_swaps:
        swaps = ", ".join(f"{fqn!r}: CustomBackwardAct({bug!r})" for fqn, bug in case.grad_swaps)
        lines.append(f"swap {{{swaps}}}, checked with gs.verify(..., backward=True)")
    else:
        lines.append(f"swap {{{swaps}}} with {made}")
    if case.replace_shift is not None:
        lines.append(f"then s.replace(gate, GateShift({case.replace_shift})) where no swap is")
    if case.region is not None:
        lines.append(_region_text(case.region))
    return "\n".join(lines)


def _replacement_text(kind: str, fqn: str, shift: float) -> str:
    """How :func:`describe` writes a replacement: ``ShiftedCopy(act0, 0.5, reshaped)``."""
    note = f", {kind}" if kind in ("reshaped", "retyped") else ""
    return f"{REPLACEMENT_KINDS[kind]}({fqn}, {shift}{note})"


def _region_text(region: RegionNames) -> str:
    """How :func:`describe` writes the region step of a case."""
    verb = "fuse_region(op)" if region.verb == "fuse" else "swap_region(op, Times(c))"
    when = "before the swaps" if region.before_swaps else "after the swaps"
    tried = ", ".join(map(repr, region.collisions))
    again = "; then another region under that name (refused)" if region.in_force else ""
    return (
        f"{when}, in a Surgery: {verb} of a top-level op named {tried} (each refused), then "
        f"{region.name!r} (taken){again}"
    )


# -- checking one case ------------------------------------------------------------------------


class Mismatch(AssertionError):
    """The swapped program computes something else than the eager reference, or the engine
    accepts a call it must refuse."""


class UnexpectedRefusal(Exception):
    """``gs.module_tree`` calls a module unswappable that the eager run shows is swappable."""


@dataclass(frozen=True)
class CaseResult:
    """How a case went: ``refused`` when the engine refused it as expected, else the number of
    calls the swap replaced."""

    refused: bool
    replaced_calls: int
    facts: Facts


def _run(model, args, kwargs):
    """One forward, on copies of the inputs (a program must not see another's writes)."""
    with torch.no_grad():
        return model(*clone_tree(args), **clone_tree(kwargs))


def _dynamic_shapes(case: Case) -> dict:
    """One dynamic batch dimension shared by the root's inputs."""
    batch = torch.export.Dim("batch", min=2, max=64)
    shapes = {"x": {0: batch}}
    if case.second_input != "none":
        shapes["y"] = {0: batch}
    return shapes


def _replacements(case: Case, model: nn.Module) -> dict[str, nn.Module]:
    """``{request: replacement}``, one object per replacement number, as the case says."""
    modules = dict(model.named_modules())
    kinds = dict(enumerate(case.replacement_kinds))
    reads = outside_reads(case.program)
    made = [
        make_replacement(modules[fqn], shift, kinds.get(n, "wrapped"), reads.get(fqn, ()))
        for n, (fqn, shift) in enumerate(case.replacements)
    ]
    return {name: made[n] for name, n in case.swaps}


def unfit_replacements(case: Case, model: nn.Module, replacements) -> dict[str, list[str]]:
    """request -> the attributes of the module it swaps whole that a block outside the module
    reads directly and its replacement does not hold as the module does (a tensor of the same
    shape and dtype): found on the objects, by the attribute reads eager makes (rule 3)."""
    reads = outside_reads(case.program)
    unfit: dict[str, list[str]] = {}
    for request, replacement in replacements.items():
        fqn, index = split_request(request)
        if index is not None:
            continue  # a one-call swap leaves the module in place: its state is still read
        for attribute in reads.get(fqn, ()):
            expected = state_at(model, f"{fqn}.{attribute}")
            held = replacement
            for part in attribute.split("."):
                held = getattr(held, part, None)
            fits = (
                isinstance(held, torch.Tensor)
                and held.shape == expected.shape
                and held.dtype == expected.dtype
            )
            if not fits:
                unfit.setdefault(request, []).append(attribute)
    return unfit


def _check_verdicts(ep, facts: Facts, exporter: str, reads: dict[str, tuple[str, ...]]) -> None:
    """module_tree must call a module unswappable, with a reason, exactly when a call of it is
    blocked in the eager run (in a program torch.export made itself; in gs.export's, never);
    and a swappable module must carry a note, naming what a replacement must hold, exactly
    when a block outside it reads its state (``reads``, see :func:`outside_reads`)."""
    tree = gs.module_tree(ep)
    for fqn, names in facts.calls.items():
        info = tree[fqn]
        blocked = [n for n in names if n in facts.blocked and exporter == "torch"]
        if blocked and (info.swappable or not info.reason):
            raise Mismatch(
                f"{fqn!r}: call {blocked[0]} {facts.blocked[blocked[0]]}, but "
                f"module_tree says swappable={info.swappable}, reason={info.reason!r}"
            )
        notes = export_notes(ep)
        if notes is not None and fqn in notes.dropped:
            # the export could not keep its signature, and said why: so must module_tree
            if info.swappable or notes.dropped[fqn] not in (info.reason or ""):
                raise Mismatch(
                    f"{fqn!r}: its signature was dropped, but module_tree says "
                    f"swappable={info.swappable}, reason={info.reason!r}"
                )
            continue
        if not blocked and not info.swappable:
            raise UnexpectedRefusal(
                f"{fqn!r}: no call of it must be refused, but module_tree says "
                f"not swappable: {info.reason}"
            )
        if not info.swappable:
            continue  # a module that cannot be swapped has its reason, not a note
        attributes = reads.get(fqn, ())
        if attributes and not any(quotes_name(info.note or "", a) for a in attributes):
            raise Mismatch(
                f"{fqn!r}: a block outside it reads its {', '.join(attributes)}, but "
                f"module_tree's note does not say so: {info.note!r}"
            )
        if not attributes and info.note is not None:
            raise Mismatch(
                f"{fqn!r}: nothing outside it reads its state, but its note says {info.note!r}"
            )


def _compare_state(gm, model, replacements, reference: Reference) -> None:
    """Every buffer after the runs: the program's (held by the swapped program) against the
    reference's copy of its module, and each replacement's against the reference's copy of it;
    and every parameter a replacement was handed (the swapped program's own copy, which the
    replacement may have written) against the reference's, which eager wrote.

    A module none of whose calls is left (each swapped, itself or inside a swapped ancestor)
    never runs, in either program; the engine may leave its buffers out. Under the name of a
    module swapped whole, the swapped program holds the replacement: its buffers are compared
    as the replacement's.
    """
    gm_buffers = dict(gm.named_buffers())
    whole = [fqn for fqn, index in map(split_request, replacements) if index is None]
    for name, _ in model.named_buffers():
        owner, _, attribute = name.rpartition(".")
        if any(owner == fqn or owner.startswith(fqn + ".") for fqn in whole):
            continue
        expected = reference.originals[owner].get_buffer(attribute)
        if name not in gm_buffers:
            if reference.ran[owner]:
                raise Mismatch(f"buffer {name!r} is missing from the swapped program")
            continue
        _assert_buffer(gm_buffers[name], expected, f"buffer {name!r}")
    for request, replacement in replacements.items():
        mirror = reference.replacements[request]
        for name, buffer in replacement.named_buffers():
            what = f"buffer {name!r} of the replacement for {request!r}"
            _assert_buffer(buffer, mirror.get_buffer(name), what)
    parameters = dict(model.named_parameters())
    for name in swap_info(gm).given_state:
        if name in parameters:  # (a name of the swapped program's own, for a tied weight)
            expected = state_at(reference.model, name)
            _assert_buffer(state_at(gm, name), expected, f"parameter {name!r}, handed over,")


def quotes_name(message: str, name: str) -> bool:
    """Whether an engine message names ``name``, quoted (```name``` or ``'name'``)."""
    return f"`{name}`" in message or f"'{name}'" in message


def _state_of(owner) -> dict[str, torch.Tensor]:
    """A copy of every tensor a model or an ExportedProgram holds, by name."""
    if isinstance(owner, torch.export.ExportedProgram):
        items = [*owner.state_dict.items(), *owner.constants.items()]
    else:
        items = list(owner.state_dict(keep_vars=True).items())
    return {k: v.detach().clone() for k, v in items if isinstance(v, torch.Tensor)}


def _check_untouched(before: dict[str, torch.Tensor], owner, what: str) -> None:
    """``owner`` (the user's model, or the program) holds what it held, bit for bit: whatever
    the swapped program and its replacements wrote, they wrote their own copies."""
    after = _state_of(owner)
    changed = sorted(set(before) ^ set(after))
    changed += [k for k in before if k in after and not torch.equal(before[k], after[k])]
    if changed:
        raise Mismatch(f"the swap wrote {what}: {', '.join(changed)} changed")


def _assert_buffer(actual, expected, what: str) -> None:
    """Compare one buffer; a difference is a :class:`Mismatch` naming it."""
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    except AssertionError as problem:
        raise Mismatch(f"{what} after the run: {problem}") from None


class Unobservable(Exception):
    """A case whose replacement does not change the output: it tests nothing (raised outside
    a hypothesis test; inside one, the case is rejected with ``assume``)."""


def _precondition(changes_output: bool, request: str) -> None:
    if changes_output:
        return
    if currently_in_test_context():
        assume(False)
    raise Unobservable(f"the replacement for {request!r} does not change the output")


def _check_refusal(ep, replacements, conflicts, blocked, not_kept=(), unfit=None) -> None:
    """The engine must refuse the swap, naming a call it must refuse: a ConflictError for an
    overlapping pair of requests, a NotSwappableError for a blocked call, a NotPreservedError
    for a module whose signature the export could not keep (its notes say so), a
    ReplacementError naming an attribute a parent reads that the replacement lacks
    (``unfit``: request -> such attributes)."""
    unfit = unfit or {}
    try:
        gs.swap(ep, replacements)
    except gs.errors.ReplacementError as refusal:
        attributes = {a for names in unfit.values() for a in names}
        if not any(quotes_name(str(refusal), a) for a in attributes):
            raise  # refused, but not for an attribute it must be: an unexpected refusal
    except gs.errors.NotPreservedError as refusal:
        if not any(f"'{split_request(name)[0]}" in str(refusal) for name in not_kept):
            raise
    except gs.errors.ConflictError as refusal:
        names = {split_request(r)[0] for pair in conflicts for r in pair}
        if not any(f"'{name}" in str(refusal) for name in names):
            raise  # a conflict between requests the strategy does not see as overlapping
    except gs.errors.NotSwappableError as refusal:
        names = [call for calls in blocked.values() for call in calls]
        if not any(f"{call!r}" in str(refusal) for call in names):
            raise  # refused, but for another call: an unexpected refusal
    else:
        lacking = {r: f"its replacement lacks {', '.join(a)}" for r, a in unfit.items()}
        reasons = conflicts or blocked or not_kept or lacking
        raise Mismatch(f"the engine swapped what it must refuse: {reasons}")


def _export(case: Case, model, args, kwargs):
    """The case's program: by gs.export, or by torch.export.export with every module's call
    signature preserved (``exporter="torch"``)."""
    dynamic_shapes = _dynamic_shapes(case) if case.dynamic else None
    if case.exporter == "gs":
        return gs.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    preserved = tuple(name for name, _ in model.named_modules() if name)
    return torch.export.export(
        model,
        args,
        kwargs,
        dynamic_shapes=dynamic_shapes,
        preserve_module_call_signature=preserved,
    )


def _through_surgery(
    case: Case, facts: Facts, ep, replacements, original_model, original_replacements
):
    """A Surgery that makes the case's swaps one by one, with its region step (before or after
    them, see :func:`_region_step`), then replaces, in one step, the inline gate of every
    gated call outside the swapped modules when the case says so; and its reference: the eager
    model with the swaps and, in those gated modules, the gate patched (a region computes what
    its ops did, so it leaves the reference as it is).

    ``gs.find`` must match the gate once in each such call, and nowhere else (a miss or a stray
    match is a :class:`Mismatch`)."""
    surgery = gs.Surgery(ep)
    region = case.region
    if region is not None and region.before_swaps:
        made = _region_step(surgery, region, ep)
    for name, replacement in replacements.items():
        surgery.swap(name, replacement)
    if region is not None and not region.before_swaps:
        made = _region_step(surgery, region, ep)
    if region is not None:
        _check_surgery_holds(surgery, replacements, region, made)
    patched = original_model
    if case.replace_shift is not None:
        patched = _replace_gates(case, facts, ep, surgery, original_model)
    return surgery.module, reference_model(patched, original_replacements)


def _replace_gates(case: Case, facts: Facts, ep, surgery, original_model) -> nn.Module:
    """Replace the gate of every gated call outside the swaps in ``surgery`` (one step); the
    model with those gates patched."""
    gated = _gated_outside_swaps(case)
    gated_calls = sorted(name for fqn in gated for name in facts.calls.get(fqn, ()))
    example = (torch.randn(2, 3),)
    found = gs.find(ep, gate, example)
    specs = module_specs(case.program)
    stray = [
        m.call
        for m in found.matches
        if not isinstance(spec := specs.get(split_request(m.call)[0]), LeafSpec)
        or spec.kind != "gated"
    ]
    if stray:
        raise Mismatch(f"gs.find matched the gate in {stray}, which have no gate")
    chosen = [m for m in found.matches if split_request(m.call)[0] in gated]
    matched = sorted(m.call for m in chosen)
    if matched != gated_calls:
        raise Mismatch(f"gs.find matched the gate in {matched}, expected {gated_calls}")
    if chosen:
        surgery.replace(gate, GateShift(case.replace_shift), example, matches=chosen)
    patched = copy.deepcopy(original_model)
    for fqn in gated:
        patched.get_submodule(fqn).gate = functools.partial(shifted_gate, shift=case.replace_shift)
    return patched


class Times(nn.Module):
    """What a swapped region (one ``x * c`` op of the program) is replaced by: the same product,
    so that the region leaves what the program computes as it was."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


def _top_level_ops(ep) -> list[torch.fx.Node]:
    """The program's products and sums that no module call holds (the root's own arithmetic:
    its weighted return, its reads of a child's state), in graph order; products by a constant
    first (those a :class:`Times` can replace)."""
    held = {name for part in gs.partition(ep).values() for name in part.nodes}
    aten = torch.ops.aten
    ops = [
        node
        for node in ep.graph.nodes
        if node.op == "call_function" and node.name not in held
        if node.target in (aten.mul.Tensor, aten.add.Tensor)
        if isinstance(node.args[0], torch.fx.Node)
    ]
    return sorted(ops, key=lambda node: not isinstance(node.args[1], (int, float)))


def _region_step(surgery, region: RegionNames, ep) -> str:
    """Try each colliding name for a region of one top-level op (each must be refused, the
    Surgery left as it was), make it under the region's own name, then, with ``in_force``,
    try that name for a second region (refused); the name the region was made under."""
    ops = _top_level_ops(ep)
    if not ops:
        raise AssertionError("the program has no top-level product or sum to make a region of")
    first, second = ops[0], ops[1] if len(ops) > 1 else ops[0]

    def make(node: torch.fx.Node, name: str | None) -> None:
        factor = node.args[1]
        if region.verb == "swap" and isinstance(factor, (int, float)):
            surgery.swap_region([node.name], Times(factor), name=name)
        else:  # (a sum, or a product of two tensors: fused, computing what it did)
            surgery.fuse_region([node.name], name=name)

    for name in region.collisions:
        _expect_refused(surgery, lambda name=name: make(first, name), name, "cannot be named")
    make(first, region.name)
    made = surgery.history[-1].name
    if region.name is not None and made != region.name:
        raise Mismatch(f"the Surgery named the region {made!r}, not {region.name!r} as asked")
    if region.in_force:
        _expect_refused(surgery, lambda: make(second, made), made, "exists already")
    return made


def _surgery_state(surgery) -> tuple:
    """What a refused step must leave as it was."""
    return surgery.version, surgery.position, dict(surgery.replacements), surgery.fused


def _expect_refused(surgery, make, name: str, why: str) -> None:
    """``make()`` must raise a SurgeryError saying ``why`` and leave the Surgery unchanged."""
    before = _surgery_state(surgery)
    try:
        make()
    except gs.errors.SurgeryError as refusal:
        if why not in str(refusal):
            raise Mismatch(
                f"a region named {name!r} is refused, but not as it must be ({why!r}): {refusal}"
            ) from None
    else:
        raise Mismatch(f"the Surgery made a region named {name!r}, a name it must refuse")
    if _surgery_state(surgery) != before:
        raise Mismatch(f"refusing a region named {name!r} changed the Surgery")


def _check_surgery_holds(surgery, replacements, region: RegionNames, made: str) -> None:
    """After the swaps and the region step: every request swapped under its own name (a module
    or a call a refused region name named, never a region), and the region under ``made``."""
    held = surgery.replacements
    for name, replacement in replacements.items():
        if held.get(name) is not replacement:
            raise Mismatch(f"after the region step, {name!r} is not swapped by its replacement")
    in_force = made in held if region.verb == "swap" else made in surgery.fused
    extra = set(held) - set(replacements) - {made}
    if not in_force or extra or (region.verb == "fuse" and surgery.fused != (made,)):
        raise Mismatch(
            f"the Surgery holds swaps {sorted(held)} and fused {surgery.fused}, expected the "
            f"requests and the region {made!r}"
        )


def run_inputs(case: Case) -> list[tuple[tuple, dict]]:
    """The inputs of the :data:`RUNS` runs; with a dynamic batch, the first is of another size
    than at export and the second of the export's size."""
    sizes = (RUN_BATCH, EXPORT_BATCH) if case.dynamic else (EXPORT_BATCH, EXPORT_BATCH)
    return [model_inputs(case.second_input, size) for size in sizes[:RUNS]]


def check_case(case: Case) -> CaseResult:
    """Export the case's program, swap its requests and check the result against the eager
    reference (outputs of every run, then buffers), or check that the engine refuses it as it
    must.

    Raises :class:`Mismatch` on a difference, :class:`UnexpectedRefusal` or whatever the engine
    raises on an unexpected refusal or crash. A replacement that would not change the model's
    output makes the case test nothing: it is rejected (hypothesis's ``assume``), or outside a
    hypothesis test :class:`Unobservable` is raised.
    """
    facts = analyze(case.program, case.second_input)
    if case.grad_swaps:
        return check_custom_backward(case, facts)
    torch.manual_seed(case.seed)
    model = build_model(case.program)
    export_args, export_kwargs = model_inputs(case.second_input, EXPORT_BATCH)
    runs = run_inputs(case)
    replacements = _replacements(case, model)
    pristine = copy.deepcopy((model, replacements))  # nothing below may run these
    reads = outside_reads(case.program)

    ep = _export(case, model, export_args, export_kwargs)
    held_by_program = _state_of(ep)
    conflicts = conflicting(replacements)
    blocked = {
        name: calls
        for name in replacements
        if case.exporter == "torch" and (calls := facts.refused(name))
    }
    # gs.export keeps every module's signature it can, and notes why not where torch fails
    # (a module returning its input that a later module writes in place, in rare programs):
    # a swap of such a module is refused, saying so
    notes = export_notes(ep)
    dropped = notes.dropped if notes is not None else {}
    not_kept = [name for name in replacements if split_request(name)[0] in dropped]
    # rule 3: a replacement must hold what a parent reads of the module it swaps whole
    unfit = unfit_replacements(case, model, replacements)
    if sorted(unfit) != sorted(unfit_requests(case)):
        raise AssertionError(  # the strategy's bookkeeping (features()) is off: a fuzzer bug
            f"the replacements lack what parents read for {sorted(unfit)}, but the kinds say "
            f"{sorted(unfit_requests(case))}"
        )
    if conflicts or blocked or not_kept or unfit:
        _check_refusal(ep, replacements, conflicts, blocked, not_kept, unfit)
        _check_untouched(_state_of(pristine[0]), model, "the user's model")
        _check_untouched(held_by_program, ep, "the ExportedProgram")
        _check_verdicts(ep, facts, case.exporter, reads)
        return CaseResult(True, 0, facts)

    original_model, original_replacements = pristine
    original_out = _run(copy.deepcopy(original_model), *runs[0])
    for name in original_replacements:
        alone = reference_model(original_model, {name: original_replacements[name]})
        # a request whose replacement leaves the output as it was would pass even if ignored
        _precondition(differs(original_out, _run(alone.model, *runs[0])), name)

    if case.replace_shift is None and case.region is None:
        gm = gs.swap(ep, replacements)
        reference = reference_model(original_model, original_replacements)
    else:
        gm, reference = _through_surgery(
            case, facts, ep, replacements, original_model, original_replacements
        )
    for number, (args, kwargs) in enumerate(runs, 1):
        expected = _run(reference.model, args, kwargs)
        actual = _run(gm, args, kwargs)
        try:
            assert_close_tree(actual, expected, rtol=RTOL, atol=ATOL)
        except AssertionError as problem:
            message = f"run {number}: outputs differ from the eager reference: {problem}"
            raise Mismatch(message) from None
    _compare_state(gm, original_model, replacements, reference)
    _check_call_index(gm)
    # a replacement writing a parameter it is handed writes the swapped program's own copy
    _check_untouched(_state_of(original_model), model, "the user's model")
    _check_untouched(held_by_program, ep, "the ExportedProgram")
    # last, so that a wrong verdict on a module this swap set does not touch hides no mismatch
    _check_verdicts(ep, facts, case.exporter, reads)
    replaced = sum(
        1 if split_request(name)[1] is not None else len(facts.calls[name]) for name in replacements
    )
    return CaseResult(False, replaced, facts)


def _check_call_index(gm: torch.fx.GraphModule) -> None:
    """The swapped program's call index, read from its program's (what every view reads), is
    the one a read of its own graph alone makes."""
    read = call_index(gm)
    alone = CallIndex(gm.graph)
    for field in ("chains", "order", "root_type", "ambiguous", "members"):
        if getattr(read, field) != getattr(alone, field):
            raise Mismatch(f"the call index read from the program's differs in {field}")
    if list(read.calls.items()) != list(alone.calls.items()):
        raise Mismatch("the call index read from the program's differs in its calls")
    order = alone.order
    for a, b in itertools.pairwise(order):  # a picture cuts its vertices into runs by identity
        if (read.chains[a] is read.chains[b]) != (alone.chains[a] is alone.chains[b]):
            raise Mismatch(f"the call index read from the program's shares chains otherwise at {a}")


# -- custom_backward: replacements with a hand-written backward, right and wrong ---------------


def _torch_gradients(model: nn.Module, args: tuple, kwargs: dict, upstream: tuple) -> dict:
    """torch's own autograd on an eager ``model``, on copies of the inputs:
    ``{"grad of input x": ..., "grad of <parameter>": ...}`` from ``upstream`` (one tensor or
    None per output leaf); a gradient that does not flow is zeros."""
    args, kwargs = clone_tree(args), clone_tree(kwargs)
    named = {}
    for name, value in zip(("x", "y"), [*args, *kwargs.values()]):
        named[f"grad of input {name}"] = value.requires_grad_(True)
    named.update((f"grad of {n}", p) for n, p in model.named_parameters())
    with torch.enable_grad():
        leaves = pytree.tree_leaves(model(*args, **kwargs))
        pairs = [(leaf, grad) for leaf, grad in zip(leaves, upstream) if grad is not None]
        grads = torch.autograd.grad(
            [leaf for leaf, _ in pairs],
            list(named.values()),
            [grad for _, grad in pairs],
            allow_unused=True,
        )
    return {
        name: torch.zeros_like(tensor) if grad is None else grad
        for (name, tensor), grad in zip(named.items(), grads)
    }


def _beyond(expected: torch.Tensor, actual: torch.Tensor, times: float) -> bool:
    """Whether ``actual`` is off ``expected`` by more than ``times`` the tolerance anywhere."""
    return bool(((actual - expected).abs() > times * (ATOL + RTOL * expected.abs())).any())


def check_custom_backward(case: Case, facts: Facts) -> CaseResult:
    """A ``custom_backward`` case: its acts swapped for replacements with a hand-written
    backward, checked with ``gs.verify(..., backward=True)`` against the original model and
    against the eager reference (the model with the replacements set).

    What torch's own autograd says, on the eager models, decides what is expected: a right
    replacement gives the original's gradients (else the fuzzer is wrong); a planted bug must
    change some gradient well beyond tolerance (else the case tests nothing). Then verify must
    find the outputs equal and, against the original, exactly the gradients torch finds wrong
    (every one wrong by over 10x the tolerance named, none named that torch finds within half
    of it); against the eager reference, everything equal. Any other verdict is a
    :class:`Mismatch`.
    """
    torch.manual_seed(case.seed)
    model = build_model(case.program)
    export_args, export_kwargs = model_inputs(case.second_input, EXPORT_BATCH)
    args, kwargs = run_inputs(case)[0]
    modules = dict(model.named_modules())
    replacements = {fqn: CustomBackwardAct(modules[fqn], bug) for fqn, bug in case.grad_swaps}
    pristine = _state_of(model)
    ep = _export(case, model, export_args, export_kwargs)
    notes = export_notes(ep)
    if notes is not None and any(fqn in notes.dropped for fqn in replacements):
        _precondition(False, "a module whose signature export did not keep")
    gm = gs.swap(ep, replacements)
    eager = reference_model(model, replacements).model
    # every eager run is of a copy: a program writes its buffers (a counter), and each run
    # must start from the state the program was exported with
    upstream = _grad_upstream(_run(copy.deepcopy(model), args, kwargs))
    try:
        expected = _torch_gradients(copy.deepcopy(model), args, kwargs, upstream)
        swapped = _torch_gradients(copy.deepcopy(eager), args, kwargs, upstream)
    except RuntimeError as error:  # eager autograd refuses the program (an in-place write)
        _precondition(False, f"eager backward fails ({str(error)[:80]})")
        raise
    wrong = any(bug != "right" for _, bug in case.grad_swaps)
    clearly = {n for n in expected if _beyond(expected[n], swapped[n], 10)}
    loosely = {n for n in expected if _beyond(expected[n], swapped[n], 0.5)}
    if not wrong and loosely:
        raise AssertionError(  # the right replacement is not right: a fuzzer bug
            f"torch's autograd: the right custom backward changes {sorted(loosely)}"
        )
    if wrong:
        _precondition(bool(clearly), "the planted gradient error")

    report = gs.verify(model, gm, args, kwargs, rtol=RTOL, atol=ATOL, backward=True)
    if not report.outputs_ok:
        raise Mismatch(f"custom backward: the forward differs from the original's:\n{report}")
    if report.backward_problem:
        raise Mismatch(f"custom backward: the gradients were not checked:\n{report}")
    named = {leaf.path for leaf in report.gradient_mismatches}
    if not wrong and named:
        raise Mismatch(f"custom backward: a right backward reported wrong:\n{report}")
    if wrong and (not named or not clearly <= named or not named <= loosely):
        raise Mismatch(
            f"custom backward: verify names {sorted(named)}, torch's autograd finds "
            f"{sorted(clearly)} wrong (and {sorted(loosely)} beyond half the tolerance):\n"
            f"{report}"
        )
    faithful = gs.verify(eager, gm, args, kwargs, rtol=RTOL, atol=ATOL, backward=True)
    if not faithful:
        raise Mismatch(f"custom backward: differs from the eager reference:\n{faithful}")
    _check_untouched(pristine, model, "the user's model")
    return CaseResult(False, sum(len(facts.calls[fqn]) for fqn in replacements), facts)


def _grad_upstream(outputs) -> tuple:
    """The upstream gradients ``gs.verify(..., backward=True)`` draws by default, for outputs
    that all need a gradient (every output of these programs does)."""
    from graphsurgeon.checks._grad import seeded_upstream

    marked = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().requires_grad_(True), outputs)
    return seeded_upstream(marked)
