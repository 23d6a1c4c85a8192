"""Small models the test modules share, and the ones several themes use alike; the models of
one theme are in its module: export_models, swap_models, check_models, pattern_models and
view_models."""

from __future__ import annotations

import torch
from torch import nn

from graphsurgeon.examples import FusedAttention


#   x ──▶ first (Linear) ──▶ act (ReLU) ──▶ last (Linear) ──▶ out
class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.last = nn.Linear(4, 4)

    def forward(self, x):
        return self.last(self.act(self.first(x)))


#   x ──▶ shared ──▶ mid ──▶ shared (again, "shared@1") ──▶ * scale ──▶ out
class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.mid = nn.Tanh()

    def forward(self, x, *, scale=2.0):
        return self.shared(self.mid(self.shared(x))) * scale


class Scale(nn.Module):
    """x * factor: the simplest replacement that changes numbers."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


#   x ──▶ a (Linear) ──▶ relu ──▶ b (Linear) ──▶ out
class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


#   x ──▶ block (Linear, BatchNorm1d) ──▶ head (Linear) ──▶ out
class NormedBlock(nn.Module):
    """In training mode a run writes its state: the batch norm's running statistics."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.block(x))


def hf_decoder(kind: str = "Llama", layers: int = 2) -> nn.Module:
    """A Hugging Face decoder of family ``kind`` (``"Llama"``, ``"Mistral"``, ``"Qwen2"``...)
    built from a small config, eager attention, seeded weights, in eval mode."""
    import transformers

    config = getattr(transformers, f"{kind}Config")(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=100,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, f"{kind}ForCausalLM")(config).eval()


class NoCausalMask(FusedAttention):
    """FusedAttention that forgets ``is_causal``: wrong from its first token on."""

    def forward(self, x):
        batch, tokens, hidden = x.shape
        q, k, v = (
            self.qkv(x)
            .view(batch, tokens, 3, self.heads, hidden // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        out = nn.functional.scaled_dot_product_attention(q, k, v)  # forgets is_causal
        return self.o(out.transpose(1, 2).reshape(batch, tokens, hidden))


#   x ──▶ heads (lin, then a view by x's token count) ──▶ out : exported with dynamic tokens,
#   the token count is size arithmetic outside every call that only heads reads
class SizedHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = _Heads()
        self.out = nn.Linear(2, 2)

    def forward(self, x):
        return self.out(self.heads(x))


class _Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        batch, tokens, _ = x.shape
        return self.lin(x).view(batch, tokens, 2, 2).sum(-1)


class Halves(nn.Module):
    """A replacement for ``SizedHeads.heads`` that reads no size: the sum of x's two halves."""

    def forward(self, x):
        return x[..., :2] + x[..., 2:]


# -- no mutation: models whose weights and buffers must come back untouched (tests/test_no_mutation.py) ---


class TimesTwo(nn.Module):
    def forward(self, x):
        return x * 2


# -- overlay: the numbers of two runs side by side (tests/test_overlay.py) --------------------------


class Residual(nn.Module):
    # input ──▶ lin ──▶ add ◀── input ;  add ──▶ head ──▶ out  (an argument named after a builtin)
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.head = nn.Linear(2, 2)

    def forward(self, input):
        return self.head(self.lin(input) + input)
