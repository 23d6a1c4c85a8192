"""Swaps on Hugging Face models built from small configs (no download): GPT-2 and BERT.

Their forward takes keyword arguments and returns a ModelOutput dataclass; attention masks,
layer lists and dropout modules that are never called are all on the way.
"""

from __future__ import annotations

import copy
import importlib
import shutil

import pytest
import torch
import transformers  # the dev extra installs it: a missing install fails here, loudly
from helpers.export_models import FailsNamingACache, Rope, SdpaT5Attention, rope_scaled
from helpers.models import hf_decoder
from helpers.references import check_swap

import graphsurgeon as gs

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")


@pytest.fixture(scope="module")
def gpt2():
    #   ids -> wte + wpe -> h[0], h[1] (ln_1, attn(c_attn, c_proj), ln_2, mlp(c_fc, act, c_proj)) -> ln_f -> lm_head
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    kwargs = {"use_cache": False}
    return model, ids, kwargs, gs.export(model, (ids,), kwargs)


@pytest.fixture(scope="module")
def bert():
    #   ids, attention_mask -> embeddings -> layer[0], layer[1] (attention, intermediate, output) -> pooler
    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    kwargs = {"attention_mask": mask}
    return model, ids, kwargs, gs.export(model, (ids,), kwargs)


def shifted(module: torch.nn.Module, path: str) -> torch.nn.Module:
    """A copy of ``module`` whose ``path`` bias is moved by 0.5: a replacement that shows."""
    copied = copy.deepcopy(module)
    with torch.no_grad():
        copied.get_parameter(path).add_(0.5)
    return copied


@pytest.mark.parametrize(
    ("name", "bias"),
    [
        ("transformer.h.0.mlp", "c_fc.bias"),
        ("transformer.h.1.attn", "c_proj.bias"),
        ("transformer.h.1", "ln_2.bias"),
    ],
)
def test_gpt2_swaps_mlp_attention_and_a_block(gpt2, name, bias):
    model, ids, kwargs, ep = gpt2
    gm, _, _ = check_swap(
        model, (ids,), {name: shifted(model.get_submodule(name), bias)}, kwargs, ep=ep
    )
    assert type(gm(ids, **kwargs)).__name__ == "CausalLMOutputWithCrossAttentions"


@pytest.mark.parametrize(
    ("name", "bias"),
    [
        ("encoder.layer.0.attention", "output.dense.bias"),
        ("encoder.layer.1", "output.dense.bias"),
        ("pooler", "dense.bias"),
    ],
)
def test_bert_swaps_attention_a_layer_and_the_pooler(bert, name, bias):
    model, ids, kwargs, ep = bert
    check_swap(model, (ids,), {name: shifted(model.get_submodule(name), bias)}, kwargs, ep=ep)


def test_unused_dropouts_and_layer_lists_are_explained(bert):
    _, _, _, ep = bert
    tree = gs.module_tree(ep)
    assert "never called" in tree["encoder.layer"].reason
    assert tree["encoder.layer.0.attention.self.query"].swappable


def test_gpt2_with_its_cache_on_is_an_export_error_that_names_the_fix(gpt2):
    model, ids, kwargs, _ = gpt2
    assert model.config.use_cache and kwargs == {"use_cache": False}  # precondition
    with pytest.raises(gs.ExportError) as caught:
        gs.export(model, (ids,))
    message = str(caught.value)
    assert "DynamicCache" in message
    assert "pass use_cache=False in kwargs" in message
    assert "set model.config.use_cache = False" in message
    # the second fix works as the message says, on a copy (the fixture's model stays as it is)
    fixed = copy.deepcopy(model)
    fixed.config.use_cache = False
    assert gs.verify(fixed, gs.export(fixed, (ids,)), (ids,))
    assert model.config.use_cache


def test_the_cache_advice_needs_a_config_with_use_cache():
    x = torch.randn(2)
    with pytest.raises(gs.ExportError, match="StaticCache") as caught:
        gs.export(FailsNamingACache(), (x,))
    assert "use_cache" not in str(caught.value)
    config = transformers.GPT2Config(n_layer=1)
    assert config.use_cache  # precondition
    with pytest.raises(gs.ExportError, match=r"key/value cache \(StaticCache\).*use_cache=False"):
        gs.export(FailsNamingACache(config), (x,))


# -- RMSNorm of the Llama family: the most common kernel swap -----------------------------
#
# LlamaRMSNorm (and its copies) begins with hidden_states.to(torch.float32): on a float32 input
# that returns the input itself, so the residual after the norm reads the norm's `to` node.


def _moved(norm: torch.nn.Module) -> torch.nn.Module:
    copied = copy.deepcopy(norm)
    with torch.no_grad():
        copied.weight.mul_(1.5).add_(0.1)
    return copied


@pytest.mark.parametrize("kind", ["Llama", "Qwen3", "Gemma2"])
def test_every_rmsnorm_of_a_llama_family_decoder_swaps_as_eager(kind):
    model = hf_decoder(kind)
    ids, kwargs = torch.randint(0, 100, (1, 8)), {"use_cache": False}
    ep = gs.export(model, (ids,), kwargs)
    tree = gs.module_tree(ep)
    norms = [fqn for fqn, info in tree.items() if info.type_name.endswith("RMSNorm")]
    # each layer's input and post-attention norms (and more in Qwen3, Gemma2), and the final one
    assert {"model.norm", "model.layers.1.input_layernorm"} <= set(norms)
    assert {"model.layers.0.post_attention_layernorm"} <= set(norms)
    for fqn in norms:
        assert tree[fqn].swappable, f"{fqn}: {tree[fqn].reason}"
        check_swap(model, (ids,), {fqn: _moved(model.get_submodule(fqn))}, kwargs, ep=ep, rtol=1e-4)


# -- Hugging Face's rotary embedding: a function, not a module, in every layer ---------------


@pytest.mark.parametrize("kind", ["Llama", "Qwen2"])
def test_the_rotary_embedding_of_every_layer_is_replaced_as_the_patched_model_computes(kind):
    model = hf_decoder(kind)
    ids, kwargs = torch.randint(0, 100, (1, 8)), {"use_cache": False}
    module = importlib.import_module(type(model).__module__)
    s = gs.Surgery.from_model(model, (ids,), kwargs)
    example = (
        torch.randn(1, 4, 5, 8),
        torch.randn(1, 2, 5, 8),
        torch.randn(1, 5, 8),
        torch.randn(1, 5, 8),
    )
    found = gs.find(s.program, module.apply_rotary_pos_emb, example)
    layers = model.config.num_hidden_layers
    assert [m.call for m in found] == [f"model.layers.{i}.self_attn" for i in range(layers)]
    s.replace(module.apply_rotary_pos_emb, Rope(), example)
    original = module.apply_rotary_pos_emb
    module.apply_rotary_pos_emb = rope_scaled  # the eager model, patched the same way
    try:
        with torch.no_grad():
            expected = model(ids, **kwargs).logits
    finally:
        module.apply_rotary_pos_emb = original
    assert not torch.allclose(expected, model(ids, **kwargs).logits)  # the patch shows
    torch.testing.assert_close(s.module(ids, **kwargs).logits, expected, rtol=1e-4, atol=1e-5)


def test_t5_unfaithful_verdict_names_the_argument_eager_passes_otherwise():
    """Was: "not faithful (the swap itself)" for a right SDPA attention, compare showing 0
    error, and nothing saying that eager T5 passes ``mask=None`` where the program passes the
    bool mask it made."""
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config).eval()
    ids, decoder_ids = torch.randint(1, 100, (1, 8)), torch.randint(1, 100, (1, 6))
    kwargs = {"decoder_input_ids": decoder_ids, "use_cache": False}
    s = gs.Surgery.from_model(model, (ids,), kwargs)
    name = "decoder.block.0.layer.0.SelfAttention"
    s.swap(name, SdpaT5Attention(model.get_submodule(name)))
    report = s.verify()
    assert not report and report.original  # the precondition: right, yet "not faithful"
    assert gs.compare(s.program, s.module, (ids,), kwargs).first_divergence is None
    assert report.call_differences == (
        f"in eager, {name!r} gets mask=None; the program passes mask=b8[1, 1, 6, 6]",
    )
    assert f"why: in eager, {name!r} gets mask=None" in str(report)


def _own_box_or_cluster(drawing, call):
    """Whether the picture draws ``call`` with an element of its own (not in a run box)."""
    return any(not e.startswith("modules:") for e in drawing.picture.elements_of_call(call))


@needs_dot
def test_the_default_view_gives_every_bart_layer_a_box_of_its_own():
    # encoder.layers.0, .1 and decoder.layers.0, .1 side by side: a wide picture scrolls rather
    # than fold the layers into run boxes
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=100,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    model = transformers.BartModel(config).eval()
    ids, decoder_ids = torch.randint(5, 100, (1, 8)), torch.randint(5, 100, (1, 6))
    ep = gs.export(model, (ids,), {"decoder_input_ids": decoder_ids, "use_cache": False})
    drawing = gs.draw(ep)
    layers = [f"{side}.layers.{i}" for side in ("encoder", "decoder") for i in range(2)]
    assert all(_own_box_or_cluster(drawing, layer) for layer in layers), drawing
    assert not [i for i in drawing.picture.rows if i.startswith("modules:")]


@needs_dot
def test_the_default_view_draws_the_blocks_inside_a_vision_models_stages():
    # embedder -> encoder.stages.0 .. 3 (ResNetStage), each holding its blocks (layers.0, ...)
    torch.manual_seed(0)
    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 2, 1], layer_type="bottleneck"
    )
    model = transformers.ResNetModel(config).eval()
    ep = gs.export(model, (torch.randn(1, 3, 32, 32),))
    drawing = gs.draw(ep)
    blocks = [
        f"encoder.stages.{s}.layers.{b}" for s, n in enumerate(config.depths) for b in range(n)
    ]
    assert all(_own_box_or_cluster(drawing, block) for block in blocks), drawing
