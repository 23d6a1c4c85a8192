"""A SurgeryWidget's stepper: running the program node by node, and showing where it is.

:class:`Stepping` owns the :class:`~graphsurgeon.Stepper` (made on the first move, made again
after an edit), the last move's result, the breakpoints, and where the run is in the pictures:
the element of the node about to run (:attr:`Stepping.current`), what it opens on top of the
user's view to show that node (the call it is in, at most its layer: "what is a layer" is the
renderer's, :func:`graphsurgeon.render.layer_calls`), and inside a swapped call the picture of
the replacement's graph with its node about to run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .. import _meta
from ..errors import AlreadyRanError, GraphSurgeonError, WidgetError
from ..partition import call_index, program_index
from ..render import graph_view, layer_calls
from ..step import Stepper, StepResult, Summary
from ._view import Scene

__all__ = ["Stepping"]

# How many values the stepper panel summarizes (the next node's inputs, the last value).
_SUMMARIES = 12
# Pictures of replacements' graphs kept laid out.
_KEPT_INSIDE = 4


class Stepping:
    """The stepper of a :class:`~graphsurgeon.widget.SurgerySession` and where it is.

    State: :attr:`stepper` (None until the first move), :attr:`last_step`,
    :attr:`breakpoints` (``("node" | "enter", name)``, applied again to each new stepper),
    :attr:`break_on_nan`, :attr:`current` (the element id of the node about to run) and
    :attr:`scroll_current` (bumped: scroll it into view), :attr:`inside` (the picture of the
    swapped call the stepper is in) and :attr:`inside_current` (its node about to run).
    """

    def __init__(self, session: Any):
        self.session = session
        self.stepper: Stepper | None = None
        self.last_step: StepResult | None = None
        self.breakpoints: list[tuple[str, str]] = []
        self.break_on_nan = False
        self.current = ""
        self.scroll_current = 0
        self.inside: Scene | None = None
        self.inside_current = ""
        self._stepper_module: Any = None  # the program the stepper runs
        self._original_stepper: Stepper | None = None  # runs the original, for counterparts
        self._inside_pictures: OrderedDict[int, Scene] = OrderedDict()
        self._layers: tuple[Any, frozenset[str]] = (None, frozenset())  # (calls, layers)

    # -- moving -----------------------------------------------------------------------------

    def _ensure_stepper(self) -> Stepper:
        session = self.session
        module = session.viewer.drawn_program()
        if self.stepper is None or self._stepper_module is not module:
            args, kwargs = session.inputs()
            session.busy("preparing the stepper…")
            self.stepper = Stepper(session.surgery.module, *args, **kwargs)
            self._stepper_module = module
            self._original_stepper = None
            self.last_step = None
            self._sync_breakpoints()
        return self.stepper

    def _drawn(self) -> Callable[[Any], bool]:
        scene = self.session.viewer.scene

        def drawn(node: Any) -> bool:
            return scene.picture.element_of_node(node.name, scene.prefix) is not None

        return drawn

    def _move(self, move: Callable[[Stepper], StepResult], verb: str) -> StepResult:
        stepper = self._ensure_stepper()
        if stepper.done:
            raise WidgetError(
                f"{verb}: the program has finished; press Restart run to run it again"
            )
        self.session.busy(f"{verb}…")
        try:
            result = move(stepper)
        except AlreadyRanError as error:  # the stepper's advice is code; here it is a button
            raise WidgetError(f"{verb}: {error.what}; press Restart run {error.again}") from None
        if (
            result.reason in ("step", "target")
            and not stepper.done
            and not stepper.frames
            and not self._drawn()(stepper.current)
        ):
            # what the picture does not draw at all: run on to the next node that it does
            rest = stepper.run_to(self._drawn())
            result = StepResult(
                ran=result.ran + rest.ran,
                position=rest.position,
                reason=rest.reason if rest.reason != "target" else result.reason,
                breakpoints=rest.breakpoints,
                trigger=rest.trigger,
                note=result.note or rest.note,
            )
        self.last_step = result
        self._update_inside()
        self._reveal_current()
        self.session.touch("stepper")
        selected_node = self.session.selection.selected_node
        if selected_node is not None and self.session.viewer.inner_call(selected_node):
            self.session.touch("selection")  # a node inside a call: drawn once it is entered
        return result

    def step(self) -> StepResult:
        """Run the next node the picture shows (and the glue before it)."""
        return self._move(lambda st: st.step(), "step")

    def step_over(self) -> StepResult:
        """Run the next node, or the whole module call it starts."""
        return self._move(lambda st: st.step_over(), "step over")

    def step_into(self) -> StepResult:
        """Enter the fused or swapped call about to run: a swapped call's replacement is
        drawn beside the program, its node about to run marked."""
        return self._move(lambda st: st.step_into(), "step into")

    def step_out(self) -> StepResult:
        """Run to the end of the current module call."""
        return self._move(lambda st: st.step_out(), "step out")

    def continue_(self) -> StepResult:
        """Run to the next breakpoint or the end."""
        return self._move(lambda st: st.continue_(), "continue")

    def run_to_selection(self) -> StepResult:
        """Run until the selected node or module is next (a breakpoint may stop it first); a
        node inside a swapped call (``"call/node"``) is reached by entering the call."""
        session = self.session
        node = session.selection.selected_node
        if node is not None:
            return self._move(lambda st: st.run_to(node=node), f"run to {node}")
        name = session.selection.target(None, "run to")
        call_node = session.viewer.call_node(name)
        if not session.viewer.calls_of(name) and call_node is not None:
            # a region made one call: its node
            return self._move(lambda st: st.run_to(node=call_node), f"run to {name}")
        return self._move(lambda st: st.run_to(module=name), f"run to {name}")

    def reset_stepper(self) -> None:
        """Restart the run from the first node (the Surgery's reset is the session's
        ``reset``)."""
        stepper = self._ensure_stepper()
        stepper.reset()
        self._original_stepper = None
        self.last_step = None
        self._update_inside()
        self._reveal_current()
        self.session.touch("stepper")

    def after_change(self) -> None:
        """The Surgery changed: the stepper goes (the next move makes one for the new
        program), and so does what it opened; its breakpoints stay."""
        self.leave_inside(render=False)
        self.stepper = None
        self._original_stepper = None
        self.last_step = None
        self.session.viewer.reveal("stepper", (), render=False)

    # -- breakpoints ------------------------------------------------------------------------

    def toggle_breakpoint(self) -> None:
        """Stop before the selected node (``"call/node"``: inside a swapped call), or at the
        first op of the selected module; again: remove."""
        selection = self.session.selection
        if selection.selected_node is not None:
            wanted = ("node", selection.selected_node)
        else:
            wanted = ("enter", selection.target(None, "breakpoint"))
        if wanted in self.breakpoints:
            self.breakpoints.remove(wanted)
        else:
            self.breakpoints.append(wanted)
        if self.stepper is not None:
            try:
                self._sync_breakpoints()
            except GraphSurgeonError:
                self.breakpoints.remove(wanted)
                self._sync_breakpoints()
                raise
        self.session.touch("stepper")

    def set_break_on_nan(self, on: bool) -> None:
        """Stop after any node whose value holds a NaN or an Inf (inside swapped calls too)."""
        self.break_on_nan = bool(on)
        if self.stepper is not None:
            self._sync_breakpoints()
        self.session.touch("stepper")

    def _sync_breakpoints(self) -> None:
        breakpoints = self.stepper.breakpoints
        breakpoints.clear()
        for kind, name in self.breakpoints:
            if kind == "node":
                breakpoints.node(name)
            else:
                breakpoints.enter(name)
        if self.break_on_nan:
            breakpoints.nan_or_inf()

    # -- where the stepper is, in the pictures ----------------------------------------------

    def _outer_node(self) -> str | None:
        """The node of the program drawn that the stepper is at: ``current``, or inside a
        call entered with step into, the call's node."""
        stepper = self.stepper
        if stepper is None or stepper.done:
            return None
        if stepper.frames:
            return self.session.viewer.call_node(stepper.frames[0])
        return stepper.current.name

    def _fused_inside(self) -> str | None:
        """Inside a fused call: its node about to run (the program's own node, drawn when
        the call is open), else None."""
        stepper = self.stepper
        if stepper is None or stepper.done or len(stepper.frames) != 1:
            return None
        if stepper.frames[0] not in self.session.surgery.fused:
            return None
        return stepper.current.name

    def _current_element(self) -> str:
        node = self._outer_node()
        if node is None:
            return ""
        scene = self.session.viewer.scene
        inner = self._fused_inside()
        if inner is not None and scene.shows_node(inner):
            return scene.node_element(inner).id
        element = scene.picture.element_of_node(node, scene.prefix)
        if element is None and self.stepper.frames:
            ids = scene.elements([self.stepper.frames[0]])
            return ids[0] if ids else ""
        return element.id if element is not None else ""

    def _layer_of(self, stack: tuple[str, ...]) -> str | None:
        """The layer a stack of calls is in: its outermost call that repeats as a layer, as
        the renderer stacks layers (:func:`graphsurgeon.render.layer_calls`), or None."""
        calls = call_index(self.session.viewer.drawn_program()).calls
        if self._layers[0] is not calls:
            self._layers = (calls, layer_calls(calls))
        layers = self._layers[1]
        return next((call for call in stack if call in layers), None)

    def _reveal_current(self) -> None:
        """The stepper's node hidden in a box: open its layer whole (one layout as the run
        enters it), or outside a layer the call it is in; close again what was opened for
        calls the stepper has left. The user's own view is kept as it is."""
        viewer = self.session.viewer
        node = self._outer_node()
        before = viewer.revealed_by("stepper")
        if node is None:
            wanted: frozenset[str] = frozenset()
        else:
            stack = viewer.chain_of_node(node)
            layer = self._layer_of(stack)
            scope = layer or (stack[-1] if stack else None)
            wanted = frozenset(
                n for n in before if scope is not None and viewer.inside_call(n, scope)
            )
            fused = self.stepper.frames[0] if self._fused_inside() is not None else None
            if fused is not None:  # a fused call's own nodes: open it
                wanted |= {fused}
        for _ in range(4):  # open until the node shows (an own-ops box may be inside)
            viewer.reveal("stepper", wanted)
            if node is None:
                break
            target = self._fused_inside() or node
            element = viewer.scene.node_element(target)
            if element is None or element.kind not in ("box", "ops"):
                break
            more = {element.id} if element.kind == "ops" else set()
            if element.kind == "box":
                # the whole layer at once: one layout as the run enters it, none as it goes
                # from the layer's norm into its attention and on into its MLP
                more |= viewer.calls_within(layer) if layer else set()
                more |= {stack[-1]} if stack else set()
                if len(element.calls) == 1 and not stack:
                    more.add(element.calls[0])
            if more <= wanted:
                break
            wanted = wanted | more
        self.mark_current()

    def mark_current(self) -> None:
        """Mark the node about to run in the picture shown (and in the swapped call's)."""
        current = self._current_element()
        if current != self.current:
            self.current = current
            self.scroll_current += 1
            self.session.touch("current")
        inside = self._inside_current_element()
        if inside != self.inside_current:
            self.inside_current = inside
            self.session.touch("inside")

    def _inside_current_element(self) -> str:
        stepper = self.stepper
        if self.inside is None or stepper is None or stepper.done or not stepper.frames:
            return ""
        element = self.inside.picture.element_of_node(stepper.current.name)
        return element.id if element is not None else ""

    # -- inside a swapped call --------------------------------------------------------------

    def _update_inside(self) -> None:
        """Inside a swapped call: its replacement's graph, drawn (once per graph), and the
        before/after picture, where the nodes it replaced are; outside, neither."""
        session = self.session
        stepper = self.stepper
        frames = stepper.frames if stepper is not None else ()
        if not frames or frames[0] in session.surgery.fused:
            self.leave_inside()
            return
        graph = stepper.call_graph
        if graph is None:
            self.leave_inside()
            return
        scene = self._inside_pictures.get(id(graph))
        if scene is None:
            session.busy(f"drawing the replacement of {frames[0]}…")
            try:
                view = graph_view(graph, collapse=None)
            except GraphSurgeonError:
                self.leave_inside()  # a graph the renderer cannot read: the call stays marked
                return
            scene = Scene.laid_out(view, "", graph)
            self._inside_pictures[id(graph)] = scene
            while len(self._inside_pictures) > _KEPT_INSIDE:
                self._inside_pictures.popitem(last=False)
        if self.inside is not scene:
            self.inside = scene
            session.touch("inside")
        session.viewer.show_beside_call()  # the original call's nodes beside the replacement's

    def leave_inside(self, render: bool = True) -> None:
        """Out of the swapped call: its picture goes, and the view it was shown in before
        comes back (drawn again unless ``render`` is false)."""
        if self.inside is None:
            return
        self.inside = None
        self.inside_current = ""
        self.session.touch("inside")
        self.session.viewer.back_from_call(render)

    def counterpart(self, node: str) -> str | None:
        """The node of the original call that node ``node`` of the swapped call's graph (the
        stepper is inside) stands for: the same op, the same time in order (the k-th
        ``aten.linear`` of the replacement and of the original call), or None."""
        session = self.session
        stepper = self.stepper
        if stepper is None or not stepper.frames or stepper.call_graph is None:
            return None
        call = stepper.frames[0]
        if call not in session.partitions:
            return None
        inner = [n for n in stepper.call_graph.graph.nodes if _meta.computes(n)]
        target = next((n for n in inner if n.name == node), None)
        if target is None:
            return None
        op = _meta.op_text(target, "full")
        k = [n for n in inner if _meta.op_text(n, "full") == op].index(target)
        by_name = program_index(session.surgery.program).by_name
        original = [
            by_name[n]
            for n in session.partitions[call].nodes
            if n in by_name and _meta.computes(by_name[n])
        ]
        same = [n for n in original if _meta.op_text(n, "full") == op]
        return same[k].name if k < len(same) else None

    def counterpart_summary(self, node: str) -> Summary | None:
        """The value of the original program's node ``node`` on the example inputs (a second
        stepper runs the original program up to it), or None when it cannot be had."""
        try:
            original = self._original_stepper
            if original is None:
                args, kwargs = self.session.inputs()
                program = self.session.surgery.program
                original = self._original_stepper = Stepper(program, *args, **kwargs)
            if node not in original.env:
                if original.done or original.position > _position_of(original, node):
                    original.reset()
                original.run_to(node=node)
                original.step()
            return original.summary(node)
        except GraphSurgeonError:  # no inputs, or a node it cannot reach
            return None

    def summaries(self) -> list[Summary]:
        """The values the next node reads, then the last value computed (what the stepper
        panel shows; a value the stepper no longer keeps is left out)."""
        stepper = self.stepper
        if stepper is None:
            return []
        names: list[str] = []
        if not stepper.done:
            names += [n.name for n in stepper.current.all_input_nodes]
        if self.last_step is not None and self.last_step.ran:
            names.append(self.last_step.ran[-1])
        summaries = []
        for name in dict.fromkeys(names):
            try:
                summaries.append(stepper.summary(name))
            except GraphSurgeonError:
                continue  # a value not kept (or of another frame): nothing to show
        return summaries[:_SUMMARIES]


def _position_of(stepper: Stepper, node: str) -> int:
    """Where node ``node`` is in the order the stepper runs its graph."""
    for i, candidate in enumerate(stepper.graph_module.graph.nodes):
        if candidate.name == node:
            return i
    return -1
