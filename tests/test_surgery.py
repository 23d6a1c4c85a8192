"""Surgery: history, undo/redo, reset, diff, verify and re-export; failures change nothing."""

from __future__ import annotations

import pytest
import torch
from conftest import eager_reference
from torch import nn

import graphsurgeon as gs


class Net(nn.Module):
    #   x -> a (Linear) -> act (ReLU) -> b (Linear)
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


@pytest.fixture
def surgery():
    torch.manual_seed(0)
    model = Net()
    return gs.Surgery.from_model(model, (torch.randn(3, 4),))


def test_swaps_accumulate_and_the_module_follows(surgery):
    x = surgery.args[0]
    assert surgery.replacements == {} and surgery.history == ()
    gelu, new_b = nn.GELU(), nn.Linear(4, 2)
    surgery.swap("act", gelu).swap("b", new_b)
    assert [str(h) for h in surgery.history] == ["swap act -> GELU", "swap b -> Linear"]
    expected = eager_reference(surgery.model, {"act": gelu, "b": new_b})(x)
    torch.testing.assert_close(surgery.module(x), expected)


def test_undo_redo_reset(surgery):
    x = surgery.args[0]
    original = surgery.module(x)
    surgery.swap("act", nn.Tanh())
    swapped = surgery.module(x)
    assert not torch.allclose(original, swapped)
    torch.testing.assert_close(surgery.undo().module(x), original)
    torch.testing.assert_close(surgery.redo().module(x), swapped)
    torch.testing.assert_close(surgery.reset().module(x), original)
    assert surgery.history == ()
    surgery.redo()
    assert surgery.replacements.keys() == {"act"}


def test_a_new_swap_after_undo_drops_the_redo_branch(surgery):
    surgery.swap("act", nn.Tanh()).undo().swap("a", nn.Linear(4, 4))
    assert [h.name for h in surgery.history] == ["a"]
    with pytest.raises(gs.errors.SurgeryError, match="nothing to redo"):
        surgery.redo()


def test_nothing_to_undo_is_a_clear_error(surgery):
    with pytest.raises(gs.errors.SurgeryError, match="nothing to undo"):
        surgery.undo()


def test_a_failed_swap_leaves_the_surgery_as_it_was(surgery):
    surgery.swap("act", nn.Tanh())
    module, history = surgery.module, surgery.history
    with pytest.raises(gs.errors.UnknownModuleError):
        surgery.swap("actt", nn.GELU())
    with pytest.raises(gs.ReplacementError):
        surgery.swap("b", "not a module")
    assert surgery.module is module and surgery.history == history


def test_diff_names_removed_added_and_kept_nodes(surgery):
    surgery.swap("act", nn.GELU())
    diff = surgery.diff()
    assert diff.removed == ("relu",)
    assert diff.added[0] == "swapped_act" and "linear" in diff.kept and "linear_1" in diff.kept
    assert str(diff).startswith("1 removed")


def test_verify_against_the_eager_reference_and_without_a_model(surgery):
    surgery.swap("act", nn.GELU())
    assert surgery.verify()
    bare = gs.Surgery(surgery.program).swap("act", nn.GELU())
    x = surgery.args[0]
    report = bare.verify((x,))
    assert not report, "without the model the original program is the reference"
    with pytest.raises(gs.errors.VerifyError, match="no inputs"):
        bare.verify()


def test_export_again_gives_a_program_that_can_be_swapped_again(surgery):
    replacement = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    surgery.swap("act", nn.GELU()).swap("a", replacement).fuse("b")
    again = surgery.export()
    x = surgery.args[0]
    torch.testing.assert_close(again.module()(x), surgery.module(x))
    tree = gs.module_tree(again)
    # the original modules keep their types; the replacements and their children are modules
    assert tree["act"].type_name == "GELU" and tree["b"].type_name == "Linear"
    assert tree["a"].type_name == "Sequential" and tree["a.1"].type_name == "Tanh"
    assert all(tree[n].swappable for n in ("a", "a.0", "a.1", "act", "b"))
    new_b = nn.Linear(4, 2)
    gm = gs.swap(again, {"a.1": nn.ReLU(), "b": new_b})
    reference = eager_reference(surgery.model, {"act": nn.GELU(), "a": replacement, "b": new_b})
    reference.a[1] = nn.ReLU()
    with torch.no_grad():
        assert not torch.allclose(gm(x), surgery.module(x))  # precondition
        torch.testing.assert_close(gm(x), reference(x))


def test_export_again_refuses_a_single_call_swap_and_says_what_to_do():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(torch.relu(self.lin(x)))

    s = gs.Surgery.from_model(Twice(), (torch.randn(2, 4),))
    s.swap("lin@1", nn.Linear(4, 4))
    with pytest.raises(gs.errors.SurgeryError, match=r"'lin@1'.*Swap every call of 'lin'"):
        s.export()


def test_a_surgery_needs_a_program_and_says_how_to_get_one():
    with pytest.raises(gs.errors.SurgeryError, match="from_model"):
        gs.Surgery(Net())
    with pytest.raises(gs.errors.SurgeryError, match=r"gs\.export"):
        gs.Surgery("model.pt2")


def test_the_program_is_never_changed(surgery):
    before = str(surgery.program.graph)
    surgery.swap("act", nn.GELU()).swap("b", nn.Linear(4, 2)).undo()
    surgery.module(surgery.args[0])
    assert str(surgery.program.graph) == before
