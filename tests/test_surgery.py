"""Surgery: history, undo/redo, reset, diff, verify and re-export; failures change nothing."""

from __future__ import annotations

import contextlib
import copy
import logging

import pytest
import torch
from helpers.grad_models import (
    FusedRMSNorm,
    NormStack,
    RenamedFusedRMSNorm,
    RMSNorm,
    RunningSum,
    fused_norms,
)
from helpers.models import Scale, TwoLinear
from helpers.references import eager_reference
from helpers.swap_models import (
    CallsBlkTwice,
    CastNorm,
    Fixed,
    Gelu,
    InlineAct,
    KeywordNames,
    Lends,
    Net,
    NormResidual,
    OneLinearTwice,
    SetsCut,
    SharedAndLooped,
    TakesNothing,
    TwoInline,
    UsesPair,
    WithNorm,
    gelu,
    silu,
)
from torch import nn

import graphsurgeon as gs
from graphsurgeon.checks import _grad


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
    s = gs.Surgery.from_model(OneLinearTwice(), (torch.randn(2, 4),))
    s.swap("lin@1", nn.Linear(4, 4))
    with pytest.raises(gs.errors.SurgeryError, match=r"'lin@1'.*Swap every call of 'lin'"):
        s.export()


def test_a_surgery_needs_a_program_and_says_how_to_get_one():
    # what is no program is refused as by every entry point (graphsurgeon._program)
    with pytest.raises(gs.errors.NotAProgramError, match="from_model"):
        gs.Surgery(Net())
    with pytest.raises(gs.errors.NotAProgramError, match=r"gs\.export"):
        gs.Surgery("model.pt2")


def test_the_program_is_never_changed(surgery):
    before = str(surgery.program.graph)
    surgery.swap("act", nn.GELU()).swap("b", nn.Linear(4, 2)).undo()
    surgery.module(surgery.args[0])
    assert str(surgery.program.graph) == before


# -- export(): the re-exported program --------------------------------------------------------
#
# Every re-exported program is run against the eager reference (the model with the same
# replacements set), then swapped again and run against the reference with that swap too.


def run(program, *args, **kwargs):
    """Run an ExportedProgram through gs.swap (ep.module() cannot compile code for every module
    name the model may have)."""
    with torch.no_grad():
        return gs.swap(program, {})(*args, **kwargs)


def check_again(again, reference, inputs, name, replacement, rtol=1e-5, atol=1e-5):
    """``again`` computes what ``reference`` does on each of ``inputs``, and swapping ``name``
    for ``replacement`` in it computes what the reference with that replacement does."""
    twice = eager_reference(reference, {name: replacement})
    swapped = gs.swap(again, {name: replacement})
    for args in inputs:
        with torch.no_grad():
            expected, expected_twice = reference(*args), twice(*args)
            assert not torch.allclose(expected, expected_twice), "precondition: a new swap"
            torch.testing.assert_close(run(again, *args), expected, rtol=rtol, atol=atol)
            torch.testing.assert_close(swapped(*args), expected_twice, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_export_leaves_the_program_exactly_as_it_was(mode):
    import copy

    model, x = getattr(WithNorm(), mode)(), torch.randn(8, 6)
    ep = gs.export(model, (x,))
    meta = dict(ep.graph_module.meta)
    graph = str(ep.graph)
    state = {k: v.clone() for k, v in ep.state_dict.items()}
    s = gs.Surgery(ep, model=model, args=(x,)).swap("bn", nn.BatchNorm1d(6).eval())
    again = s.export()
    assert ep.graph_module.meta.keys() == meta.keys(), "nothing added to the program's meta"
    assert all(ep.graph_module.meta[k] is v for k, v in meta.items())
    assert str(ep.graph) == graph
    for key, value in ep.state_dict.items():
        assert torch.equal(value, state[key]) and value is not again.state_dict.get(key)
    copy.deepcopy(ep)  # raised "Cannot access data pointer of Tensor" once export() had run
    copy.deepcopy(gs.swap(ep, {"block": copy.deepcopy(model.block)}))
    copy.deepcopy(s.module)
    copy.deepcopy(again)
    if mode == "eval":
        reference = eager_reference(model, {"bn": nn.BatchNorm1d(6).eval()})
        replacement = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
        check_again(again, reference, [(x,)], "block", replacement)


@pytest.mark.parametrize("swapped", [["head"], ["d.in", 'd.a"b']])
def test_export_handles_module_names_that_are_keywords_or_hold_quotes_and_newlines(swapped):
    model, x = KeywordNames().eval(), torch.randn(2, 4)
    replacements = {name: nn.Linear(4, 4) for name in swapped}
    s = gs.Surgery.from_model(model, (x,))
    for name, module in replacements.items():
        s.swap(name, module)
    again = s.export()  # raised a bare SyntaxError from the code torch's unflatten generates
    tree = gs.module_tree(again)
    assert all(tree[f"d.{name}"].swappable for name in KeywordNames.NAMES)
    reference = eager_reference(model, replacements)
    check_again(again, reference, [(x,)], "d.c\nd", nn.Linear(4, 4))
    # and once more: a program re-exported from a re-exported one
    third = gs.Surgery(again, model=reference, args=(x,)).swap("d.0", nn.Tanh()).export()
    with torch.no_grad():
        expected = eager_reference(reference, {"d.0": nn.Tanh()})(x)
        torch.testing.assert_close(run(third, x), expected)


def _dynamic_pair():
    model, x = TwoLinear().eval(), torch.randn(3, 4)
    batch = torch.export.Dim("batch", min=2, max=9)
    ep = gs.export(model, (x,), dynamic_shapes=({0: batch},))
    return model, x, ep, batch


def test_export_keeps_the_programs_dynamic_sizes_by_default():
    model, x, ep, _ = _dynamic_pair()
    replacement = nn.Linear(4, 4)
    again = gs.Surgery(ep, args=(x,)).swap("a", replacement).export()
    assert [(r.lower, r.upper) for r in again.range_constraints.values()] == [(2, 9)]
    reference = eager_reference(model, {"a": replacement})
    inputs = [(torch.randn(n, 4),) for n in (2, 5, 9)]
    check_again(again, reference, inputs, "b", nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    static = gs.Surgery(ep, args=(x,)).swap("a", replacement).export(dynamic_shapes=None)
    assert static.range_constraints == {}, "dynamic_shapes=None asks for static sizes"


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_export_takes_dynamic_shapes_as_for_the_models_forward(form):
    model, x, ep, _ = _dynamic_pair()
    batch = torch.export.Dim("batch", min=2, max=6)
    dynamic_shapes = ({0: batch},) if form == "tuple" else {"x": {0: batch}}
    replacement = nn.Linear(4, 4)
    s = gs.Surgery(ep, args=(x,)).swap("a", replacement)
    again = s.export(dynamic_shapes=dynamic_shapes)  # raised ExportError: tuple vs dict
    assert [(r.lower, r.upper) for r in again.range_constraints.values()] == [(2, 6)]
    reference = eager_reference(model, {"a": replacement})
    check_again(again, reference, [(torch.randn(n, 4),) for n in (2, 6)], "b", nn.Tanh())


def test_export_of_a_dynamic_decoder_with_a_fused_attention():
    from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT

    model = TinyGPT(n_layers=2).eval()
    tokens = model.example_input()
    length = torch.export.Dim("length", min=2, max=32)
    ep = gs.export(model, (tokens,), dynamic_shapes=({1: length},))
    replacements = {"layers.1.attn": FusedAttention(model.layers[1].attn)}
    s = gs.Surgery(ep, model=model, args=(tokens,)).swap(*next(iter(replacements.items())))
    # raised TypeError: FusedAttention.forward() takes 2 positional arguments but 3 were given
    again = s.export()
    assert [(r.lower, r.upper) for r in again.range_constraints.values()] == [(2, 32)]
    inputs = [(tokens,), (tokens[:, :5],)]
    reference = eager_reference(model, replacements)
    check_again(again, reference, inputs, "layers.0.mlp", GeluTanhMLP(model.layers[0].mlp), 1e-4)
    # every module still takes what it took: the untouched attention too
    check_again(
        again, reference, inputs, "layers.0.attn", FusedAttention(model.layers[0].attn), 1e-4
    )
    (entry,) = [e for e in again.module_call_graph if e.fqn == "layers.0.attn"]
    assert len(entry.signature.inputs) == 1


def test_export_without_inputs_says_what_to_pass():
    ep = gs.export(TwoLinear(), (torch.randn(2, 4),))
    s = gs.Surgery(ep).swap("a", nn.Linear(4, 4))
    with pytest.raises(gs.errors.SurgeryError, match=r"export: no inputs.*s\.export\(\(x,\)\)"):
        s.export()
    # a list is refused as by every entry point (graphsurgeon._program.as_inputs)
    with pytest.raises(gs.InputStructureError, match=r"export: args: .*got a list; pass tuple"):
        s.export([torch.randn(2, 4)])
    assert s.export((torch.randn(2, 4),)).range_constraints == {}
    given = gs.Surgery(ep, args=(torch.randn(2, 4),)).export()
    assert gs.module_tree(given)["a"].swappable


@pytest.mark.parametrize("strict", [False, True])
def test_export_of_repeated_calls_in_strict_and_non_strict_mode(strict):
    model, x = SharedAndLooped(), torch.randn(2, 4)
    ep = gs.export(model, (x,), strict=strict)
    replacement = nn.Linear(4, 4)
    again = gs.Surgery(ep, args=(x,)).swap("shared", replacement).export(strict=strict)
    tree = gs.module_tree(again)
    assert tree["block"].calls == 3 and all(tree[n].swappable for n in ("shared", "block"))
    reference = eager_reference(model, {"shared": replacement})
    check_again(again, reference, [(x,)], "block.0", nn.Linear(4, 4))


def test_export_in_train_mode_updates_the_running_statistics_as_eager_does():
    model, x = WithNorm().train(), torch.randn(8, 6)
    replacement = nn.BatchNorm1d(6, momentum=0.3)
    again = gs.Surgery.from_model(model, (x,)).swap("bn", replacement).export()
    reference = eager_reference(model, {"bn": replacement})
    program = gs.swap(again, {})
    for _ in range(2):
        torch.testing.assert_close(program(x), reference(x))
    for name in ("bn.running_mean", "block.1.running_var", "block.1.num_batches_tracked"):
        torch.testing.assert_close(program.get_buffer(name), reference.get_buffer(name))
    assert float(replacement.num_batches_tracked) == 0, "export() ran nothing of it"


def test_a_saved_re_exported_program_keeps_the_module_types(tmp_path):
    from graphsurgeon.examples import FusedAttention, TinyGPT

    model = TinyGPT(n_layers=2).eval()
    tokens = model.example_input()
    s = gs.Surgery.from_model(model, (tokens,))
    again = s.swap("layers.1.attn", FusedAttention(model.layers[1].attn)).export()
    torch.export.save(again, tmp_path / "again.pt2")
    tree = gs.module_tree(torch.export.load(tmp_path / "again.pt2"))
    assert tree[""].type_name == "TinyGPT" and tree["layers.0"].type_name == "Block"
    assert tree["layers.1.attn"].type_name == "FusedAttention"
    assert tree["layers.0.attn"].type_name == "Attention" and tree["layers.0.attn"].swappable


def test_a_replacement_that_makes_a_kept_dynamic_size_static_is_named_with_what_to_do():
    _, x, ep, _ = _dynamic_pair()
    s = gs.Surgery(ep, args=(x,)).swap("a", Fixed())
    with pytest.raises(gs.errors.ExportError) as caught:
        s.export()
    message = str(caught.value)
    assert "x.shape[0] in [2, 9]" in message and "dynamic_shapes=None" in message
    assert s.export(dynamic_shapes=None).range_constraints == {}


@pytest.mark.parametrize("strict", [False, True])
def test_a_module_reading_another_modules_parameter_reads_that_parameter(strict):
    model, x = Lends(), torch.randn(2, 4)
    replacement = nn.Linear(4, 4)
    s = gs.Surgery(gs.export(model, (x,), strict=strict), args=(x,)).swap("lin", replacement)
    again = s.export(strict=strict)
    assert again.constants == {} and "scale" in again.state_dict
    reference = eager_reference(model, {"lin": replacement})
    check_again(again, reference, [(x,)], "borrows", Scale(3.0))


def test_a_module_that_cannot_be_called_on_its_own_arguments_runs_in_its_caller():
    from graphsurgeon.export import export_notes

    model = SetsCut()
    batch, width = torch.export.Dim("batch", min=2, max=9), torch.export.Dim("w", min=2, max=6)
    args = (torch.randn(3, 8), torch.randn(3, 4))
    ep = gs.export(model, args, dynamic_shapes=({0: batch}, {0: batch, 1: width}))
    replacement = nn.Linear(8, 8)
    again = gs.Surgery(ep, args=args).swap("lin", replacement).export()
    assert not gs.module_tree(again)["cut"].swappable
    assert "size" in export_notes(again).dropped["cut"]
    reference = eager_reference(model, {"lin": replacement})
    inputs = [args, (torch.randn(5, 8), torch.randn(5, 6))]
    check_again(again, reference, inputs, "lin", nn.Sequential(nn.Linear(8, 8), nn.Tanh()))


def test_export_with_a_replacement_returning_the_wrong_structure_names_it():
    x = torch.randn(2, 4)
    s = gs.Surgery.from_model(UsesPair(), (x,)).swap("pair", Scale(2.0))  # one tensor, not two
    with pytest.raises(gs.errors.ExportError, match=r"'pair' \(Scale\) returned f32\[2, 4\]"):
        s.export()


def test_compare_judges_each_replacement_against_what_it_replaced():
    from graphsurgeon.examples import GeluTanhMLP, TinyGPT

    model = TinyGPT(2).eval()
    tokens = model.example_input()
    s = gs.Surgery.from_model(model, (tokens,))
    s.swap("layers.1.mlp", GeluTanhMLP(model.layers[1].mlp))
    assert s.verify(), "precondition: the swap itself is faithful"
    comparison = s.compare()
    assert comparison.first_divergence == "layers.1.mlp"
    assert s.compare(rtol=1e-2, atol=1e-2).ok
    with pytest.raises(gs.GraphSurgeonError, match="no inputs"):
        gs.Surgery(s.program).compare()


# -- long sessions: only a few built states are kept --------------------------------------------


def node_names(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


def test_a_long_session_keeps_only_a_few_built_states_and_builds_the_others_again(surgery):
    import gc
    import weakref

    x = surgery.args[0]
    activations = [nn.Tanh(), nn.GELU(), nn.Sigmoid(), nn.SiLU(), nn.ELU(), nn.Softsign()]
    built, names, outputs = [], [], []
    for activation in activations:
        module = surgery.swap("act", activation).module
        built.append(weakref.ref(module))
        names.append(node_names(module))
        outputs.append(module(x))
        del module
    gc.collect()
    alive = [i for i, ref in enumerate(built) if ref() is not None]
    assert len({id(ref()) for ref in built if ref() is not None}) == len(alive)
    # the bound: the last keep_built states used, not one module per step
    assert alive == [3, 4, 5], f"the Surgery kept the modules of states {alive}"
    surgery.undo().undo().undo().undo()  # back to the state of step 2, dropped since
    assert surgery.history[-1].replacement_type == "GELU"
    again = surgery.module
    assert again is surgery.module, "the same object while it is kept"
    assert node_names(again) == names[1]
    torch.testing.assert_close(again(x), outputs[1])
    reference = eager_reference(surgery.model, {"act": nn.GELU()})
    torch.testing.assert_close(again(x), reference(x))
    surgery.redo().redo().redo().redo()
    torch.testing.assert_close(surgery.module(x), outputs[5])
    assert node_names(surgery.module) == names[5]


def test_a_state_built_again_keeps_the_buffers_its_runs_changed():
    import copy
    import gc
    import weakref

    model, x = WithNorm().train(), torch.randn(8, 6)
    s = gs.Surgery.from_model(model, (x,))
    s.keep_built = 3
    s.swap("lin", nn.Linear(6, 6))
    first = s.module
    first(x)
    first(x)  # updates its own copy of the BatchNorm statistics, as eager does
    kept = copy.deepcopy(first)
    mean = first.get_buffer("bn.running_mean").clone()
    assert not torch.equal(mean, s.program.state_dict["bn.running_mean"]), "precondition"
    dropped = weakref.ref(first)
    del first
    for _ in range(3):
        s.swap("block.0", nn.Linear(6, 6))
    gc.collect()
    assert dropped() is None, "the state's module was dropped"
    for _ in range(3):
        s.undo()
    again = s.module
    torch.testing.assert_close(again.get_buffer("bn.running_mean"), mean)
    torch.testing.assert_close(again(x), kept(x))
    torch.testing.assert_close(
        again.get_buffer("block.1.running_var"), kept.get_buffer("block.1.running_var")
    )


# -- requests that overlap earlier ones ----------------------------------------------------------


def test_a_whole_module_swap_replaces_earlier_swaps_of_its_calls():
    model, x = CallsBlkTwice(), torch.randn(2, 4)
    first, whole = nn.Linear(4, 4), nn.Linear(4, 4)
    s = gs.Surgery.from_model(model, (x,)).swap("blk@1", first)
    assert s.replacements == {"blk@1": first}
    # raised "ConflictError: call 'blk@1' is requested twice; request it once."
    s.swap("blk", whole)
    assert s.replacements == {"blk": whole} and len(s.history) == 2
    with torch.no_grad():
        expected = eager_reference(model, {"blk": whole})(x)
        assert not torch.allclose(expected, model(x)), "precondition: a new swap"
        torch.testing.assert_close(s.module(x), expected)
    assert s.verify()
    assert s.undo().replacements == {"blk@1": first}
    s.reset().redo().swap("blk@0", nn.Tanh())  # one call each: nothing is covered
    assert list(s.replacements) == ["blk@1", "blk@0"]


def test_one_call_of_a_module_swapped_as_a_whole_is_refused_in_the_users_words():
    s = gs.Surgery.from_model(CallsBlkTwice(), (torch.randn(2, 4),)).swap("blk", nn.Linear(4, 4))
    module, history = s.module, s.history
    with pytest.raises(gs.errors.ConflictError) as caught:
        s.swap("blk@1", nn.Linear(4, 4))
    message = str(caught.value)
    assert "requested twice" not in message
    assert "'blk' is swapped for a Linear as a whole in step 1" in message
    assert "undo step 1 (s.undo())" in message and "'blk@0' and 'blk@1'" in message
    assert s.module is module and s.history == history


def test_a_swap_inside_a_fused_module_says_it_is_fused_and_what_to_do(tiny_gpt):
    from graphsurgeon.examples import FusedAttention

    model, _, ep = tiny_gpt
    attention = FusedAttention(model.layers[0].attn)
    with pytest.raises(
        gs.errors.ConflictError, match=r"Swap only 'layers\.0'"
    ):  # the engine's text
        gs.swap(ep, {"layers.0": copy_of(model.layers[0]), "layers.0.attn": attention})
    s = gs.Surgery(ep).fuse("layers.0").fuse("layers.1")
    with pytest.raises(gs.errors.ConflictError) as caught:
        s.swap("layers.0.attn", attention)
    message = str(caught.value)
    assert "Swap only" not in message, "it speaks of swapping the fused parent"
    assert "inside 'layers.0', which is fused (step 1)" in message
    assert "undo the fuse of 'layers.0'" in message and "s.undo() 2 times" in message
    assert s.fused == ("layers.0", "layers.1")
    # the other way round: a fuse around a swapped module
    s = gs.Surgery(ep).swap("layers.0.attn", attention)
    with pytest.raises(
        gs.errors.ConflictError, match=r"'layers\.0\.attn' inside it is swapped for a "
    ):
        s.fuse("layers.0")
    with pytest.raises(gs.errors.ConflictError, match=r"would run instead of it.*undo step 1"):
        s.swap("layers.0", copy_of(model.layers[0]))


def copy_of(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)


# -- re-export: TorchScript, torch's output -----------------------------------------------------


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_export_with_a_torchscript_replacement_says_what_to_do(surgery):
    x = surgery.args[0]
    scripted = torch.jit.script(nn.GELU())
    surgery.swap("act", scripted)
    torch.testing.assert_close(surgery.module(x), surgery.model.b(nn.GELU()(surgery.model.a(x))))
    # raised "ExportError: ... RuntimeError: register_forward_pre_hook is not supported on
    # ScriptModules"
    with pytest.raises(gs.errors.SurgeryError, match=r"'act' is swapped for a TorchScript"):
        surgery.export()
    surgery.undo().swap("act", nn.Sequential(nn.Tanh(), torch.jit.script(nn.GELU())))
    with pytest.raises(gs.errors.SurgeryError, match=r"holds a TorchScript module at 'act\.1'"):
        surgery.export()
    surgery.undo().swap("act", nn.GELU())
    assert gs.module_tree(surgery.export())["act"].type_name == "GELU"


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_export_with_torch_ao_packed_weights_says_what_to_do(surgery):
    x = surgery.args[0]
    quantized = torch.ao.quantization.quantize_dynamic(
        nn.Sequential(nn.Linear(4, 4)), {nn.Linear}, dtype=torch.qint8
    )
    surgery.swap("a", quantized[0])
    # precondition: it runs in the swapped program, as eagerly
    torch.testing.assert_close(surgery.module(x), surgery.model.b(surgery.model.act(quantized(x))))
    # raised "ExportError: ... AttributeError: __torch__.torch.classes.quantized.
    # LinearPackedParamsBase ... does not have a field with name '__obj_flatten__'"
    expected = r"'a' is swapped for a module whose weights are packed .*dynamic.*Quantize with"
    with pytest.raises(gs.errors.SurgeryError, match=expected):
        surgery.export()
    surgery.undo().swap("a", nn.Sequential(quantized, nn.Identity()))
    with pytest.raises(gs.errors.SurgeryError, match=r"holds a module whose .* at 'a\.0\.0'"):
        surgery.export()


@contextlib.contextmanager
def logged(name: str):
    """The warnings and errors a logger and its children emit while the block runs (seen by a
    handler of its own on each: torch's loggers do not propagate)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    loggers = [logging.getLogger(name)] + [
        logger
        for key, logger in logging.root.manager.loggerDict.items()
        if key.startswith(name + ".") and isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


class DataDependent(nn.Module):
    """A replacement torch.export cannot trace: its branch depends on a value."""

    def forward(self, x):
        return x * 2 if x.sum() > 0 else x - 1


def test_a_failed_export_writes_nothing_to_stderr_and_names_the_replacement(surgery, capfd):
    import warnings

    x = surgery.args[0]
    surgery.swap("act", DataDependent())
    torch.testing.assert_close(
        surgery.module(x), eager_reference(surgery.model, {"act": DataDependent()})(x)
    )
    levels = {n: logging.getLogger(n).level for n in ("torch", "torch.export", "torch._dynamo")}
    filters = list(warnings.filters)
    capfd.readouterr()
    with logged("torch") as records, pytest.raises(gs.errors.ExportError) as caught:
        surgery.export()
    # torch printed the partial graph and logged a warning of its own, dozens of lines
    assert capfd.readouterr().err == "" and records == []
    assert "in the replacement for 'act' (DataDependent, at test_surgery.py:" in str(caught.value)
    assert {n: logging.getLogger(n).level for n in levels} == levels
    assert warnings.filters == filters


@pytest.mark.parametrize("name", ["mlp", "norm", "act"])
def test_a_program_whose_modules_return_their_input_exports_again_as_eager(name):
    torch.manual_seed(0)
    model, x = NormResidual().eval(), torch.randn(2, 8)
    replacement = {"mlp": nn.Linear(8, 8), "norm": CastNorm(), "act": nn.GELU()}[name]
    s = gs.Surgery.from_model(model, (x,)).swap(name, replacement)
    again = s.export()
    reference = eager_reference(model, {name: replacement})
    assert not torch.allclose(reference(x), model(x))  # precondition: the swap shows
    assert gs.verify(reference, again, (x,))
    assert all(info.swappable for fqn, info in gs.module_tree(again).items() if fqn)


def test_the_state_a_view_reads_is_public():
    # a view (the widget) reads these instead of the Surgery's own fields
    torch.manual_seed(0)
    model, x = TwoLinear().eval(), torch.randn(2, 4)
    s = gs.Surgery.from_model(model, (x,))
    seen = s.version
    assert (s.can_undo, s.can_redo, s.steps, s.position, s.last_verify) == (
        False,
        False,
        (),
        0,
        None,
    )
    s.swap("a", nn.Linear(4, 4))
    assert s.version != seen and s.can_undo and not s.can_redo and s.position == 1
    report = s.verify()
    assert s.last_verify is report
    seen = s.version
    s.undo()
    assert s.version != seen and s.can_redo and len(s.steps) == 1 and s.position == 0
    assert s.last_verify is None  # the verify belongs to the state it was made in
    s.redo()
    assert s.last_verify is report
    # a copy of the original module, the model's own or rebuilt from the program
    copied = s.original("a")
    assert torch.equal(copied.weight, model.a.weight) and copied is not model.a
    rebuilt = gs.Surgery(s.program).original("a")
    assert torch.allclose(rebuilt(x), model.a(x))
    with pytest.raises(gs.errors.UnknownModuleError, match="Did you mean 'a'"):
        s.original("aa")


def test_verify_gives_two_verdicts_faithful_and_equal_to_the_original():
    # a replacement that computes something else is faithful (the swap is what eager PyTorch
    # computes with it) and differs from the original: both verdicts, each with its own badge
    torch.manual_seed(0)
    model, x = TwoLinear().eval(), torch.randn(2, 4)
    s = gs.Surgery.from_model(model, (x,)).swap("a", nn.Linear(4, 4))
    report = s.verify()
    assert report and report.original is not None and not report.original
    assert "against the eager model with the same replacements" in str(report)
    assert "and against the original model: MISMATCH" in str(report)
    html = report._repr_html_()
    assert "faithful" in html and "differs from the original" in html
    # a faithful copy of the original: both hold
    s.swap("a", copy.deepcopy(model.a))
    both = s.verify()
    assert both and both.original
    # without the model, the one reference is the original program
    plain = gs.Surgery(s.program, args=(x,)).swap("a", nn.Linear(4, 4)).verify()
    assert not plain and plain.original is None and "the original program" in str(plain)


# -- verify(backward=True): both verdicts with the gradients --------------------------------


def _torch_gradients(model: nn.Module, x: torch.Tensor, upstream: torch.Tensor) -> dict:
    """torch's own autograd on ``model``: ``{"grad of <name>": gradient}`` of the input and of
    every parameter, from ``upstream`` at the output."""
    x = x.detach().requires_grad_(True)
    named = dict(model.named_parameters())
    grads = torch.autograd.grad(model(x), [x, *named.values()], upstream, allow_unused=True)
    names = ["grad of input x", *(f"grad of {name}" for name in named)]
    return dict(zip(names, grads))


def _differing(expected: dict, actual: dict) -> set[str]:
    return {
        name
        for name in expected.keys() & actual.keys()
        if not torch.allclose(expected[name], actual[name], rtol=1e-5, atol=1e-5)
    }


def test_verify_backward_checks_the_gradients_in_both_verdicts():
    torch.manual_seed(0)
    model, x = NormStack(layers=4).eval(), torch.randn(3, 8)
    bugs = {"layers.1.norm": "weight factor", "layers.3.norm": "missing mean"}
    s = gs.Surgery.from_model(model, (x,))
    for name, replacement in fused_norms(model, bugs).items():
        s.swap(name, replacement)
    assert s.verify() and s.verify().original, "precondition: the forward is right everywhere"
    report = s.verify(backward=True)
    assert s.last_verify is report
    # faithful: the eager model with the same (wrong) replacements has the same gradients
    assert report and report.backward and report.gradients_ok
    # against the original: the outputs match, the gradients do not, where torch says so
    original = report.original
    assert not original and original.outputs_ok and original.gradients_ok is False
    upstream = _grad.seeded_upstream(model(x).requires_grad_(True))[0]
    expected = _torch_gradients(model, x, upstream)
    actual = _torch_gradients(s.module, x, upstream)
    assert {g.path for g in original.gradients} == set(expected)
    wrong = _differing(expected, actual)
    assert {"grad of layers.1.norm.weight", "grad of input x"} <= wrong
    assert {g.path for g in original.gradient_mismatches} == wrong
    assert not _differing(
        _torch_gradients(eager_reference(model, s.replacements), x, upstream), actual
    )
    # both forms say the gradients were checked, and which differ
    text = str(report)
    assert "gradients" in text.splitlines()[0] and "backward: match" in text
    assert "against the original model (outputs and gradients): MISMATCH" in text
    assert "grad of" in text.splitlines()[1]  # the outputs match: the worst gradient is named
    html = report._repr_html_()
    assert "backward: match" in html and "grad of" in html and "differs from the original" in html
    # without the model, the one reference is the original program: the same gradients differ
    bare = gs.Surgery(s.program, args=(x,))
    for name, replacement in s.replacements.items():
        bare.swap(name, replacement)
    alone = bare.verify(backward=True)
    assert alone.original is None and alone.outputs_ok and not alone
    assert {g.path for g in alone.gradient_mismatches} == wrong


def test_verify_backward_pairs_parameters_by_name_and_says_what_it_could_not_pair():
    torch.manual_seed(0)
    model, x = NormStack(layers=2).eval(), torch.randn(3, 8)
    s = gs.Surgery.from_model(model, (x,))
    s.swap("layers.1.norm", RenamedFusedRMSNorm(model.layers[1].norm))
    names = {name for name, _ in s.module.named_parameters()}
    assert "layers.1.norm.scale" in names and "layers.0.norm.weight" in names  # the model's fqns
    report = s.verify(backward=True)
    assert report and report.original, "the replacement is right: forward and backward"
    faithful = {g.path for g in report.gradients}
    assert "grad of layers.1.norm.scale" in faithful
    against_original = {g.path for g in report.original.gradients}
    assert not {"grad of layers.1.norm.scale", "grad of layers.1.norm.weight"} & against_original
    notes = " ".join(report.original.backward_notes)
    assert "the candidate has no such parameter (or it is frozen): layers.1.norm.weight" in notes
    assert "the reference has no such parameter (or it is frozen): layers.1.norm.scale" in notes
    # what was compared agrees with torch's autograd on the model
    upstream = _grad.seeded_upstream(model(x).requires_grad_(True))[0]
    expected = _torch_gradients(model, x, upstream)
    actual = _torch_gradients(s.module, x, upstream)
    assert not _differing(expected, actual) and len(expected.keys() & actual.keys()) == len(
        against_original
    )
    # the same replacement with a planted backward bug: only the gradients that flow differ
    s.swap("layers.1.norm", RenamedFusedRMSNorm(model.layers[1].norm, "missing mean"))
    wrong = s.verify(backward=True).original
    assert wrong.outputs_ok and not wrong.gradients_ok
    actual = _torch_gradients(s.module, x, upstream)
    assert {g.path for g in wrong.gradient_mismatches} == _differing(expected, actual) != set()


def test_backward_checks_can_be_repeated_on_a_program_that_writes_its_buffers():
    """Was: a buffer written in place from values that need a gradient kept that run's autograd
    history (its values were put back, not its history), so the next backward check of the
    same program failed ("Trying to backward through the graph a second time"), and the
    user's model came back with a buffer that requires grad."""
    torch.manual_seed(0)
    model, x = nn.Sequential(RunningSum(), RMSNorm(8)).eval(), torch.randn(3, 8)
    s = gs.Surgery.from_model(model, (x,)).swap("1", FusedRMSNorm(model[1], "weight factor"))
    first, second = s.verify(backward=True), s.verify(backward=True)
    assert first and second and first.original.outputs_ok
    assert [g.path for g in first.original.gradient_mismatches] == ["grad of 1.weight"]
    assert str(first) == str(second)
    assert s.bisect(backward=True).culprits == s.bisect(backward=True).culprits == ("1",)
    assert not model[0].total.requires_grad and not model[0].total.any()
    # torch agrees: only the weight's gradient differs (the buffer's state as exported: zeros)
    upstream = _grad.seeded_upstream(model(x).requires_grad_(True))[0]
    model[0].total.zero_()
    fused = eager_reference(model, s.replacements)
    expected = _torch_gradients(copy.deepcopy(model), x, upstream)
    assert _differing(expected, _torch_gradients(fused, x, upstream)) == {"grad of 1.weight"}


# -- replace: a pattern of ops that is no module's, swapped as a module is --------------------


def _patched(model, function):
    """The eager model with every act_fn set to ``function``: what replace should compute."""
    patched = copy.deepcopy(model)
    for module in patched.modules():
        if isinstance(module, InlineAct):
            module.act_fn = function
    return patched


def test_replace_makes_every_match_one_call_and_computes_the_patched_model():
    torch.manual_seed(0)
    model, x = TwoInline().eval(), torch.randn(3, 4)
    s = gs.Surgery.from_model(model, (x,))
    expected = _patched(model, gelu)(x)
    assert not torch.allclose(expected, model(x))  # precondition: the replacement shows
    s.replace(silu, Gelu(), (torch.randn(2, 4),))  # traced at another batch size
    assert list(s.replacements) == ["silu:a", "silu:b"] and set(s.regions) == {"silu:a", "silu:b"}
    assert s.history[-1].action == "replace" and s.history[-1].name == "silu (2 matches)"
    torch.testing.assert_close(s.module(x), expected)
    # one step: undo takes every match back, redo brings them again
    s.undo()
    assert s.replacements == {} and torch.allclose(s.module(x), model(x))
    s.redo()
    torch.testing.assert_close(s.module(x), expected)
    # compare checks each region against the nodes it replaced
    assert s.compare().first_divergence == "silu:a"
    # verify: the one reference is the original model, and it says why
    report = s.verify()
    assert not report and "patch the function in the model" in str(report)
    # exported again, each region is a module of its own there, swappable in turn
    again = s.export()
    assert gs.verify(_patched(model, gelu), again, (x,))
    tree = gs.module_tree(again)
    assert tree["a.replaced_silu"].swappable and tree["b.replaced_silu"].type_name == "Gelu"
    # a stepper steps into a region's call as into a swapped module's
    stepper = gs.Stepper(s, x)
    call = next(n.name for n in s.module.graph.nodes if n.op == "call_module")
    stepper.run_to(call)
    stepper.step_into()
    assert stepper.stack[-1].startswith("a")


def test_replace_chosen_matches_and_refusals_say_why():
    torch.manual_seed(0)
    model, x = TwoInline().eval(), torch.randn(3, 4)
    s = gs.Surgery.from_model(model, (x,))
    found = gs.find(s.program, silu, (x,))
    s.replace(silu, Gelu(), (x,), matches=[found.matches[1]])
    assert list(s.replacements) == ["silu:b"]
    torch.testing.assert_close(s.module(x), _patched_b(model)(x))
    with pytest.raises(gs.errors.SurgeryError, match=r"'gelu' occurs nowhere"):
        s.replace(gelu, Gelu(), (x,))
    with pytest.raises(gs.errors.SurgeryError, match=r"matches=5: there are 2 matches"):
        s.replace(silu, Gelu(), (x,), matches=5)

    with pytest.raises(gs.ReplacementError, match=r"cannot take the arguments.*\(x: f32\[3, 4\]\)"):
        s.replace(silu, TakesNothing(), (x,))
    assert list(s.replacements) == ["silu:b"], "a refused replace changes nothing"
    # a region inside a swapped module: the two cannot both replace those nodes
    s.swap("a", nn.Identity())
    with pytest.raises(gs.errors.ConflictError, match=r"share nodes"):
        s.replace(silu, Gelu(), (x,), matches=0)


def _patched_b(model):
    patched = copy.deepcopy(model)
    patched.b.act_fn = gelu
    return patched


def test_bisect_finds_a_wrong_region_among_swaps():
    torch.manual_seed(0)
    model, x = TwoInline().eval(), torch.randn(3, 4)
    s = gs.Surgery.from_model(model, (x,))
    s.swap("a.lin", copy.deepcopy(model.a.lin))  # faithful
    s.replace(silu, Gelu(), (x,), matches=1)  # wrong: another function
    found = s.bisect()
    assert found.culprits == ("silu:b",)


def counted_rewrites(monkeypatch) -> list:
    """The Surgery's own builds from now on (a build ahead runs through the warm-up's)."""
    import graphsurgeon.surgery as surgery_module

    built = []
    rewrite = surgery_module.rewrite
    monkeypatch.setattr(
        surgery_module, "rewrite", lambda *a, **k: built.append(a[1]) or rewrite(*a, **k)
    )
    return built


def test_a_swap_built_ahead_is_what_that_swap_takes(tiny_gpt, monkeypatch):
    # Surgery.prepare_swap (the widget asks for it once a replacement is chosen) builds the
    # next state in the background; the swap it was built for takes that program
    model, tokens, ep = tiny_gpt
    s = gs.Surgery(ep, args=(tokens,))
    replacement = copy.deepcopy(model.layers[1])
    s.prepare_swap("layers.1", replacement).join(30)
    ahead = s._ahead
    assert ahead is not None and ahead.module is not None, "precondition: built ahead"
    built = counted_rewrites(monkeypatch)
    s.swap("layers.1", replacement)
    assert built == [] and s.module is ahead.module and s._ahead is None
    assert s.replacements == {"layers.1": replacement}
    assert gs.verify(eager_reference(model, {"layers.1": replacement}), s.module, (tokens,))
    # the swap just made, asked for again: nothing to build
    assert s.prepare_swap("layers.1", replacement) is None and s._ahead is None


@pytest.mark.parametrize("change", ["another module", "weight written", "another step", "undo"])
def test_a_swap_built_ahead_is_not_taken_once_what_it_read_has_changed(
    tiny_gpt, monkeypatch, change
):
    model, tokens, ep = tiny_gpt
    s = gs.Surgery(ep, args=(tokens,))
    if change == "undo":
        s.swap("layers.0", copy.deepcopy(model.layers[0]))
    replacement = copy.deepcopy(model.layers[1])
    s.prepare_swap("layers.1", replacement).join(30)
    ahead = s._ahead.module
    assert ahead is not None, "precondition: built ahead"
    module = replacement
    if change == "another module":
        module = copy.deepcopy(model.layers[1])
    elif change == "weight written":  # in place, as a user's cell may between choice and swap
        with torch.no_grad():
            replacement.mlp.up.weight.mul_(2.0)
    elif change == "another step":
        s.swap("layers.0", copy.deepcopy(model.layers[0]))
    else:
        s.undo()
    built = counted_rewrites(monkeypatch)
    s.swap("layers.1", module)
    assert len(built) == 1 and s.module is not ahead
    assert gs.verify(eager_reference(model, s.replacements), s.module, (tokens,))


def test_a_swap_refused_is_built_ahead_by_no_one_and_refused_when_asked_for(tiny_gpt):
    model, tokens, ep = tiny_gpt
    s = gs.Surgery(ep, args=(tokens,))
    s.swap("layers.1", copy.deepcopy(model.layers[1]))
    # refused by the Surgery (inside a swapped module): nothing is started
    assert s.prepare_swap("layers.1.attn", nn.Identity()) is None and s._ahead is None
    with pytest.raises(gs.errors.ConflictError):
        s.swap("layers.1.attn", nn.Identity())
    # refused by the rewrite (a forward that takes two inputs): the build fails on its own
    # thread, quietly; the swap raises as it would have
    s.prepare_swap("layers.0.attn", nn.Bilinear(64, 64, 64)).join(30)
    assert s._ahead is not None and s._ahead.module is None, "precondition: the build failed"
    with pytest.raises(gs.errors.SwapError, match=r"layers\.0\.attn"):
        s.swap("layers.0.attn", nn.Bilinear(64, 64, 64))
    assert list(s.replacements) == ["layers.1"] and len(s.history) == 1


def test_a_warm_up_s_program_is_taken_only_for_the_state_it_was_built_for(tiny_gpt):
    # Surgery.build_in_background (the widget starts it) builds the current state in the background; its
    # module is that state's only while that state is the current one
    model, tokens, ep = tiny_gpt
    s = gs.Surgery(ep, args=(tokens,))
    request = {"layers.1": copy.deepcopy(model.layers[1])}
    s.swap("layers.1", request["layers.1"])
    s.undo()
    s._forget_built()  # no state built
    s.build_in_background().join(30)  # built for state 0
    assert s._warmed is not None, "precondition: the warm-up built state 0"
    warmed = s._warmed[2]
    s.redo()  # state 1: built now, the warm-up's program not taken
    assert 1 not in s._built and s.module is not warmed
    assert gs.verify(eager_reference(model, request), s.module, (tokens,))
    s.undo()
    assert s.module is not warmed and s._warmed is None  # dropped when it was not taken
    # for the current state, it is taken
    fresh = gs.Surgery(ep, args=(tokens,))
    fresh.build_in_background().join(30)
    assert fresh.module is fresh._built[0] and fresh.module is not None
    assert gs.verify(model, fresh.module, (tokens,))
