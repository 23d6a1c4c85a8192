"""No public verb changes the program, the model, the replacements or the inputs it is given.

The program here updates buffers when it runs (BatchNorm in train mode), in the original modules
and in a replacement, so a verb that ran anything on shared state would show in the buffers.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.export_models import ConvBnFlattenNet, Doubles, PassesItsWeight
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks.verify import eager_reference
from graphsurgeon.swap import swap_info


def _state(*owners) -> list[dict[str, torch.Tensor]]:
    states = []
    for owner in owners:
        if isinstance(owner, torch.export.ExportedProgram):
            items = list(owner.state_dict.items()) + list(owner.constants.items())
        elif isinstance(owner, nn.Module):
            items = list(owner.state_dict(keep_vars=True).items())
        else:
            items = [("value", owner)]
        states.append({k: v.detach().clone() for k, v in items if isinstance(v, torch.Tensor)})
    return states


def _changed(before, after) -> list[str]:
    """Which tensors differ: ``"owner k: key"``; empty when every one is bit for bit the same."""
    changed = []
    for k, (b, a) in enumerate(zip(before, after)):
        if b.keys() != a.keys():
            changed.append(f"owner {k}: keys {sorted(b.keys() ^ a.keys())}")
        changed += [
            f"owner {k}: {key}" for key in b if key in a and not torch.equal(b[key], a[key])
        ]
    return changed


def _same(before, after) -> bool:
    return not _changed(before, after)


@pytest.fixture
def setting():
    torch.manual_seed(0)
    model = ConvBnFlattenNet().train()
    x = torch.randn(2, 3, 6, 6)
    ep = gs.export(model, (x,))
    replacement = nn.BatchNorm2d(4).train()  # updates its own running stats when it runs
    return model, x, ep, replacement


def _runs_every_verb(model, x, ep, replacement, *, run_results: bool):
    """Every public verb; with ``run_results`` the swapped programs are also called directly."""
    replacements = {"bn": replacement}
    gs.module_tree(ep)
    gs.partition(ep)
    swapped = gs.swap(ep, replacements)
    if run_results:
        swapped(x)
    swap_info(swapped).diff  # noqa: B018 - computed on demand
    fused = gs.fuse(ep, ["bn", "conv"])
    fused(x)
    gs.verify(ep, swapped, (x,))
    gs.verify(model, ep, (x,))
    gs.verify(eager_reference(model, replacements), swapped, (x,))
    gs.compare(ep, swapped, (x,))
    gs.to_dot(ep)
    gs.to_dot(swapped, diff=True)
    gs.to_dot(fused)
    stepper = gs.Stepper(swapped, x)
    stepper.continue_()
    gs.Stepper(ep, x).continue_()
    surgery = gs.Surgery(ep, model=model, args=(x,))
    surgery.swap("bn", replacement).fuse("conv")
    if run_results:
        surgery.module(x)
    surgery.verify()
    surgery.diff()
    surgery.export()
    surgery.undo().redo().reset()


def test_the_precondition_running_the_program_changes_its_buffers(setting):
    model, x, ep, replacement = setting
    before = _state(ep, model, replacement)
    ep.module()(x)  # torch's own module shares the program's buffers
    model(x)
    replacement(torch.randn(2, 4, 6, 6))
    after = _state(ep, model, replacement)
    assert all(not _same([b], [a]) for b, a in zip(before, after))


def test_no_public_verb_changes_program_model_replacement_or_inputs(setting):
    model, x, ep, replacement = setting
    graph = str(ep.graph)
    before = _state(ep, model, replacement, x)
    _runs_every_verb(model, x, ep, replacement, run_results=False)
    assert str(ep.graph) == graph
    assert _changed(before, _state(ep, model, replacement, x)) == []
    assert model.training and replacement.training


def test_running_a_swapped_program_updates_the_replacement_it_holds_and_nothing_else(setting):
    # A swapped program holds the replacement itself, as a model holds its submodules: calling
    # it in train mode updates the replacement's statistics (and trains its parameters), which
    # is what a user who installs a module expects. The program and the model stay as they were.
    model, x, ep, replacement = setting
    before = _state(ep, model, x)
    replacement_before = _state(replacement)
    _runs_every_verb(model, x, ep, replacement, run_results=True)
    assert _changed(before, _state(ep, model, x)) == []
    assert not _same(replacement_before, _state(replacement))


def test_the_swapped_program_updates_its_own_copies_of_the_programs_buffers(setting):
    model, x, ep, _replacement = setting
    swapped = gs.swap(ep, {"head": copy.deepcopy(model.head)})
    before = _state(ep)
    swapped(x)
    assert _same(before, _state(ep))


def _dies(make_and_use) -> bool:
    """Whether the program ``make_and_use`` builds and uses is freed once the caller drops it."""
    import gc
    import weakref

    program = make_and_use()
    alive = weakref.ref(program)
    del program
    gc.collect()
    return alive() is None


def test_nothing_graphsurgeon_caches_keeps_a_program_alive():
    # Each verb caches what it derives from a program (its index, its runnable original,
    # cuts): a notebook that exports model after model must not keep every one of them.
    model, x = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.randn(1, 2)

    def verified():
        ep = gs.export(model, (x,))
        gs.verify(ep, ep, (x,))
        return ep

    def stepped():
        ep = gs.export(model, (x,))
        gs.Stepper(ep, x).continue_()
        return ep

    def compared():
        ep = gs.export(model, (x,))
        gs.compare(ep, gs.swap(ep, {"1": torch.nn.Tanh()}), (x,))
        return ep

    def drawn_and_tree():
        ep = gs.export(model, (x,))
        gs.to_dot(ep), gs.module_tree(ep), gs.fuse(ep, "0")
        return ep

    for use in (verified, stepped, compared, drawn_and_tree):
        assert _dies(use), use.__name__


@pytest.mark.parametrize("name", ["m", "n"])
def test_a_replacement_writing_a_parameter_it_is_given_never_writes_the_users_model(name):
    """Was: the swapped program handed the model's own parameter to the replacement, and
    ``w.mul_(2)`` doubled the user's ``model.w`` at every run."""
    torch.manual_seed(0)
    model, x = PassesItsWeight().eval(), torch.randn(2, 4)
    ep = gs.export(model, (x,))
    before = _state(model, ep)
    gm = gs.swap(ep, {name: Doubles()})
    with torch.no_grad():
        first, second = gm(x), gm(x)
    assert _changed(before, _state(model, ep)) == []
    # what eager does with the same replacement: it writes its own (copied) weight each run
    eager = eager_reference(model, {name: Doubles()})
    with torch.no_grad():
        torch.testing.assert_close(first, eager(x))
        torch.testing.assert_close(second, eager(x))
    assert not torch.equal(first, second)  # precondition: the replacement did write
    # a check is a question: verify and compare leave the program's copy as they found it
    held = [gm.get_parameter(p).detach().clone() for p in swap_info(gm).given_state]
    assert held and gs.verify(eager_reference(model, {}), gm, (x,)) is not None
    gs.compare(ep, gm, (x,))
    assert all(torch.equal(gm.get_parameter(p), h) for p, h in zip(swap_info(gm).given_state, held))
